"""Calor's recall engine in-process over cached vectors: quick ablations while tuning.

The same ``MemoryEngine`` the server runs, on a real RocksDB in a temp folder, fed
the vectors :mod:`vectors` cached (the server's model, embedded by the bench) instead
of embedding again; so a variant of the recall settings costs seconds, not the hour
the model takes. ``quality.py`` gives the figures that count, through the server.

    .venv/bin/python bench/tune.py --split oracle [--set lexical=0.3] [--ablation]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import baselines  # noqa: E402
import longmemeval  # noqa: E402
import scoring  # noqa: E402
from longmemeval import Question, Turn  # noqa: E402
from vectors import VectorCache  # noqa: E402

from calor.models.embedder import OnnxEmbedder  # noqa: E402
from calor.server.clock import SystemClock  # noqa: E402
from calor.server.commands import NewMemory, RecallQuery  # noqa: E402
from calor.server.engine.memory_engine import MemoryEngine  # noqa: E402
from calor.server.recall import fusion, ranking  # noqa: E402
from calor.server.recall.fusion import Fusion  # noqa: E402
from calor.server.storage.store import MemoryStore  # noqa: E402
from calor.server.thermo.policy import ChannelPolicy, RecallWeights  # noqa: E402

RECALL_LIMIT = 50
F64 = npt.NDArray[np.float64]


def policy_with(settings: Sequence[str]) -> ChannelPolicy:
    """The default policy with ``name=value`` recall weights overridden (``fusion=…``
    settings are :func:`fusion_variant`'s)."""
    weights = RecallWeights()
    for setting in settings:
        name, _, value = setting.partition("=")
        if name == "fusion":
            if value not in FUSION_VARIANTS:
                raise SystemExit(
                    f"unknown fusion variant {value!r}; one of {list(FUSION_VARIANTS)}"
                )
            continue
        weights = replace(weights, **{name: float(value)})
    return replace(ChannelPolicy(), weights=weights)


def _fixed_lambda(dense: F64, words: F64, specific: float, weight: float) -> Fusion:
    """The fusion with λ = ``weight_lexical`` for every query: no adapting to it."""
    fixed = replace(
        fusion.fuse(dense, words, specific, weight),
        lexical_weight=weight if words.size and words.std() > 0.0 else 0.0,
    )
    best = np.sort(fixed.relevance(dense, words))[::-1][:10]
    if not best.size:
        return fixed
    return replace(fixed, spread=max(1e-3, float(best[0] - best[-1])), best=float(best[0]))


@dataclass(frozen=True)
class _FullHeat(Fusion):
    """A fusion whose ``spread`` is 1 (heat and keyword overlap at their full weights),
    the band of its temporal boost still the recall's own (``band_spread``)."""

    band_spread: float = 0.0

    def time_share(self, relevance: Any) -> Any:
        return Fusion.time_share(replace(self, spread=self.band_spread), relevance)


def _absolute_heat(dense: F64, words: F64, specific: float, weight: float) -> Fusion:
    """The fusion with heat and keyword overlap at their full weights, not scaled by the
    spread of relevance (as before issue 33)."""
    fitted = fusion.fuse(dense, words, specific, weight)
    return _FullHeat(**{**asdict(fitted), "spread": 1.0}, band_spread=fitted.spread)


@dataclass(frozen=True)
class _FullTimeBoost(Fusion):
    """A fusion that gives every hit its whole temporal boost, however weakly related."""

    def time_share(self, relevance: Any) -> Any:
        return 1.0 + 0.0 * relevance


def _absolute_time(dense: F64, words: F64, specific: float, weight: float) -> Fusion:
    """The fusion with the boost of a time the query names at full weight for every hit,
    not only the most relevant (as before issue 33)."""
    return _FullTimeBoost(**asdict(fusion.fuse(dense, words, specific, weight)))


FUSION_VARIANTS: dict[str, Callable[[F64, F64, float, float], Fusion]] = {
    "fixed-lambda": _fixed_lambda,
    "absolute-heat": _absolute_heat,
    "absolute-time": _absolute_time,
}


@contextmanager
def fusion_variant(settings: Sequence[str]) -> Iterator[None]:
    """Runs the engine with the ``fusion=…`` variant among ``settings`` in place of its
    own fusion (none: as shipped). For ablations only: the variants are not settings."""
    chosen = [s.partition("=")[2] for s in settings if s.partition("=")[0] == "fusion"]
    if not chosen:
        yield
        return
    with mock.patch.object(ranking, "fuse", FUSION_VARIANTS[chosen[-1]]):
        yield


def calor_rankings(
    questions: Sequence[Question],
    cache: VectorCache,
    policy: ChannelPolicy,
    protocol: str = "metadata",
) -> list[list[int]]:
    """Each question's haystack stored in its own channel as ``protocol`` tells it; its
    recall as turn indices."""
    rankings: list[list[int]] = []
    with tempfile.TemporaryDirectory(prefix="calor-tune-") as folder:
        store = MemoryStore.open(
            Path(folder) / "db", model_id=cache.embedder.model_id, dim=cache.embedder.dim
        )
        engine = MemoryEngine.open(store, SystemClock(), policy)
        for number, question in enumerate(questions):
            channel = f"q{number}"
            engine.channels.set_policy(channel, policy)
            turn_vectors, query_vector = cache.get(question)
            items = [_new_memory(channel, turn, protocol) for turn in question.turns]
            stored = engine.store(items, turn_vectors)
            position = {s.record.id: i for i, s in enumerate(stored)}
            query = RecallQuery(
                channel=channel,
                query=question.text,
                limit=RECALL_LIMIT,
                peek=True,
                include_archived=True,
                as_of=_seconds(longmemeval.as_of(question, protocol)),
            )
            hits = engine.recall(query, query_vector).hits
            rankings.append([position[h.record.id] for h in hits])
        store.close()
    return rankings


def _new_memory(channel: str, turn: Turn, protocol: str) -> NewMemory:
    told = longmemeval.told(turn, protocol)
    return NewMemory(
        channel=channel,
        text=turn.text,
        memory_type=told.memory_type,
        created_at=turn.created_at.timestamp(),
        tags=told.tags,
        **({"source": told.source} if told.source else {}),
    )


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


ABLATIONS: dict[str, list[str]] = {
    "calor (defaults)": [],
    "- lexical fusion": ["lexical=0"],
    "- source trust": ["source=0"],
    "- keyword overlap": ["keyword=0"],
    "- temporal boost": ["temporal=0"],
    "- heat": ["heat=0"],
    "- adaptive λ (fixed at weight_lexical)": ["fusion=fixed-lambda"],
    "- heat among the relevant (absolute)": ["fusion=absolute-heat"],
    "- time among the relevant (absolute)": ["fusion=absolute-time"],
    "cosine only": ["lexical=0", "source=0", "keyword=0", "temporal=0", "heat=0"],
}
TABLE_METRICS = (
    "turn/recall_any@5",
    "turn/recall_all@5",
    "turn/recall_all@10",
    "turn/ndcg_any@5",
    "turn/ndcg_any@10",
    "session/recall_all@5",
    "session/ndcg_any@10",
)


def markdown(rows: dict[str, dict[str, float]]) -> str:
    """Overall figures as a Markdown table, one row per variant."""
    short = [m.replace("recall_", "").replace("_any", "") for m in TABLE_METRICS]
    lines = ["| variant | " + " | ".join(short) + " |", "|---" * (len(short) + 1) + "|"]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[m]:.1f}" for m in TABLE_METRICS) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=longmemeval.SPLIT_NAMES, default="oracle")
    parser.add_argument("--questions", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], help="recall weight, name=value")
    parser.add_argument("--ablation", action="store_true", help="every piece off in turn")
    parser.add_argument("--protocol", choices=longmemeval.PROTOCOLS, default="metadata")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tune-last.json"))
    args = parser.parse_args(argv)
    cache = VectorCache(OnnxEmbedder.load(threads=2))
    questions = [q for q in longmemeval.load(args.split, args.questions) if cache.has(q)]
    variants = ABLATIONS if args.ablation else {"calor " + " ".join(args.set): args.set}
    systems: dict[str, list[list[int]]] = {}
    for name, settings in variants.items():
        started = time.perf_counter()
        with fusion_variant(settings):
            systems[name] = calor_rankings(questions, cache, policy_with(settings), args.protocol)
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    systems.update(baselines.rank_questions(questions, cache))
    report = {
        name: scoring.aggregate(
            questions, [scoring.score(q, r) for q, r in zip(questions, ranked, strict=True)]
        )
        for name, ranked in systems.items()
    }
    print(f"{args.split}, {args.protocol} protocol: {len(questions)} questions")
    print(markdown({name: groups["overall"] for name, groups in report.items()}))
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
