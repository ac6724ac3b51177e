"""Feedback on recalls: what a rating applies to, and how each memory type has been rated.

A rating (helpful, unhelpful or partial) is given on a logged recall, optionally naming
the memories it is about, which must be hits of that recall. It applies to the memory
types of the named memories, or of all the recall's hits when none are named; each
type counts once per recall. The last feedback on a recall is the one that counts, and
it lives as long as its recall's entry in the log (:mod:`calor.server.engine.recall_log`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from calor.server.engine.recall_log import RETENTION_SECONDS, RecallEntry, since_id
from calor.server.errors import InvalidArgumentError
from calor.server.storage.ops import PutKey
from calor.server.storage.store import Keys, MemoryStore

__all__ = [
    "RATINGS",
    "FeedbackEntry",
    "TypeTally",
    "feedback_entry",
    "feedback_summary",
    "hint",
    "recent_feedback",
    "tally_by_type",
]

RATINGS = ("helpful", "unhelpful", "partial")
"""What a recall can be rated."""

# What to try when a type's recalls mostly do not help: a type that fades can fade
# faster; one that is meant to last is more likely outdated than too warm.
_FADING = frozenset({"working", "episodic"})


@dataclass(frozen=True)
class FeedbackEntry:
    """The feedback on one recall.

    Attributes:
        recall_id: The recall it rates.
        at: When it was given.
        rating: ``helpful``, ``unhelpful`` or ``partial``.
        memory_ids: The hits it names; empty when it is about the whole recall.
        memory_types: The memory types it applies to, each once, in sorted order.
    """

    recall_id: str
    at: float
    rating: str
    memory_ids: tuple[str, ...]
    memory_types: tuple[str, ...]

    def to_json(self) -> bytes:
        """The entry as stored (under its recall id)."""
        data = {
            "at": self.at,
            "rating": self.rating,
            "memory_ids": list(self.memory_ids),
            "memory_types": list(self.memory_types),
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, recall_id: str, data: bytes) -> FeedbackEntry:
        """An entry as stored under ``recall_id``."""
        loaded = json.loads(data)
        return cls(
            recall_id=recall_id,
            at=float(loaded["at"]),
            rating=str(loaded["rating"]),
            memory_ids=tuple(loaded["memory_ids"]),
            memory_types=tuple(loaded["memory_types"]),
        )

    def put(self, channel: str) -> PutKey:
        """The write that keeps this entry (replacing any earlier one on the recall)."""
        return PutKey(Keys.feedback(channel, self.recall_id), self.to_json())


def feedback_entry(
    recall: RecallEntry, rating: str, memory_ids: Sequence[str], at: float
) -> FeedbackEntry:
    """The feedback ``rating`` on ``recall``, about ``memory_ids`` (all hits if none).

    Raises:
        InvalidArgumentError: The rating is not one of :data:`RATINGS`, or a named
            memory is not a hit of the recall.
    """
    if rating not in RATINGS:
        raise InvalidArgumentError(f"rating: must be one of {', '.join(RATINGS)}, got {rating!r}")
    types = recall.hit_types()
    named = tuple(dict.fromkeys(memory_ids))
    for memory_id in named:
        if memory_id not in types:
            raise InvalidArgumentError(
                f"memory_ids: {memory_id} is not a hit of recall {recall.recall_id}"
            )
    about = named or tuple(types)
    return FeedbackEntry(
        recall_id=recall.recall_id,
        at=at,
        rating=rating,
        memory_ids=named,
        memory_types=tuple(sorted({types[memory_id] for memory_id in about})),
    )


def recent_feedback(store: MemoryStore, channel: str, now: float) -> list[FeedbackEntry]:
    """The feedback on a channel's recalls of the last 30 days, oldest recall first."""
    start = since_id(now - RETENTION_SECONDS)
    return [
        FeedbackEntry.from_json(recall_id, data)
        for recall_id, data in store.feedback_entries(channel, start)
    ]


@dataclass(frozen=True)
class TypeTally:
    """How the recalls that touched one memory type were rated."""

    helpful: int = 0
    unhelpful: int = 0
    partial: int = 0

    @property
    def total(self) -> int:
        """Rated recalls of the type."""
        return self.helpful + self.unhelpful + self.partial

    @property
    def helpful_share(self) -> float:
        """helpful / (helpful + unhelpful + partial); 0 when none were rated."""
        return self.helpful / self.total if self.total else 0.0

    def count(self, rating: str) -> int:
        """The recalls given ``rating``."""
        return {"helpful": self.helpful, "unhelpful": self.unhelpful, "partial": self.partial}[
            rating
        ]


def tally_by_type(entries: Iterable[FeedbackEntry]) -> dict[str, TypeTally]:
    """Each memory type's tally over ``entries``, by type name in sorted order."""
    counts: dict[str, dict[str, int]] = {}
    for entry in entries:
        for memory_type in entry.memory_types:
            per_type = counts.setdefault(memory_type, dict.fromkeys(RATINGS, 0))
            per_type[entry.rating] += 1
    return {name: TypeTally(**counts[name]) for name in sorted(counts)}


def hint(memory_type: str, tally: TypeTally) -> str:
    """Plain-language advice when fewer than half of a type's rated recalls helped; ""
    otherwise."""
    if not tally.total or tally.helpful_share >= 0.5:
        return ""
    mostly = "unhelpful" if tally.unhelpful >= tally.partial else "only partly helpful"
    if memory_type in _FADING:
        advice = f"consider a shorter {memory_type} half-life"
    else:
        advice = f"check for outdated {memory_type} memories and correct or forget them"
    return (
        f"{memory_type} recalls are mostly {mostly} "
        f"({tally.helpful} of {tally.total} helpful); {advice}"
    )


WORKING_SHARE = 0.9
"""Helpful share above which every rated type counts as working."""
WORKING_RATINGS = 20
"""Ratings a type needs before its share counts."""


def feedback_summary(tallies: Mapping[str, TypeTally]) -> str:
    """Plain language over every rated type: that the settings are working when each was
    more than 90% helpful over at least 20 ratings; "" while that cannot be said."""
    if not tallies or any(
        tally.total < WORKING_RATINGS or tally.helpful_share <= WORKING_SHARE
        for tally in tallies.values()
    ):
        return ""
    rated = sum(tally.total for tally in tallies.values())
    helpful = sum(tally.helpful for tally in tallies.values())
    names = ", ".join(tallies)
    return (
        f"the settings are working: every rated type ({names}) was more than "
        f"{WORKING_SHARE:.0%} helpful, {helpful} of {rated} rated recalls in all"
    )
