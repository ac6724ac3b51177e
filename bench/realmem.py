"""Recall quality on RealMem: Calor's engine in-process beside dense, BM25 and RRF.

Per persona one channel, filled session by session in time order; before a session is
stored its queries are asked, so each sees every turn of the earlier sessions
(:mod:`realmem_data`). Calor is the server's ``MemoryEngine`` on a real RocksDB in a
temp folder, fed cached vectors (:mod:`realmem_vectors`) as ``tune.py`` does; the
baselines (:mod:`baselines`) rank the same turns. Scored at session level
(:mod:`realmem_score`). Once the vectors are cached a run takes minutes, so recall
settings can be tried with ``--set name=value`` (a :class:`RecallWeights` field) or
``--ablation``; baseline rankings are cached beside the vectors.

    .venv/bin/python bench/realmem.py --embed-only          # fill the vector cache
    .venv/bin/python bench/realmem.py [--clock session] [--set lexical=0.3] [--ablation]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import baselines  # noqa: E402
import realmem_data  # noqa: E402
import realmem_score  # noqa: E402
from realmem_data import Persona  # noqa: E402
from realmem_vectors import PersonaVectors  # noqa: E402
from tune import ABLATIONS, RECALL_LIMIT, fusion_variant, policy_with  # noqa: E402

from calor.models.embedder import OnnxEmbedder  # noqa: E402
from calor.server.clock import ManualClock, SystemClock  # noqa: E402
from calor.server.commands import NewMemory, RecallQuery  # noqa: E402
from calor.server.engine.memory_engine import MemoryEngine  # noqa: E402
from calor.server.recall.ranking import Hit  # noqa: E402
from calor.server.storage.store import MemoryStore  # noqa: E402
from calor.server.thermo.policy import ChannelPolicy  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "realmem-latest.json"
CLOCKS = ("wall", "session")
Rankings = list[list[int]]


def calor_rankings(
    persona: Persona, cache: PersonaVectors, policy: ChannelPolicy, clock: str
) -> Rankings:
    """Each of the persona's queries asked of Calor before its session is stored; the
    hits as turn indices. ``clock`` ``session`` moves a manual clock to each session's
    time (a live conversation); ``wall`` runs on the real clock, long after."""
    turn_vectors, query_vectors = cache.get(persona)
    asked: dict[int, list[int]] = defaultdict(list)
    for number, query in enumerate(persona.queries):
        asked[query.session].append(number)
    rankings: Rankings = [[] for _ in persona.queries]
    manual = ManualClock(persona.sessions[0].starts_at) if clock == "session" else None
    channel = "realmem"
    with tempfile.TemporaryDirectory(prefix="calor-realmem-") as folder:
        store = MemoryStore.open(
            Path(folder) / "db", model_id=cache.embedder.model_id, dim=cache.embedder.dim
        )
        try:
            engine = MemoryEngine.open(store, manual or SystemClock(), policy)
            engine.channels.set_policy(channel, policy)
            position: dict[str, int] = {}
            for number, session in enumerate(persona.sessions):
                if manual is not None:
                    manual.set(session.starts_at)
                for q in asked[number]:
                    recall = RecallQuery(
                        channel=channel,
                        query=persona.queries[q].text,
                        limit=RECALL_LIMIT,
                        peek=True,
                        include_archived=True,
                    )
                    hits = engine.recall(recall, query_vectors[q]).hits
                    # Only this store's hits: no other shard is asked (no foreign hits).
                    rankings[q] = [position[h.record.id] for h in hits if isinstance(h, Hit)]
                if session.end == session.first:
                    continue
                if manual is not None:
                    manual.set(session.ends_at)
                turns = persona.turns[session.first : session.end]
                items = [NewMemory(channel, t.text, created_at=t.created_at) for t in turns]
                stored = engine.store(items, turn_vectors[session.first : session.end])
                position.update({s.record.id: session.first + i for i, s in enumerate(stored)})
        finally:
            store.close()
    return rankings


def baseline_rankings(persona: Persona, cache: PersonaVectors) -> dict[str, Rankings]:
    """Dense, BM25 and RRF over the turns each query's channel holds, top
    ``RECALL_LIMIT`` turns as Calor returns; kept beside the persona's vectors, under a
    name that changes with the texts and with ``baselines.py``."""
    code = hashlib.sha256(Path(baselines.__file__).read_bytes()).hexdigest()[:8]
    path = cache.path(persona).with_suffix(f".baselines-{code}-{RECALL_LIMIT}.json")
    if path.is_file():
        cached: dict[str, Rankings] = json.loads(path.read_text())
        return cached
    turn_vectors, query_vectors = cache.get(persona)
    texts = [turn.text for turn in persona.turns]
    systems: dict[str, Rankings] = {name: [] for name in baselines.NAMES}
    for number, query in enumerate(persona.queries):
        held = persona.sessions[query.session].first
        ranked = baselines.rank_all(
            texts[:held], query.text, turn_vectors[:held], query_vectors[number]
        )
        for name, ranking in ranked.items():
            systems[name].append(ranking[:RECALL_LIMIT])
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(systems))
    partial.replace(path)
    return systems


def embed(personas: Sequence[Persona], cache: PersonaVectors) -> None:
    """Fill the vector cache, persona by persona, saying how far it got."""
    started = time.perf_counter()
    for persona in personas:
        cache.get(persona, progress=True)
        print(f"{persona.name}: cached, {time.perf_counter() - started:.0f} s", flush=True)


def run(
    personas: Sequence[Persona],
    cache: PersonaVectors,
    variants: dict[str, list[str]],
    clock: str,
    timings: dict[str, float],
) -> dict[str, dict[str, dict[str, realmem_score.Scores]]]:
    """Every Calor variant and every baseline, scored; seconds per part in ``timings``."""
    scored: dict[str, list[tuple[Persona, realmem_data.Query, realmem_score.Scores]]] = {}
    for name, settings in variants.items():
        started = time.perf_counter()
        rows = scored.setdefault(name, [])
        for persona in personas:
            with fusion_variant(settings):
                ranked = calor_rankings(persona, cache, policy_with(settings), clock)
            rows.extend(_scored(persona, ranked))
        timings[name] = time.perf_counter() - started
        _say(f"{name}: {timings[name]:.1f} s")
    started = time.perf_counter()
    for persona in personas:
        for name, ranked in baseline_rankings(persona, cache).items():
            scored.setdefault(name, []).extend(_scored(persona, ranked))
    timings["baselines"] = time.perf_counter() - started
    _say(f"baselines: {timings['baselines']:.1f} s")
    return {name: realmem_score.aggregate(rows) for name, rows in scored.items()}


def _scored(
    persona: Persona, rankings: Rankings
) -> list[tuple[Persona, realmem_data.Query, realmem_score.Scores]]:
    return [
        (persona, query, realmem_score.score(persona, query, ranking))
        for query, ranking in zip(persona.queries, rankings, strict=True)
    ]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cpu_model() -> str:
    """The CPU's model name and core count, as /proc/cpuinfo tells them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown CPU"
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return f"{models[0] if models else 'unknown CPU'}, {len(models)} cores"


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def _meta(
    title: str,
    args: argparse.Namespace,
    variants: dict[str, list[str]],
    personas: Sequence[Persona],
    timings: dict[str, float],
) -> dict[str, object]:
    """What the JSON says of the run besides its figures."""
    notes: dict[str, int] = defaultdict(int)
    for persona in personas:
        for note, count in persona.notes.items():
            notes[note] += count
    return {
        "title": title,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "clock": args.clock,
        "role": not args.no_role,
        "variants": variants,
        "personas": [p.name for p in personas],
        "queries": sum(len(p.queries) for p in personas),
        "turns": sum(len(p.turns) for p in personas),
        "recall_limit": RECALL_LIMIT,
        "seconds": timings,
        "data_notes": dict(notes),
        "persona_notes": {p.name: p.notes for p in personas},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--personas", type=int, default=None, help="the first N, by name")
    parser.add_argument("--no-role", action="store_true", help="store the content alone")
    parser.add_argument("--embed-only", action="store_true", help="fill the vector cache")
    parser.add_argument("--clock", choices=CLOCKS, default="wall")
    parser.add_argument("--set", action="append", default=[], help="recall weight, name=value")
    parser.add_argument("--ablation", action="store_true", help="every piece off in turn")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    personas = [
        realmem_data.load(n, role=not args.no_role) for n in realmem_data.names(args.personas)
    ]
    cache = PersonaVectors(OnnxEmbedder.load(threads=2))
    if args.embed_only:
        embed(personas, cache)
        return 0
    missing = [p.name for p in personas if not cache.has(p)]
    if missing:
        _say(f"embedding {', '.join(missing)} first (--embed-only fills the cache alone)")
        embed([p for p in personas if not cache.has(p)], cache)
    timings["load"] = time.perf_counter() - started
    variants = ABLATIONS if args.ablation else {" ".join(["calor", *args.set]): args.set}
    for settings in variants.values():
        policy_with(settings)  # a misspelt weight fails here, before any run
    report = run(personas, cache, variants, args.clock, timings)
    title = (
        f"RealMem, {len(personas)} personas, {sum(len(p.queries) for p in personas)} queries, "
        f"{sum(len(p.turns) for p in personas)} turns; clock {args.clock}, "
        f"{'no role' if args.no_role else 'role'} labels; commit {_commit()}, {cpu_model()}"
    )
    print(title)
    overall = {name: groups["overall"]["all"] for name, groups in report.items()}
    print(f"\nsessions in order of their first turn in the top {RECALL_LIMIT} turns:")
    print(realmem_score.markdown(overall))
    print("\nsessions of the top k turns:")
    print(realmem_score.markdown(overall, realmem_score.TABLE_BY_TURNS))
    asked = int(next(iter(overall.values()))["turn_queries"])
    print(f"\nthe turns the answer's memories came from ({asked} queries):")
    print(realmem_score.markdown(overall, realmem_score.TABLE_TURN))
    print("\n" + ", ".join(f"{part} {seconds:.1f} s" for part, seconds in timings.items()))
    meta = _meta(title, args, variants, personas, timings)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "systems": report}, indent=1))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
