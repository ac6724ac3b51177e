"""A channel's vectors by heat tier (DESIGN §5): hot memories held at half precision, warm
ones in 8 bits a dimension and cold ones in 4 once many (:data:`TIERS`), each tier its
own :class:`VectorIndex` (exact while small, an HNSW graph once large) and all of them
searched together, best first.

4 bits a dimension find about 0.88 of exact search's ten nearest on their own; so a
search scores the best :data:`RESCORED` of a 4-bit tier's hits again from their whole
vectors, read from where they are kept whole (RocksDB, through ``whole``), and so does
:meth:`TieredVectors.similarities` for a memory in such a tier. Without ``whole`` (or for
a memory not found there), the tier's own estimate stands.

A tier holds rows of its own, each naming the channel label it is for: a memory that
leaves a tier and comes back later takes a fresh row, as a graph cannot take a deleted
row back. Which tier a memory belongs in is decided elsewhere (:func:`tiers_for`, by its
heat); memories move only when told to (:meth:`TieredVectors.move`: in dreams and sweeps,
never on the recall path). The scores of the tiers are each an estimate of the same
cosine (or the cosine itself, once scored again), so they are compared as they are.

A quantised tier's ranges are trained on the bounds of the vectors the channel has been
given; until it has been given :data:`SETTLED` (bounds from fewer misplace later vectors
badly: 10 give 0.73 of exact search's ten nearest in 4 bits, 1,000 as many as 5,000),
its warm and cold tiers hold their vectors at half precision, and are turned to their
own precision once it has.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from calor.server.recall.columns import Batch, heats_and_states, needs_record
from calor.server.recall.vectors import APPROXIMATE_ABOVE, VectorIndex
from calor.server.thermo.lifecycle import Clocks
from calor.server.thermo.policy import ChannelPolicy

__all__ = [
    "COLD",
    "HOT",
    "HOT_HEAT",
    "RESCORED",
    "TIERS",
    "WARM",
    "TieredVectors",
    "WholeVectors",
    "tiers_for",
]

TIERS: tuple[tuple[str, str, str], ...] = (
    ("hot", "half", "half"),
    ("warm", "int8", "int8"),
    ("cold", "int8", "int4"),
)
"""Each tier's name, precision while searched exactly and precision in its graph, by its
code: a quarter of float32's memory for warm vectors, and an eighth for cold ones once
they are many. (An exact search decodes every vector: 4 bits cost half as much again as
8 to scan, 2.3 against 1.5 ms over 20,000; a graph visits a few hundred.)"""
RESCORED_PRECISIONS = frozenset({"int4"})
"""Precisions too coarse to rank by alone: their best hits are scored again whole."""
RESCORED = 32
"""How many of a coarse tier's best hits a search scores again from whole vectors (it
asks the tier for at least as many). The true ten nearest are among 4 bits' best 32 for
nearly every query (``bench/tiers.py``)."""
HOT, WARM, COLD = 0, 1, 2
HOT_HEAT = 0.5
"""Heat from which a memory is hot (an episodic memory for its first day); below the
channel's cold threshold it is cold, in between warm."""
SETTLED = 1_024
"""Vectors a channel is given before its bounds are trusted to train quantised tiers."""

_F32 = npt.NDArray[np.float32]
_I64 = npt.NDArray[np.int64]
_I8 = npt.NDArray[np.int8]
_NONE = -1

WholeVectors = Callable[[_I64], tuple[_F32, npt.NDArray[np.bool_]]]
"""Labels to their whole vectors (one row each) and which of them were found."""


def tiers_for(batch: Batch, policy: ChannelPolicy, clocks: Clocks) -> _I8:
    """The tier each memory's heat now calls for (a working memory, young by nature,
    is hot)."""
    heat, _ = heats_and_states(batch, policy, clocks)
    tiers = np.where(heat >= HOT_HEAT, HOT, np.where(heat >= policy.cold_threshold, WARM, COLD))
    tiers[needs_record(batch)] = HOT
    return tiers.astype(np.int8)


