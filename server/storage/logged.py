"""A write batch that keeps what it writes, so that a commit can go to a write log first
(cluster mode: the log is the truth and RocksDB a view of it).

An entry is the batch's operations in order: ``put``, ``delete`` and ``delete_range`` of
raw keys. Replaying entries in log order onto any store rebuilds the same keys.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Protocol

import rocksdict

from calor.server.errors import StorageError

__all__ = [
    "EMPTY_ENTRY",
    "Batch",
    "LoggedBatch",
    "WriteLog",
    "entry_of_puts",
    "entry_operations",
    "replay",
]

_MAGIC = b"CW1"
EMPTY_ENTRY = _MAGIC
"""An entry that writes nothing: a new owner's mark in the log (see ``MemoryStore.take_over``)."""
_PUT, _DELETE, _DELETE_RANGE = b"P", b"D", b"R"
_LENGTH = struct.Struct(">I")


class WriteLog(Protocol):
    """An ordered, replicated log of commits (cluster mode); see ``calor.server.cluster``."""

    def append(self, entry: bytes, after: int) -> int:
        """Make ``entry`` durable in the log as the entry following position ``after``;
        returns its position.

        Raises:
            LogBehindError: The log holds entries after ``after`` that this store has not
                seen (another writer, or an append whose answer was lost); nothing of
                this entry is in the log.
            UnavailableError: The log could not be reached; nothing of it is in the log.
        """
        ...

    def entries_after(self, position: int) -> Iterator[tuple[int, bytes]]:
        """Every entry after ``position``, in order, with its position.

        Raises:
            LogTrimmedError: The log no longer holds the entry after ``position``.
        """
        ...


class LoggedBatch:
    """A RocksDB write batch (``batch``) that also records its operations as a log entry."""

    def __init__(self, batch: rocksdict.WriteBatch) -> None:
        self.batch = batch
        self._parts: list[bytes] = [_MAGIC]

    def put(self, key: bytes, value: bytes) -> None:
        """Put ``key`` (recorded)."""
        self.batch.put(key, value)
        self._parts += (_PUT, _LENGTH.pack(len(key)), key, _LENGTH.pack(len(value)), value)

    def delete(self, key: bytes) -> None:
        """Delete ``key`` (recorded)."""
        self.batch.delete(key)
        self._parts += (_DELETE, _LENGTH.pack(len(key)), key)

    def delete_range(self, start: bytes, end: bytes) -> None:
        """Delete the keys from ``start`` up to ``end`` (recorded)."""
        self.batch.delete_range(start, end)
        self._parts += (_DELETE_RANGE, _LENGTH.pack(len(start)), start, _LENGTH.pack(len(end)), end)

    def entry(self) -> bytes:
        """What the batch writes, as one log entry."""
        return b"".join(self._parts)


Batch = rocksdict.WriteBatch | LoggedBatch
"""What a commit's keys are put in: a plain batch, or one that keeps a log entry too."""


def entry_of_puts(pairs: Iterable[tuple[bytes, bytes]]) -> bytes:
    """One entry that puts every key of ``pairs`` (a snapshot's part)."""
    parts = [_MAGIC]
    for key, value in pairs:
        parts += (_PUT, _LENGTH.pack(len(key)), key, _LENGTH.pack(len(value)), value)
    return b"".join(parts)


def entry_operations(entry: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
    """The operations of a log entry in order: (kind, key, value or range end; b"" for a
    delete).

    Raises:
        StorageError: ``entry`` is not a whole entry of this format.
    """
    if not entry.startswith(_MAGIC):
        raise StorageError("a write log entry does not start as Calor's entries do")
    view = memoryview(entry)
    at = len(_MAGIC)
    try:
        while at < len(entry):
            kind = bytes(view[at : at + 1])
            key, at = _field(view, at + 1)
            if kind == _DELETE:
                yield kind, key, b""
                continue
            if kind not in (_PUT, _DELETE_RANGE):
                raise StorageError(f"a write log entry holds an unknown operation {kind!r}")
            value, at = _field(view, at)
            yield kind, key, value
    except struct.error as error:
        raise StorageError("a write log entry is cut short") from error


def replay(batch: rocksdict.WriteBatch, entry: bytes) -> None:
    """Add a log entry's operations to ``batch``."""
    for kind, key, value in entry_operations(entry):
        if kind == _DELETE:
            batch.delete(key)
        elif kind == _PUT:
            batch.put(key, value)
        else:
            batch.delete_range(key, value)


def _field(view: memoryview, at: int) -> tuple[bytes, int]:
    (length,) = _LENGTH.unpack_from(view, at)
    start = at + _LENGTH.size
    if start + length > len(view):
        raise StorageError("a write log entry is cut short")
    return bytes(view[start : start + length]), start + length
