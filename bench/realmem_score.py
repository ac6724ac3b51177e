"""RealMem's session-level metrics and their means, overall, per persona and per category.

A system ranks the turns stored before a query; the ranking becomes the sessions in the
order of their first turn in it (as :func:`scoring.sessions_of` does), scored against
the query's evidence sessions with :func:`scoring.metrics_at_k`: ``session/…@k``, out of
the sessions the channel held. ``turns/recall_any@k`` and ``turns/recall_all@k`` are
the sessions of the top k *turns* instead (how the data README's outside figures were
counted). ``turn/…@k`` scores the turns themselves against the turns the answer's
memories came from (:attr:`Query.evidence_turns`), message-level evidence as in a
long project conversation: ``recall_any``, ``recall_all``, ``ndcg_any`` and ``recall``
(the share of those turns in the top k); its means are over the queries that have such
turns (``turn_queries``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from realmem_data import Persona, Query
from scoring import KS, metrics_at_k

METRICS = tuple(
    f"session/{name}@{k}" for name in ("recall_any", "recall_all", "ndcg_any") for k in KS
) + tuple(f"turns/{name}@{k}" for name in ("recall_any", "recall_all") for k in KS)
TABLE = tuple(
    f"session/{name}@{k}" for k in (10, 5) for name in ("recall_any", "recall_all", "ndcg_any")
)
TABLE_BY_TURNS = tuple(
    f"turns/{name}@{k}" for k in (10, 5) for name in ("recall_any", "recall_all")
)
TURN_METRICS = tuple(
    f"turn/{name}@{k}" for name in ("recall_any", "recall_all", "ndcg_any", "recall") for k in KS
)
TABLE_TURN = tuple(
    f"turn/{name}@{k}" for k in (10, 5) for name in ("recall", "recall_all", "ndcg_any")
)

Scores = dict[str, float]


def score(persona: Persona, query: Query, ranking: Sequence[int]) -> Scores:
    """Every metric for one query, from a ranking of the persona's turn indices."""
    seen: dict[int, None] = {}
    for turn in ranking:
        seen.setdefault(persona.turns[turn].session, None)
    out = {
        f"session/{name}": value
        for name, value in metrics_at_k(list(seen), query.evidence, query.session).items()
    }
    for k in KS:
        found = {persona.turns[turn].session for turn in ranking[:k]} & query.evidence
        out[f"turns/recall_any@{k}"] = float(bool(found))
        out[f"turns/recall_all@{k}"] = float(found == query.evidence)
    gold = query.evidence_turns
    if gold:
        held = persona.sessions[query.session].first
        for name, value in metrics_at_k(ranking, gold, held).items():
            out[f"turn/{name}"] = value
        for k in KS:
            out[f"turn/recall@{k}"] = len(gold.intersection(ranking[:k])) / len(gold)
    return out


def aggregate(scored: Sequence[tuple[Persona, Query, Scores]]) -> dict[str, dict[str, Scores]]:
    """Means in percent: ``overall``, ``personas`` (by name) and ``categories`` (by the
    query's RealMem category), each with its ``queries`` count."""
    groups: dict[str, dict[str, list[Scores]]] = {
        "overall": defaultdict(list),
        "personas": defaultdict(list),
        "categories": defaultdict(list),
    }
    for persona, query, scores in scored:
        groups["overall"]["all"].append(scores)
        groups["personas"][persona.name].append(scores)
        groups["categories"][query.category].append(scores)
    return {
        kind: {name: _mean(rows) for name, rows in sorted(members.items())}
        for kind, members in groups.items()
    }


def _mean(rows: Sequence[Scores]) -> Scores:
    means = {m: 100.0 * sum(r[m] for r in rows) / len(rows) for m in METRICS}
    means["queries"] = float(len(rows))
    with_turns = [r for r in rows if TURN_METRICS[0] in r]
    for m in TURN_METRICS:
        means[m] = 100.0 * sum(r[m] for r in with_turns) / max(1, len(with_turns))
    means["turn_queries"] = float(len(with_turns))
    return means


def markdown(rows: dict[str, Scores], metrics: Sequence[str] = TABLE) -> str:
    """Figures as a Markdown table, one row per system."""
    short = [m.split("/")[1].replace("recall_", "").replace("ndcg_any", "ndcg") for m in metrics]
    lines = ["| system | " + " | ".join(short) + " |", "|---" * (len(short) + 1) + "|"]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[m]:.1f}" for m in metrics) + " |")
    return "\n".join(lines)
