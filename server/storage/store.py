"""RocksDB, the source of truth: the whole on-disk schema, its migrations, atomic commits
of change lists, and the reads recovery and the trigger engine need.

Schema version 2. Keys are raw bytes; channel names never hold NUL (``\\0`` below).

    meta:schema                        JSON {schema_version, model_id, dim}
    meta:migrations                    JSON list of the migrations this store went through
    meta:last_seq                      the last event number given (kept when the log is trimmed)
    m:<channel>\\0<id>                  MemoryRecord JSON
    v:<channel>\\0<id>                  float32 embedding, little-endian
    i:<channel>\\0<key>                 id of the memory stored under an idempotency key
    p:<channel>                        the channel's policy (settings) JSON
    c:<channel>                        the channel's own state JSON (heat, interactions, ...)
    e:<channel>\\0<a>\\0<b>\\0<kind>       edge weight as text (a < b; edges are undirected)
    x:<channel>\\0<a>\\0<b>              an open conflict's reason (a < b)
    l:<seq, 8 bytes big-endian>        EventRecord JSON: the event log, numbered at commit
    t:<trigger id>                     TriggerRule JSON
    f:<trigger id>                     the trigger's fire counter JSON
    h:<trigger id>\\0<order, 8 bytes>   a firing of the trigger (its history) JSON
    d:<trigger id>\\0<memory id>        t0 of the heat trajectory whose decay already fired
    s:cursor                           the trigger dispatcher's place in the log JSON
    s:watermark                        time up to which decay crossings were handled
    o:<idempotency key>                a webhook delivery not yet finished JSON
    r:<channel>\\0<recall id>           a recall's logged hits and their signals JSON (recall log)
    g:<channel>\\0<recall id>           the last feedback on that recall JSON
    q:<channel>                        the channel's recall log tally JSON {entries}

Every key is built and parsed here (:class:`Keys` and the readers of
:class:`MemoryStore`); other modules name keys only through :class:`Keys`. Every write
is a list of change lists (:mod:`calor.server.storage.ops`) committed by :meth:`MemoryStore.write`
as one atomic RocksDB write batch; with ``sync`` on, the write-ahead log is fsynced
before the write returns. A store written by an older schema version is brought up to
date at open by named migrations, each recorded under ``meta:migrations``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import cast

import numpy as np
import rocksdict

from calor.server.errors import StoreMismatchError, UnavailableError
from calor.server.events import EventRecord
from calor.server.records import MemoryRecord
from calor.server.storage.ops import (
    AddMemory,
    ChangeList,
    DeleteKey,
    DropVector,
    Forget,
    Link,
    Log,
    OpenConflict,
    Operation,
    PutKey,
    PutMemory,
    SetPolicy,
    SetState,
    SettleConflict,
    StageVector,
    Unlink,
    vector_bytes,
    vector_from,
)

__all__ = ["SCHEMA_VERSION", "Keys", "MemoryStore"]

SCHEMA_VERSION = 2
_SEP = b"\x00"


def _join(prefix: bytes, *parts: str) -> bytes:
    return prefix + _SEP.join(part.encode() for part in parts)


def _split(key: bytes) -> list[str]:
    return [part.decode() for part in key[2:].split(_SEP)]


def _seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


class Keys:
    """Every key of the store, by name."""

    META = b"meta:schema"
    MIGRATIONS = b"meta:migrations"
    LAST_SEQ = b"meta:last_seq"
    CURSOR = b"s:cursor"
    WATERMARK = b"s:watermark"

    @staticmethod
    def memory(channel: str, memory_id: str) -> bytes:
        """A memory's record."""
        return _join(b"m:", channel, memory_id)

    @staticmethod
    def vector(channel: str, memory_id: str) -> bytes:
        """A memory's embedding."""
        return _join(b"v:", channel, memory_id)

    @staticmethod
    def idempotency(channel: str, key: str) -> bytes:
        """The memory a store with this idempotency key made."""
        return _join(b"i:", channel, key)

    @staticmethod
    def policy(channel: str) -> bytes:
        """A channel's settings."""
        return b"p:" + channel.encode()

    @staticmethod
    def channel_state(channel: str) -> bytes:
        """A channel's own state."""
        return b"c:" + channel.encode()

    @staticmethod
    def edge(channel: str, a: str, b: str, kind: str) -> bytes:
        """An undirected edge (the smaller id first)."""
        low, high = (a, b) if a < b else (b, a)
        return _join(b"e:", channel, low, high, kind)

    @staticmethod
    def conflict(channel: str, a: str, b: str) -> bytes:
        """An open conflict between two memories (the smaller id first)."""
        low, high = (a, b) if a < b else (b, a)
        return _join(b"x:", channel, low, high)

    @staticmethod
    def event(seq: int) -> bytes:
        """A logged event: sequence numbers sort as keys."""
        return b"l:" + _seq_bytes(seq)

    @staticmethod
    def trigger(trigger_id: str) -> bytes:
        """A trigger's rule."""
        return b"t:" + trigger_id.encode()

    @staticmethod
    def fire_counter(trigger_id: str) -> bytes:
        """How often a trigger fired, and when last."""
        return b"f:" + trigger_id.encode()

    @staticmethod
    def firing(trigger_id: str, order: int) -> bytes:
        """One entry of a trigger's history."""
        return _join(b"h:", trigger_id) + _SEP + _seq_bytes(order)

    @staticmethod
    def decay_mark(trigger_id: str, memory_id: str) -> bytes:
        """The heat trajectory of a memory whose decay crossing a trigger fired for."""
        return _join(b"d:", trigger_id, memory_id)

    @staticmethod
    def delivery(idempotency_key: str) -> bytes:
        """A webhook delivery in the outbox."""
        return b"o:" + idempotency_key.encode()

    @staticmethod
    def recall(channel: str, recall_id: str) -> bytes:
        """One logged recall of a channel (recall ids sort by time)."""
        return _join(b"r:", channel, recall_id)

    @staticmethod
    def feedback(channel: str, recall_id: str) -> bytes:
        """The feedback given on one logged recall."""
        return _join(b"g:", channel, recall_id)

    @staticmethod
    def recall_tally(channel: str) -> bytes:
        """How many recalls a channel's recall log holds."""
        return b"q:" + channel.encode()


