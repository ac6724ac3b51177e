"""LongMemEval retrieval metrics, computed as the benchmark's authors compute them.

A system returns a ranking of turns. At turn level the gold items are the turns
marked ``has_answer``; at session level the ranking becomes the sessions in order of
their first turn in it, and the gold items are the evidence sessions. For k = 5, 10:
``recall_any@k`` (a gold item in the top k), ``recall_all@k`` (every gold item in the
top k) and ``ndcg_any@k`` (binary gains; the authors' DCG weighs ranks 1 and 2 alike,
then 1/log2(rank)).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from longmemeval import Question

KS = (5, 10)
LEVELS = ("turn", "session")
METRICS = tuple(
    f"{level}/{name}@{k}"
    for level in LEVELS
    for name in ("recall_any", "recall_all", "ndcg_any")
    for k in KS
)
HEADLINE = ("turn/recall_all@10", "turn/ndcg_any@10", "session/recall_all@10")


def _dcg(gains: Sequence[int], k: int) -> float:
    top = gains[:k]
    if not top:
        return 0.0
    return top[0] + sum(g / math.log2(rank) for rank, g in enumerate(top[1:], start=2))


def metrics_at_k(
    ranking: Sequence[int], gold: frozenset[int], corpus_size: int
) -> dict[str, float]:
    """``recall_any@k``, ``recall_all@k`` and ``ndcg_any@k`` (k in :data:`KS`) of one
    ranking of items against the ``gold`` items, out of ``corpus_size`` items in all."""
    out: dict[str, float] = {}
    gains = [1 if item in gold else 0 for item in ranking]
    ideal = [1] * min(len(gold), corpus_size)
    for k in KS:
        found = sum(gains[:k])
        out[f"recall_any@{k}"] = float(found > 0)
        out[f"recall_all@{k}"] = float(found == len(gold))
        out[f"ndcg_any@{k}"] = _dcg(gains, k) / _dcg(ideal, k)
    return out


def sessions_of(question: Question, ranking: Sequence[int]) -> list[int]:
    """The sessions in the order their first turn appears in a turn ranking."""
    seen: dict[int, None] = {}
    for turn in ranking:
        seen.setdefault(question.turns[turn].session, None)
    return list(seen)


def score(question: Question, ranking: Sequence[int]) -> dict[str, float]:
    """Every metric for one question, from a ranking of its turn indices, best first."""
    out = {
        f"turn/{name}": value
        for name, value in metrics_at_k(ranking, question.gold_turns, len(question.turns)).items()
    }
    sessions = sessions_of(question, ranking)
    session_count = len({turn.session for turn in question.turns})
    for name, value in metrics_at_k(sessions, question.gold_sessions, session_count).items():
        out[f"session/{name}"] = value
    return out


def aggregate(
    questions: Sequence[Question], per_question: Sequence[dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Means over all questions (``overall``) and per question type, in percent."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for question, scores in zip(questions, per_question, strict=True):
        groups["overall"].append(scores)
        groups[question.question_type].append(scores)
    return {name: _mean(rows) for name, rows in sorted(groups.items())}


def _mean(rows: Iterable[dict[str, float]]) -> dict[str, float]:
    rows = list(rows)
    means = {m: 100.0 * sum(r[m] for r in rows) / len(rows) for m in METRICS}
    means["questions"] = float(len(rows))
    return means
