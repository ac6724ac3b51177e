"""The live, in-memory view of one channel, rebuilt from RocksDB: records, indexes, graph.

The view changes in one way only: :meth:`Channel.apply` takes a change list that is
already durable (see :mod:`calor.server.engine.changes`). Every method expects the caller to
hold ``lock``; nothing here reads or writes RocksDB.
"""

from __future__ import annotations

import bisect
import heapq
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from calor.models.entities import entity_key
from calor.server.clock import Clock
from calor.server.config import APPROXIMATE_ABOVE
from calor.server.engine.ingest import Neighbourhood
from calor.server.engine.rejections import Rejections
from calor.server.engine.results import Current
from calor.server.engine.states import RecordTable, states_now
from calor.server.recall.columns import Batch
from calor.server.recall.index import ChannelIndex, WholeByIds
from calor.server.recall.tiers import COLD as COLD_TIER
from calor.server.recall.tiers import HOT as HOT_TIER
from calor.server.recall.tiers import tiers_for
from calor.server.records import ACTIVE, ARCHIVED, COLD, DELETED, MERGED, MemoryRecord
from calor.server.storage.ops import (
    AddMemory,
    ChangeList,
    Forget,
    Link,
    OpenConflict,
    Operation,
    PutKey,
    PutMemory,
    SetHeat,
    SetPolicy,
    SetState,
    SettleConflict,
    Unlink,
)
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.graph import UNMARKED, Graph, Slots
from calor.server.thermo.lifecycle import Clocks, current_heat, evolve, next_change_at
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["Channel", "conflict_pair"]

_LIVE = frozenset({ACTIVE, COLD})
# Memories in these states name their entities no more: nothing links to them.
_UNNAMED = frozenset({DELETED, MERGED})
# How many change lists back the channel remembers which memories each one touched.
_TOUCHED_KEPT = 512
# How many scheduled moments per memory (most of them outdated by later changes) the
# schedule may hold before it is rebuilt from the records.
_STALE_SCHEDULE = 2


def _ids_of(op: PutMemory | Forget | SetHeat) -> tuple[str, ...]:
    """The memories a change to memories touches."""
    return op.memory_ids if isinstance(op, SetHeat) else (op.record.id,)


def conflict_pair(a: str, b: str) -> tuple[str, str]:
    """The order-free name of a conflict between two memories."""
    return (a, b) if a < b else (b, a)


