"""The memory record as RocksDB keeps it, and its JSON encoding.

Times are float seconds since the Unix epoch (UTC). Heat is stored as ``heat0`` at
``t0``; the current heat is a function of the clock (see ``heat.py``).
"""

from __future__ import annotations

import json
import operator
import sys
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["ACTIVE", "ARCHIVED", "COLD", "DELETED", "GHOST", "MERGED", "MemoryRecord"]

ACTIVE = "active"
COLD = "cold"
ARCHIVED = "archived"
GHOST = "ghost"
MERGED = "merged"
DELETED = "deleted"


@dataclass(slots=True)
class MemoryRecord:
    """One memory: what was stored, and the state its heat is computed from."""

    id: str
    channel: str
    text: str
    memory_type: str
    created_at: float
    updated_at: float
    heat0: float
    t0: float
    stability: float = 1.0
    importance: float = 0.5
    utility: float = 0.5
    recall_count: int = 0
    last_recalled_at: float | None = None
    keystone: bool = False
    state: str = ACTIVE
    tags: dict[str, str] = field(default_factory=dict)
    entities: list[str] = field(default_factory=list)
    source: str = "agent"
    confidence: str = "observed"
    provenance: dict[str, str] = field(default_factory=dict)
    merged_into: str = ""
    merged_from: list[str] = field(default_factory=list)
    idempotency_key: str = ""
    interactions0: int = 0
    recall_times: list[float] = field(default_factory=list)
    confirmations: int = 0
    valence: float = 0.0
    session: str = ""
    surprise: float = 0.0
    importance_adjustment: float = 0.0
    classifier_version: int = 0
    """The version of the type classifier that inferred ``memory_type``; 0 when the type
    was given (by the caller, an import or a dream's promotion) and is never re-read."""
    heat_history: list[list[Any]] | None = None
    """The latest jumps of its heat and the pieces they began, oldest first (see
    ``thermo/history.py``): empty until its heat first changes after the store; ``None``
    for a memory stored before histories were kept."""

    @property
    def superseded(self) -> bool:
        """Whether a newer memory supersedes this one (``Update(supersedes=)``) or it was
        deprecated (the trigger action): what it says is settled, and it ranks lower."""
        return self.tags.get("deprecated") == "true" or bool(self.tags.get("superseded_by"))

    def to_json(self) -> bytes:
        """The record as compact UTF-8 JSON."""
        # Every field is a JSON value already (no nested dataclasses): no asdict deep copy.
        values = dict(zip(_FIELDS, _values(self), strict=True))
        return _ENCODER.encode(values).encode()

    def copy(self) -> MemoryRecord:
        """A shallow copy (tags and lists are replaced, never mutated in place)."""
        return MemoryRecord(*_values(self))

    @classmethod
    def from_json(cls, data: bytes) -> MemoryRecord:
        """A record from :meth:`to_json` output; unknown keys from newer versions are ignored."""
        raw: dict[str, Any] = json.loads(data)
        for name in _SHARED:  # one string for each id and each repeated word in memory
            value = raw.get(name)
            if isinstance(value, str):
                raw[name] = sys.intern(value)
        if tuple(raw) == _FIELDS:  # as this version writes it: every field, in order
            return cls(*raw.values())
        return cls(**{k: v for k, v in raw.items() if k in _KNOWN})


_FIELDS = tuple(f.name for f in fields(MemoryRecord))
_KNOWN = frozenset(_FIELDS)
_SHARED = ("id", "channel", "memory_type", "state", "source", "confidence", "session")
_values = operator.attrgetter(*_FIELDS)  # every field's value, in declaration order
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
