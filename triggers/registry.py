"""Triggers at rest: rules, fire counters, firing history and decay markers in RocksDB
(their keys are named by :class:`calor.server.storage.store.Keys`).

A firing's counter, history and decay marker are written in the change of the action
itself (``count``, ``history``, ``decay_fired``, each returning bookkeeping writes),
and the counter is applied in memory only once that change is durable (``apply_count``).
A dropped channel's triggers go with it, history and all (``drop_writes``, ``dropped``).
A trigger id is its channel's own, so a trigger is found by (channel, id), in memory and
in its keys alike.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

from calor.server.engine.changes import Changes, commit
from calor.server.storage.ops import DeleteKey, DeleteRange, PutKey
from calor.server.storage.store import Keys, MemoryStore
from calor.triggers.feedback import Rating
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
    """Every trigger of the server, held in memory and written through to RocksDB.

    A trigger id is its channel's own: two channels may each have a trigger of the same
    id, so a trigger is found by its channel and id.
    """

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._rules: dict[tuple[str, str], TriggerRule] = {}
        self._counters: dict[tuple[str, str], Counter] = {}
        self._history_seq = 0
        self._lock = threading.Lock()
        self._dropping: dict[str, list[str]] = {}  # channel -> trigger ids, until durable

    def load(self) -> None:
        """Read every trigger and its counter back from the store."""
        for value in self._store.trigger_rules():
            rule = TriggerRule.from_json(value)
            self._rules[rule.channel, rule.id] = rule
        for channel, trigger_id, value in self._store.fire_counters():
            self._counters[channel, trigger_id] = Counter(**json.loads(value))
        # History keys go on from the last one used, so that no firing after a restart
        # overwrites one from before.
        for channel, trigger_id in self._rules:
            last = self._store.last_firing_order(channel, trigger_id)
            self._history_seq = max(self._history_seq, last)

    def add(self, rule: TriggerRule) -> None:
        """Register a validated rule, durably."""
        self._write(PutKey(Keys.trigger(rule.channel, rule.id), rule.to_json()))
        with self._lock:
            self._rules[rule.channel, rule.id] = rule

    def remove(self, channel: str, trigger_id: str) -> bool:
        """Delete a rule (its history stays readable); False if there was none."""
        with self._lock:
            if (channel, trigger_id) not in self._rules:
                return False
        self._write(DeleteKey(Keys.trigger(channel, trigger_id)))
        with self._lock:
            self._rules.pop((channel, trigger_id), None)
        return True

    def drop_writes(self, channel: str) -> list[DeleteRange]:
        """The writes that delete a channel's triggers for good: rules, fire counters,
        history and decay marks, those deleted triggers left included (for the batch that
        drops the channel); none when it has none. A trigger that has fired has a
        counter, kept when it is deleted, so a channel without rules or counters has no
        trigger keys."""
        with self._lock:
            ids = [i for c, i in self._rules if c == channel]
            held = bool(ids) or any(c == channel for c, _ in self._counters)
            self._dropping[channel] = ids
        return [DeleteRange(*span) for span in Keys.trigger_ranges(channel)] if held else []

    def dropped(self, channel: str) -> None:
        """The batch from :meth:`drop_writes` is durable: its triggers go from memory too."""
        with self._lock:
            for trigger_id in self._dropping.pop(channel, []):
                self._rules.pop((channel, trigger_id), None)
            for key in [key for key in self._counters if key[0] == channel]:
                del self._counters[key]

    def get(self, channel: str, trigger_id: str) -> TriggerRule | None:
        """The rule of this id in this channel, if there is one."""
        return self._rules.get((channel, trigger_id))

    def named(self, trigger_id: str) -> list[TriggerRule]:
        """Every channel's rule of this id, by channel."""
        with self._lock:
            found = [r for (_, i), r in self._rules.items() if i == trigger_id]
        return sorted(found, key=lambda r: r.channel)

    def rules(self, channel: str | None = None, event: str | None = None) -> list[TriggerRule]:
        """The rules of a channel (and event), by id (then channel)."""
        with self._lock:
            found = [
                r
                for r in self._rules.values()
                if (channel is None or r.channel == channel) and (event is None or r.event == event)
            ]
        return sorted(found, key=lambda r: (r.id, r.channel))

    def fires(self, rule: TriggerRule) -> int:
        """How many times a trigger has fired."""
        counter = self._counters.get((rule.channel, rule.id))
        return counter.fires if counter is not None else 0

    def can_fire(self, rule: TriggerRule, now: float) -> bool:
        """Whether the rule may fire now: not paused, and ``max_fires`` and
        ``cooldown_seconds`` let it."""
        current = self._rules.get((rule.channel, rule.id), rule)
        if current.paused:
            return False
        counter = self._counters.get((rule.channel, rule.id), Counter())
        if rule.max_fires and counter.fires >= rule.max_fires:
            return False
        return not (counter.fires and now - counter.last_fired_at < rule.cooldown_seconds)

    def count(self, rule: TriggerRule, at: float) -> tuple[Counter, PutKey]:
        """One more firing of a trigger: the counter to :meth:`apply_count` once durable,
        and its write."""
        with self._lock:
            current = self._counters.get((rule.channel, rule.id), Counter())
        counter = Counter(current.fires + 1, at)
        value = json.dumps(asdict(counter)).encode()
        return counter, PutKey(Keys.fire_counter(rule.channel, rule.id), value)

    def apply_count(self, rule: TriggerRule, counter: Counter) -> None:
        """Make a counter written by :meth:`count` (and committed) the one in force."""
        with self._lock:
            self._counters[rule.channel, rule.id] = counter

    def history_entry(self, channel: str, firing: Firing) -> PutKey:
        """The write that adds a firing to the history of its trigger in ``channel``."""
        with self._lock:
            self._history_seq += 1
            order = max(firing.seq, self._history_seq)
            self._history_seq = order
        value = json.dumps(asdict(firing)).encode()
        return PutKey(Keys.firing(channel, firing.trigger_id, order), value)

    def decay_mark(self, rule: TriggerRule, memory_id: str, t0: float) -> PutKey:
        """The write noting that the trigger fired for this heat trajectory of the memory."""
        return PutKey(Keys.decay_mark(rule.channel, rule.id, memory_id), repr(t0).encode())

    def rate(self, rule: TriggerRule, firing: Firing, useful: bool, now: float) -> None:
        """Rate a firing of the rule, durably (a later rating of it replaces this one)."""
        rating = Rating(firing.at, useful, now)
        self._write(
            PutKey(Keys.trigger_rating(rule.channel, rule.id, firing.seq), rating.to_json())
        )

    def ratings(self, channel: str, trigger_id: str) -> dict[int, Rating]:
        """The ratings of a trigger's firings, by the seq of the event that caused each."""
        return {
            seq: Rating.from_json(value)
            for seq, value in self._store.trigger_ratings(channel, trigger_id)
        }

    def pause(self, rule: TriggerRule, reason: str) -> TriggerRule:
        """Pause a rule (it fires no more), durably, saying why; the paused rule."""
        paused = replace(rule, paused=reason)
        self.add(paused)
        return paused

    def history(self, channel: str, trigger_id: str) -> Iterator[Firing]:
        """The firings of the trigger of this id in this channel, oldest first (those of
        a deleted one too)."""
        for value in self._store.firings(channel, trigger_id):
            yield Firing(**json.loads(value))

    def decay_fired(self, rule: TriggerRule, memory_id: str, t0: float) -> bool:
        """Whether this trigger already fired for the memory's current heat trajectory."""
        value = self._store.get(Keys.decay_mark(rule.channel, rule.id, memory_id))
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
