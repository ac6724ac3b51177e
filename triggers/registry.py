"""Triggers at rest: rules, fire counters, firing history and decay markers in RocksDB
(their keys are named by :class:`calor.server.storage.store.Keys`).

A firing's counter, history and decay marker are written in the change of the action
itself (``count``, ``history``, ``decay_fired``, each returning bookkeeping writes),
and the counter is applied in memory only once that change is durable (``apply_count``).
A dropped channel's triggers go with it, history and all (``drop_writes``, ``dropped``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from calor.server.engine.changes import Changes, commit
from calor.server.storage.ops import DeleteKey, DeleteRange, PutKey
from calor.server.storage.store import Keys, MemoryStore
from calor.triggers.rules import TriggerRule

__all__ = ["Counter", "Firing", "TriggerRegistry"]


@dataclass(frozen=True)
class Firing:
    """One firing of a trigger: when, on which memory, with what outcome."""

    trigger_id: str
    memory_id: str
    at: float
    outcome: str
    seq: int
    late: bool = False


@dataclass(frozen=True)
class Counter:
    """How often a trigger has fired, and when it last did (for limits and cooldowns)."""

    fires: int = 0
    last_fired_at: float = 0.0


class TriggerRegistry:
    """Every trigger of the server, held in memory and written through to RocksDB."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._rules: dict[str, TriggerRule] = {}
        self._counters: dict[str, Counter] = {}
        self._history_seq = 0
        self._lock = threading.Lock()
        self._dropping: dict[str, list[str]] = {}  # channel -> trigger ids, until durable

    def load(self) -> None:
        """Read every trigger and its counter back from the store."""
        for value in self._store.trigger_rules():
            rule = TriggerRule.from_json(value)
            self._rules[rule.id] = rule
        for trigger_id, value in self._store.fire_counters():
            self._counters[trigger_id] = Counter(**json.loads(value))
        # History keys go on from the last one used, so that no firing after a restart
        # overwrites one from before.
        for trigger_id in self._rules:
            last = self._store.last_firing_order(trigger_id)
            self._history_seq = max(self._history_seq, last)

    def add(self, rule: TriggerRule) -> None:
        """Register a validated rule, durably."""
        self._write(PutKey(Keys.trigger(rule.id), rule.to_json()))
        with self._lock:
            self._rules[rule.id] = rule

    def remove(self, trigger_id: str) -> bool:
        """Delete a rule (its history stays readable); False if there was none."""
        with self._lock:
            if trigger_id not in self._rules:
                return False
        self._write(DeleteKey(Keys.trigger(trigger_id)))
        with self._lock:
            self._rules.pop(trigger_id, None)
        return True

    def drop_writes(self, channel: str) -> list[DeleteRange]:
        """The writes that delete a channel's triggers for good: rules, fire counters,
        history and decay marks (for the batch that drops the channel)."""
        ids = [rule.id for rule in self.rules(channel=channel)]
        with self._lock:
            self._dropping[channel] = ids
        return [DeleteRange(*span) for i in ids for span in Keys.trigger_ranges(i)]

    def dropped(self, channel: str) -> None:
        """The batch from :meth:`drop_writes` is durable: its triggers go from memory too."""
        with self._lock:
            for trigger_id in self._dropping.pop(channel, []):
                self._rules.pop(trigger_id, None)
                self._counters.pop(trigger_id, None)

    def get(self, trigger_id: str) -> TriggerRule | None:
        """One rule."""
        return self._rules.get(trigger_id)

    def rules(self, channel: str | None = None, event: str | None = None) -> list[TriggerRule]:
        """The rules of a channel (and event), oldest first."""
        with self._lock:
            found = [
                r
                for r in self._rules.values()
                if (channel is None or r.channel == channel) and (event is None or r.event == event)
            ]
        return sorted(found, key=lambda r: r.id)

    def fires(self, trigger_id: str) -> int:
        """How many times a trigger has fired."""
        counter = self._counters.get(trigger_id)
        return counter.fires if counter is not None else 0

    def can_fire(self, rule: TriggerRule, now: float) -> bool:
        """Whether ``max_fires`` and ``cooldown_seconds`` let the rule fire now."""
        counter = self._counters.get(rule.id, Counter())
        if rule.max_fires and counter.fires >= rule.max_fires:
            return False
        return not (counter.fires and now - counter.last_fired_at < rule.cooldown_seconds)

    def count(self, trigger_id: str, at: float) -> tuple[Counter, PutKey]:
        """One more firing of a trigger: the counter to :meth:`apply_count` once durable,
        and its write."""
        with self._lock:
            current = self._counters.get(trigger_id, Counter())
        counter = Counter(current.fires + 1, at)
        value = json.dumps(asdict(counter)).encode()
        return counter, PutKey(Keys.fire_counter(trigger_id), value)

    def apply_count(self, trigger_id: str, counter: Counter) -> None:
        """Make a counter written by :meth:`put_count` (and committed) the one in force."""
        with self._lock:
            self._counters[trigger_id] = counter

    def history_entry(self, firing: Firing) -> PutKey:
        """The write that adds a firing to its trigger's history."""
        with self._lock:
            self._history_seq += 1
            order = max(firing.seq, self._history_seq)
            self._history_seq = order
        return PutKey(Keys.firing(firing.trigger_id, order), json.dumps(asdict(firing)).encode())

    def decay_mark(self, trigger_id: str, memory_id: str, t0: float) -> PutKey:
        """The write noting that the trigger fired for this heat trajectory of the memory."""
        return PutKey(Keys.decay_mark(trigger_id, memory_id), repr(t0).encode())

    def history(self, trigger_id: str) -> Iterator[Firing]:
        """A trigger's firings, oldest first."""
        for value in self._store.firings(trigger_id):
            yield Firing(**json.loads(value))

    def decay_fired(self, trigger_id: str, memory_id: str, t0: float) -> bool:
        """Whether this trigger already fired for the memory's current heat trajectory."""
        value = self._store.get(Keys.decay_mark(trigger_id, memory_id))
        return value is not None and float(value) == t0

    def watermark(self) -> float:
        """The time up to which decay crossings were handled before (0 if never)."""
        value = self._store.get(Keys.WATERMARK)
        return float(value) if value is not None else 0.0

    def set_watermark(self, when: float) -> None:
        """Note that decay crossings up to ``when`` are handled."""
        self._write(PutKey(Keys.WATERMARK, repr(when).encode()))

    def _write(self, *writes: PutKey | DeleteKey) -> None:
        change = Changes("")
        change.keep(writes)
        commit(self._store, [change])
