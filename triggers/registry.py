"""Triggers at rest: rules, fire counters, firing history and decay markers in RocksDB.

Keys (raw bytes, beside the memory store's own):

    t:<trigger id>                    TriggerRule JSON
    f:<trigger id>                    {"fires": n, "last_fired_at": t} JSON
    h:<trigger id>\\0<seq, 8 bytes>    Firing JSON (the trigger's history)
    d:<trigger id>\\0<memory id>       t0 of the heat trajectory whose decay already fired
    s:watermark                       time up to which decay crossings have been handled
    s:cursor                          the dispatcher's place in the log (calor.triggers.engine)
    o:<idempotency key>               a webhook delivery not yet finished (calor.triggers.outbox)

A firing's counter, history and decay marker are written into the batch of the action
itself (``put_count``, ``put_history``, ``put_decay_fired``), and the counter is applied
in memory only once that batch is durable (``apply_count``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from calor.server.store import MemoryStore, WriteBatch
from calor.triggers.rules import TriggerRule

__all__ = ["Counter", "Firing", "TriggerRegistry"]

_SEP = b"\x00"
_WATERMARK = b"s:watermark"


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

    def load(self) -> None:
        """Read every trigger and its counter back from the store."""
        for _, value in self._store.scan_raw(b"t:"):
            rule = TriggerRule.from_json(value)
            self._rules[rule.id] = rule
        for key, value in self._store.scan_raw(b"f:"):
            self._counters[key[2:].decode()] = Counter(**json.loads(value))
        # History keys go on from the last one used, so that no firing after a restart
        # overwrites one from before.
        for trigger_id in self._rules:
            last = self._store.last_key_raw(b"h:" + trigger_id.encode() + _SEP)
            if last is not None:
                self._history_seq = max(self._history_seq, int.from_bytes(last[-8:], "big"))

    def add(self, rule: TriggerRule) -> None:
        """Register a validated rule, durably."""
        with self._store.batch() as batch:
            batch.put_raw(b"t:" + rule.id.encode(), rule.to_json())
        with self._lock:
            self._rules[rule.id] = rule

    def remove(self, trigger_id: str) -> bool:
        """Delete a rule (its history stays readable); False if there was none."""
        with self._lock:
            if trigger_id not in self._rules:
                return False
        with self._store.batch() as batch:
            batch.delete_raw(b"t:" + trigger_id.encode())
        with self._lock:
            self._rules.pop(trigger_id, None)
        return True

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

    def put_count(self, batch: WriteBatch, trigger_id: str, at: float) -> Counter:
        """Write one more firing of a trigger into ``batch``; returns the counter to
        :meth:`apply_count` once the batch is durable."""
        with self._lock:
            current = self._counters.get(trigger_id, Counter())
        counter = Counter(current.fires + 1, at)
        batch.put_raw(b"f:" + trigger_id.encode(), json.dumps(asdict(counter)).encode())
        return counter

    def apply_count(self, trigger_id: str, counter: Counter) -> None:
        """Make a counter written by :meth:`put_count` (and committed) the one in force."""
        with self._lock:
            self._counters[trigger_id] = counter

    def put_history(self, batch: WriteBatch, firing: Firing) -> None:
        """Add a firing to its trigger's history, in ``batch``."""
        with self._lock:
            self._history_seq += 1
            order = max(firing.seq, self._history_seq)
            self._history_seq = order
        batch.put_raw(
            b"h:" + firing.trigger_id.encode() + _SEP + order.to_bytes(8, "big"),
            json.dumps(asdict(firing)).encode(),
        )

    def put_decay_fired(
        self, batch: WriteBatch, trigger_id: str, memory_id: str, t0: float
    ) -> None:
        """Note, in ``batch``, that the trigger fired for this heat trajectory of the memory."""
        batch.put_raw(_decay_key(trigger_id, memory_id), repr(t0).encode())

    def history(self, trigger_id: str) -> Iterator[Firing]:
        """A trigger's firings, oldest first."""
        for _, value in self._store.scan_raw(b"h:" + trigger_id.encode() + _SEP):
            yield Firing(**json.loads(value))

    def decay_fired(self, trigger_id: str, memory_id: str, t0: float) -> bool:
        """Whether this trigger already fired for the memory's current heat trajectory."""
        value = self._store.get_raw(_decay_key(trigger_id, memory_id))
        return value is not None and float(value) == t0

    def watermark(self) -> float:
        """The time up to which decay crossings were handled before (0 if never)."""
        value = self._store.get_raw(_WATERMARK)
        return float(value) if value is not None else 0.0

    def set_watermark(self, when: float) -> None:
        """Note that decay crossings up to ``when`` are handled."""
        with self._store.batch() as batch:
            batch.put_raw(_WATERMARK, repr(when).encode())


def _decay_key(trigger_id: str, memory_id: str) -> bytes:
    return b"d:" + trigger_id.encode() + _SEP + memory_id.encode()