def _put_ops(batch: rocksdict.WriteBatch, change: ChangeList, events: list[EventRecord]) -> None:
    """Add one change list's keys to ``batch``; its events go to ``events`` for numbering."""
    for op in change.ops:
        if isinstance(op, Log):
            events.append(op.event)
        elif isinstance(op, AddMemory | PutMemory | Forget | StageVector | DropVector):
            _put_memory_op(batch, change.channel, op)
        else:
            _put_channel_op(batch, change.channel, op)


def _put_memory_op(
    batch: rocksdict.WriteBatch,
    name: str,
    op: AddMemory | PutMemory | Forget | StageVector | DropVector,
) -> None:
    match op:
        case AddMemory(record, vector, staged):
            batch.put(Keys.memory(name, record.id), record.to_json())
            if not staged:
                batch.put(Keys.vector(name, record.id), vector_bytes(vector))
            if record.idempotency_key:
                batch.put(Keys.idempotency(name, record.idempotency_key), record.id.encode())
        case PutMemory(record, vector):
            batch.put(Keys.memory(name, record.id), record.to_json())
            if vector is not None:
                batch.put(Keys.vector(name, record.id), vector_bytes(vector))
        case Forget(record):
            batch.put(Keys.memory(name, record.id), record.to_json())
            batch.delete(Keys.vector(name, record.id))
        case StageVector(memory_id, vector):
            batch.put(Keys.vector(name, memory_id), vector_bytes(vector))
        case DropVector(memory_id):
            batch.delete(Keys.vector(name, memory_id))


def _put_channel_op(batch: rocksdict.WriteBatch, name: str, op: Operation) -> None:
    match op:
        case Link(a, b, kind, weight):
            batch.put(Keys.edge(name, a, b, kind), repr(float(weight)).encode())
        case Unlink(a, b, kind):
            batch.delete(Keys.edge(name, a, b, kind))
        case OpenConflict(a, b, reason):
            batch.put(Keys.conflict(name, a, b), reason.encode())
        case SettleConflict(a, b):
            batch.delete(Keys.conflict(name, a, b))
        case SetState(state):
            batch.put(Keys.channel_state(name), state.to_json())
        case SetPolicy(policy):
            batch.put(Keys.policy(name), policy.to_json())
        case PutKey(key, value):
            batch.put(key, value)
        case DeleteKey(key):
            batch.delete(key)


# A migration brings a store from the version before it to its own: (version, name, step).
_Migration = tuple[int, str, Callable[[rocksdict.Rdict], None]]


