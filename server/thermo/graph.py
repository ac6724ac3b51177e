"""The memory graph of a channel: typed, weighted links between its memories.

Edges are undirected for spreading; each is kept in memory under both ends and in
RocksDB once (see ``store.py``). A pair may be linked by several kinds at once.
In memory the graph is packed (flat integer arrays per linked memory, not objects):
a channel holds several edges per memory.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt

__all__ = ["EDGE_KINDS", "UNMARKED", "Edge", "Graph", "Slots"]

Slots = npt.NDArray[np.int64]

UNMARKED = -2
"""The mark of a slot whose owner set none (see :meth:`Graph.marks_at`)."""

EDGE_KINDS = (
    "semantic",
    "entity",
    "sequence",
    "merged",
    "echo",
    "manual",
    "supersedes",
    "summary",
)


@dataclass(frozen=True)
class Edge:
    """A typed, weighted link between two memories of one channel."""

    from_id: str
    to_id: str
    kind: str
    weight: float


class Graph:
    """Adjacency of one channel's memories, packed: each linked memory has a slot, and a
    slot's links are two flat arrays (neighbour slot and kind in one integer; weight).

    A memory without links holds no slot. Each slot also carries a mark, an integer its
    owner may set (where the memory sits in the owner's indexes, say) so that a walk
    over slots reads it without looking the memory up by id; the mark is forgotten
    when the slot changes hands. Not thread-safe: the caller holds the channel's lock.
    """

    def __init__(self) -> None:
        self._slot_of: dict[str, int] = {}
        self._id_at: list[str] = []  # slot → memory id ("" while free)
        self._free: list[int] = []
        # slot → (neighbour slot << _KIND_BITS) | kind code, 32 bits: 2^28 slots
        self._ends: list[array[int]] = []
        self._weights: list[array[float]] = []  # slot → weight of each entry of _ends
        self._kind_names: list[str] = []
        self._kind_codes: dict[str, int] = {}
        self._marks = np.full(16, UNMARKED, dtype=np.int64)  # slot → its owner's mark

    def add(self, a: str, b: str, kind: str, weight: float) -> Edge:
        """Link two memories (a second link of the same kind keeps the larger weight)."""
        code = self._kind_code(kind)
        here, there = self._take_slot(a), self._take_slot(b)
        at = _find(self._ends[here], (there << _KIND_BITS) | code)
        if at >= 0:
            weight = max(weight, self._weights[here][at])
            self._weights[here][at] = weight
            if here != there:
                back = _find(self._ends[there], (here << _KIND_BITS) | code)
                self._weights[there][back] = weight
        else:
            self._append(here, there, code, weight)
        return Edge(self._id_at[here], self._id_at[there], kind, weight)

    def load(self, edges: Iterable[tuple[str, str, str, float]]) -> None:
        """Take in edges read back from the store, (a, b, kind, weight): each pair and
        kind at most once, and none of them held already (a view being built)."""
        for a, b, kind, weight in edges:
            self._append(self._take_slot(a), self._take_slot(b), self._kind_code(kind), weight)

    def remove(self, memory_id: str) -> list[Edge]:
        """Drop a memory and every edge touching it; returns the edges dropped."""
        here = self._slot_of.get(memory_id)
        if here is None:
            return []
        dropped = [Edge(memory_id, *link) for link in self._links(here)]
        for entry in self._ends[here]:
            there = entry >> _KIND_BITS
            if there != here:
                self._drop_entry(there, (here << _KIND_BITS) | (entry & _KIND_MASK))
        self._release(here)
        return dropped

    def unlink(self, a: str, b: str, kind: str) -> None:
        """Drop the edge of one kind between two memories, if there is one."""
        held = self._held(a, b, kind)
        if held is None:
            return
        here, there, code = held
        self._drop_entry(here, (there << _KIND_BITS) | code)
        if here != there:
            self._drop_entry(there, (here << _KIND_BITS) | code)

    def weight(self, a: str, b: str, kind: str) -> float | None:
        """The weight of the edge of one kind between two memories, or None."""
        held = self._held(a, b, kind)
        if held is None:
            return None
        here, there, code = held
        at = _find(self._ends[here], (there << _KIND_BITS) | code)
        return None if at < 0 else self._weights[here][at]

    def neighbours(self, memory_id: str) -> Iterable[str]:
        """The memories linked to this one."""
        here = self._slot_of.get(memory_id)
        if here is None:
            return ()
        return [self._id_at[slot] for slot in self._neighbour_slots(here)]

    # --- slots, for walks in bulk ------------------------------------------------------

    def slots(self, memory_ids: Iterable[str]) -> Slots:
        """The slot of each memory, -1 for a memory without links."""
        return np.array(list(map(self._slot_of.get, memory_ids, repeat(-1))), dtype=np.int64)

    def ids_at(self, slots: Slots) -> list[str]:
        """The memory held in each slot."""
        return list(map(self._id_at.__getitem__, slots.tolist()))

    def links_at(self, slots: Slots) -> tuple[Slots, Slots]:
        """The slots linked to the given held slots, all in one array (one linked by
        several kinds comes once per kind), and how many of them each given slot has."""
        picked = list(map(self._ends.__getitem__, slots.tolist()))
        linked = np.frombuffer(b"".join(picked), dtype=np.uint32) >> _KIND_BITS
        counts = np.fromiter(map(len, picked), dtype=np.int64, count=len(picked))
        return linked.astype(np.int64), counts

    # --- marks: an integer per slot that the graph's owner keeps ----------------------

    def marks_at(self, slots: Slots) -> Slots:
        """The mark of each given slot, a held one (``UNMARKED`` where none is set)."""
        return self._marks[slots]

    def mark(self, slots: Slots, marks: Slots) -> None:
        """Set the marks of held slots; each stays until its memory is unmarked (or
        leaves the graph)."""
        self._marks[slots] = marks

    def unmark(self, memory_id: str) -> None:
        """Forget the mark of a memory's slot, if it holds one."""
        slot = self._slot_of.get(memory_id)
        if slot is not None:
            self._marks[slot] = UNMARKED

    def edges(self, memory_id: str) -> list[Edge]:
        """Every edge of a memory, as seen from it, in a stable order."""
        here = self._slot_of.get(memory_id)
        if here is None:
            return []
        return [Edge(memory_id, *link) for link in sorted(self._links(here))]

    def kinds(self, a: str, b: str) -> frozenset[str]:
        """The kinds of the edges between two memories."""
        here, there = self._slot_of.get(a), self._slot_of.get(b)
        if here is None or there is None:
            return frozenset()
        return frozenset(
            self._kind_names[entry & _KIND_MASK]
            for entry in self._ends[here]
            if entry >> _KIND_BITS == there
        )

    # --- slots ---------------------------------------------------------------------

    def _links(self, here: int) -> Iterator[tuple[str, str, float]]:
        """A slot's links as (other memory, kind, weight), in the order they were made."""
        for entry, weight in zip(self._ends[here], self._weights[here], strict=True):
            yield self._id_at[entry >> _KIND_BITS], self._kind_names[entry & _KIND_MASK], weight

    def _neighbour_slots(self, here: int) -> list[int]:
        """A slot's neighbours, each once, in the order they were first linked."""
        return list(dict.fromkeys(entry >> _KIND_BITS for entry in self._ends[here]))

    def _kind_code(self, kind: str) -> int:
        code = self._kind_codes.get(kind)
        if code is None:
            if len(self._kind_names) > _KIND_MASK:
                raise ValueError(f"more than {_KIND_MASK + 1} edge kinds in one graph")
            code = self._kind_codes[kind] = len(self._kind_names)
            self._kind_names.append(sys.intern(kind))
        return code

    def _held(self, a: str, b: str, kind: str) -> tuple[int, int, int] | None:
        """The slots of two memories and the code of a kind, if all three are held."""
        here, there = self._slot_of.get(a), self._slot_of.get(b)
        code = self._kind_codes.get(kind)
        if here is None or there is None or code is None:
            return None
        return here, there, code

    def _append(self, here: int, there: int, code: int, weight: float) -> None:
        """A new link of one kind between two slots, kept at both ends."""
        self._ends[here].append((there << _KIND_BITS) | code)
        self._weights[here].append(weight)
        if here != there:
            self._ends[there].append((here << _KIND_BITS) | code)
            self._weights[there].append(weight)

    def _take_slot(self, memory_id: str) -> int:
        """The memory's slot, given one if it has none."""
        slot = self._slot_of.get(memory_id)
        if slot is not None:
            return slot
        memory_id = sys.intern(memory_id)  # one copy of each id (edges read from keys)
        if self._free:
            slot = self._free.pop()
            self._id_at[slot] = memory_id
        else:
            slot = len(self._id_at)
            self._id_at.append(memory_id)
            self._ends.append(array("I"))
            self._weights.append(array("d"))
            if slot == len(self._marks):
                grown = np.full(2 * slot, UNMARKED, dtype=np.int64)
                grown[:slot] = self._marks
                self._marks = grown
        self._marks[slot] = UNMARKED
        self._slot_of[memory_id] = slot
        return slot

    def _drop_entry(self, slot: int, entry: int) -> None:
        """Drop one entry of a slot's links; the slot is freed once it has none."""
        at = _find(self._ends[slot], entry)
        if at < 0:
            return
        del self._ends[slot][at]
        del self._weights[slot][at]
        if not self._ends[slot]:
            self._release(slot)

    def _release(self, slot: int) -> None:
        del self._slot_of[self._id_at[slot]]
        self._id_at[slot] = ""
        self._marks[slot] = UNMARKED
        self._ends[slot] = array("I")
        self._weights[slot] = array("d")
        self._free.append(slot)


_KIND_BITS = 4
_KIND_MASK = (1 << _KIND_BITS) - 1


def _find(entries: array[int], entry: int) -> int:
    """Where an entry sits in a slot's links, or -1."""
    try:
        return entries.index(entry)
    except ValueError:
        return -1
