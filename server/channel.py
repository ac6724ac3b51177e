"""The live, in-memory view of one channel, rebuilt from RocksDB: records, indexes, graph.

Every method expects the caller to hold ``lock``. The engine writes to RocksDB first
and then tells the channel what changed; nothing here writes to disk.
"""

from __future__ import annotations

import bisect
import heapq
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from calor.models.entities import entity_key
from calor.server.channel_state import ChannelState
from calor.server.graph import Graph
from calor.server.index import ChannelIndex
from calor.server.ingest import Ingested, Neighbourhood
from calor.server.lifecycle import Clocks, evolve, next_change_at
from calor.server.policy import ChannelPolicy
from calor.server.records import ACTIVE, ARCHIVED, COLD, MemoryRecord
from calor.server.store import MemoryStore

__all__ = ["Channel"]

_LIVE = frozenset({ACTIVE, COLD})


@dataclass
class Channel:
    """One channel's memories as the engine serves them.

    ``index`` holds the live (ACTIVE and COLD) memories, ``attic`` the ARCHIVED ones
    (searched only with ``include_archived``); ghosts, merged and forgotten memories
    are in neither. ``changes`` is a heap of the moments a memory's state changes by
    itself, so those changes are persisted when due without scanning the channel;
    ``cold_since_sweep`` counts the memories that turned COLD since the last
    consolidation sweep.
    """

    name: str
    dim: int
    records: dict[str, MemoryRecord] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    dream_lock: threading.Lock = field(default_factory=threading.Lock)
    graph: Graph = field(default_factory=Graph)
    state: ChannelState = field(default_factory=ChannelState)
    entity_members: dict[str, list[str]] = field(default_factory=dict)
    last_in_session: dict[str, tuple[str, float]] = field(default_factory=dict)
    changes: list[tuple[float, str]] = field(default_factory=list)
    cold_since_sweep: int = 0
    conflicts: dict[tuple[str, str], str] = field(default_factory=dict)
    _ids: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.index = ChannelIndex(self.dim)
        self.attic = ChannelIndex(self.dim)

    # --- building ----------------------------------------------------------------

    def remember(self, record: MemoryRecord) -> None:
        """Take a record read back from RocksDB (in id order) into the view."""
        self.records[record.id] = record
        self._ids.append(record.id)
        for entity in record.entities:
            self.entity_members.setdefault(entity_key(entity), []).append(record.id)
        if record.session:
            self.last_in_session[record.session] = (record.id, record.created_at)

    def index_all(
        self,
        entries: Sequence[tuple[MemoryRecord, np.ndarray]],
        policy: ChannelPolicy,
        clocks: Clocks,
    ) -> None:
        """Index stored memories with their embeddings, each where its state puts it."""
        live: list[tuple[MemoryRecord, np.ndarray]] = []
        archived: list[tuple[MemoryRecord, np.ndarray]] = []
        for record, vector in entries:
            state = evolve(record, policy, clocks).state
            if state in _LIVE:
                live.append((record, vector))
            elif state == ARCHIVED:
                archived.append((record, vector))
            self._schedule(record, policy)
        for target, group in ((self.index, live), (self.attic, archived)):
            if group:
                target.add([(r.id, r.text) for r, _ in group], np.stack([v for _, v in group]))

    def neighbourhood(self) -> Neighbourhood:
        """What a store links new memories against."""
        return Neighbourhood(self.index, self.records, self.entity_members, self.last_in_session)

    # --- changes -----------------------------------------------------------------

    def admit(self, ingested: Sequence[Ingested], policy: ChannelPolicy, clocks: Clocks) -> None:
        """Take newly stored memories into the view (they are already durable)."""
        live: list[Ingested] = []
        archived: list[Ingested] = []
        for entry in ingested:
            record = entry.record
            self.records[record.id] = record
            self._insert_id(record.id)
            state = evolve(record, policy, clocks).state
            (live if state in _LIVE else archived if state == ARCHIVED else []).append(entry)
            for edge in entry.edges:
                self.graph.add(edge.from_id, edge.to_id, edge.kind, edge.weight)
            self._schedule(record, policy)
        for target, group in ((self.index, live), (self.attic, archived)):
            if group:
                target.add(
                    [(e.record.id, e.record.text) for e in group],
                    np.stack([e.vector for e in group]),
                )

    def replace(
        self,
        record: MemoryRecord,
        policy: ChannelPolicy,
        clocks: Clocks,
        store: MemoryStore,
        vector: np.ndarray | None = None,
    ) -> None:
        """Swap in a changed record and move it to the index its state calls for."""
        self.records[record.id] = record
        state = evolve(record, policy, clocks).state
        target = self.index if state in _LIVE else self.attic if state == ARCHIVED else None
        for index in (self.index, self.attic):
            if index is not target and record.id in index:
                vector = vector if vector is not None else index.vector(record.id)
                index.remove(record.id)
        if target is not None and (record.id not in target or vector is not None):
            if vector is None:
                vector = store.get_vector(record.channel, record.id)
            if vector is not None:
                target.add([(record.id, record.text)], vector.reshape(1, -1))
        self._schedule(record, policy)

    def forget(self, tombstone: MemoryRecord) -> None:
        """Swap in a tombstone: out of every index, the graph and its conflicts."""
        self.records[tombstone.id] = tombstone
        self.index.remove(tombstone.id)
        self.attic.remove(tombstone.id)
        self.graph.remove(tombstone.id)

    def conflicts_of(self, memory_id: str) -> list[tuple[str, str]]:
        """The open conflicts a memory is part of."""
        return [pair for pair in self.conflicts if memory_id in pair]

    # --- scheduled state changes -------------------------------------------------

    def _schedule(self, record: MemoryRecord, policy: ChannelPolicy) -> None:
        moment = next_change_at(record, policy)
        if moment != math.inf:
            heapq.heappush(self.changes, (moment, record.id))

    def due_transitions(self, policy: ChannelPolicy, clocks: Clocks) -> list[MemoryRecord]:
        """Records whose state changed by itself since last asked (to persist)."""
        changed: dict[str, MemoryRecord] = {}
        while self.changes and self.changes[0][0] <= clocks.now:
            _, memory_id = heapq.heappop(self.changes)
            record = self.records.get(memory_id)
            if record is None:
                continue
            evolved = evolve(record, policy, clocks)
            if evolved is not record:
                changed[memory_id] = evolved
                if evolved.state == COLD and record.state == ACTIVE:
                    self.cold_since_sweep += 1
            elif next_change_at(record, policy) > clocks.now:
                self._schedule(record, policy)
        return list(changed.values())

    def reschedule(self, policy: ChannelPolicy) -> None:
        """Recompute every scheduled moment (after the channel's policy changed).

        Ranking always reads the evolved state, so results are right at once; the
        indexes catch up as the rescheduled changes fall due.
        """
        self.changes = []
        for record in self.records.values():
            self._schedule(record, policy)

    # --- listing -----------------------------------------------------------------

    def _insert_id(self, memory_id: str) -> None:
        if not self._ids or self._ids[-1] < memory_id:
            self._ids.append(memory_id)
        else:
            bisect.insort(self._ids, memory_id)

    def ids_after(self, after_id: str) -> Iterator[str]:
        """Memory ids in order, starting after ``after_id``."""
        start = bisect.bisect_right(self._ids, after_id) if after_id else 0
        yield from self._ids[start:]
