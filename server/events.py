"""Memory events as records: what happened, to which memory, in which channel, and when.

Events are written to RocksDB in the same atomic batch as the change they report,
each with a per-server sequence number given at commit, so the log never holds an
event for a change that did not happen, nor misses one that did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from calor.server.records import MemoryRecord

__all__ = [
    "EVENT_KINDS",
    "LOG_LAST_SEQ_KEY",
    "LOG_OLDEST_SEQ_KEY",
    "Cause",
    "EventRecord",
    "memory_event",
]

LOG_LAST_SEQ_KEY = "calor-log-last-seq"
"""Trailing metadata of an OUT_OF_RANGE answer: the log's last sequence."""
LOG_OLDEST_SEQ_KEY = "calor-log-oldest-seq"
"""Trailing metadata of an OUT_OF_RANGE answer: the oldest sequence the log retains."""

EVENT_KINDS = (
    "on_store",
    "on_recall",
    "on_boost",
    "on_decay",
    "notify",
    "dream",
    "pin",
    "tag",
    "deprecate",
    "webhook",
    "chain",
)


@dataclass(frozen=True)
class EventRecord:
    """One logged event. ``seq`` is 0 until the event is committed."""

    kind: str
    channel: str
    at: float
    memory_id: str = ""
    trigger_id: str = ""
    message: str = ""
    payload: dict[str, str] = field(default_factory=dict)
    seq: int = 0

    def with_seq(self, seq: int) -> EventRecord:
        """The same event, numbered."""
        return replace(self, seq=seq)

    def may_quote(self) -> bool:
        """Whether the event may carry a piece of its memory's text: a message about a
        memory (a notify template can hold ``{text}``). The store indexes such events under
        their memory, so forgetting it rewrites them (:meth:`scrubbed`)."""
        return bool(self.memory_id and self.message)

    def scrubbed(self) -> EventRecord:
        """The same event (same number) without its message, marked ``forgotten`` in its
        payload: what stays of it once its memory is forgotten."""
        return replace(self, message="", payload={**self.payload, "forgotten": "true"})

    def to_json(self) -> bytes:
        """The event as JSON, for the log."""
        # Every field is a JSON value already (the payload a flat dict): no asdict deep copy.
        return json.dumps(self.__dict__, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, data: bytes) -> EventRecord:
        """An event from :meth:`to_json`."""
        raw: dict[str, Any] = json.loads(data)
        return cls(**raw)


@dataclass(frozen=True)
class Cause:
    """Why a change happened when a trigger made it: the trigger, the chain of
    triggers that led to it (for depth limits and cycle detection), and the
    sequence number of the logged event that set it off (0 for a decay crossing)."""

    trigger_id: str
    chain: tuple[str, ...] = ()
    seq: int = 0

    @property
    def depth(self) -> int:
        """How many triggers deep this change is."""
        return len(self.chain)

    def payload(self) -> dict[str, str]:
        """The event payload fields that carry the cause."""
        return {"chain": ",".join(self.chain), "depth": str(self.depth), "cause_seq": str(self.seq)}

    @classmethod
    def of(cls, event: EventRecord) -> tuple[str, ...]:
        """The chain of triggers behind an event (empty for a user's own action)."""
        chain = event.payload.get("chain", "")
        return tuple(chain.split(",")) if chain else ()


def memory_event(
    kind: str,
    record: MemoryRecord,
    at: float,
    heat: float,
    cause: Cause | None = None,
    **extra: str,
) -> EventRecord:
    """The event a change to a memory logs, with its type and heat in the payload."""
    payload = {"memory_type": record.memory_type, "heat": f"{heat:.6f}", **extra}
    if cause is not None:
        payload.update(cause.payload())
    return EventRecord(
        kind=kind,
        channel=record.channel,
        at=at,
        memory_id=record.id,
        trigger_id=cause.trigger_id if cause is not None else "",
        payload=payload,
    )
