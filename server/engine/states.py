"""How many of a channel's memories are in each state, kept as the view changes, so that
metrics and ``ServerStatus`` count without scanning a channel's memories."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from calor.server.records import MemoryRecord
from calor.server.thermo.lifecycle import Clocks, evolve
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["RecordTable", "states_now"]

_MISSING: Any = object()


class RecordTable(dict[str, MemoryRecord]):
    """A channel's records by id that counts them per stored state (``by_state``) as
    they are set and removed."""

    def __init__(self, records: Iterable[tuple[str, MemoryRecord]] = ()) -> None:
        super().__init__()
        self.by_state: Counter[str] = Counter()
        for key, record in records:
            self[key] = record

    def __setitem__(self, key: str, record: MemoryRecord) -> None:
        before = self.get(key)
        if before is not None:
            self._uncount(before)
        super().__setitem__(key, record)
        self.by_state[record.state] += 1

    def __delitem__(self, key: str) -> None:
        record = self[key]
        super().__delitem__(key)
        self._uncount(record)

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        if key in self:
            record = self[key]
            del self[key]
            return record
        if default is _MISSING:
            raise KeyError(key)
        return default

    def popitem(self) -> tuple[str, MemoryRecord]:
        key, record = super().popitem()
        self._uncount(record)
        return key, record

    def clear(self) -> None:
        super().clear()
        self.by_state.clear()

    def setdefault(self, key: str, default: MemoryRecord) -> MemoryRecord:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, record in dict(*args, **kwargs).items():
            self[key] = record

    def __ior__(self, other: Any) -> RecordTable:  # type: ignore[override,misc]
        self.update(other)
        return self

    def _uncount(self, record: MemoryRecord) -> None:
        self.by_state[record.state] -= 1
        if self.by_state[record.state] <= 0:
            del self.by_state[record.state]


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
