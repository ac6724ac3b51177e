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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from calor.server.commands import NewMemory

__all__ = ["Shareable", "SharedSource", "shared_copy", "shared_prefix"]


class Shareable(Protocol):
    """What a share copies of a memory (a record has all of it)."""

    @property
    def channel(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def memory_type(self) -> str: ...
    @property
    def tags(self) -> Mapping[str, str]: ...
    @property
    def source(self) -> str: ...
    @property
    def confidence(self) -> str: ...


@dataclass(frozen=True)
class SharedSource:
    """A :class:`Shareable` memory as another shard's owner answered it (cluster mode: a
    share into a channel of another shard)."""

    channel: str
    id: str
    text: str
    memory_type: str
    tags: Mapping[str, str]
    source: str
    confidence: str


def shared_prefix(channel: str) -> str:
    """What a memory shared from ``channel`` starts with."""
    return f"[Shared by {channel}] "


def shared_copy(record: Shareable, target: str) -> NewMemory:
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
