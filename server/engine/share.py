"""Share (DESIGN §9): a memory copied into another channel, as a new memory of its own.

The copy's text says where it came from (``[Shared by CHANNEL] ``) and its provenance
names the source channel and id; its type and tags are kept. It goes through the
store pipeline like any new memory, so it starts with its own heat, importance and
links in the target channel. It reuses the source's embedding: the prefix names where
the memory came from, not what it says, and embedding it would pull every memory
shared from one channel toward the others (and toward queries naming that channel)
while costing a model call for nothing the meaning needs. The lexical index does read
the prefix, so "shared by agent-7" still finds them by words.
"""

from __future__ import annotations

from calor.server.commands import NewMemory
from calor.server.records import MemoryRecord

__all__ = ["shared_copy", "shared_prefix"]


def shared_prefix(channel: str) -> str:
    """What a memory shared from ``channel`` starts with."""
    return f"[Shared by {channel}] "


def shared_copy(record: MemoryRecord, target: str) -> NewMemory:
    """The memory to store in ``target`` for a share of ``record`` (as it stands now).

    The source's own provenance is not carried over: it names memories of the source
    channel (near-duplicates, imports) that mean nothing in the target.
    """
    return NewMemory(
        channel=target,
        text=shared_prefix(record.channel) + record.text,
        memory_type=record.memory_type,
        tags=dict(record.tags),
        source=record.source,
        confidence=record.confidence,
        provenance={"shared_from_channel": record.channel, "shared_from_id": record.id},
    )
