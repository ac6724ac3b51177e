"""A store's keys as of one write-log position, as a file (cluster mode): a node that
joins, or that fell behind a log trimmed since, starts from a snapshot and the log's
tail instead of replaying the whole log.

The file is ``CS1``, the position (8 bytes, big-endian), then frames: a 4-byte length
and a write-log entry of puts (about a megabyte each; see
:func:`calor.server.storage.logged.entry_of_puts`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from itertools import islice
from typing import BinaryIO

from calor.server.errors import StorageError
from calor.server.storage.logged import entry_of_puts
from calor.server.storage.store import MemoryStore

__all__ = ["load", "save"]

_MAGIC = b"CS1"
_POSITION = struct.Struct(">Q")
_FRAME = struct.Struct(">I")
_PAIRS_PER_ENTRY = 512  # a memory's record and vector are about 2 KB


def save(store: MemoryStore, out: BinaryIO) -> int:
    """Write the store's keys as of now to ``out``; returns the write-log position they
    reflect."""
    position, pairs = store.frozen()
    out.write(_MAGIC + _POSITION.pack(position))
    while chunk := list(islice(pairs, _PAIRS_PER_ENTRY)):
        entry = entry_of_puts(chunk)
        out.write(_FRAME.pack(len(entry)))
        out.write(entry)
    out.flush()
    return position


def load(store: MemoryStore, source: BinaryIO) -> int:
    """Replace the store's keys with the snapshot read from ``source``; returns its
    position.

    Raises:
        StorageError: ``source`` is not a whole snapshot (nothing is changed when its
            beginning is wrong; a snapshot cut short leaves the store at position 0).
    """
    head = source.read(len(_MAGIC) + _POSITION.size)
    if len(head) != len(_MAGIC) + _POSITION.size or not head.startswith(_MAGIC):
        raise StorageError("not a Calor snapshot")
    (position,) = _POSITION.unpack_from(head, len(_MAGIC))
    store.restore(position, _entries(source))
    return int(position)


def _entries(source: BinaryIO) -> Iterator[bytes]:
    while frame := source.read(_FRAME.size):
        if len(frame) != _FRAME.size:
            raise StorageError("a snapshot is cut short")
        (length,) = _FRAME.unpack(frame)
        entry = source.read(length)
        if len(entry) != length:
            raise StorageError("a snapshot is cut short")
        yield entry
