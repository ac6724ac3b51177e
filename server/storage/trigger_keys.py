"""Schema version 4: the trigger engine's keys move under their channel, a trigger id being
its channel's own from then on.

Before it a trigger's rule was ``t:<id>``, its fire counter ``f:<id>``, its history
``h:<id>\\0<order>`` and its decay marks ``d:<id>\\0<memory id>``; each now starts with
``<channel>\\0`` (see :mod:`calor.server.storage.keys`). A rule names its channel. What a
trigger deleted before left behind (its counter, history and decay marks) does not: it
goes to the one channel that holds the memories it fired on, and is dropped when no
single channel does.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import rocksdict

from calor.server.storage.keys import SEP, Keys, past

__all__ = ["triggers_by_channel"]

_ORDER_BYTES = 8
_PROBES = 16  # memories looked up to place what a deleted trigger left


@dataclass(frozen=True)
class _Old:
    """A key of the old layout: its family, the whole key, and what follows the id."""

    family: bytes
    key: bytes
    tail: bytes

    def moved(self, channel: str, trigger_id: str) -> bytes:
        """The key under ``channel`` in the new layout."""
        if self.family == Keys.TRIGGERS:
            return Keys.trigger(channel, trigger_id)
        if self.family == Keys.FIRE_COUNTERS:
            return Keys.fire_counter(channel, trigger_id)
        if self.family == Keys.HISTORY:
            return Keys.history(channel, trigger_id) + self.tail
        return Keys.decay_mark(channel, trigger_id, self.tail.decode())


def triggers_by_channel(db: rocksdict.Rdict) -> None:
    """Move every trigger key of the old layout under its channel.

    Idempotent, as a migration must be: each key is written anew before the old one is
    deleted, and a trigger's rule moves after the rest of its keys, so a run cut short
    finds what it had not moved yet and moves it the same way.
    """
    found = _old_keys(db)
    if not found:
        return
    names: list[str] | None = None
    for trigger_id, keys in sorted(found.items()):
        rule = next((old for old in keys if old.family == Keys.TRIGGERS), None)
        if rule is not None:
            channel: str | None = str(json.loads(_value(db, rule.key))["channel"])
        else:
            names = _memory_channels(db) if names is None else names
            channel = _holder(db, keys, names)
        for old in sorted(keys, key=lambda k: k.family == Keys.TRIGGERS):
            if channel is not None:
                db.put(old.moved(channel, trigger_id), _value(db, old.key))
            db.delete(old.key)


def _old_keys(db: rocksdict.Rdict) -> dict[str, list[_Old]]:
    """Every key of the old layout, by trigger id. A new key has one separator more
    (after the channel) than the old key of the same family."""
    found: dict[str, list[_Old]] = defaultdict(list)
    for family in (Keys.TRIGGERS, Keys.FIRE_COUNTERS):
        for key in _keys(db, family):
            rest = key[len(family) :]
            if SEP not in rest:
                found[rest.decode()].append(_Old(family, key, b""))
    for key in _keys(db, Keys.HISTORY):
        head = key[len(Keys.HISTORY) : -_ORDER_BYTES - 1]
        if len(key) > len(Keys.HISTORY) + _ORDER_BYTES + 1 and SEP not in head:
            found[head.decode()].append(_Old(Keys.HISTORY, key, key[-_ORDER_BYTES:]))
    for key in _keys(db, Keys.DECAY_MARKS):
        parts = key[len(Keys.DECAY_MARKS) :].split(SEP)
        if len(parts) == 2:
            found[parts[0].decode()].append(_Old(Keys.DECAY_MARKS, key, parts[1]))
    return found


def _holder(db: rocksdict.Rdict, keys: list[_Old], names: list[str]) -> str | None:
    """The one channel holding memories a deleted trigger fired on (read from its history
    and decay marks), or None when none or several do."""
    memories: list[str] = []
    for old in keys:
        if old.family == Keys.HISTORY:
            memory_id = str(json.loads(_value(db, old.key)).get("memory_id", ""))
        elif old.family == Keys.DECAY_MARKS:
            memory_id = old.tail.decode()
        else:
            continue
        if memory_id and memory_id not in memories:
            memories.append(memory_id)
        if len(memories) >= _PROBES:
            break
    holders = {
        name
        for name in names
        for memory_id in memories
        if db.get(Keys.memory(name, memory_id)) is not None
    }
    return holders.pop() if len(holders) == 1 else None


def _memory_channels(db: rocksdict.Rdict) -> list[str]:
    """Every channel that holds a memory record: a seek per channel."""
    names: list[str] = []
    start = Keys.MEMORIES
    while True:
        key = next(iter(db.keys(from_key=start)), None)
        if key is None or not cast(bytes, key).startswith(Keys.MEMORIES):
            return names
        channel = cast(bytes, key)[len(Keys.MEMORIES) :].partition(SEP)[0]
        names.append(channel.decode())
        start = past(Keys.in_channel(Keys.MEMORIES, channel.decode()))


def _keys(db: rocksdict.Rdict, prefix: bytes) -> list[bytes]:
    """The keys under ``prefix``, read before any is moved."""
    return list(_under(db, prefix))


def _under(db: rocksdict.Rdict, prefix: bytes) -> Iterator[bytes]:
    for key in db.keys(from_key=prefix):
        raw = cast(bytes, key)
        if not raw.startswith(prefix):
            return
        yield raw


def _value(db: rocksdict.Rdict, key: bytes) -> bytes:
    return cast(bytes, db.get(key))
