"""A split built here from LongMemEval S: what the user said, among long assistant replies.

The issue-33 robustness set. Every scored S question whose answer lies in the *user's*
turns only (abstention questions left out) keeps its evidence sessions; the rest of its
haystack is replaced by :data:`FILLERS` sessions whose assistant replies run long (on
average at least :data:`LONG_REPLY_CHARS` characters: prose and code that shares many
words with everything else), drawn from a fixed pool of :data:`POOL` such sessions of
the whole S file, so the texts repeat across questions and embed once. The fillers take
the dates of sessions the question's own haystack held, so the timeline stays the
question's; all sessions are then ordered by date. Every draw is seeded by the question
id: the split is the same on every machine. The questions come one type at a time in
turn, so the first N hold every type.

It tests what the data's own haystacks test less: generic questions ("what did I say
about…") over a channel where most memories are long and lexically alike.
"""

from __future__ import annotations

import random
from typing import Any

NAME = "long-replies"
LONG_REPLY_CHARS = 2000
POOL = 400
FILLERS = 25
_SEED = "calor-long-replies-1"


def build(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The split's items, in LongMemEval's own JSON shape, from the S file's ``items``
    (abstention questions included; :func:`longmemeval.load` skips them as for S)."""
    pool = _long_reply_pool(items)
    built = []
    for item in items:
        if str(item["question_id"]).endswith("_abs") or not _asked_about_user(item):
            continue
        draw = random.Random(f"{_SEED}:{item['question_id']}")
        kept = [
            (str(sid), str(date), session)
            for sid, date, session in _sessions(item)
            if _evidence(sid)
        ]
        dates = [str(date) for sid, date, _ in _sessions(item) if not _evidence(sid)]
        fillers = draw.sample(pool, min(FILLERS, len(pool)))
        filler_dates = draw.sample(dates, min(len(dates), len(fillers)))
        kept += [
            (sid, date, session)
            for (sid, session), date in zip(fillers, filler_dates, strict=False)
        ]
        kept.sort(key=lambda s: _sortable(s[1]))
        built.append(
            {
                **item,
                "question_id": f"{item['question_id']}-{NAME}",
                "haystack_session_ids": [s[0] for s in kept],
                "haystack_dates": [s[1] for s in kept],
                "haystack_sessions": [s[2] for s in kept],
            }
        )
    return _by_type_in_turn(built)


def _by_type_in_turn(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One question of each type in turn (the S file is grouped by type), so that the
    first N questions hold every type."""
    queues: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        queues.setdefault(str(item["question_type"]), []).append(item)
    mixed = []
    while any(queues.values()):
        for queue in queues.values():
            if queue:
                mixed.append(queue.pop(0))
    return mixed


def _long_reply_pool(items: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Non-evidence sessions whose assistant replies average ``LONG_REPLY_CHARS`` or more,
    each once, ``POOL`` of them chosen with the split's seed."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        for sid, _, session in _sessions(item):
            if _evidence(sid) or str(sid) in seen:
                continue
            replies = [len(str(t["content"])) for t in session if t["role"] == "assistant"]
            if replies and sum(replies) / len(replies) >= LONG_REPLY_CHARS:
                seen[str(sid)] = session
    ordered = sorted(seen.items())
    return random.Random(_SEED).sample(ordered, min(POOL, len(ordered)))


def _asked_about_user(item: dict[str, Any]) -> bool:
    """Whether every turn holding the answer is the user's."""
    roles = [
        turn["role"]
        for sid, _, session in _sessions(item)
        if _evidence(sid)
        for turn in session
        if turn.get("has_answer")
    ]
    return bool(roles) and all(role == "user" for role in roles)


def _sessions(item: dict[str, Any]) -> Any:
    return zip(
        item["haystack_session_ids"], item["haystack_dates"], item["haystack_sessions"], strict=True
    )


def _evidence(session_id: object) -> bool:
    return str(session_id).startswith("answer")


def _sortable(date: str) -> str:
    """``2023/05/30 (Tue) 23:40`` → ``2023/05/30 23:40``: sorts as time does."""
    return date[:10] + date[-6:]
