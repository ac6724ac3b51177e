"""LongMemEval questions as the quality bench sees them: turns to store, gold to score.

The service under test sees only what :class:`Turn` exposes: ``text``, ``created_at``,
``session`` (an opaque counter, 0, 1, 2… in haystack order) and ``by_user`` (who spoke,
which the text's ``user:`` / ``assistant:`` label says anyway). The
dataset's session ids and ``has_answer`` flags stay here, where the scorer reads them.

Two protocols say how much of that a client tells the service (:func:`told`,
:func:`as_of`): ``metadata`` (each turn episodic, its session counter as a ``session``
tag, ``source`` human or agent by who spoke; the question asked ``as_of`` its date) and
``bare`` (the text and ``created_at`` only, as a client storing plain text would; the
question asked with no ``as_of``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import longreplies

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
SPLITS = {
    "oracle": DATA / "longmemeval_oracle.json",
    "s": DATA / "longmemeval_s_498.json.gz",
}
# Splits built here from a file split (``longreplies.py``): name → the split it reads.
BUILT_SPLITS = {longreplies.NAME: "s"}
SPLIT_NAMES = (*SPLITS, *BUILT_SPLITS)
ABSTENTION_SUFFIX = "_abs"
PROTOCOLS = ("metadata", "bare")
EVIDENCE_PREFIX = "answer"
_DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"


@dataclass(frozen=True, slots=True)
class Turn:
    """One conversation turn, stored as one memory."""

    text: str
    session: int
    created_at: datetime
    by_user: bool


@dataclass(frozen=True, slots=True)
class Question:
    """One scored question: its haystack turns and which of them hold the answer."""

    question_id: str
    question_type: str
    text: str
    asked_at: datetime
    turns: tuple[Turn, ...]
    gold_turns: frozenset[int]
    gold_sessions: frozenset[int]

    @property
    def digest(self) -> str:
        """Names exactly the texts this question embeds, for the vector cache."""
        h = hashlib.sha256(self.text.encode())
        for turn in self.turns:
            h.update(b"\0" + turn.text.encode())
        return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Told:
    """What a protocol tells the service of a turn besides its text and ``created_at``:
    ``None`` and an empty dict mean nothing (the service decides)."""

    memory_type: str | None
    tags: dict[str, str]
    source: str | None


def told(turn: Turn, protocol: str) -> Told:
    """What ``protocol`` tells the service of ``turn``."""
    if protocol == "bare":
        return Told(None, {}, None)
    if protocol != "metadata":
        raise ValueError(f"unknown protocol {protocol!r}; one of {PROTOCOLS}")
    return Told("episodic", {"session": str(turn.session)}, "human" if turn.by_user else "agent")


def as_of(question: Question, protocol: str) -> datetime | None:
    """The moment ``protocol`` asks the question as of (None: now)."""
    return question.asked_at if protocol == "metadata" else None


def parse_date(text: str) -> datetime:
    """``2023/05/30 (Tue) 23:40`` as an aware UTC datetime."""
    return datetime.strptime(text, _DATE_FORMAT).replace(tzinfo=UTC)


def _question(item: dict[str, Any]) -> Question:
    turns: list[Turn] = []
    gold_turns: set[int] = set()
    gold_sessions: set[int] = set()
    sessions = zip(
        item["haystack_session_ids"], item["haystack_dates"], item["haystack_sessions"], strict=True
    )
    for index, (session_id, date, session) in enumerate(sessions):
        evidence = str(session_id).startswith(EVIDENCE_PREFIX)
        if evidence:
            gold_sessions.add(index)
        created_at = parse_date(date)
        for turn in session:
            content = str(turn["content"]).strip()
            if not content:
                continue
            if evidence and turn.get("has_answer"):
                gold_turns.add(len(turns))
            role = str(turn["role"])
            turns.append(Turn(f"{role}: {content}", index, created_at, role == "user"))
    return Question(
        question_id=str(item["question_id"]),
        question_type=str(item["question_type"]),
        text=str(item["question"]),
        asked_at=parse_date(item["question_date"]),
        turns=tuple(turns),
        gold_turns=frozenset(gold_turns),
        gold_sessions=frozenset(gold_sessions),
    )


def load(split: str, limit: int | None = None) -> list[Question]:
    """The split's scored questions (abstention questions skipped), first ``limit`` of them."""
    path = SPLITS[BUILT_SPLITS.get(split, split)]
    if not path.is_file():
        raise SystemExit(f"LongMemEval {split!r} split not found at {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        items: list[dict[str, Any]] = json.load(f)
    if split == longreplies.NAME:
        items = longreplies.build(items)
    return list(_scored(items, limit))


def _scored(items: list[dict[str, Any]], limit: int | None) -> Iterator[Question]:
    count = 0
    for item in items:
        if str(item["question_id"]).endswith(ABSTENTION_SUFFIX):
            continue
        if limit is not None and count >= limit:
            return
        count += 1
        yield _question(item)
