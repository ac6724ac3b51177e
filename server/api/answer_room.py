"""How much of a ranked answer fits in one gRPC message (``--max-message-bytes``).

A recall's hits are measured before they are recalled, so that the hits an answer cannot
carry are left out and never heated: an answer is cut, not refused after its effects
were made. A cheap bound from the records' string lengths decides most recalls; only
when it says the answer might not fit are the hits measured as the messages they become.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from google.protobuf.message import Message

from calor.server.api.convert import hit_message, memory_message
from calor.server.engine.recall_log import ForeignHit
from calor.server.errors import ResourceExhaustedError
from calor.server.recall.ranking import Hit
from calor.server.records import MemoryRecord

__all__ = ["ANSWER_SLACK", "hits_that_fit", "messages_that_fit"]

_M = TypeVar("_M", bound=Message)

ANSWER_SLACK = 1024
"""Bytes of an answer kept for what is not its memories (a recall id, a time window, a
page token, flags)."""

_HIT_SLACK = 192
"""Bytes a hit may take beyond its memory as measured before the recall: its scores
and framing, and what recalling it changes (a count that grows a byte, a last recall
time that appears, a new t0)."""

_STRING_SLACK = 8  # a string's tag and length (and a map entry's framing)
_RECORD_FIXED = 512  # numbers, enums and timestamps of one memory, framing included


def _bound(record: MemoryRecord) -> int:
    """An upper bound on the bytes ``record`` takes as a hit (4 bytes per character:
    UTF-8's most)."""
    strings = [record.id, record.channel, record.text, record.merged_into]
    strings += record.entities
    strings += record.merged_from
    for mapping in (record.tags, record.provenance):
        for key, value in mapping.items():
            strings += (key, value)
    return _RECORD_FIXED + _HIT_SLACK + sum(4 * len(s) + _STRING_SLACK for s in strings)


def _size(hit: Hit | ForeignHit) -> int:
    """The bytes ``hit`` takes in an answer, at most."""
    if isinstance(hit, ForeignHit):
        assert isinstance(hit.reply, Message)
        return hit.reply.ByteSize() + _STRING_SLACK
    return hit_message(hit, memory_message(hit.record, 0.0)).ByteSize() + _HIT_SLACK


def hits_that_fit(hits: Sequence[Hit | ForeignHit], max_bytes: int) -> int:
    """How many of ``hits`` (best first) one answer of at most ``max_bytes`` carries."""
    budget = max_bytes - ANSWER_SLACK
    rough = sum(_bound(h.record) if isinstance(h, Hit) else _size(h) for h in hits)
    if rough <= budget:
        return len(hits)
    used = 0
    for count, hit in enumerate(hits):
        used += _size(hit)
        if used > budget:
            return count
    return len(hits)


def messages_that_fit(messages: Iterable[_M], max_bytes: int) -> list[_M]:
    """The first of ``messages`` that one answer of at most ``max_bytes`` carries as a
    repeated field (a page: the rest is for its next page).

    Raises:
        ResourceExhaustedError: Not even the first fits.
    """
    budget, used = max_bytes - ANSWER_SLACK, 0
    kept: list[_M] = []
    for message in messages:
        used += message.ByteSize() + _STRING_SLACK
        if used > budget:
            if not kept:
                raise ResourceExhaustedError(
                    "one memory alone is larger than one answer may be (the server's "
                    "--max-message-bytes)"
                )
            break
        kept.append(message)
    return kept
