"""The embeddings of one channel's searchable memories, by label: searched exactly while
the channel is small, through an HNSW graph once it grows past ``approximate_above``.

The graph is built off the request path (:meth:`VectorIndex.snapshot`, then
:meth:`ApproximateBuild.run` without the channel's lock, then :meth:`VectorIndex.install`),
and what changed while it was built is caught up when it is installed. HNSW cannot delete:
a removed memory's label is a tombstone that searches skip, and the graph is rebuilt once
tombstones make up a tenth of it.

Vectors are held compressed at the index's precision
(:data:`~calor.server.recall.hnsw.PRECISIONS`), and read back and scored as held: at
half precision (half of float32's memory), or quantised to 8 or 4 bits per dimension (a
quarter, an eighth), each dimension's range trained on the bounds the index is made
with; a graph holds them at the same precision and ranges. RocksDB keeps every vector
whole. A built graph's links (:class:`~calor.server.recall.hnsw.GraphLinks`, no vectors)
can be saved and, after a restart, joined again to the vectors RocksDB holds
(:meth:`VectorIndex.adopt`) instead of built again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import faiss
import numpy as np
import numpy.typing as npt

from calor.server.config import APPROXIMATE_ABOVE
from calor.server.recall.hnsw import PRECISIONS, GraphLinks, fingerprints, new_graph, quantiser

__all__ = ["APPROXIMATE_ABOVE", "ApproximateBuild", "VectorIndex"]

_SEARCH_BREADTH = 128  # least efSearch; at least twice k is used
# Least efSearch when a few neighbours are looked for to link to (a store, a share, a
# dream): in a graph of 60,000 short memories, 64 finds 0.992 of the exact nine nearest
# against 0.993 at 128, in 0.6 of the time (0.10 against 0.16 ms a query); narrower
# loses more in dense clusters of near ties (32: 0.92 of the ten nearest in the tests').
_NEIGHBOUR_BREADTH = 64
_REBUILD_SHARE = 0.1  # tombstones, as a share of the graph, that call for a rebuild
# Arrivals during a build that are caught up under the channel's lock: at most this many,
# or this share of the graph; past that the graph is built again from a new snapshot.
_CATCH_UP = 2_000
_CATCH_UP_SHARE = 0.05
_BUILD_BLOCK = 16_384  # rows a build turns to float32 and adds to its graph at a time

_F16 = npt.NDArray[np.float16]
_F32 = npt.NDArray[np.float32]
_I64 = npt.NDArray[np.int64]
_U64 = npt.NDArray[np.uint64]

# A quantised index's range in each dimension is the bounds it is made with, widened by
# this share each way, so vectors added later rarely fall outside it.
_RANGE_MARGIN = 0.05


@dataclass
class ApproximateBuild:
    """An HNSW graph being built from a snapshot of a channel's vectors, held at half
    precision (or as the index holds them, if coarser) and given to the graph a block at
    a time, so a build holds no float32 copy of the whole channel."""

    dim: int
    labels: _I64
    vectors: _F16
    graph: faiss.IndexIDMap2 | None = None
    prints: _U64 | None = None
    """The :func:`fingerprints` of the vectors as RocksDB holds them, row by row (taken
    from the index, which keeps them once vectors are quantised; else computed)."""
    precision: str = "half"
    ranges: _F32 | None = None
    """A quantised index's trained ranges: the graph encodes with the same, so the
    vectors it is given (read back from the index) keep their codes exactly."""

    def run(self) -> None:
        """Build the graph (long: minutes at a million vectors); no lock needed."""
        if self.prints is None:
            self.prints = fingerprints(self.vectors)
        graph = faiss.IndexIDMap2(new_graph(self.dim, self.precision, self.ranges))
        for start in range(0, self.vectors.shape[0], _BUILD_BLOCK):
            block = self.vectors[start : start + _BUILD_BLOCK].astype(np.float32)
            graph.add_with_ids(block, self.labels[start : start + _BUILD_BLOCK])
        self.graph = graph
        self.vectors = np.empty((0, self.dim), dtype=np.float16)  # the graph holds them


@dataclass
class VectorIndex:
    """Unit vectors by int64 label; inner-product search, exact or approximate.

    ``precision`` (a name in :data:`~calor.server.recall.hnsw.PRECISIONS`) is how the
    vectors are held; a quantised index is made with ``bounds``: each dimension's least
    and greatest value (two rows)
    among the vectors it will hold, which its ranges are trained on.

    Not thread-safe: the caller holds the channel's lock around every call.
    """

    dim: int
    approximate_above: int = APPROXIMATE_ABOVE
    precision: str = "half"
    bounds: _F32 | None = None
    graph_precision: str | None = None
    """How a graph built of these vectors holds them (None: as the exact index does):
    coarser, where the graph visits few enough vectors that decoding them costs little."""
    _index: faiss.IndexIDMap2 = field(init=False)
    _approximate: bool = field(default=False, init=False)
    _tombstones: set[int] = field(default_factory=set, init=False)
    _tombstone_cache: _I64 | None = field(default=None, init=False)
    _live: int = field(default=0, init=False)
    _building: bool = field(default=False, init=False)
    _changed: list[int] = field(default_factory=list, init=False)
    _removed: list[int] = field(default_factory=list, init=False)
    # While searched through a graph: each label's fingerprint (what a save writes), and
    # how many nodes the graph had when it was last saved (or built, or restored).
    _prints: _U64 = field(default_factory=lambda: np.zeros(0, dtype=np.uint64), init=False)
    _saved_nodes: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        # Exact search over half-precision vectors: half float32's memory, faster to scan
        # (measured: 0.38 against 0.56 ms for k=100 over 10,000), the same neighbours.
        exact = faiss.IndexScalarQuantizer(
            self.dim, PRECISIONS[self.precision], faiss.METRIC_INNER_PRODUCT
        )
        if not self.quantised and self.graph_precision not in (None, "half"):
            raise ValueError(f"a {self.graph_precision} graph needs a quantised index's ranges")
        if self.quantised:
            if self.bounds is None:
                raise ValueError(f"a {self.precision} index needs the bounds of its vectors")
            exact.sq.rangestat = faiss.ScalarQuantizer.RS_minmax
            exact.sq.rangestat_arg = _RANGE_MARGIN
            # Trained on the two rows of bounds alone, the quantiser's ranges are the
            # ones all the vectors would train.
            exact.train(np.ascontiguousarray(self.bounds, dtype=np.float32))
        self._index = faiss.IndexIDMap2(exact)

    @property
    def quantised(self) -> bool:
        """Whether vectors are held in fewer bits than half precision's (they then keep
        their fingerprints beside them: the index cannot read back the vectors whole)."""
        return self.precision != "half"

    def ranges(self) -> _F32 | None:
        """A quantised index's trained ranges (None at half precision)."""
        if not self.quantised:
            return None
        return np.asarray(faiss.vector_to_array(quantiser(self._index).trained), dtype=np.float32)

    @property
    def approximate(self) -> bool:
        """Whether searches go through the HNSW graph."""
        return self._approximate

    def add(self, labels: _I64, vectors: _F32) -> None:
        """Hold new vectors (fresh labels, one row each)."""
        # Rounded to half precision here, as numpy rounds (what fingerprints hash), so
        # the exact index holds exactly these values whatever rounding FAISS would use.
        vectors = vectors.astype(np.float16).astype(np.float32)
        self._index.add_with_ids(vectors, labels)
        self._live += len(labels)
        if self._building:
            self._changed.extend(labels.tolist())
        if self._approximate or self.quantised:
            self._note_prints(labels, fingerprints(vectors))

    @property
    def code_size(self) -> int:
        """Bytes each vector takes as held (its links in a graph not counted)."""
        return int(quantiser(self._index).code_size)

    @property
    def live(self) -> int:
        """How many vectors are held (tombstones not counted)."""
        return self._live

    def remove(self, label: int) -> None:
        """Stop finding a label (a tombstone while the graph holds it)."""
        self.remove_many(np.array([label], dtype=np.int64))

    def remove_many(self, labels: _I64) -> None:
        """Stop finding held labels (one pass over an exact index, however many)."""
        if labels.size == 0:
            return
        self._live -= labels.size
        if self._building:
            self._removed.extend(labels.tolist())
        if self._approximate:
            self._tombstones.update(labels.tolist())
        else:
            self._index.remove_ids(faiss.IDSelectorBatch(labels))

    def reconstruct(self, label: int) -> _F32:
        """The vector held under a label."""
        return np.asarray(self._index.reconstruct(label), dtype=np.float32)

    def reconstruct_batch(self, labels: _I64) -> _F32:
        """The vectors held under labels, one row each."""
        return np.asarray(self._index.reconstruct_batch(labels), dtype=np.float32)

    def similarities(self, query: _F32, labels: _I64) -> _F32:
        """The inner product of one query with the vector under each label, in order."""
        if not self._approximate:
            # Exact: a search restricted to the labels scores only their codes, at a third
            # of the cost of reconstructing them (0.05 against 0.15 ms for 200 of 10,000).
            selector = faiss.IDSelectorBatch(labels)  # held here while the search runs
            chosen = faiss.SearchParameters()
            chosen.sel = selector
            sims, found = self._index.search(query.reshape(1, -1), labels.size, params=chosen)
            if (found[0] >= 0).all():
                order = np.argsort(found[0])
                position = np.searchsorted(found[0], labels, sorter=order)
                return np.asarray(sims[0][order[position]], dtype=np.float32)
        return np.asarray(self.reconstruct_batch(labels) @ query.reshape(-1), dtype=np.float32)

    def neighbours(self, queries: _F32, k: int) -> tuple[_F32, _I64]:
        """:meth:`search` for a few neighbours to link to: through a graph, a narrower
        search, as good for a handful of nearest (a recall looks much deeper)."""
        return self.search(queries, k, least_breadth=_NEIGHBOUR_BREADTH)

    def search(
        self, queries: _F32, k: int, *, least_breadth: int = _SEARCH_BREADTH
    ) -> tuple[_F32, _I64]:
        """The ``k`` nearest held vectors of each query row: (similarities, labels),
        best first; label -1 pads a row that found fewer. Through a graph, at least
        ``least_breadth`` candidates are visited (and twice ``k``)."""
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
            breadth = max(least_breadth, 2 * wanted)
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
        prints = self._prints[labels] if self._approximate or self.quantised else None
        half = np.empty((labels.shape[0], self.dim), dtype=np.float16)
        for start in range(0, labels.shape[0], _BUILD_BLOCK):
            chosen = labels[start : start + _BUILD_BLOCK]
            half[start : start + chosen.shape[0]] = self.reconstruct_batch(chosen)
        precision = self.graph_precision or self.precision
        return ApproximateBuild(
            self.dim, labels, half, prints=prints, precision=precision, ranges=self.ranges()
        )

    def install(self, build: ApproximateBuild) -> bool:
        """Search through the built graph from now on, with what changed meanwhile; False
        (and exact search stays) if the build failed, or if so much arrived meanwhile
        that catching up would hold the channel long: then build again."""
        self._building = False
        removed = set(self._removed)
        added = [label for label in self._changed if label not in removed]
        if build.graph is None or build.prints is None or len(added) > _catch_up(build.labels.size):
            self._changed, self._removed = [], []
            return False
        held = set(faiss.vector_to_array(build.graph.id_map).tolist())
        fresh = np.array(added, dtype=np.int64)
        self._search_through(build.graph, build.labels, build.prints, fresh, removed & held)
        self._changed, self._removed = [], []
        return True

    def adopt(self, links: GraphLinks, labels: _I64, prints: _U64) -> bool:
        """Search through a saved graph from now on, joined to the vectors held here.

        ``labels``: each node's label now (-1: its memory is gone); ``prints``: each
        node's :func:`fingerprints` when the graph was built. A node whose memory is
        gone or was embedded again since is a tombstone (with a zero vector); memories
        the graph lacks are added to it. False (and exact search stays, so the graph is
        built again) if it does not fit: too many tombstones or too much to add.
        """
        if (
            self._approximate
            or self._building
            or links.size != labels.shape[0]
            or links.precision != (self.graph_precision or self.precision)
        ):
            return False
        alive = labels >= 0
        if np.unique(labels[alive]).size != np.count_nonzero(alive):
            return False  # two nodes claim one memory: not a graph of these memories
        vectors = np.zeros((links.size, self.dim), dtype=np.float32)
        vectors[alive] = self.reconstruct_batch(labels[alive])
        held_prints = (
            self._prints[labels[alive]] if self.quantised else fingerprints(vectors[alive])
        )
        alive[alive] = held_prints == prints[alive]
        vectors[~alive] = 0.0
        held = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        missing = np.setdiff1d(held, labels[alive])
        dead = np.flatnonzero(~alive)
        if dead.size > _REBUILD_SHARE * links.size or missing.size > _catch_up(links.size):
            return False
        labels = labels.copy()
        labels[dead] = -2 - np.arange(dead.size)  # unique, and never a search result
        graph = links.join(vectors, labels)
        tombstones = set(labels[dead].tolist())
        self._search_through(graph, labels[alive], prints[alive], missing, tombstones)
        return True

    def wants_save(self) -> bool:
        """Whether the graph grew enough since it was last saved that a restart would
        have much to catch up (half of what :meth:`adopt` takes): save it again."""
        if not self._approximate or self._building:
            return False
        grown = self._index.ntotal - self._saved_nodes
        return 2 * grown >= _catch_up(self._saved_nodes)

    def saving(self) -> tuple[GraphLinks, _I64, _U64]:
        """What a save writes, as of now: the graph's links, each node's label (a
        tombstone's too) and fingerprint. Counts as saved."""
        labels = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        prints = np.zeros(labels.shape[0], dtype=np.uint64)
        known = (labels >= 0) & (labels < self._prints.shape[0])
        prints[known] = self._prints[labels[known]]
        self._saved_nodes = labels.shape[0]
        return GraphLinks.of(self._index), labels, prints

    def _search_through(
        self, graph: faiss.IndexIDMap2, labels: _I64, prints: _U64, add: _I64, tombstones: set[int]
    ) -> None:
        """Search through ``graph`` from now on: it holds ``labels`` (their fingerprints
        ``prints``) and the ``tombstones`` searches skip; the vectors of ``add`` are
        caught up into it first. It counts as saved at the size it came with."""
        self._saved_nodes = graph.ntotal
        vectors = self.reconstruct_batch(add)
        if add.size:
            graph.add_with_ids(vectors, add)
        if not self.quantised:  # a quantised index kept its own all along
            self._prints = np.zeros(0, dtype=np.uint64)
            self._note_prints(labels, prints)
            self._note_prints(add, fingerprints(vectors))
        self._index = graph
        self.precision = self.graph_precision or self.precision
        self._tombstones = tombstones
        self._tombstone_cache = None
        self._approximate = True

    def _note_prints(self, labels: _I64, prints: _U64) -> None:
        """Keep the fingerprints of labels (the table grows as labels do)."""
        if labels.size == 0:
            return
        needed = int(labels.max()) + 1
        if needed > self._prints.shape[0]:
            grown = np.zeros(max(needed, 2 * self._prints.shape[0]), dtype=np.uint64)
            grown[: self._prints.shape[0]] = self._prints
            self._prints = grown
        self._prints[labels] = prints

    def abandon(self) -> None:
        """A build will not be installed: stop noting changes for it."""
        self._building = False
        self._changed, self._removed = [], []


def _catch_up(nodes: int) -> float:
    """How many arrivals a graph of ``nodes`` takes in when put in place (under the
    channel's lock): past that it is built again instead."""
    return max(_CATCH_UP, _CATCH_UP_SHARE * nodes)


def _first(sims: _F32, labels: _I64, keep: npt.NDArray[np.bool_], k: int) -> tuple[_F32, _I64]:
    """Each row's first ``k`` kept results, -1 padded."""
    out_sims = np.zeros((labels.shape[0], k), dtype=np.float32)
    out_labels = np.full((labels.shape[0], k), -1, dtype=np.int64)
    for row in range(labels.shape[0]):
        chosen = np.flatnonzero(keep[row])[:k]
        out_sims[row, : chosen.size] = sims[row, chosen]
        out_labels[row, : chosen.size] = labels[row, chosen]
    return out_sims, out_labels
