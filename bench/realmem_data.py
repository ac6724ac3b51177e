"""RealMem personas as the RealMem bench sees them: turns to store, queries to ask, gold.

One persona is one long conversation (``../shared/data/realmem``, Apache-2.0): about 200
sessions in time order, each a list of turns. Every turn becomes one memory
(``speaker: content``, or the content alone), ``created_at`` its session's date at
midnight UTC plus its position among the persona's turns in seconds, so turns keep
their order within a day. A query is a user turn marked ``is_query``; its gold is the
``memory_session_uuids`` of the assistant turn right after it, kept only where the
session comes before the query's own; a query with none left is not scored. Its gold
turns are the turns the memories that reply used (``memory_used``) were taken from:
each is one of its session's ``extracted_memory``, whose ``source_content_snapshot``
is the text of that turn (the turn that starts with it, or else the one its
``source_turn`` numbers from 1), so recall can also be scored message by message.

The service under test sees only :class:`Turn` ``text`` and ``created_at`` and the
query's ``text``; session uuids and the evidence stay here, where the scorer reads them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "realmem"
SUFFIX = "_dialogues_256k.json"


@dataclass(frozen=True, slots=True)
class Turn:
    """One conversation turn, stored as one memory."""

    text: str
    session: int
    created_at: float


@dataclass(frozen=True, slots=True)
class Session:
    """A session's turns, ``turns[first:end]`` of its persona, and when it took place."""

    uuid: str
    date: str
    first: int
    end: int
    starts_at: float
    ends_at: float


@dataclass(frozen=True, slots=True)
class Query:
    """A scored query: asked at the start of ``session``, answered from ``evidence``
    (indices of earlier sessions)."""

    query_id: str
    text: str
    session: int
    evidence: frozenset[int]
    category: str
    evidence_turns: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Persona:
    """One persona's turns and sessions in time order, its scored queries, and a tally
    of what loading left out (``notes``)."""

    name: str
    turns: tuple[Turn, ...]
    sessions: tuple[Session, ...]
    queries: tuple[Query, ...]
    notes: dict[str, int]

    @property
    def digest(self) -> str:
        """Names exactly the texts embedded for this persona, for the vector cache."""
        h = hashlib.sha256()
        for turn in self.turns:
            h.update(b"\0t" + turn.text.encode())
        for query in self.queries:
            h.update(b"\0q" + query.text.encode())
        return h.hexdigest()[:16]


def names(limit: int | None = None) -> list[str]:
    """The personas' names in alphabetical order, the first ``limit`` of them."""
    found = sorted(p.name.removesuffix(SUFFIX) for p in DATA.glob(f"*{SUFFIX}"))
    if not found:
        raise SystemExit(f"RealMem data not found under {DATA}")
    return found[:limit]


def load(name: str, role: bool = True) -> Persona:
    """One persona; ``role`` prefixes each stored text with its speaker (``user: ...``)."""
    with (DATA / f"{name}{SUFFIX}").open(encoding="utf-8") as f:
        raw: list[dict[str, Any]] = json.load(f)["dialogues"]
    notes: Counter[str] = Counter()
    ordered = sorted(raw, key=lambda s: _date(s["current_time"]))  # stable: ties keep file order
    notes["sessions filed after a later-dated one"] = sum(
        _date(a["current_time"]) > _date(b["current_time"]) for a, b in pairwise(raw)
    )
    index = {str(s["session_uuid"]): i for i, s in enumerate(ordered)}
    stored_at: list[dict[int, int]] = []  # per session: position in it → turn index
    turns: list[Turn] = []
    sessions: list[Session] = []
    queries: list[Query] = []
    for number, session in enumerate(ordered):
        midnight = _date(session["current_time"]).timestamp()
        first = len(turns)
        said = session["dialogue_turns"]
        stored_at.append({})
        for position, turn in enumerate(said):
            if _is_query(turn):
                answer = said[position + 1] if position + 1 < len(said) else {}
                query = _query(name, number, position, turn, answer, index, notes)
                if query is not None:
                    gold = _evidence_turns(answer, ordered, index, stored_at, number, notes)
                    queries.append(replace(query, evidence_turns=gold))
            content = str(turn["content"]).strip()
            if not content:
                notes["empty turns not stored"] += 1
                continue
            text = f"{str(turn['speaker']).lower()}: {content}" if role else content
            stored_at[number][position] = len(turns)
            turns.append(Turn(text, number, midnight + len(turns)))
        end = len(turns)
        uuid, date = str(session["session_uuid"]), str(session["current_time"])
        sessions.append(Session(uuid, date, first, end, midnight + first, midnight + end))
    return Persona(name, tuple(turns), tuple(sessions), tuple(queries), dict(notes))


