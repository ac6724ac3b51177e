"""Calor's recall engine in-process over cached vectors: quick ablations while tuning.

The same ``MemoryEngine`` the server runs, on a real RocksDB in a temp folder, fed
the vectors :mod:`vectors` cached (the server's model, embedded by the bench) instead
of embedding again; so a variant of the recall settings costs seconds, not the hour
the model takes. ``quality.py`` gives the figures that count, through the server.

    .venv/bin/python bench/tune.py --split oracle [--set keyword=0] [--set context=0]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import baselines  # noqa: E402
import longmemeval  # noqa: E402
import scoring  # noqa: E402
from longmemeval import Question  # noqa: E402
from vectors import VectorCache  # noqa: E402

from calor.models.embedder import OnnxEmbedder  # noqa: E402
from calor.server.clock import SystemClock  # noqa: E402
from calor.server.commands import NewMemory, RecallQuery  # noqa: E402
from calor.server.engine import MemoryEngine  # noqa: E402
from calor.server.policy import ChannelPolicy, RecallWeights  # noqa: E402
from calor.server.store import MemoryStore  # noqa: E402

RECALL_LIMIT = 50
SHOWN = (*scoring.HEADLINE, "turn/recall_all@5", "turn/ndcg_any@5")


def policy_with(settings: Sequence[str]) -> ChannelPolicy:
    """The default policy with ``name=value`` recall weights overridden."""
    weights = RecallWeights()
    for setting in settings:
        name, _, value = setting.partition("=")
        weights = replace(weights, **{name: float(value)})
    return replace(ChannelPolicy(), weights=weights)


def calor_rankings(
    questions: Sequence[Question], cache: VectorCache, policy: ChannelPolicy
) -> list[list[int]]:
    """Each question's haystack stored in its own channel; its recall as turn indices."""
    rankings: list[list[int]] = []
    with tempfile.TemporaryDirectory(prefix="calor-tune-") as folder:
        store = MemoryStore.open(
            Path(folder) / "db", model_id=cache.embedder.model_id, dim=cache.embedder.dim
        )
        engine = MemoryEngine.open(store, SystemClock(), policy)
        for number, question in enumerate(questions):
            channel = f"q{number}"
            engine.set_policy(channel, policy)
            turn_vectors, query_vector = cache.get(question)
            items = [
                NewMemory(
                    channel=channel,
                    text=turn.text,
                    memory_type="episodic",
                    created_at=turn.created_at.timestamp(),
                    tags={"session": str(turn.session)},
                    source="human" if turn.by_user else "agent",
                )
                for turn in question.turns
            ]
            stored = engine.store(items, turn_vectors)
            position = {s.record.id: i for i, s in enumerate(stored)}
            query = RecallQuery(
                channel=channel,
                query=question.text,
                limit=RECALL_LIMIT,
                peek=True,
                include_archived=True,
                as_of=question.asked_at.timestamp(),
            )
            hits = engine.recall(query, query_vector).hits
            rankings.append([position[h.record.id] for h in hits])
        store.close()
    return rankings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=sorted(longmemeval.SPLITS), default="oracle")
    parser.add_argument("--questions", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], help="recall weight, name=value")
    parser.add_argument("--baselines", action="store_true", help="score the baselines too")
    args = parser.parse_args(argv)
    questions = [q for q in longmemeval.load(args.split, args.questions)]
    cache = VectorCache(OnnxEmbedder.load(threads=2))
    questions = [q for q in questions if cache.has(q)]
    systems: dict[str, list[list[int]]] = {}
    started = time.perf_counter()
    systems["calor"] = calor_rankings(questions, cache, policy_with(args.set))
    seconds = time.perf_counter() - started
    if args.baselines:
        for name in baselines.NAMES:
            systems[name] = []
        for question in questions:
            turn_vectors, query_vector = cache.get(question)
            texts = [t.text for t in question.turns]
            for name, ranking in baselines.rank_all(
                texts, question.text, turn_vectors, query_vector
            ).items():
                systems[name].append(ranking)
    print(f"{len(questions)} questions, calor {seconds:.1f} s, settings {args.set}")
    report = {}
    for name, rankings in systems.items():
        per_question = [scoring.score(q, r) for q, r in zip(questions, rankings, strict=True)]
        report[name] = scoring.aggregate(questions, per_question)
        row = report[name]["overall"]
        print(f"{name:8}" + "".join(f"  {m} {row[m]:5.1f}" for m in SHOWN))
    Path("/tmp/tune-last.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
