"""A channel's records as its view holds them: every memory's stored state, counted per
state as the view changes (so metrics and ``ServerStatus`` count without scanning a
channel's memories), and the full records of the memories used most recently."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace

from calor.server.records import MemoryRecord
from calor.server.thermo.lifecycle import Clocks, evolve
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["RECORDS_CACHED", "RecordReader", "RecordTable", "states_now"]

RECORDS_CACHED = 4096
"""Full records a channel keeps in memory, the most recently used; the rest are read
from RocksDB when asked for."""


RecordReader = Callable[[str], MemoryRecord | None]
"""Where a :class:`RecordTable` reads a record it does not keep: one channel's record by
id as RocksDB holds it, or None."""


class RecordTable(Mapping[str, MemoryRecord]):
    """A channel's records by id, with how many are in each stored state (``by_state``).

    Every memory's id and stored state are held. Without a ``reader`` every full record
    is too; with one, only the ``cached`` (default :data:`RECORDS_CACHED`) most recently
    used, and the others are read from the store when asked for (the store holds what
    the view holds: a change is applied only once written). Records are replaced, never
    changed in place.
    """

    def __init__(
        self,
        records: Iterable[tuple[str, MemoryRecord]] = (),
        reader: RecordReader | None = None,
        cached: int | None = None,
    ) -> None:
        self.by_state: Counter[str] = Counter()
        self._states: dict[str, str] = {}
        self._full: OrderedDict[str, MemoryRecord] = OrderedDict()
        self._reader = reader
        self._cached = RECORDS_CACHED if cached is None else cached
        # Changes counted, so a record read from the store without the channel's lock is
        # kept only if nothing changed the table during the read: else it may be older
        # than what the change put in place (a forget, a heat), and would hide it.
        self._changes = 0
        self._changing = threading.Lock()
        for key, record in records:
            self[key] = record

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, memory_id: object) -> bool:
        return memory_id in self._states

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._states))  # a snapshot: the view may change meanwhile

    def __getitem__(self, memory_id: str) -> MemoryRecord:
        """A memory's record, read from the store if not kept."""
        record = self._full.get(memory_id)
        if record is not None:
            if self._reader is not None:
                with contextlib.suppress(KeyError):  # a reader without the lock raced a put
                    self._full.move_to_end(memory_id)
            return record
        if self._reader is None or memory_id not in self._states:
            raise KeyError(memory_id)
        changes = self._changes
        record = self._reader(memory_id)
        if record is None:
            raise KeyError(memory_id)
        with self._changing:
            if self._changes == changes:
                self._keep(memory_id, record)
        return record

    def state(self, memory_id: str) -> str | None:
        """A memory's stored state, without reading its record."""
        return self._states.get(memory_id)

    def ids_in(self, states: Iterable[str]) -> list[str]:
        """The ids of the memories whose stored state is one of ``states``, in the order
        they came."""
        wanted = frozenset(states)
        return [memory_id for memory_id, state in self._states.items() if state in wanted]

    def __setitem__(self, memory_id: str, record: MemoryRecord) -> None:
        with self._changing:
            self._changes += 1
            before = self._states.get(memory_id)
            if before is not None:
                self._uncount(before)
            self._states[memory_id] = record.state
            self.by_state[record.state] += 1
            self._keep(memory_id, record)

    def set_heats(self, heats: Mapping[str, float], at: float, interactions: int) -> None:
        """Memories whose heat alone changed (materialised at ``at``). A record read from
        the store carries it; one without a store to read from is replaced here."""
        with self._changing:
            self._changes += 1
            for memory_id, heat0 in heats.items():
                held = self._full.get(memory_id)
                if held is None:
                    continue
                if self._reader is not None:
                    del self._full[memory_id]
                else:
                    self._full[memory_id] = replace(
                        held, heat0=heat0, t0=at, interactions0=interactions, updated_at=at
                    )

    def clear(self) -> None:
        """Forget every memory (a dropped channel): nothing is read from the store again."""
        with self._changing:
            self._changes += 1
            self._states.clear()
            self._full.clear()
            self.by_state.clear()
            self._reader = None

    def _keep(self, memory_id: str, record: MemoryRecord) -> None:
        self._full[memory_id] = record
        if self._reader is not None:
            self._full.move_to_end(memory_id)
            while len(self._full) > self._cached:
                self._full.popitem(last=False)

    def _uncount(self, state: str) -> None:
        self.by_state[state] -= 1
        if self.by_state[state] <= 0:
            del self.by_state[state]


def states_now(
    records: RecordTable,
    schedule: list[tuple[float, str]],
    policy: ChannelPolicy,
    clocks: Clocks,
) -> dict[str, int]:
    """Memories per state as they stand at ``clocks``: the stored counts, corrected by
    the state changes whose moment has come but that no read has persisted yet.

    ``schedule`` is the channel's heap of (moment, id); only its due entries are read.
    """
    counts = Counter(records.by_state)
    for memory_id in _due(schedule, clocks.now):
        record = records.get(memory_id)
        if record is None:
            continue
        state = evolve(record, policy, clocks).state
        if state != record.state:
            counts[record.state] -= 1
            counts[state] += 1
    return {state: count for state, count in counts.items() if count > 0}


def _due(heap: list[tuple[float, str]], now: float) -> set[str]:
    """The ids of a heap's entries due by ``now``, visiting only those (a parent is never
    later than its children)."""
    due: set[str] = set()
    stack = [0]
    while stack:
        i = stack.pop()
        if i < len(heap) and heap[i][0] <= now:
            due.add(heap[i][1])
            stack.extend((2 * i + 1, 2 * i + 2))
    return due
