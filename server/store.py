"""RocksDB, the source of truth: key schema, atomic write batches, and recovery reads.

Key schema (raw bytes; channel names never hold NUL):

    meta:schema                 JSON {schema_version, model_id, dim}
    m:<channel>\\0<id>           MemoryRecord JSON
    v:<channel>\\0<id>           float32 embedding, little-endian
    i:<channel>\\0<key>          id stored under an idempotency key
    p:<channel>                 the channel's policy (settings) JSON
    c:<channel>                 the channel's own state JSON (heat, interactions, entropy)
    e:<channel>\\0<a>\\0<b>\\0<kind>  edge weight (a < b; edges are undirected)
    l:<seq, 8 bytes big-endian>  EventRecord JSON: the event log, numbered at commit
    t:, h:, d:, s:, o:          the trigger engine's records (see calor.triggers)

Every change goes through :meth:`MemoryStore.batch`, one atomic RocksDB write batch
that is discarded if anything inside the block raises. With ``sync`` on, the
write-ahead log is fsynced before the batch is acknowledged.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import numpy as np
import rocksdict

from calor.server.errors import StoreMismatchError, UnavailableError
from calor.server.events import EventRecord
from calor.server.records import MemoryRecord

__all__ = ["SCHEMA_VERSION", "BatchWrites", "MemoryStore", "WriteBatch", "event_key"]

SCHEMA_VERSION = 1
_META = b"meta:schema"
_SEP = b"\x00"


def _key(prefix: bytes, channel: str, name: str) -> bytes:
    return prefix + channel.encode() + _SEP + name.encode()


def _edge_key(channel: str, a: str, b: str, kind: str) -> bytes:
    low, high = (a, b) if a < b else (b, a)
    return b"e:" + _SEP.join(part.encode() for part in (channel, low, high, kind))


def event_key(seq: int) -> bytes:
    """The log key of an event: sequence numbers sort as keys."""
    return b"l:" + seq.to_bytes(8, "big")


class WriteBatch:
    """Changes gathered for one atomic write; build it with :meth:`MemoryStore.batch`."""

    def __init__(self) -> None:
        self._batch = rocksdict.WriteBatch(raw_mode=True)
        self.events: list[EventRecord] = []

    def append_event(self, event: EventRecord) -> None:
        """Log an event with this batch; it gets its sequence number at commit."""
        self.events.append(event)

    def put_raw(self, key: bytes, value: bytes) -> None:
        """Write a key owned by another component (the trigger engine)."""
        self._batch.put(key, value)

    def delete_raw(self, key: bytes) -> None:
        """Drop a key owned by another component."""
        self._batch.delete(key)

    def put_record(self, record: MemoryRecord) -> None:
        """Write (or overwrite) a memory record."""
        self._batch.put(_key(b"m:", record.channel, record.id), record.to_json())

    def put_vector(self, channel: str, memory_id: str, vector: np.ndarray) -> None:
        """Write a memory's embedding."""
        data = np.ascontiguousarray(vector, dtype="<f4").tobytes()
        self._batch.put(_key(b"v:", channel, memory_id), data)

    def delete_vector(self, channel: str, memory_id: str) -> None:
        """Drop a memory's embedding."""
        self._batch.delete(_key(b"v:", channel, memory_id))

    def put_policy(self, channel: str, policy: bytes) -> None:
        """Write a channel's policy (settings) as JSON."""
        self._batch.put(b"p:" + channel.encode(), policy)

    def put_channel_state(self, channel: str, state: bytes) -> None:
        """Write a channel's own state JSON."""
        self._batch.put(b"c:" + channel.encode(), state)

    def put_edge(self, channel: str, a: str, b: str, kind: str, weight: float) -> None:
        """Write an undirected edge (stored once, under the smaller id first)."""
        self._batch.put(_edge_key(channel, a, b, kind), repr(float(weight)).encode())

    def delete_edge(self, channel: str, a: str, b: str, kind: str) -> None:
        """Drop an undirected edge."""
        self._batch.delete(_edge_key(channel, a, b, kind))

    def put_idempotency(self, channel: str, key: str, memory_id: str) -> None:
        """Remember which memory a store with this idempotency key made."""
        self._batch.put(_key(b"i:", channel, key), memory_id.encode())


# Writes a caller adds to another component's batch (a trigger's cursor beside its action).
BatchWrites = Callable[[WriteBatch], None]