def _query(
    persona: str,
    session: int,
    position: int,
    turn: dict[str, Any],
    answer: dict[str, Any],
    index: dict[str, int],
    notes: Counter[str],
) -> Query | None:
    """The query ``turn`` with its evidence from ``answer``, or None (and why, in notes)."""
    notes["queries (is_query)"] += 1
    uuids = answer.get("memory_session_uuids") if answer.get("speaker") == "Assistant" else None
    if not uuids:
        notes["skipped: no evidence on the next turn"] += 1
        return None
    known = [index[u] for u in uuids if u in index]
    notes["evidence uuids not in the persona"] += len(uuids) - len(known)
    earlier = frozenset(i for i in known if i < session)
    notes["evidence links to the query's own session"] += sum(i == session for i in known)
    notes["evidence links to later sessions"] += sum(i > session for i in known)
    if not earlier:
        notes["skipped: no evidence in earlier sessions"] += 1
        return None
    query_id = str(turn.get("query_id", "None"))
    if query_id == "None":
        query_id = f"{persona}:{session}:{position}"
    category = str(turn.get("category_name") or "unknown")
    return Query(query_id, str(turn["content"]).strip(), session, earlier, category)


def _evidence_turns(
    answer: dict[str, Any],
    ordered: list[dict[str, Any]],
    index: dict[str, int],
    stored_at: list[dict[int, int]],
    session: int,
    notes: Counter[str],
) -> frozenset[int]:
    """The stored turns of earlier sessions that the memories ``answer`` used came from."""
    found: set[int] = set()
    for used in answer.get("memory_used") or []:
        number = index.get(str(used.get("session_uuid")), session)
        if number >= session:
            continue
        content = str(used.get("content", "")).strip()
        source = ordered[number]
        extracted = [m for m in source["extracted_memory"] if str(m["content"]).strip() == content]
        if not extracted:
            notes["used memories not among their session's extracted ones"] += 1
            continue
        position = _source_position(source["dialogue_turns"], extracted[0])
        if position is None or position not in stored_at[number]:
            notes["used memories whose turn is not found"] += 1
            continue
        found.add(stored_at[number][position])
    return frozenset(found)


def _source_position(said: list[dict[str, Any]], memory: dict[str, Any]) -> int | None:
    """The position of the turn an extracted memory came from: the one turn its snapshot
    starts, or else ``source_turn`` (numbered from 1)."""
    snapshot = str(memory.get("source_content_snapshot") or "").strip()[:80]
    if snapshot:
        starts = [i for i, t in enumerate(said) if str(t["content"]).strip().startswith(snapshot)]
        if len(starts) == 1:
            return starts[0]
    number = memory.get("source_turn")
    if isinstance(number, int) and 1 <= number <= len(said):
        return number - 1
    return None


def _is_query(turn: dict[str, Any]) -> bool:
    """``is_query`` is the string "True" in the files; a bool is taken too."""
    return turn.get("speaker") == "User" and str(turn.get("is_query")) == "True"


def _date(text: str) -> datetime:
    """``2025-12-19 (Friday)`` as midnight UTC of that day."""
    return datetime.strptime(text.split(" ", 1)[0], "%Y-%m-%d").replace(tzinfo=UTC)
