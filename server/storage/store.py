"""RocksDB, the source of truth: opening a store (its schema checked and migrated,
:mod:`calor.server.storage.migrations`), atomic commits of change lists, purges, and
the reads by domain it inherits from :class:`~calor.server.storage.reads.StoreReads`.

Schema version 4; every key is named in :mod:`calor.server.storage.keys`.

Keys are built by :class:`~calor.server.storage.keys.Keys` and parsed by the readers of
:class:`MemoryStore`; other modules name keys only through :class:`Keys`. Every write
is a list of change lists (:mod:`calor.server.storage.ops`) committed by :meth:`MemoryStore.write`
as one atomic RocksDB write batch; with ``sync`` on, the write-ahead log is fsynced
before the write returns (a write that asks for less, a recall's heat effects, has it
fsynced soon after: :mod:`calor.server.storage.wal_sync`).

Forgetting leaves no text behind: a forgotten memory's record loses its text and its
embedding key goes; every logged event about a memory that has a message, and every
:class:`~calor.server.storage.ops.Quote`, is indexed under that memory (``k:``) with its
scrubbed form, which the forget's own batch puts in its place (what is forgotten before
it commits is written scrubbed at once). A dropped channel loses every key it owns by
range deletes in one batch. Deleted bytes linger in the memtable, the write-ahead log
and older table files until RocksDB compacts them away, so each such batch also records
the key ranges it touched (``meta:purge``) and :meth:`MemoryStore.purge` flushes and
compacts them (:mod:`calor.server.storage.purge` runs it soon after, and at the next
start when a stop cut it short).

A store written by an older schema version is brought up to date at open by named
migrations, each recorded under ``meta:migrations``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import rocksdict

from calor.server.errors import (
    CalorError,
    LogBehindError,
    StorageError,
    StorageFullError,
    StoreInUseError,
    StoreMismatchError,
)
from calor.server.events import EventRecord
from calor.server.heap import release
from calor.server.records import DELETED, MemoryRecord
from calor.server.storage.batch import PendingBatch, put_ops
from calor.server.storage.keys import (
    SCHEMA_VERSION,
    SEP,
    Keys,
)
from calor.server.storage.lock import in_use
from calor.server.storage.logged import EMPTY_ENTRY, LoggedBatch, WriteLog, replay
from calor.server.storage.migrations import migrate
from calor.server.storage.ops import (
    ChangeList,
    Quote,
)
from calor.server.storage.reads import StoreReads
from calor.server.storage.wal_sync import WalSyncer

__all__ = ["SCHEMA_VERSION", "Keys", "MemoryStore"]

_WRITE_BUFFER_BYTES = 8 * 1024 * 1024
_ForgetListener = Callable[[set[tuple[str, str]], set[str], int], None]

log = logging.getLogger("calor.server")


# How RocksDB words a write refused for want of space: ENOSPC, EFBIG (a file size
# limit), EDQUOT.
_FULL = ("no space left on device", "file too large", "disk quota exceeded")


def _write_refused(error: Exception) -> CalorError:
    """What a failed RocksDB write means to a caller: a full disk is RESOURCE_EXHAUSTED,
    any other I/O error UNAVAILABLE. The in-memory view does not take the batch."""
    message = str(error)
    log.error("RocksDB refused a write: %s", message)
    if any(words in message.lower() for words in _FULL):
        return StorageFullError(
            f"the store is out of disk space and refused the write ({message}); "
            "free space, then restart the server"
        )
    return StorageError(f"the store could not write ({message})")


class MemoryStore(StoreReads):
    """The RocksDB store of every channel's memories and embeddings."""

    def __init__(self, db: rocksdict.Rdict, path: Path, dim: int, sync: bool) -> None:
        self._db = db
        self.path = path
        self.dim = dim
        self._write_options = rocksdict.WriteOptions()
        self._write_options.sync = sync
        self._soon_options = rocksdict.WriteOptions()  # synced soon after (wal_sync.py)
        self._soon_options.sync = False
        self._syncer = WalSyncer(lambda: self._db.flush_wal(True)) if sync else None
        self._closed = False
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._purge_lock = threading.Lock()
        self.last_seq = self._find_last_seq()
        self._listeners: list[Callable[[list[EventRecord]], None]] = []
        self._purge_listeners: list[Callable[[], None]] = []
        self._forget_listeners: list[_ForgetListener] = []
        saved = db.get(Keys.PURGE)
        self._purging: dict[bytes, tuple[bytes, bytes]] = _ranges_from(saved)
        self._log: WriteLog | None = None
        kept = db.get(Keys.LOG_POSITION)
        self.log_position = int(kept) if kept is not None else 0
        """The last write-log entry this store holds (cluster mode; 0 otherwise)."""

    def _reload_derived(self) -> None:
        """Read again what the store keeps in memory of its keys, after keys were written
        other than by :meth:`write` (the write log's entries, a snapshot)."""
        self.last_seq = self._find_last_seq()
        self._purging = _ranges_from(self._db.get(Keys.PURGE))

    def _find_last_seq(self) -> int:
        """The last event number given: numbers go on even after retention emptied the log."""
        kept = self._db.get(Keys.LAST_SEQ)
        last = int(kept) if kept is not None else 0
        for key, _ in self._db.items(backwards=True, from_key=b"l;"):
            raw_key = cast(bytes, key)
            if raw_key.startswith(Keys.EVENTS):
                last = max(last, int.from_bytes(raw_key[2:], "big"))
            break
        return last

    def sequence(self) -> int:
        """RocksDB's sequence number: it grows with every write."""
        return int(self._db.latest_sequence_number())

    def on_commit(self, listener: Callable[[list[EventRecord]], None]) -> None:
        """Call ``listener`` with the numbered events of each commit, in commit order.

        It runs in the committing thread while commits are held, so it must be quick
        (hand the events to an event loop, for example).
        """
        self._listeners.append(listener)

    def on_forget(self, listener: _ForgetListener) -> None:
        """Call ``listener`` after each commit that forgets memories or drops channels,
        with the (channel, memory id) pairs, the channels, and the last event number
        then, under the commit lock (it must be quick)."""
        self._forget_listeners.append(listener)

    def on_purge(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each commit that left bytes for :meth:`purge` to drop
        (in the committing thread, under the commit lock: it must be quick)."""
        self._purge_listeners.append(listener)

    @property
    def purge_pending(self) -> bool:
        """Whether forgotten or dropped bytes may still be on disk (:meth:`purge` drops them)."""
        return bool(self._purging)

    @classmethod
    def open(cls, path: Path, *, model_id: str, dim: int, sync: bool = True) -> MemoryStore:
        """Open (or create) the store at ``path`` for embeddings of ``model_id``; a store
        of an older schema version is migrated first.

        Raises:
            StoreMismatchError: the store was written by another model, or by a newer
                version of Calor.
            StoreInUseError: another process (or another store of this one) holds it.
        """
        path.mkdir(parents=True, exist_ok=True)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        # A write-ahead log made obsolete by a flush is deleted at once, never archived:
        # it may hold the text of what was forgotten since (RocksDB's defaults; said here
        # because forgetting relies on them).
        options.set_wal_ttl_seconds(0)
        options.set_wal_size_limit_mb(0)
        # Memtables of 8 MB (RocksDB's default, 64, held up to 128 MB of recent writes in
        # memory whatever the store's size): flushed a little more often, in the background.
        options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
        # The column family's options said here (else an existing store keeps those it
        # was made with: rocksdict reads them back from its OPTIONS file).
        try:
            db = rocksdict.Rdict(
                str(path / "rocksdb"), options, column_families={"default": options}
            )
        except Exception as error:  # rocksdict raises a bare Exception: "IO error: … LOCK: …"
            if "/LOCK:" not in str(error):
                raise
            raise StoreInUseError(in_use(path)) from error
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
                _write_meta(db, expected, migrate(db, version))
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
        held = self.open_batch()
        for change in changes:
            put_ops(held, change)
        return self.write_batch(held)

    def open_batch(self) -> PendingBatch:
        """An empty write batch that change lists are added to (``put_ops``) before
        :meth:`write_batch` commits it: a big batch can be said a part at a time."""
        self._check_open()
        raw = rocksdict.WriteBatch(raw_mode=True)
        return PendingBatch(LoggedBatch(raw) if self._log is not None else raw, raw)

    def write_batch(self, held: PendingBatch, *, synced: bool = True) -> list[EventRecord]:
        """Commit a batch from :meth:`open_batch` as :meth:`write` does. Unless
        ``synced``, the write returns before its write-ahead log reaches the disk, which
        it does soon after (:mod:`calor.server.storage.wal_sync`)."""
        self._check_open()
        batch = held.raw
        size = batch.size_in_bytes()  # before the write consumes it
        with self._commit_lock:
            numbered, purging = self._finish(held)
            position = self._logged(held.batch) if isinstance(held.batch, LoggedBatch) else None
            if position is not None:
                batch.put(Keys.LOG_POSITION, str(position).encode())
            options = self._write_options if synced else self._soon_options
            try:
                self._db.write(batch, options)
            except Exception as error:  # rocksdict raises a bare Exception: "IO error: …"
                raise _write_refused(error) from error
            if not synced and self._syncer is not None:
                self._syncer.soon()
            self._purging = purging
            if position is not None:
                self.log_position = position
            if numbered:
                self.last_seq = numbered[-1].seq
                for listener in self._listeners:
                    listener(numbered)
            if held.forgotten or held.dropped:
                for forget_listener in self._forget_listeners:
                    forget_listener(set(held.forgotten), set(held.dropped), self.last_seq)
            if held.erased:
                for purge_listener in self._purge_listeners:
                    purge_listener()
        self._flush_if_big(size)  # outside the lock: other commits go on meanwhile
        return numbered

    def _finish(
        self, held: PendingBatch
    ) -> tuple[list[EventRecord], dict[bytes, tuple[bytes, bytes]]]:
        """What a batch adds under the commit lock: scrubs of what it forgets, its events
        numbered, its quotes, the ranges left to purge. Returns the numbered events and
        the purge ranges once it is written."""
        for channel, memory_id in held.forgotten:
            self._scrub(held, Keys.quote(channel, memory_id, b""))
        for channel in held.dropped:
            self._scrub(held, Keys.channel_quotes(channel))
        numbered = [
            self._put_event(held, e.with_seq(self.last_seq + n))
            for n, e in enumerate(held.events, 1)
        ]
        if numbered:
            held.batch.put(Keys.LAST_SEQ, str(numbered[-1].seq).encode())
        for quote in held.quotes:
            self._put_quote(held, quote)
        purging = _merged(self._purging, held.erased)
        if held.erased:
            held.batch.put(Keys.PURGE, _ranges_json(purging))
        return numbered, purging

    def catch_up(self, log: WriteLog) -> int:
        """Apply the write log's entries after :attr:`log_position`, each as one batch
        with its position (cluster mode: a node that does not own the store follows the
        log this way). Returns how many were applied."""
        self._check_open()
        with self._commit_lock:
            return self._apply_entries(log)

    def _apply_entries(self, log: WriteLog) -> int:
        applied = 0
        for position, entry in log.entries_after(self.log_position):
            batch = rocksdict.WriteBatch(raw_mode=True)
            replay(batch, entry)
            batch.put(Keys.LOG_POSITION, str(position).encode())
            self._db.write(batch, self._write_options)
            self.log_position = position
            applied += 1
        if applied:
            self._reload_derived()
        return applied

    def take_over(self, log: WriteLog, attempts: int = 20) -> int:
        """Become the write log's one writer: catch up, then append an empty entry at the
        position caught up to; from then on a commit is written here only once the log
        holds it, and a writer that has not seen that entry is refused. Returns how many
        entries were caught up.

        Raises:
            LogBehindError: Another writer kept appending through every attempt.
        """
        self._check_open()
        applied = 0
        for _ in range(attempts):
            with self._commit_lock:
                applied += self._apply_entries(log)
                try:
                    position = log.append(EMPTY_ENTRY, self.log_position)
                except LogBehindError:
                    continue  # the last owner wrote after the catch-up: catch up again
                self._db.put(Keys.LOG_POSITION, str(position).encode(), self._write_options)
                self.log_position = position
                self._log = log
                return applied
        raise LogBehindError("another writer kept appending to the write log; not taken over")

    @contextmanager
    def commits_held(self) -> Iterator[None]:
        """Commits wait while the caller is inside (one being written finishes first):
        :attr:`log_position` holds still, every append of this store answered."""
        self._check_open()
        with self._commit_lock:
            yield

    def frozen(self) -> tuple[int, Iterator[tuple[bytes, bytes]]]:
        """Every key and its value as of now, with the write-log position they reflect
        (that position's own key left out): a snapshot's content. Commits made while it
        is read do not change what it yields."""
        self._check_open()
        with self._commit_lock:
            view = self._db.snapshot()
            position = self.log_position

        def items() -> Iterator[tuple[bytes, bytes]]:
            for key, value in view.items():
                if key != Keys.LOG_POSITION:
                    yield cast(bytes, key), cast(bytes, value)

        return position, items()

    def restore(self, position: int, entries: Iterable[bytes]) -> None:
        """Replace every key with a snapshot's (``entries`` of puts, as :meth:`frozen`
        read them at write-log ``position``), and compact the old bytes away. A restore
        cut short leaves the store at position 0, to be restored again (cluster mode, on
        a node that does not own the store)."""
        self._check_open()
        assert self._log is None, "the store's writer cannot restore a snapshot"
        with self._commit_lock:
            emptied = rocksdict.WriteBatch(raw_mode=True)
            emptied.delete_range(b"\x00", b"\xff")  # every key: they begin with a letter
            emptied.put(Keys.LOG_POSITION, b"0")
            self._db.write(emptied, self._write_options)
            for entry in entries:
                batch = rocksdict.WriteBatch(raw_mode=True)
                replay(batch, entry)
                self._db.write(batch, self._write_options)
            self._db.put(Keys.LOG_POSITION, str(position).encode(), self._write_options)
            self.log_position = position
            self._reload_derived()
            self._db.flush(wait=True)
            self._db.compact_range(None, None)  # what was here before is gone from disk too

    def _logged(self, batch: LoggedBatch) -> int:
        """Append a commit to the write log (under the commit lock); its position."""
        assert self._log is not None
        return self._log.append(batch.entry(), self.log_position)

    def _flush_if_big(self, size: int) -> None:
        """After a write bigger than a memtable (a bulk store): its memtable, which took
        the whole batch, is written to a table file now rather than held in memory until
        later writes fill it (measured: 26 MB after storing 10,000 short memories), and
        the memory handed back."""
        if size <= _WRITE_BUFFER_BYTES:
            return
        try:
            self._db.flush(wait=True)
        except Exception as error:  # rocksdict raises a bare Exception: "IO error: …"
            log.warning("flushing after a big write failed (it stays in the memtable): %s", error)
            return
        release()

    def _put_event(self, held: PendingBatch, event: EventRecord) -> EventRecord:
        """Put a numbered event; one that may quote its memory is indexed under it, or
        put scrubbed when the memory is forgotten already. Returns what was put."""
        if event.may_quote():
            if self._forgotten(held, event.channel, event.memory_id):
                event = event.scrubbed()
            else:
                index = Keys.quote(event.channel, event.memory_id, Keys.event(event.seq))
                held.batch.put(index, event.scrubbed().to_json())
        held.batch.put(Keys.event(event.seq), event.to_json())
        return event

    def _put_quote(self, held: PendingBatch, quote: Quote) -> None:
        """Put a quote, indexed under its memory; scrubbed when that is forgotten already."""
        if self._forgotten(held, quote.channel, quote.memory_id):
            held.batch.put(quote.key, quote.scrubbed)
        else:
            held.batch.put(quote.key, quote.value)
            held.batch.put(Keys.quote(quote.channel, quote.memory_id, quote.key), quote.scrubbed)

    def _forgotten(self, held: PendingBatch, channel: str, memory_id: str) -> bool:
        """Whether a memory is forgotten (or gone with its channel) as of this batch."""
        if held.gone(channel, memory_id):
            return True
        if (channel, memory_id) in held.added:
            return False
        data = self._db.get(Keys.memory(channel, memory_id))
        return data is None or MemoryRecord.from_json(data).state == DELETED

    def _scrub(self, held: PendingBatch, prefix: bytes) -> None:
        """Put in place the scrubbed form of everything the quote index holds under
        ``prefix`` (one memory's or one channel's), and drop those index entries."""
        for key, scrubbed in self._scan(prefix):
            _, _, quoted = key[2:].split(SEP, 2)
            if self._db.get(quoted) is not None:  # not trimmed from the log, nor finished
                held.batch.put(quoted, scrubbed)
                held.erase(quoted)
            held.batch.delete(key)

    def trim_events(self, keep_after: int) -> None:
        """Drop logged events numbered up to ``keep_after`` (retention)."""
        self._check_open()
        with self._commit_lock:  # never between a forget's read of an event and its rewrite
            try:
                self._db.delete_range(Keys.event(0), Keys.event(keep_after + 1))
            except Exception as error:  # rocksdict raises a bare Exception: "IO error: …"
                raise _write_refused(error) from error

    # --- purging -------------------------------------------------------------------

    def purge(self) -> int:
        """Make RocksDB drop the bytes of what was forgotten or dropped, now.

        Deleted and overwritten values linger in the memtable, the write-ahead log and
        older table files. The memtable is flushed (which makes the log that held them
        obsolete; RocksDB deletes it), then every key range waiting for it is compacted
        down to the last level, which rewrites the files that held old values without
        them; RocksDB deletes the files they replace. Returns how many ranges were
        compacted (0: nothing was waiting).
        """
        with self._purge_lock:
            self._check_open()
            with self._commit_lock:
                ranges = dict(self._purging)
            if not ranges:
                return 0
            self._db.flush(True)
            options = rocksdict.CompactOptions()
            options.set_bottommost_level_compaction(rocksdict.BottommostLevelCompaction.force())
            for start, end in sorted(ranges.values()):
                self._db.compact_range(start, end, options)
            with self._commit_lock:
                left = {f: span for f, span in self._purging.items() if ranges.get(f) != span}
                if left:
                    self._db.put(Keys.PURGE, _ranges_json(left), self._write_options)
                else:
                    self._db.delete(Keys.PURGE, self._write_options)
                self._purging = left
            return len(ranges)

    @property
    def syncing(self) -> bool:
        """Whether a write that did not wait for the disk waits for its sync still."""
        return self._syncer is not None and self._syncer.pending

    def close(self) -> None:
        """Sync, flush and close RocksDB; later calls raise UnavailableError."""
        if self._syncer is not None:
            self._syncer.close()
        with self._purge_lock, self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self._db.close()
                except Exception as error:  # an earlier write failed (a full disk)
                    # What was acknowledged is in the synced write-ahead log; the next
                    # open replays it, so a refused write must not fail the shutdown.
                    log.error("RocksDB closed with an error: %s", error)


def _merged(
    pending: dict[bytes, tuple[bytes, bytes]], erased: Sequence[tuple[bytes, bytes]]
) -> dict[bytes, tuple[bytes, bytes]]:
    """Ranges waiting for a purge, one per key family (its first two bytes), widened to
    cover ``erased``: few compactions however many forgets came in between."""
    merged = dict(pending)
    for start, end in erased:
        family = start[:2]
        low, high = merged.get(family, (start, end))
        merged[family] = (min(low, start), max(high, end))
    return merged


def _ranges_json(ranges: dict[bytes, tuple[bytes, bytes]]) -> bytes:
    return json.dumps([[start.hex(), end.hex()] for start, end in ranges.values()]).encode()


def _ranges_from(saved: bytes | None) -> dict[bytes, tuple[bytes, bytes]]:
    if saved is None:
        return {}
    ranges = [(bytes.fromhex(start), bytes.fromhex(end)) for start, end in json.loads(saved)]
    return _merged({}, ranges)


def _write_meta(db: rocksdict.Rdict, meta: dict[str, object], migrations: list[str]) -> None:
    """Record the schema ``meta`` and the migrations done, synced, in one batch."""
    write_options = rocksdict.WriteOptions()
    write_options.sync = True
    batch = rocksdict.WriteBatch(raw_mode=True)
    batch.put(Keys.META, json.dumps(meta).encode())
    batch.put(Keys.MIGRATIONS, json.dumps(migrations).encode())
    db.write(batch, write_options)