def _cursor_as_json(db: rocksdict.Rdict) -> None:
    """Version 2: the trigger cursor, once a bare sequence number, becomes JSON."""
    saved = db.get(Keys.CURSOR)
    if saved is not None and not bytes(saved).startswith(b"{"):
        db.put(Keys.CURSOR, json.dumps({"seq": int(saved), "done": []}).encode())


_MIGRATIONS: list[_Migration] = [
    (2, "cursor_as_json", _cursor_as_json),
]


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
        """The last event number given: numbers go on even after retention emptied the log."""
        kept = self._db.get(Keys.LAST_SEQ)
        last = int(kept) if kept is not None else 0
        for key, _ in self._db.items(backwards=True, from_key=b"l;"):
            raw_key = cast(bytes, key)
            if raw_key.startswith(b"l:"):
                last = max(last, int.from_bytes(raw_key[2:], "big"))
            break
        return last

    def on_commit(self, listener: Callable[[list[EventRecord]], None]) -> None:
        """Call ``listener`` with the numbered events of each commit, in commit order.

        It runs in the committing thread while commits are held, so it must be quick
        (hand the events to an event loop, for example).
        """
        self._listeners.append(listener)

    @classmethod
    def open(cls, path: Path, *, model_id: str, dim: int, sync: bool = True) -> MemoryStore:
        """Open (or create) the store at ``path`` for embeddings of ``model_id``; a store
        of an older schema version is migrated first.

        Raises:
            StoreMismatchError: the store was written by another model, or by a newer
                version of Calor.
        """
        path.mkdir(parents=True, exist_ok=True)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        db = rocksdict.Rdict(str(path / "rocksdb"), options)
        expected = {"schema_version": SCHEMA_VERSION, "model_id": model_id, "dim": dim}
        found = db.get(Keys.META)
        if found is None:
            _write_meta(db, expected, [])
        else:
            meta = json.loads(found)
            version = int(meta.get("schema_version", 0))
            wrong_model = (meta.get("model_id"), meta.get("dim")) != (model_id, dim)
            if wrong_model or version > SCHEMA_VERSION:
                db.close()
                raise StoreMismatchError(
                    f"the store at {path} was made with {meta}, this server runs {expected}; "
                    "point --data-dir elsewhere or re-import the memories"
                )
            if version < SCHEMA_VERSION:
                _migrate(db, version, expected)
        return cls(db, path, dim, sync)

    def migrations(self) -> list[str]:
        """The names of the migrations this store went through, oldest first."""
        self._check_open()
        data = self._db.get(Keys.MIGRATIONS)
        return [] if data is None else list(json.loads(data))

    # --- writes --------------------------------------------------------------------

    def write(self, changes: Sequence[ChangeList]) -> list[EventRecord]:
        """Commit change lists as one atomic write batch; returns their numbered events.

        Events are numbered at commit, in order, and handed to the commit listeners.
        """
        self._check_open()
        batch = rocksdict.WriteBatch(raw_mode=True)
        events: list[EventRecord] = []
        for change in changes:
            _put_ops(batch, change, events)
        with self._commit_lock:
            numbered = [e.with_seq(self.last_seq + n) for n, e in enumerate(events, 1)]
            for event in numbered:
                batch.put(Keys.event(event.seq), event.to_json())
            if numbered:
                batch.put(Keys.LAST_SEQ, str(numbered[-1].seq).encode())
            self._db.write(batch, self._write_options)
            if numbered:
                self.last_seq = numbered[-1].seq
                for listener in self._listeners:
                    listener(numbered)
        return numbered

    def trim_events(self, keep_after: int) -> None:
        """Drop logged events numbered up to ``keep_after`` (retention)."""
        self._check_open()
        self._db.delete_range(Keys.event(0), Keys.event(keep_after + 1))

    # --- memories ------------------------------------------------------------------

    def get_vector(self, channel: str, memory_id: str) -> np.ndarray | None:
        """The embedding of one memory, or None."""
        self._check_open()
        data = self._db.get(Keys.vector(channel, memory_id))
        return None if data is None else vector_from(data)

    def idempotent_id(self, channel: str, key: str) -> str | None:
        """The id a store with this idempotency key made in this channel, if any."""
        self._check_open()
        data = self._db.get(Keys.idempotency(channel, key))
        return None if data is None else bytes(data).decode()

    def idempotency_keys(self) -> Iterator[tuple[str, str, str]]:
        """Every idempotency entry as (channel, key, memory id)."""
        for key, value in self._scan(b"i:"):
            channel, _, name = key[2:].partition(_SEP)
            yield channel.decode(), name.decode(), value.decode()

    def records(self, channel: str | None = None) -> Iterator[MemoryRecord]:
        """Every record, of one channel or of all, in key order."""
        prefix = b"m:" if channel is None else Keys.memory(channel, "")
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
            channel, a, b, kind = _split(key)
            yield channel, a, b, kind, float(value)

    def conflicts(self) -> Iterator[tuple[str, str, str, str]]:
        """Every open conflict as (channel, a, b, reason)."""
        for key, value in self._scan(b"x:"):
            channel, a, b = _split(key)
            yield channel, a, b, value.decode()

    def vectors(self) -> Iterator[tuple[str, str, np.ndarray]]:
        """Every stored embedding as (channel, id, vector)."""
        for key, value in self._scan(b"v:"):
            channel, _, memory_id = key[2:].partition(_SEP)
            yield channel.decode(), memory_id.decode(), np.frombuffer(value, dtype="<f4")

    # --- the event log -------------------------------------------------------------

    def events_after(self, seq: int, limit: int = 1000) -> list[EventRecord]:
        """Logged events with a sequence number above ``seq``, oldest first."""
        found: list[EventRecord] = []
        for _, value in self._scan(b"l:", start=Keys.event(seq + 1)):
            found.append(EventRecord.from_json(value))
            if len(found) >= limit:
                break
        return found

    def logged(self) -> Iterator[tuple[int, bytes]]:
        """Every logged event as (the sequence number of its key, JSON), oldest first."""
        for key, value in self._scan(b"l:"):
            yield int.from_bytes(key[2:], "big"), value

    def first_seq(self) -> int:
        """The oldest sequence number the log still holds (0 when empty)."""
        for key, _ in self._scan(b"l:"):
            return int.from_bytes(key[2:], "big")
        return 0

    # --- the trigger engine's records ----------------------------------------------

    def trigger_rules(self) -> Iterator[bytes]:
        """Every trigger's rule JSON, in id order."""
        for _, value in self._scan(b"t:"):
            yield value

    def fire_counters(self) -> Iterator[tuple[str, bytes]]:
        """Every trigger's fire counter as (trigger id, JSON)."""
        for key, value in self._scan(b"f:"):
            yield key[2:].decode(), value

    def firings(self, trigger_id: str) -> Iterator[bytes]:
        """A trigger's history entries (JSON), oldest first."""
        for _, value in self._scan(_join(b"h:", trigger_id) + _SEP):
            yield value

    def last_firing_order(self, trigger_id: str) -> int:
        """The order number of a trigger's latest history entry (0 if none)."""
        last = self._last_key(_join(b"h:", trigger_id) + _SEP)
        return 0 if last is None else int.from_bytes(last[-8:], "big")

    def deliveries(self) -> Iterator[bytes]:
        """Every webhook delivery in the outbox (JSON), in key order."""
        for _, value in self._scan(b"o:"):
            yield value

    # --- the recall log and its feedback -------------------------------------------

    def recall_entry(self, channel: str, recall_id: str) -> bytes | None:
        """One logged recall's JSON, or None."""
        return self.get(Keys.recall(channel, recall_id))

    def oldest_recall_ids(self, channel: str, limit: int) -> list[str]:
        """The ids of a channel's oldest logged recalls, oldest first, at most ``limit``."""
        self._check_open()
        prefix = Keys.recall(channel, "")
        found: list[str] = []
        for key in self._db.keys(from_key=prefix):
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

    def close(self) -> None:
        """Flush and close RocksDB; later calls raise UnavailableError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()


def _write_meta(db: rocksdict.Rdict, meta: dict[str, object], migrations: list[str]) -> None:
    write_options = rocksdict.WriteOptions()
    write_options.sync = True
    batch = rocksdict.WriteBatch(raw_mode=True)
    batch.put(Keys.META, json.dumps(meta).encode())
    batch.put(Keys.MIGRATIONS, json.dumps(migrations).encode())
    db.write(batch, write_options)


def _migrate(db: rocksdict.Rdict, version: int, meta: dict[str, object]) -> None:
    """Run the migrations after ``version`` in order, then record them and the version.

    Each migration is idempotent, so a crash before the record is written repeats it.
    """
    done = json.loads(db.get(Keys.MIGRATIONS) or b"[]")
    for target, name, step in _MIGRATIONS:
        if target > version:
            step(db)
            done.append(name)
    _write_meta(db, meta, done)
