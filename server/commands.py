"""Validated requests, as plain frozen records the engine acts on (no protobuf below here)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ListQuery", "NewMemory", "RecallQuery", "TagFilter", "UpdateChange"]

TagFilter = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class NewMemory:
    """A memory to store; ``memory_type`` None means classify it."""

    channel: str
    text: str
    memory_type: str | None = None
    importance: float | None = None
    keystone: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    source: str = "agent"
    confidence: str = "observed"
    idempotency_key: str = ""
    created_at: float | None = None
    provenance: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecallQuery:
    """What to look for, where, and whether the recall counts (``peek`` off)."""

    channel: str
    query: str
    limit: int = 10
    channels: tuple[str, ...] = ()
    memory_types: frozenset[str] = frozenset()
    states: frozenset[str] = frozenset()
    tags: TagFilter = ()
    time_from: float | None = None
    time_to: float | None = None
    min_heat: float = 0.0
    peek: bool = False
    include_archived: bool = False
    as_of: float | None = None


@dataclass(frozen=True)
class ListQuery:
    """A page of a channel's memories, oldest id first."""

    channel: str
    page_size: int = 100
    after_id: str = ""
    memory_types: frozenset[str] = frozenset()
    states: frozenset[str] = frozenset()
    tags: TagFilter = ()
    time_from: float | None = None
    time_to: float | None = None


@dataclass(frozen=True)
class UpdateChange:
    """A correction to one memory; None leaves a field as it is."""

    channel: str
    memory_id: str
    text: str | None = None
    memory_type: str | None = None
    tags: dict[str, str] | None = None
    importance: float | None = None
    supersedes: str = ""
