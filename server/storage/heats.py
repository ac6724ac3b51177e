"""A memory's heat kept beside its record.

Resonance changes the heat of hundreds of memories per recall in a large channel and
nothing else about them. Rather than rewrite each whole record, a :class:`~calor.
server.storage.ops.SetHeat` writes 24 bytes per memory under its own key (``w:``);
every read of the record puts them back on it, and the next write of the whole
record (which carries them) deletes the key.
"""

from __future__ import annotations

import struct

from calor.server.records import MemoryRecord

__all__ = ["heat_bytes", "with_heat"]

_HEAT = struct.Struct("<ddq")  # heat0, the moment it was materialised, interactions then


def heat_bytes(heat0: float, at: float, interactions: int) -> bytes:
    """A memory's materialised heat, as stored."""
    return _HEAT.pack(heat0, at, interactions)


def with_heat(record: MemoryRecord, data: bytes) -> MemoryRecord:
    """The record with the heat stored beside it (changed in place: a record just read)."""
    record.heat0, record.t0, record.interactions0 = _HEAT.unpack(data)
    record.updated_at = record.t0
    return record