class MemoryStore:
    """The RocksDB store of every channel's memories and embeddings."""

    def __init__(self, db: rocksdict.Rdict, path: Path, dim: int, sync: bool) -> None:
        self._db = db
        self.path = path
        self.dim = dim
        self._write_options = rocksdict.WriteOptions()
        self._write_options.sync = sync
        self._closed = False
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self.last_seq = self._find_last_seq()
        self._listeners: list[Callable[[list[EventRecord]], None]] = []

    def _find_last_seq(self) -> int:
        for key, _ in self._db.items(backwards=True, from_key=b"l;"):
            raw_key = cast(bytes, key)
            return int.from_bytes(raw_key[2:], "big") if raw_key.startswith(b"l:") else 0
        return 0

    def on_commit(self, listener: Callable[[list[EventRecord]], None]) -> None:
        """Call ``listener`` with the numbered events of each commit, in commit order.

        It runs in the committing thread while commits are held, so it must be quick
        (hand the events to an event loop, for example).
        """
        self._listeners.append(listener)

    @classmethod
    def open(cls, path: Path, *, model_id: str, dim: int, sync: bool = True) -> MemoryStore:
        """Open (or create) the store at ``path`` for embeddings of ``model_id``.

        Raises:
            StoreMismatchError: the store was written by another schema or model.
        """
        path.mkdir(parents=True, exist_ok=True)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        db = rocksdict.Rdict(str(path / "rocksdb"), options)
        expected = {"schema_version": SCHEMA_VERSION, "model_id": model_id, "dim": dim}
        found = db.get(_META)
        if found is None:
            write_options = rocksdict.WriteOptions()
            write_options.sync = True
            batch = rocksdict.WriteBatch(raw_mode=True)
            batch.put(_META, json.dumps(expected).encode())
            db.write(batch, write_options)
        else:
            meta = json.loads(found)
            if meta != expected:
                db.close()
                raise StoreMismatchError(
                    f"the store at {path} was made with {meta}, this server runs {expected}; "
                    "point --data-dir elsewhere or re-import the memories"
                )
        return cls(db, path, dim, sync)

    @contextmanager
    def batch(self) -> Iterator[WriteBatch]:
        """Gather changes and write them atomically when the block ends without error."""
        batch = WriteBatch()
        yield batch
        self._check_open()
        with self._commit_lock:
            events = [e.with_seq(self.last_seq + n) for n, e in enumerate(batch.events, 1)]
            for event in events:
                batch._batch.put(event_key(event.seq), event.to_json())
            self._db.write(batch._batch, self._write_options)
            if events:
                self.last_seq = events[-1].seq
                for listener in self._listeners:
                    listener(events)

    def get_vector(self, channel: str, memory_id: str) -> np.ndarray | None:
        """The embedding of one memory, or None."""
        self._check_open()
        data = self._db.get(_key(b"v:", channel, memory_id))
        return None if data is None else np.frombuffer(data, dtype="<f4").astype(np.float32)

    def idempotent_id(self, channel: str, key: str) -> str | None:
        """The id a store with this idempotency key made in this channel, if any."""
        self._check_open()
        data = self._db.get(_key(b"i:", channel, key))
        return None if data is None else bytes(data).decode()

    def records(self, channel: str | None = None) -> Iterator[MemoryRecord]:
        """Every record, of one channel or of all, in key order."""
        prefix = b"m:" if channel is None else b"m:" + channel.encode() + _SEP
        for _, value in self._scan(prefix):
            yield MemoryRecord.from_json(value)

    def policies(self) -> Iterator[tuple[str, bytes]]:
        """Every channel's stored policy JSON as (channel, data)."""
        for key, value in self._scan(b"p:"):
            yield key[2:].decode(), value

    def channel_states(self) -> Iterator[tuple[str, bytes]]:
        """Every channel's stored own state as (channel, JSON)."""
        for key, value in self._scan(b"c:"):
            yield key[2:].decode(), value

    def edges(self) -> Iterator[tuple[str, str, str, str, float]]:
        """Every stored edge as (channel, a, b, kind, weight)."""
        for key, value in self._scan(b"e:"):
            channel, a, b, kind = (part.decode() for part in key[2:].split(_SEP))
            yield channel, a, b, kind, float(value)

    def vectors(self) -> Iterator[tuple[str, str, np.ndarray]]:
        """Every stored embedding as (channel, id, vector)."""
        for key, value in self._scan(b"v:"):
            channel, _, memory_id = key[2:].partition(_SEP)
            yield channel.decode(), memory_id.decode(), np.frombuffer(value, dtype="<f4")

    def events_after(self, seq: int, limit: int = 1000) -> list[EventRecord]:
        """Logged events with a sequence number above ``seq``, oldest first."""
        found: list[EventRecord] = []
        for _, value in self._scan(b"l:", start=event_key(seq + 1)):
            found.append(EventRecord.from_json(value))
            if len(found) >= limit:
                break
        return found

    def first_seq(self) -> int:
        """The oldest sequence number the log still holds (0 when empty)."""
        for key, _ in self._scan(b"l:"):
            return int.from_bytes(key[2:], "big")
        return 0

    def trim_events(self, keep_after: int) -> None:
        """Drop logged events numbered up to ``keep_after`` (retention)."""
        self._check_open()
        self._db.delete_range(event_key(0), event_key(keep_after + 1))

    def get_raw(self, key: bytes) -> bytes | None:
        """A key owned by another component."""
        self._check_open()
        value = self._db.get(key)
        return None if value is None else cast(bytes, value)

    def scan_raw(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every key under a prefix owned by another component, in key order."""
        return self._scan(prefix)

    def last_key_raw(self, prefix: bytes) -> bytes | None:
        """The greatest key under a prefix owned by another component, or None."""
        self._check_open()
        head = prefix.rstrip(b"\xff")
        if not head:
            raise ValueError("the prefix must not be empty or all 0xff")
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

    def close(self) -> None:
        """Flush and close RocksDB; later calls raise UnavailableError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