class TieredVectors:
    """Unit vectors by channel label, each in one tier; inner-product search across the
    tiers. Not thread-safe: the caller holds the channel's lock around every call."""

    def __init__(
        self,
        dim: int,
        approximate_above: int = APPROXIMATE_ABOVE,
        whole: WholeVectors | None = None,
    ) -> None:
        self.dim = dim
        self.approximate_above = approximate_above
        self.whole = whole
        """Where coarse tiers' hits are scored again from (None: they are not)."""
        self._tiers: list[VectorIndex | None] = [None] * len(TIERS)
        self._label_at: list[_I64] = [np.zeros(0, dtype=np.int64) for _ in TIERS]
        self._rows_used = [0] * len(TIERS)
        self._tier_of: _I8 = np.full(0, _NONE, dtype=np.int8)  # by label
        self._row_of: _I64 = np.zeros(0, dtype=np.int64)  # by label
        # Each dimension's least and greatest value among the vectors ever added, and how
        # many were: what a quantised tier's ranges are trained on, once there are enough.
        self._bounds: _F32 | None = None
        self._given = 0

    @property
    def approximate(self) -> bool:
        """Whether a tier searches through an HNSW graph."""
        return any(index.approximate for _, index in self.held())

    def held(self) -> list[tuple[int, VectorIndex]]:
        """The tiers in use: (code, index)."""
        return [(code, index) for code, index in enumerate(self._tiers) if index is not None]

    def tiers_of(self, labels: _I64) -> _I8:
        """The tier of each label (-1: not held)."""
        inside = labels < self._tier_of.shape[0]
        out = np.full(labels.shape, _NONE, dtype=np.int8)
        out[inside] = self._tier_of[labels[inside]]
        return out

    def labels_of(self, code: int, rows: _I64) -> _I64:
        """The channel labels of a tier's rows; -1 for -1, and for a row its label has
        left (removed, or moved to another tier or row)."""
        table = self._label_at[code]
        if table.shape[0] == 0:
            return np.full(rows.shape, _NONE, dtype=np.int64)
        labels = table[np.clip(rows, 0, table.shape[0] - 1)]
        known = (rows >= 0) & (rows < table.shape[0]) & (labels >= 0)
        safe = np.where(known, labels, 0)
        current = known & (self._tier_of[safe] == code) & (self._row_of[safe] == rows)
        return np.where(current, labels, _NONE)

    def rows_in(self, code: int, labels: _I64) -> _I64:
        """Each label's row in a tier, -1 if the tier does not hold it."""
        here = self.tiers_of(labels) == code
        return np.where(here, self._row_of[np.where(here, labels, 0)], -1)

    def add(self, labels: _I64, vectors: _F32, tiers: _I8) -> None:
        """Hold new vectors (labels not held, one row each) in the given tiers."""
        if labels.size == 0:
            return
        self._widen(vectors)
        self._given += labels.size
        self._settle()
        self._place(labels, vectors, tiers)

    def remove(self, label: int) -> None:
        """Stop finding a label."""
        if label >= self._tier_of.shape[0] or self._tier_of[label] == _NONE:
            return
        code = int(self._tier_of[label])
        self._tier(code).remove(int(self._row_of[label]))
        self._tier_of[label] = _NONE

    def move(self, labels: _I64, tiers: _I8, vectors: _F32) -> None:
        """Hold held labels in other tiers from now on, with ``vectors`` (whole, or read
        back from a finer tier)."""
        held = self.tiers_of(labels)
        for code in np.unique(held[held != _NONE]).tolist():
            chosen = labels[held == code]
            self._tier(code).remove_many(self._row_of[chosen])
            self._tier_of[chosen] = _NONE
        self._place(labels, vectors, tiers)

    def reconstruct(self, label: int) -> _F32:
        """The vector held under a label, as its tier holds it (whole, for a tier too
        coarse to compare by)."""
        return self.reconstruct_batch(np.array([label], dtype=np.int64)).reshape(-1)

    def reconstruct_batch(self, labels: _I64) -> _F32:
        """The vectors held under labels (all held), one row each, as their tiers hold
        them (whole, for a tier too coarse to compare by: a dream's near-duplicates are
        told apart by cosines 4 bits blur by up to 0.1)."""
        out = np.empty((labels.shape[0], self.dim), dtype=np.float32)
        for code, chosen in self._by_tier(labels):
            out[chosen] = self._tier(code).reconstruct_batch(self._row_of[labels[chosen]])
            if self._rescored(code):
                assert self.whole is not None
                whole, found = self.whole(labels[chosen])
                rows = np.flatnonzero(chosen)[found]
                out[rows] = whole[found]
        return out

    def similarities(self, query: _F32, labels: _I64) -> _F32:
        """The inner product of one query with the vector under each label (all held)."""
        out = np.empty(labels.shape[0], dtype=np.float32)
        for code, chosen in self._by_tier(labels):
            out[chosen] = self._tier(code).similarities(query, self._row_of[labels[chosen]])
            if self._rescored(code):
                out[chosen] = self._whole_similarities(
                    query.reshape(1, -1), labels[chosen], out[chosen]
                )
        return out

    def search(self, queries: _F32, k: int) -> tuple[_F32, _I64]:
        """The ``k`` nearest held vectors of each query row across the tiers:
        (similarities, labels), best first; label -1 pads."""
        found = []
        for code, index in self._searched():
            if not self._rescored(code):
                found.append((code, index.search(queries, k)))
                continue
            sims, rows = index.search(queries, max(k, RESCORED))
            found.append((code, (self._rescore(queries, code, sims, rows), rows)))
        return self._merged(found, queries.shape[0], k)

    def neighbours(self, queries: _F32, k: int) -> tuple[_F32, _I64]:
        """:meth:`search` for a few neighbours to link to (see
        :meth:`VectorIndex.neighbours`)."""
        found = [(c, index.neighbours(queries, k)) for c, index in self._searched()]
        return self._merged(found, queries.shape[0], k)

    def wants_graph(self) -> bool:
        """Whether a tier wants its graph built."""
        return any(index.wants_graph() for _, index in self.held())

    def wants_save(self) -> bool:
        """Whether a tier's graph grew enough since it was saved to be saved again."""
        return any(index.wants_save() for _, index in self.held())

    # --- inner workings ----------------------------------------------------------------

    def _by_tier(self, labels: _I64) -> list[tuple[int, npt.NDArray[np.bool_]]]:
        """Held labels grouped by tier: (code, which of them); KeyError for one not held."""
        codes = self.tiers_of(labels)
        if codes.size and (codes == codes[0]).all() and codes[0] != _NONE:
            return [(int(codes[0]), np.ones(codes.size, dtype=bool))]  # the common case
        if (codes == _NONE).any():
            raise KeyError(int(labels[codes == _NONE][0]))
        return [(code, codes == code) for code in np.unique(codes).tolist()]

    def _rescored(self, code: int) -> bool:
        """Whether a tier's hits are scored again from whole vectors."""
        index = self._tiers[code]
        return (
            self.whole is not None and index is not None and index.precision in RESCORED_PRECISIONS
        )

    def _rescore(self, queries: _F32, code: int, sims: _F32, rows: _I64) -> _F32:
        """A coarse tier's similarities with each query row's best :data:`RESCORED` hits
        scored again whole (no longer in order)."""
        out = sims.copy()
        labels = self.labels_of(code, rows[:, :RESCORED])
        held = labels >= 0
        which, column = np.nonzero(held)
        out[which, column] = self._whole_similarities(queries[which], labels[held], sims[held])
        return out

    def _whole_similarities(self, queries: _F32, labels: _I64, estimates: _F32) -> _F32:
        """The inner product of each label's whole vector with its query (one row each,
        or one for all); its estimate where the whole vector is not found."""
        assert self.whole is not None
        vectors, found = self.whole(labels)
        exact = np.einsum("ij,ij->i", vectors, np.broadcast_to(queries, vectors.shape))
        return np.where(found, exact, estimates).astype(np.float32)

    def _searched(self) -> list[tuple[int, VectorIndex]]:
        return [(code, index) for code, index in self.held() if index.live]

    def _merged(
        self, found: list[tuple[int, tuple[_F32, _I64]]], rows: int, k: int
    ) -> tuple[_F32, _I64]:
        """Each tier's results in channel labels, the best ``k`` of them per query row."""
        if not found:
            return np.empty((rows, 0), dtype=np.float32), np.empty((rows, 0), dtype=np.int64)
        parts = [(sims, self.labels_of(code, held)) for code, (sims, held) in found]
        if len(parts) == 1 and not self._rescored(found[0][0]):
            return parts[0]
        sims = np.concatenate([s for s, _ in parts], axis=1)
        labels = np.concatenate([lab for _, lab in parts], axis=1)
        ranked = np.where(labels >= 0, sims, -np.inf)
        order = np.argsort(-ranked, axis=1, kind="stable")[:, :k]
        labels = np.take_along_axis(labels, order, axis=1)
        sims = np.where(labels >= 0, np.take_along_axis(sims, order, axis=1), 0.0)
        return sims.astype(np.float32), labels

    def _tier(self, code: int) -> VectorIndex:
        index = self._tiers[code]
        if index is None:
            index = self._tiers[code] = self._new_tier(code)
        return index

    def _new_tier(self, code: int) -> VectorIndex:
        """An empty tier: at its precision, or at half until the bounds are settled."""
        _, precision, in_graph = TIERS[code]
        if precision == "half" or self._given < SETTLED:
            return VectorIndex(self.dim, self.approximate_above)
        return VectorIndex(self.dim, self.approximate_above, precision, self._bounds, in_graph)

    def _settle(self) -> None:
        """Once the bounds are settled, turn each tier held at half precision meanwhile
        to its own, its vectors (read back at half precision) kept in the same rows."""
        if self._given < SETTLED:
            return
        for code, index in enumerate(self._tiers):
            if index is None or index.quantised or TIERS[code][1] == "half":
                continue
            labels = np.flatnonzero(self._tier_of == code)
            rows = self._row_of[labels]
            settled = self._new_tier(code)
            settled.add(rows, index.reconstruct_batch(rows))
            self._tiers[code] = settled

    def _place(self, labels: _I64, vectors: _F32, tiers: _I8) -> None:
        self._grow(int(labels.max()) + 1)
        for code in np.unique(tiers).tolist():
            chosen = tiers == code
            self._put(code, labels[chosen], vectors[chosen])

    def _put(self, code: int, labels: _I64, vectors: _F32) -> None:
        start = self._rows_used[code]
        rows = np.arange(start, start + labels.shape[0], dtype=np.int64)
        table = self._label_at[code]
        if rows[-1] >= table.shape[0]:
            grown = np.full(max(int(rows[-1]) + 1, 2 * table.shape[0], 64), _NONE, np.int64)
            grown[: table.shape[0]] = table
            self._label_at[code] = table = grown
        self._tier(code).add(rows, np.ascontiguousarray(vectors, dtype=np.float32))
        table[rows] = labels
        self._rows_used[code] = start + labels.shape[0]
        self._tier_of[labels] = code
        self._row_of[labels] = rows

    def _widen(self, vectors: _F32) -> None:
        least, most = vectors.min(axis=0), vectors.max(axis=0)
        if self._bounds is None:
            self._bounds = np.stack([least, most]).astype(np.float32)
        else:
            np.minimum(self._bounds[0], least, out=self._bounds[0])
            np.maximum(self._bounds[1], most, out=self._bounds[1])

    def _grow(self, least: int) -> None:
        if least <= self._tier_of.shape[0]:
            return
        size = max(least, 2 * self._tier_of.shape[0], 64)
        tier_of = np.full(size, _NONE, dtype=np.int8)
        tier_of[: self._tier_of.shape[0]] = self._tier_of
        row_of = np.zeros(size, dtype=np.int64)
        row_of[: self._row_of.shape[0]] = self._row_of
        self._tier_of, self._row_of = tier_of, row_of
