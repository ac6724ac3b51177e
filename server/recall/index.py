"""Per-channel search indexes, rebuilt from RocksDB at start: FAISS for meaning, BM25 for words.

Both indexes of a channel share one label space (int64 labels handed out here), so a
candidate found by either is the same memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat

import faiss
import numpy as np
import numpy.typing as npt

from calor.server.recall.columns import Batch, RecordColumns
from calor.server.recall.graph_files import SavedGraph
from calor.server.recall.lexical import LexicalIndex
from calor.server.recall.tiers import HOT, TieredVectors
from calor.server.recall.vectors import APPROXIMATE_ABOVE, VectorIndex
from calor.server.records import MemoryRecord

__all__ = ["ChannelIndex", "ScratchIndex", "WholeByIds"]

WholeByIds = Callable[[list[str]], tuple[np.ndarray, npt.NDArray[np.bool_]]]
"""Memory ids to their embeddings as the store keeps them, whole (one row each), and
which of them were found."""

# One query against a flat index is a single matrix-vector product: FAISS's OpenMP
# threads cost far more to wake than they save (measured: 12.5 ms with 2 threads,
# 0.9 ms with 1, for k=100 over 10,000 vectors on this 2-core machine).
faiss.omp_set_num_threads(1)


class ChannelIndex:
    """The searchable memories of one channel: a FAISS inner-product index, a BM25 index,
    and the columns of stored fields recall scores with (``columns``, by label).

    Not thread-safe: the caller holds the channel's lock around every call.
    """

    def __init__(
        self,
        dim: int,
        approximate_above: int = APPROXIMATE_ABOVE,
        on_move: Callable[[str], None] | None = None,
        tier: int = HOT,
        whole: WholeByIds | None = None,
    ) -> None:
        self.dim = dim
        self.on_move = on_move
        """Told of each memory that enters or leaves the index (its label changes)."""
        self._id_at: list[str] = []  # by label, "" once removed (labels are handed out in order)
        # Labels to whole vectors through the ids, never through a method of this index:
        # its vectors holding it would make a cycle, and an unloaded channel's index would
        # then wait for the cycle collector (which never sees the frozen loaded ones).
        by_label = None if whole is None else _WholeByLabel(self._id_at, whole)
        self.vectors = TieredVectors(dim, approximate_above, whole=by_label)
        """The embeddings by heat tier (each searched exactly, or through an HNSW graph
        once large)."""
        self.tier = tier
        """The vector tier memories arrive in unless their ``placing`` says otherwise."""
        self.lexical = LexicalIndex()
        self.columns = RecordColumns()
        self._label_of: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._label_of)

    def __contains__(self, memory_id: object) -> bool:
        return memory_id in self._label_of

    def add(
        self,
        records: Sequence[MemoryRecord],
        vectors: np.ndarray,
        placing: Callable[[Batch], npt.NDArray[np.int8]] | None = None,
    ) -> None:
        """Index memories with their unit-norm embeddings (one row each); ``placing``
        gives the vector tier each belongs in, from their columns (else ``tier``)."""
        if not records:
            return
        for record in records:
            if record.id in self._label_of:
                self.remove(record.id)
        first = len(self._id_at)
        labels = np.arange(first, first + len(records), dtype=np.int64)
        self._id_at.extend(record.id for record in records)
        matrix = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(records), self.dim)
        for label, record in zip(labels.tolist(), records, strict=True):
            self._label_of[record.id] = label
            if self.on_move is not None:
                self.on_move(record.id)
            self.lexical.add(label, record.text)
            self.columns.set(label, record)
        if placing is None:
            tiers = np.full(labels.shape[0], self.tier, dtype=np.int8)
        else:
            tiers = placing(self.columns.batch(labels))
        self.vectors.add(labels, matrix, tiers)

    def refresh(self, record: MemoryRecord) -> None:
        """Take an indexed memory's changed fields (heat, state, ...) into the columns."""
        label = self._label_of.get(record.id)
        if label is not None:
            self.columns.set(label, record)

    def label(self, memory_id: str) -> int | None:
        """The label of an indexed memory."""
        return self._label_of.get(memory_id)

    def labels(self, memory_ids: list[str]) -> npt.NDArray[np.int64]:
        """The label of each memory, -1 for one not indexed here."""
        return np.array(list(map(self._label_of.get, memory_ids, repeat(-1))), dtype=np.int64)

    def label_mask(self, labels: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """A boolean per label ever handed out here, true for ``labels``: a set that numpy
        indexes (membership of many labels at once, without sorting)."""
        mask = np.zeros(len(self._id_at), dtype=bool)
        mask[labels] = True
        return mask

    def remove(self, memory_id: str) -> bool:
        """Take a memory out of both indexes; False if it was not there."""
        label = self._label_of.pop(memory_id, None)
        if label is None:
            return False
        self._id_at[label] = ""
        if self.on_move is not None:
            self.on_move(memory_id)
        self.vectors.remove(label)
        self.lexical.remove(label)
        return True

    def members(self) -> tuple[list[str], np.ndarray]:
        """Every indexed memory: (ids, labels), in the same order."""
        return list(self._label_of), np.fromiter(
            self._label_of.values(), dtype=np.int64, count=len(self._label_of)
        )

    def memory_id(self, label: int) -> str:
        """The memory id behind a label."""
        memory_id = self._id_at[label] if 0 <= label < len(self._id_at) else ""
        if not memory_id:
            raise KeyError(label)
        return memory_id

    def memory_ids(self, labels: np.ndarray) -> list[str]:
        """The memory ids behind labels, in order; "" for a label no memory holds now."""
        return _ids_at(self._id_at, labels)

    def restore(self, saved: SavedGraph, tier: int) -> bool:
        """Search a tier through a saved HNSW graph (see ``VectorIndex.adopt``); False if
        it does not fit the memories the tier holds here."""
        labels = np.fromiter(
            (self._label_of.get(memory_id, -1) for memory_id in saved.ids),
            dtype=np.int64,
            count=len(saved.ids),
        )
        index = dict(self.vectors.held()).get(tier)
        if index is None:
            return False
        return index.adopt(saved.links, self.vectors.rows_in(tier, labels), saved.prints)

    def tier_ids(self, tier: int, rows: npt.NDArray[np.int64]) -> list[str]:
        """The memory ids behind a tier's rows, in order; "" for a row no memory holds."""
        return self.memory_ids(self.vectors.labels_of(tier, rows))

    def dense(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest memories by cosine: (labels, similarities), best first."""
        sims, labels = self.vectors.search(query.reshape(1, self.dim).astype(np.float32), k)
        keep = labels[0] >= 0
        return labels[0][keep], sims[0][keep]

    def search_many(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest memories of each query row, to link to: (similarities,
        labels); label -1 pads."""
        return self.vectors.neighbours(np.ascontiguousarray(queries, dtype=np.float32), k)

    def vector(self, memory_id: str) -> np.ndarray | None:
        """The indexed embedding of a memory."""
        label = self._label_of.get(memory_id)
        return None if label is None else self.vectors.reconstruct(label)

    def similarities(self, query: np.ndarray, labels: npt.NDArray[np.int64]) -> np.ndarray:
        """Cosine of the query with each labelled memory's embedding."""
        label_array = np.asarray(labels, dtype=np.int64)
        if label_array.size == 0:
            return np.empty(0, dtype=np.float32)
        return self.vectors.similarities(query.astype(np.float32), label_array)


def _ids_at(id_at: list[str], labels: np.ndarray) -> list[str]:
    """The ids behind labels, in order; "" for a label no memory holds now."""
    held = len(id_at)
    return [id_at[label] if 0 <= label < held else "" for label in labels.tolist()]


class _WholeByLabel:
    """A channel index's labels to whole vectors: its ids (the index's own list, which
    only grows), then the store's reader."""

    def __init__(self, id_at: list[str], whole: WholeByIds) -> None:
        self._id_at, self._whole = id_at, whole

    def __call__(self, labels: npt.NDArray[np.int64]) -> tuple[np.ndarray, npt.NDArray[np.bool_]]:
        return self._whole(_ids_at(self._id_at, labels))


class ScratchIndex:
    """A throwaway index over the earlier items of one store batch (or one dream's
    snapshot), so later items can link to them before anything of the batch is committed
    to the channel. Exact while small; past ``approximate_above`` searched through an
    HNSW graph, as a channel is, so a big batch costs no all-pairs search."""

    def __init__(self, dim: int, approximate_above: int = APPROXIMATE_ABOVE) -> None:
        self._vectors = VectorIndex(dim, approximate_above)
        self._ids: list[str] = []

    @property
    def approximate(self) -> bool:
        """Whether searches go through an HNSW graph."""
        return self._vectors.approximate

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Add embeddings (one row per id)."""
        if not ids:
            return
        labels = np.arange(len(self._ids), len(self._ids) + len(ids), dtype=np.int64)
        self._vectors.add(labels, np.ascontiguousarray(vectors, dtype=np.float32))
        self._ids.extend(ids)
        if self._vectors.wants_graph():
            build = self._vectors.snapshot()
            build.run()
            self._vectors.install(build)

    def search(self, queries: np.ndarray, k: int) -> list[list[tuple[float, str]]]:
        """The ``k`` nearest earlier items of each query row, as (similarity, id)."""
        sims, rows = self._vectors.neighbours(np.ascontiguousarray(queries, dtype=np.float32), k)
        return [
            [(float(s), self._ids[r]) for s, r in zip(sim_row, id_row, strict=True) if r >= 0]
            for sim_row, id_row in zip(sims, rows, strict=True)
        ]
