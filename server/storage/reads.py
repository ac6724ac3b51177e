"""What a store's keys hold, read by domain: memories and their embeddings, channels'
settings and state, edges and conflicts, the event log, the trigger engine's records,
the recall log and its feedback. :class:`~calor.server.storage.store.MemoryStore`
reads through these; keys are parsed here and named only through
:class:`~calor.server.storage.keys.Keys`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import numpy as np
import numpy.typing as npt
import rocksdict

from calor.server.errors import UnavailableError
from calor.server.events import EventRecord
from calor.server.records import MemoryRecord
from calor.server.storage.heats import with_heat
from calor.server.storage.keys import SEP, Keys, split
from calor.server.storage.ops import vector_from

__all__ = ["StoreReads"]

_SEP_TEXT = SEP.decode()
_PAST_SEP = bytes([SEP[0] + 1])  # sorts after SEP: past one channel's keys of a family


class StoreReads:
    """The reads of one open RocksDB (the store's own, its subclass's to open and close)."""

    _db: rocksdict.Rdict
    _closed: bool
    dim: int
    """The embeddings' dimension."""

    # --- memories ------------------------------------------------------------------

    def record(self, channel: str, memory_id: str) -> MemoryRecord | None:
        """One memory's stored record (with the heat kept beside it), or None."""
        data = self.get(Keys.memory(channel, memory_id))
        if data is None:
            return None
        record = MemoryRecord.from_json(data)
        heat = self._db.get(Keys.heat(channel, memory_id))
        return record if heat is None else with_heat(record, heat)

    def get_vector(self, channel: str, memory_id: str) -> np.ndarray | None:
        """The embedding of one memory, or None."""
        self._check_open()
        data = self._db.get(Keys.vector(channel, memory_id))
        return None if data is None else vector_from(data)

    def get_vectors(
        self, channel: str, memory_ids: list[str]
    ) -> tuple[np.ndarray, npt.NDArray[np.bool_]]:
        """The embeddings of memories, one row each (zeros for one not found), and which
        were found; read together."""
        self._check_open()
        keys: list[str | int | float | bytes | bool] = [
            Keys.vector(channel, memory_id) for memory_id in memory_ids
        ]
        found = cast(list[bytes | None], self._db.get(keys)) if keys else []
        held = np.array([data is not None for data in found], dtype=np.bool_)
        out = np.zeros((len(found), self.dim), dtype=np.float32)
        if held.any():
            joined = b"".join(data for data in found if data is not None)
            out[held] = np.frombuffer(joined, dtype="<f4").reshape(-1, self.dim)
        return out, held

    def idempotent_id(self, channel: str, key: str) -> str | None:
        """The id a store with this idempotency key made in this channel, if any."""
        self._check_open()
        data = self._db.get(Keys.idempotency(channel, key))
        return None if data is None else bytes(data).decode()

    def idempotency_keys(self) -> Iterator[tuple[str, str, str]]:
        """Every idempotency entry as (channel, key, memory id)."""
        for key, value in self._scan(Keys.IDEMPOTENCY):
            channel, _, name = key[2:].partition(SEP)
            yield channel.decode(), name.decode(), value.decode()

    def records(self, channel: str | None = None) -> Iterator[MemoryRecord]:
        """Every record (with the heat kept beside it), of one channel or of all, in key
        order."""
        heats = {key[len(Keys.HEATS) :]: value for key, value in self.heats(channel)}
        prefix = Keys.MEMORIES if channel is None else Keys.in_channel(Keys.MEMORIES, channel)
        for key, value in self._scan(prefix):
            heat = heats.get(key[len(Keys.MEMORIES) :]) if heats else None
            record = MemoryRecord.from_json(value)
            yield record if heat is None else with_heat(record, heat)

    def heats(self, channel: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Every heat kept beside a record, of one channel or of all, by key."""
        prefix = Keys.HEATS if channel is None else Keys.in_channel(Keys.HEATS, channel)
        return self._scan(prefix)

    def channel_names(self) -> set[str]:
        """Every channel that holds anything: settings, its own state, a memory or an
        embedding. A seek or two per channel, not a read of its memories."""
        names = {name for name, _ in self.policies()}
        names.update(name for name, _ in self.channel_states())
        self._check_open()
        for family in (Keys.MEMORIES, Keys.VECTORS):  # a vector alone: written ahead
            start = family
            while True:
                key = next(iter(self._db.keys(from_key=start)), None)
                if key is None or not cast(bytes, key).startswith(family):
                    break
                channel = cast(bytes, key)[len(family) :].partition(SEP)[0]
                names.add(channel.decode())
                start = family + channel + _PAST_SEP  # past every key of that channel
        return names

    def channel_policy(self, channel: str) -> bytes | None:
        """A channel's stored policy JSON, or None (the default policy holds)."""
        return self.get(Keys.policy(channel))

    def channel_state(self, channel: str) -> bytes | None:
        """A channel's stored own state JSON, or None (never written)."""
        return self.get(Keys.channel_state(channel))

    def policies(self) -> Iterator[tuple[str, bytes]]:
        """Every channel's stored policy JSON as (channel, data)."""
        for key, value in self._scan(Keys.POLICIES):
            yield key[2:].decode(), value

    def channel_states(self) -> Iterator[tuple[str, bytes]]:
        """Every channel's stored own state as (channel, JSON)."""
        for key, value in self._scan(Keys.STATES):
            yield key[2:].decode(), value

    def edges(self, channel: str | None = None) -> Iterator[tuple[str, str, str, str, float]]:
        """Every stored edge, of one channel or of all, as (channel, a, b, kind, weight)."""
        if channel is None:
            for key, value in self._scan(Keys.EDGES):
                owner, a, b, kind = split(key)
                yield owner, a, b, kind, float(value)
            return
        prefix = Keys.in_channel(Keys.EDGES, channel)
        start = len(prefix)  # one channel's: only the ids and kind decoded
        for key, value in self._scan(prefix):
            a, b, kind = key[start:].decode().split(_SEP_TEXT)
            yield channel, a, b, kind, float(value)

    def conflicts(self, channel: str | None = None) -> Iterator[tuple[str, str, str, str]]:
        """Every open conflict, of one channel or of all, as (channel, a, b, reason)."""
        prefix = Keys.CONFLICTS if channel is None else Keys.in_channel(Keys.CONFLICTS, channel)
        for key, value in self._scan(prefix):
            owner, a, b = split(key)
            yield owner, a, b, value.decode()

    def vectors(self, channel: str | None = None) -> Iterator[tuple[str, str, np.ndarray]]:
        """Every stored embedding, of one channel or of all, as (channel, id, vector)."""
        prefix = Keys.VECTORS if channel is None else Keys.in_channel(Keys.VECTORS, channel)
        for key, value in self._scan(prefix):
            owner, _, memory_id = key[2:].partition(SEP)
            yield owner.decode(), memory_id.decode(), np.frombuffer(value, dtype="<f4")

    def rejections(self, channel: str) -> Iterator[tuple[bytes, bytes]]:
        """A channel's rejections as stored: (key, float32 embedding bytes)."""
        yield from self._scan(Keys.rejection(channel, ""))

    # --- the event log -------------------------------------------------------------

    def events_after(self, seq: int, limit: int = 1000) -> list[EventRecord]:
        """Logged events with a sequence number above ``seq``, oldest first."""
        found: list[EventRecord] = []
        for _, value in self._scan(Keys.EVENTS, start=Keys.event(seq + 1)):
            found.append(EventRecord.from_json(value))
            if len(found) >= limit:
                break
        return found

    def logged(self) -> Iterator[tuple[int, bytes]]:
        """Every logged event as (the sequence number of its key, JSON), oldest first."""
        for key, value in self._scan(Keys.EVENTS):
            yield int.from_bytes(key[2:], "big"), value

    def first_seq(self) -> int:
        """The oldest sequence number the log still holds (0 when empty)."""
        for key, _ in self._scan(Keys.EVENTS):
            return int.from_bytes(key[2:], "big")
        return 0

    # --- the trigger engine's records ----------------------------------------------

    def trigger_rules(self) -> Iterator[bytes]:
        """Every trigger's rule JSON, in (channel, id) order."""
        for _, value in self._scan(Keys.TRIGGERS):
            yield value

    def fire_counters(self) -> Iterator[tuple[str, str, bytes]]:
        """Every trigger's fire counter as (channel, trigger id, JSON)."""
        for key, value in self._scan(Keys.FIRE_COUNTERS):
            channel, trigger_id = split(key)
            yield channel, trigger_id, value

    def firings(self, channel: str, trigger_id: str) -> Iterator[bytes]:
        """A trigger's history entries (JSON), oldest first."""
        for _, value in self._scan(Keys.history(channel, trigger_id)):
            yield value

    def trigger_ratings(self, channel: str, trigger_id: str) -> Iterator[tuple[int, bytes]]:
        """A trigger's ratings as (cause seq, JSON), by cause seq."""
        prefix = Keys.trigger_ratings(channel, trigger_id)
        for key, value in self._scan(prefix):
            yield int.from_bytes(key[len(prefix) :], "big"), value

    def last_firing_order(self, channel: str, trigger_id: str) -> int:
        """The order number of a trigger's latest history entry (0 if none)."""
        last = self._last_key(Keys.history(channel, trigger_id))
        return 0 if last is None else int.from_bytes(last[-8:], "big")

    def deliveries(self) -> Iterator[bytes]:
        """Every webhook delivery in the outbox (JSON), in key order."""
        for _, value in self._scan(Keys.DELIVERIES):
            yield value

    # --- the recall log and its feedback -------------------------------------------

    def recall_entry(self, channel: str, recall_id: str) -> bytes | None:
        """One logged recall's JSON, or None."""
        return self.get(Keys.recall(channel, recall_id))

    def oldest_recall_ids(self, channel: str, limit: int, start: str = "") -> list[str]:
        """The ids of a channel's oldest logged recalls from ``start`` on, oldest first,
        at most ``limit``."""
        self._check_open()
        prefix = Keys.recall(channel, "")
        found: list[str] = []
        for key in self._db.keys(from_key=Keys.recall(channel, start)):
            raw_key = cast(bytes, key)
            if len(found) >= limit or not raw_key.startswith(prefix):
                break
            found.append(raw_key[len(prefix) :].decode())
        return found

    def recall_tally(self, channel: str) -> bytes | None:
        """The channel's recall log tally JSON, or None before its first logged recall."""
        return self.get(Keys.recall_tally(channel))

    def feedback_entries(self, channel: str, since_id: str = "") -> Iterator[tuple[str, bytes]]:
        """A channel's feedback as (recall id, JSON), in recall id order, from ``since_id``."""
        prefix = Keys.feedback(channel, "")
        for key, value in self._scan(prefix, start=Keys.feedback(channel, since_id)):
            yield key[len(prefix) :].decode(), value

    def get(self, key: bytes) -> bytes | None:
        """The value under one key built by :class:`Keys`, or None."""
        self._check_open()
        value = self._db.get(key)
        return None if value is None else cast(bytes, value)

    # --- scanning ------------------------------------------------------------------

    def _last_key(self, prefix: bytes) -> bytes | None:
        """The greatest key under ``prefix``, or None."""
        self._check_open()
        head = prefix.rstrip(b"\xff")
        end = head[:-1] + bytes([head[-1] + 1])  # the least key past every key under it
        for key, _ in self._db.items(backwards=True, from_key=end):
            raw_key = cast(bytes, key)
            if raw_key >= end:
                continue
            return raw_key if raw_key.startswith(prefix) else None
        return None

    def _scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        for key, value in self._db.items(from_key=start or prefix):
            raw_key = cast(bytes, key)
            if not raw_key.startswith(prefix):
                break
            yield raw_key, cast(bytes, value)

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError("the store is closed: the server is shutting down")
