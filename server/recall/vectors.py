"""The embeddings of one channel's searchable memories, by label: searched exactly while
the channel is small, through an HNSW graph once it grows past ``approximate_above``.

The graph is built off the request path (:meth:`VectorIndex.snapshot`, then
:meth:`ApproximateBuild.run` without the channel's lock, then :meth:`VectorIndex.install`),
and what changed while it was built is caught up when it is installed. HNSW cannot delete:
a removed memory's label is a tombstone that searches skip, and the graph is rebuilt once
tombstones make up a tenth of it. RocksDB keeps every vector; the graph is rebuilt from
the channel's vectors after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import faiss
import numpy as np
import numpy.typing as npt

from calor.server.config import APPROXIMATE_ABOVE

__all__ = ["APPROXIMATE_ABOVE", "ApproximateBuild", "VectorIndex"]

_LINKS = 32  # HNSW M: neighbours per node
_BUILD_BREADTH = 80  # efConstruction
_SEARCH_BREADTH = 128  # least efSearch; at least twice k is used
_REBUILD_SHARE = 0.1  # tombstones, as a share of the graph, that call for a rebuild
# Arrivals during a build that are caught up under the channel's lock: at most this many,
# or this share of the graph; past that the graph is built again from a new snapshot.
_CATCH_UP = 2_000
_CATCH_UP_SHARE = 0.05

_F32 = npt.NDArray[np.float32]
_I64 = npt.NDArray[np.int64]


@dataclass
class ApproximateBuild:
    """An HNSW graph being built from a snapshot of a channel's vectors."""

    dim: int
    labels: _I64
    vectors: _F32
    graph: faiss.IndexIDMap2 | None = None

    def run(self) -> None:
        """Build the graph (long: minutes at a million vectors); no lock needed."""
        hnsw = faiss.IndexHNSWFlat(self.dim, _LINKS, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = _BUILD_BREADTH
        graph = faiss.IndexIDMap2(hnsw)
        graph.add_with_ids(self.vectors, self.labels)
        self.graph = graph
        self.vectors = np.empty((0, self.dim), dtype=np.float32)  # the graph holds them


@dataclass
class VectorIndex:
    """Unit vectors by int64 label; inner-product search, exact or approximate.

    Not thread-safe: the caller holds the channel's lock around every call.
    """

    dim: int
    approximate_above: int = APPROXIMATE_ABOVE
    _index: faiss.IndexIDMap2 = field(init=False)
    _approximate: bool = field(default=False, init=False)
    _tombstones: set[int] = field(default_factory=set, init=False)
    _tombstone_cache: _I64 | None = field(default=None, init=False)
    _live: int = field(default=0, init=False)
    _building: bool = field(default=False, init=False)
    _changed: list[int] = field(default_factory=list, init=False)
    _removed: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))

    @property
    def approximate(self) -> bool:
        """Whether searches go through the HNSW graph."""
        return self._approximate

    def add(self, labels: _I64, vectors: _F32) -> None:
        """Hold new vectors (fresh labels, one row each)."""
        self._index.add_with_ids(vectors, labels)
        self._live += len(labels)
        if self._building:
            self._changed.extend(labels.tolist())

    def remove(self, label: int) -> None:
        """Stop finding a label (a tombstone while the graph holds it)."""
        self._live -= 1
        if self._building:
            self._removed.append(label)
        if self._approximate:
            self._tombstones.add(label)
        else:
            self._index.remove_ids(np.array([label], dtype=np.int64))  # type: ignore[arg-type]

    def reconstruct(self, label: int) -> _F32:
        """The vector held under a label."""
        return np.asarray(self._index.reconstruct(label), dtype=np.float32)

    def reconstruct_batch(self, labels: _I64) -> _F32:
        """The vectors held under labels, one row each."""
        return np.asarray(self._index.reconstruct_batch(labels), dtype=np.float32)

    def search(self, queries: _F32, k: int) -> tuple[_F32, _I64]:
        """The ``k`` nearest held vectors of each query row: (similarities, labels),
        best first; label -1 pads a row that found fewer."""
        k = min(k, self._live)
        rows = queries.shape[0]
        if k <= 0 or rows == 0:
            return np.empty((rows, 0), dtype=np.float32), np.empty((rows, 0), dtype=np.int64)
        if not self._approximate:
            sims, labels = self._index.search(queries, k)
            return sims, labels
        # At most a tenth of the graph is tombstones (then it is rebuilt): asking for twice
        # k is nearly always enough, and the search widens when it is not.
        wanted = min(k + min(len(self._tombstones), k), self._index.ntotal)
        while True:
            breadth = max(_SEARCH_BREADTH, 2 * wanted)
            params = faiss.SearchParametersHNSW(efSearch=breadth)  # type: ignore[attr-defined]
            sims, labels = self._index.search(queries, wanted, params=params)
            keep = labels >= 0
            if self._tombstones:
                keep &= ~np.isin(labels, self._tombstone_array())
            if keep.sum(axis=1).min() >= k or wanted >= self._index.ntotal:
                return _first(sims, labels, keep, k)
            wanted = min(2 * wanted, self._index.ntotal)

    # --- the approximate graph, built off the request path ---------------------------

    def _tombstone_array(self) -> _I64:
        if self._tombstone_cache is None or self._tombstone_cache.size != len(self._tombstones):
            self._tombstone_cache = np.fromiter(self._tombstones, dtype=np.int64)
        return self._tombstone_cache

    def wants_graph(self) -> bool:
        """Whether a graph should be built now: the channel grew past the threshold, or
        tombstones fill too much of the graph; never while one is being built."""
        if self._building:
            return False
        if not self._approximate:
            return self._live > self.approximate_above
        return len(self._tombstones) > _REBUILD_SHARE * max(1, self._index.ntotal)

    def snapshot(self) -> ApproximateBuild:
        """The live vectors to build a graph of; changes from now on are caught up by
        :meth:`install`."""
        labels = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        if self._tombstones:
            labels = labels[~np.isin(labels, self._tombstone_array())]
        self._building = True
        self._changed, self._removed = [], []
        return ApproximateBuild(self.dim, labels, self.reconstruct_batch(labels))

    def install(self, build: ApproximateBuild) -> bool:
        """Search through the built graph from now on, with what changed meanwhile; False
        (and exact search stays) if the build failed, or if so much arrived meanwhile
        that catching up would hold the channel long: then build again."""
        self._building = False
        removed = set(self._removed)
        added = [label for label in self._changed if label not in removed]
        if build.graph is None or len(added) > max(_CATCH_UP, _CATCH_UP_SHARE * len(build.labels)):
            self._changed, self._removed = [], []
            return False
        if added:
            fresh = np.array(added, dtype=np.int64)
            build.graph.add_with_ids(self.reconstruct_batch(fresh), fresh)
        held = set(faiss.vector_to_array(build.graph.id_map).tolist())
        self._index = build.graph
        self._tombstones = removed & held
        self._approximate = True
        self._changed, self._removed = [], []
        return True

    def abandon(self) -> None:
        """A build will not be installed: stop noting changes for it."""
        self._building = False
        self._changed, self._removed = [], []


def _first(sims: _F32, labels: _I64, keep: npt.NDArray[np.bool_], k: int) -> tuple[_F32, _I64]:
    """Each row's first ``k`` kept results, -1 padded."""
    out_sims = np.zeros((labels.shape[0], k), dtype=np.float32)
    out_labels = np.full((labels.shape[0], k), -1, dtype=np.int64)
    for row in range(labels.shape[0]):
        chosen = np.flatnonzero(keep[row])[:k]
        out_sims[row, : chosen.size] = sims[row, chosen]
        out_labels[row, : chosen.size] = labels[row, chosen]
    return out_sims, out_labels