@dataclass
class Channel:
    """One channel's memories as the engine serves them, with its settings and clocks.

    ``index`` holds the live (ACTIVE and COLD) memories, ``attic`` the ARCHIVED ones
    (searched only with ``include_archived``); ghosts, merged and forgotten memories
    are in neither. ``schedule`` is a heap of the moments a memory's state changes by
    itself, so those changes are persisted when due without scanning the channel;
    ``cold_since_sweep`` counts the memories that turned COLD since the last
    consolidation sweep. ``revision`` counts the change lists applied (what is derived
    from the view is current while it holds); ``arrivals`` counts those that may bring a
    memory into a Context block that did not show it (a store, a re-embedded text, a
    memory back in the live index, new settings): a reused block is stale once it moves.
    :meth:`touched_since` names the memories the latest change lists touched.
    ``on_due`` hears of each moment that becomes the earliest of ``schedule``, and
    ``on_large`` of an index that grew past ``approximate_above`` memories (see
    :mod:`calor.server.engine.graphs`).
    ``dropped`` is set once the channel is dropped: the view takes no more changes.
    """

    name: str
    dim: int
    policy: ChannelPolicy
    clock: Clock
    records: RecordTable = field(default_factory=RecordTable)
    lock: threading.RLock = field(default_factory=threading.RLock)
    dream_lock: threading.Lock = field(default_factory=threading.Lock)
    graph: Graph = field(default_factory=Graph)
    state: ChannelState = field(default_factory=ChannelState)
    entity_members: dict[str, list[str]] = field(default_factory=dict)
    last_in_session: dict[str, tuple[str, float]] = field(default_factory=dict)
    schedule: list[tuple[float, str]] = field(default_factory=list)
    cold_since_sweep: int = 0
    revision: int = 0
    arrivals: int = 0
    conflicts: dict[tuple[str, str], str] = field(default_factory=dict)
    dropped: bool = False
    dreaming: bool = False
    """A dream the curator's schedule asked for is under way."""
    on_due: Callable[[float, str], None] | None = None
    on_large: Callable[[Channel], None] | None = None
    whole_vectors: WholeByIds | None = None
    """Memories' embeddings as the store keeps them, whole (a vector tier holds them
    coarser), and which were found; given when the view is made."""
    approximate_above: int = APPROXIMATE_ABOVE
    _ids: list[str] = field(default_factory=list)
    _touched: deque[tuple[str, ...]] = field(default_factory=lambda: deque(maxlen=_TOUCHED_KEPT))

    def __post_init__(self) -> None:
        self.index, self.attic = self._new_indexes()
        self.rejections = Rejections(self.name)
        self._schedule_set_at = self.clock.now()  # the curator's, when it never dreamt

    # --- reading -----------------------------------------------------------------

    def clocks(self) -> Clocks:
        """Now, on both of the channel's clocks (wall time and interactions)."""
        return Clocks(self.clock.now(), self.state.interactions)

    def evolved(self, record: MemoryRecord, clocks: Clocks | None = None) -> MemoryRecord:
        """A record as it stands now (promotion and state transitions applied)."""
        return evolve(record, self.policy, clocks or self.clocks())

    def heat(self, record: MemoryRecord, clocks: Clocks | None = None) -> float:
        """A memory's heat now."""
        clocks = clocks or self.clocks()
        return current_heat(evolve(record, self.policy, clocks), self.policy, clocks)

    def current(self, record: MemoryRecord, clocks: Clocks | None = None) -> Current:
        """A memory as it stands now, with its heat: what a reply shows."""
        clocks = clocks or self.clocks()
        evolved = evolve(record, self.policy, clocks)
        return Current(evolved.copy(), current_heat(evolved, self.policy, clocks))

    def states(self) -> dict[str, int]:
        """How many memories are in each state now, from the counts the view keeps (no
        scan of the channel)."""
        return states_now(self.records, self.schedule, self.policy, self.clocks())

    def dream_due_at(self) -> float:
        """When the curator's schedule dreams next: ``dreams.interval_seconds`` after the
        last dream (or after the schedule was set, for a channel that never dreamt);
        ``math.inf`` while the schedule is off."""
        interval = self.policy.dreams.interval_seconds
        if interval <= 0.0:
            return math.inf
        return (self.state.last_dream_at or self._schedule_set_at) + interval

    def note_dream(self) -> None:
        """Tell the due timer when the curator's schedule dreams next (if it is on)."""
        due = self.dream_due_at()
        if due != math.inf and not self.dreaming and self.on_due is not None:
            self.on_due(due, self.name)

    def knows_entity(self, key: str) -> bool:
        """Whether a memory of the channel names the entity of this `entity_key` (so a word
        that only opens a sentence counts as its name)."""
        return bool(self.entity_members.get(key))

    def neighbourhood(self) -> Neighbourhood:
        """What a store links new memories against (read, never written, by ingest)."""
        return Neighbourhood(
            self.index, self.records, self.entity_members, self.last_in_session, self.rejections
        )

    def conflicts_of(self, memory_id: str) -> list[tuple[str, str]]:
        """The open conflicts a memory is part of."""
        return [pair for pair in self.conflicts if memory_id in pair]

    def places(self, slots: Slots) -> Slots:
        """Where the memories in the given graph slots are indexed: ``label << 1`` in the
        live index, ``label << 1 | 1`` in the attic, -1 in neither. Kept as the slots'
        marks, so a walk over the graph (resonance) finds a memory's columns without
        looking it up by id; a memory entering or leaving an index clears its mark."""
        graph = self.graph
        marks = graph.marks_at(slots)
        unknown = np.flatnonzero(marks == UNMARKED)
        if unknown.size:
            ids = graph.ids_at(slots[unknown])
            live, attic = self.index.labels(ids), self.attic.labels(ids)
            found = np.where(live >= 0, live << 1, np.where(attic >= 0, attic << 1 | 1, -1))
            graph.mark(slots[unknown], found)
            marks[unknown] = found
        return marks

    def needs_vector(self, record: MemoryRecord) -> bool:
        """Whether a changed record enters an index that holds no embedding of it yet."""
        if record.id in self.index or record.id in self.attic:
            return False  # held already: a move between indexes brings its own vector
        return self._index_for(record) is not None

    def touched_since(self, revision: int) -> set[str] | None:
        """The ids of the memories put, added or forgotten by the change lists applied
        after ``revision``; None when that is further back than the channel remembers."""
        behind = self.revision - revision
        if behind < 0 or behind > len(self._touched):
            return None
        touched: set[str] = set()
        for ids in list(self._touched)[len(self._touched) - behind :]:
            touched.update(ids)
        return touched

    def ids_after(self, after_id: str) -> Iterator[str]:
        """Memory ids in order, starting after ``after_id``."""
        start = bisect.bisect_right(self._ids, after_id) if after_id else 0
        yield from self._ids[start:]

    # --- building from the store -------------------------------------------------

    def remember(self, record: MemoryRecord) -> None:
        """Take a record read back from RocksDB (in id order) into the view."""
        self.records[record.id] = record
        self._ids.append(record.id)
        self._name_entities(record, None)
        if record.session:
            self.last_in_session[record.session] = (record.id, record.created_at)

    def link_all(self, edges: Iterable[tuple[str, str, str, float]]) -> None:
        """Take in the stored edges, (a, b, kind, weight), each once."""
        self.graph.load(edges)

    def index_all(
        self, entries: Sequence[tuple[MemoryRecord, np.ndarray]], *, noting: bool = True
    ) -> None:
        """Index stored memories with their embeddings, each where its state puts it;
        ``noting=False`` while more are coming (then :meth:`note_size` once)."""
        for record, _ in entries:
            self._schedule(record)
        self._index_new(list(entries))
        if noting:
            self.note_size()

    # --- the one way the view changes --------------------------------------------

    def apply(self, change: ChangeList, replaced: Mapping[str, MemoryRecord] | None = None) -> None:
        """Apply a change list that is durable already to the view. ``replaced``: the
        records its puts and forgets replace, as they were before it was written (the
        table may read records it does not keep from the store, which holds the new
        ones by now); without it they are read from the table."""
        before = dict(replaced or {})
        for op in change.ops:  # the channel's clocks first: indexing reads them
            if isinstance(op, SetState):
                if op.state.sweeps > self.state.sweeps:
                    self.cold_since_sweep = 0  # a sweep was counted: cold ones count anew
                dreamt = op.state.last_dream_at != self.state.last_dream_at
                self.state = op.state
                if dreamt:
                    self.note_dream()
        new: list[tuple[MemoryRecord, np.ndarray]] = []  # indexed together, at the end
        touched: list[str] = []
        for op in change.ops:
            if isinstance(op, AddMemory):
                touched.append(op.record.id)
                self._add(op.record)
                new.append((op.record, op.vector))
                self.arrivals += 1
            elif isinstance(op, PutMemory | Forget | SetHeat):
                if any(r.id in _ids_of(op) for r, _ in new):
                    self._index_new(new)
                    new = []
                touched.extend(_ids_of(op))
                self._change_memory(op, before)
            else:
                if isinstance(op, SetPolicy):
                    self.arrivals += 1
                self._apply_to_channel(op)
        self._index_new(new)
        self._touched.append(tuple(touched))
        self._note_owed_sweep()
        self.note_size()
        self.revision += 1

    def _change_memory(
        self, op: PutMemory | Forget | SetHeat, before: dict[str, MemoryRecord]
    ) -> None:
        if isinstance(op, SetHeat):
            self._set_heats(op)
            return
        replacing = before.pop(op.record.id, None) or self.records.get(op.record.id)
        if isinstance(op, PutMemory):
            arriving = op.vector is not None or op.record.id not in self.index
            self._put(op.record, op.vector, replacing)
            if arriving and op.record.id in self.index:
                self.arrivals += 1  # a new text, or back from the attic or a merge
        else:
            self._forget(op.record, replacing)

    def note_size(self) -> None:
        """An index grew past exact search (or holds too many tombstones), or its graph
        grew much since it was saved: ask for a graph built, or saved again."""
        if self.on_large is None:
            return
        if any(
            index.vectors.wants_graph() or index.vectors.wants_save()
            for index in (self.index, self.attic)
        ):
            self.on_large(self)

    def _note_owed_sweep(self) -> None:
        """Enough memories turned (or arrived) cold for a sweep: it is due now."""
        if self.cold_since_sweep >= self.policy.cold_count_trigger and self.on_due is not None:
            self.on_due(self.clock.now(), self.name)

    def drop(self) -> None:
        """Empty the view of a channel that was dropped: whoever still holds it reads an
        empty channel, and it takes no more changes (see ``changes.commit``)."""
        self.dropped = True
        self.records.clear()
        self._ids.clear()
        self.graph = Graph()
        self.index, self.attic = self._new_indexes()
        self.rejections = Rejections(self.name)
        self.entity_members.clear()
        self.last_in_session.clear()
        self.schedule.clear()
        self.conflicts.clear()
        self.cold_since_sweep = 0
        self._touched.clear()  # nothing derived from before says what changed since
        self.revision += 1
        self.arrivals += 1

    def _new_indexes(self) -> tuple[ChannelIndex, ChannelIndex]:
        """An empty live index and attic, each telling the graph of the memories that
        move in or out (see :meth:`places`). They hold the graph, not the view: the
        registry tells a view nobody holds by its reference count."""
        # The store's reader itself, never a method of the view: an index holding the view
        # would keep it alive (the registry unloads a view nobody holds, by its count).
        moved, whole = self.graph.unmark, self.whole_vectors
        return (
            ChannelIndex(self.dim, self.approximate_above, moved, HOT_TIER, whole),
            ChannelIndex(self.dim, self.approximate_above, moved, COLD_TIER, whole),
        )

    def _whole(self, memory_ids: list[str]) -> tuple[np.ndarray, npt.NDArray[np.bool_]]:
        """Memories' whole embeddings from the store (none found without one)."""
        if self.whole_vectors is None:
            none = len(memory_ids)
            return np.zeros((none, self.dim), np.float32), np.zeros(none, bool)
        return self.whole_vectors(memory_ids)

    def _placing(self, target: ChannelIndex) -> Callable[[Batch], np.ndarray] | None:
        """How memories arriving in an index find their vector tier: in the live index by
        their heat; in the attic, all cold."""
        return self._tiers_for if target is self.index else None

    def _tiers_for(self, batch: Batch) -> np.ndarray:
        """The vector tier each of a batch of live memories belongs in, by its heat now."""
        return tiers_for(batch, self.policy, self.clocks())

    def retier(self) -> int:
        """Move each live memory to the vector tier its heat now calls for (in dreams and
        sweeps, never on the recall path: DESIGN §5); one moving to a finer tier takes
        its embedding whole from the store. How many moved."""
        ids, labels = self.index.members()
        if labels.size == 0:
            return 0
        vectors = self.index.vectors
        wanted = self._tiers_for(self.index.columns.batch(labels))
        held = vectors.tiers_of(labels)
        moving = np.flatnonzero(wanted != held)
        if moving.size == 0:
            return 0
        chosen = labels[moving]
        # Each vector read once: whole for a move to a finer tier, as held for the rest.
        finer = np.flatnonzero(wanted[moving] < held[moving])
        whole, found = self._whole([ids[row] for row in moving[finer].tolist()])
        from_store = finer[found]
        as_held = np.setdiff1d(np.arange(chosen.size), from_store)
        matrix = np.empty((chosen.size, self.dim), dtype=np.float32)
        matrix[from_store] = whole[found]
        if as_held.size:
            matrix[as_held] = vectors.reconstruct_batch(chosen[as_held])
        vectors.move(chosen, wanted[moving], matrix)
        return int(moving.size)

    def _apply_to_channel(self, op: Operation) -> None:
        match op:
            case Link(a, b, kind, weight):
                self.graph.add(a, b, kind, weight)
            case Unlink(a, b, kind):
                self.graph.unlink(a, b, kind)
            case OpenConflict(a, b, reason):
                self.conflicts[conflict_pair(a, b)] = reason
            case SettleConflict(a, b):
                self.conflicts.pop(conflict_pair(a, b), None)
            case SetPolicy(policy):
                if policy.dreams.interval_seconds != self.policy.dreams.interval_seconds:
                    self._schedule_set_at = self.clock.now()
                self.policy = policy
                self._reschedule()
                self.note_dream()
            case PutKey():
                self.rejections.take(op)  # the others are other components' bookkeeping
            case _:
                pass  # state (taken first), the log, other components' bookkeeping

    def _add(self, record: MemoryRecord) -> None:
        if record.state in (COLD, ARCHIVED):
            self.cold_since_sweep += 1  # imported cold, with its state
        self.records[record.id] = record
        self._insert_id(record.id)
        self._name_entities(record, None)
        if record.session:
            self.last_in_session[record.session] = (record.id, record.created_at)
        self._schedule(record)

    def _put(
        self, record: MemoryRecord, vector: np.ndarray | None, before: MemoryRecord | None
    ) -> None:
        self.records[record.id] = record
        self._name_entities(record, before)
        target = self._index_for(record)
        for index in (self.index, self.attic):
            if index is not target and record.id in index:
                vector = vector if vector is not None else self._vector_of(record.id, index)
                index.remove(record.id)
        if target is not None and vector is not None:
            target.add([record], vector.reshape(1, -1), self._placing(target))
        elif target is not None:
            target.refresh(record)
        self._schedule(record)

    def _vector_of(self, memory_id: str, index: ChannelIndex) -> np.ndarray | None:
        """A memory's embedding to index elsewhere: whole from the store, else as the
        index holds it."""
        whole, found = self._whole([memory_id])
        return whole[0] if found[0] else index.vector(memory_id)

    def _set_heats(self, op: SetHeat) -> None:
        """Heat alone changed: the records and the columns take it. It only rose, on
        memories that stay ACTIVE, so no scheduled moment comes sooner (the ones held
        fall due first and are moved on then)."""
        self.records.set_heats(
            dict(zip(op.memory_ids, op.heat0, strict=True)), op.at, op.interactions
        )
        heats = np.asarray(op.heat0, dtype=np.float64)
        for index in (self.index, self.attic):
            labels = index.labels(list(op.memory_ids))
            held = labels >= 0
            if held.any():
                index.columns.set_heats(labels[held], heats[held], op.at, op.interactions)

    def _forget(self, tombstone: MemoryRecord, before: MemoryRecord | None) -> None:
        self.records[tombstone.id] = tombstone
        self._name_entities(tombstone, before)
        self.index.remove(tombstone.id)
        self.attic.remove(tombstone.id)
        self.graph.remove(tombstone.id)

    def _index_new(self, entries: list[tuple[MemoryRecord, np.ndarray]]) -> None:
        groups: dict[int, list[tuple[MemoryRecord, np.ndarray]]] = {}
        for record, vector in entries:
            target = self._index_for(record)
            if target is not None:
                groups.setdefault(id(target), []).append((record, vector))
        for target in (self.index, self.attic):
            group = groups.get(id(target))
            if group:
                records = [r for r, _ in group]
                target.add(records, np.stack([v for _, v in group]), self._placing(target))

    def _index_for(self, record: MemoryRecord) -> ChannelIndex | None:
        state = evolve(record, self.policy, self.clocks()).state
        return self.index if state in _LIVE else self.attic if state == ARCHIVED else None

    def _name_entities(self, record: MemoryRecord, before: MemoryRecord | None) -> None:
        """Entity membership: a memory is listed under each entity it names, unless merged
        or forgotten (``before``: the record it replaces, if any)."""
        named = record.state not in _UNNAMED
        was_named = before is not None and before.state not in _UNNAMED
        if before is not None and named == was_named and before.entities == record.entities:
            return  # the common change (heat, counts, tags): membership stays as it is
        keep = {entity_key(e) for e in record.entities} if named else set()
        held = {entity_key(e) for e in before.entities} if was_named and before else set()
        for key in held - keep:
            members = self.entity_members.get(key, [])
            if record.id in members:
                members.remove(record.id)
        for key in dict.fromkeys(entity_key(e) for e in record.entities):
            if key in keep and key not in held:
                self.entity_members.setdefault(key, []).append(record.id)

    def _insert_id(self, memory_id: str) -> None:
        if not self._ids or self._ids[-1] < memory_id:
            self._ids.append(memory_id)
        else:
            bisect.insort(self._ids, memory_id)

    # --- scheduled state changes -------------------------------------------------

    def _schedule(self, record: MemoryRecord) -> None:
        moment = next_change_at(record, self.policy)
        if moment != math.inf:
            earliest = not self.schedule or moment < self.schedule[0][0]
            heapq.heappush(self.schedule, (moment, record.id))
            if earliest and self.on_due is not None:
                self.on_due(moment, self.name)
            if len(self.schedule) > _STALE_SCHEDULE * len(self.records) + 1024:
                self._reschedule()  # each change adds a moment: drop the outdated ones

    def _reschedule(self) -> None:
        """Recompute every scheduled moment (after the channel's policy changed, or when
        outdated moments pile up).

        Ranking always reads the evolved state, so results are right at once; the
        indexes catch up as the rescheduled changes fall due.
        """
        policy = self.policy
        moments = ((next_change_at(record, policy), record.id) for record in self.records.values())
        self.schedule = [(moment, memory_id) for moment, memory_id in moments if moment != math.inf]
        heapq.heapify(self.schedule)
        if self.schedule and self.on_due is not None:
            self.on_due(self.schedule[0][0], self.name)

    def due_transitions(self) -> list[MemoryRecord]:
        """Records whose state changed by itself since last asked (to persist)."""
        clocks = self.clocks()
        changed: dict[str, MemoryRecord] = {}
        while self.schedule and self.schedule[0][0] <= clocks.now:
            _, memory_id = heapq.heappop(self.schedule)
            record = self.records.get(memory_id)
            if record is None:
                continue
            evolved = evolve(record, self.policy, clocks)
            if evolved is not record:
                changed[memory_id] = evolved
                if evolved.state in (COLD, ARCHIVED) and record.state == ACTIVE:
                    self.cold_since_sweep += 1  # turned cold, or arrived long cold
            elif next_change_at(record, self.policy) > clocks.now:
                self._schedule(record)
        return list(changed.values())
