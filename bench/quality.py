"""Recall quality on LongMemEval, Calor against plain retrieval: `make bench-quality`.

For each scored question (abstention questions skipped) of each split, a fresh
``calor serve`` subprocess gets the question's haystack in its own channel through one
``StoreStream`` call: one memory per turn, ``role: content`` as text, episodic,
``created_at`` from the session date, a ``session`` tag holding an opaque counter
(0, 1, 2… in haystack order; never the dataset's session id, nor ``has_answer``), and
``source`` human for the user's turns, agent for the assistant's (DESIGN §3: human is
"a person said it"; the text's role label says the same).
Then it is asked the question: ``Recall(limit=100, peek=True, include_archived=True,
as_of=<question date>)``. On the same turns, outside Calor, the three baselines of
``baselines.py`` rank every turn. ``scoring.py`` scores all four the authors' way.

Two splits: ``oracle`` (all 470 scored questions, evidence sessions only) and ``s``
(the first 50 scored questions, about 490 turns each; ``--questions N`` for more).
The ``s`` channels are also where recall latency is measured: ``LATENCY_REPEATS``
sequential ``Recall(limit=10, peek=True)`` per question, timed on the client, query
embedding included.

Prints one table and writes JSON to ``bench/results/`` (``quality-<stamp>.json`` and
``quality-latest.json``).

    .venv/bin/python bench/quality.py [--splits oracle,s] [--questions 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import baselines
import longmemeval
import scoring
from _server import Server
from google.protobuf.timestamp_pb2 import Timestamp
from longmemeval import Question
from throughput import machine_info, summarize
from vectors import VectorCache

from calor.models.embedder import OnnxEmbedder
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

DEFAULT_OUT = longmemeval.REPO / "bench" / "results"
RECALL_LIMIT = 100
LATENCY_LIMIT = 10
LATENCY_REPEATS = 5
CALL_TIMEOUT_S = 3600.0
SYSTEMS = ("calor", *baselines.NAMES)

Json = dict[str, Any]


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def store_haystack(stub: pb_grpc.MemoryServiceStub, channel: str, question: Question) -> list[str]:
    """The question's turns stored in ``channel`` through one StoreStream; their ids."""
    requests = (
        pb.StoreStreamRequest(
            store=pb.StoreRequest(
                channel=channel,
                text=turn.text,
                memory_type=memory_pb2.MEMORY_TYPE_EPISODIC,
                created_at=_timestamp(turn.created_at),
                tags={"session": str(turn.session)},
                source=memory_pb2.SOURCE_HUMAN if turn.by_user else memory_pb2.SOURCE_AGENT,
            )
        )
        for turn in question.turns
    )
    ids = list(stub.StoreStream(requests, timeout=CALL_TIMEOUT_S).ids)
    if len(ids) != len(question.turns):
        raise RuntimeError(f"StoreStream answered {len(ids)} ids for {len(question.turns)} turns")
    return ids


def recall(
    stub: pb_grpc.MemoryServiceStub, channel: str, question: Question, limit: int
) -> tuple[list[str], float]:
    """The ids Calor recalls for the question, best first, and the call's milliseconds."""
    request = pb.RecallRequest(
        channel=channel,
        query=question.text,
        limit=limit,
        peek=True,
        include_archived=True,
        as_of=_timestamp(question.asked_at),
    )
    started = time.perf_counter()
    reply = stub.Recall(request, timeout=60.0)
    return [hit.memory.id for hit in reply.hits], (time.perf_counter() - started) * 1000


def run_calor(questions: Sequence[Question], measure_latency: bool) -> Json:
    """Every question through a fresh server: rankings, timings, latencies."""
    server = Server()
    rankings: list[list[int]] = []
    ingest_s = recall_s = 0.0
    scored_ms: list[float] = []
    latency_ms: list[float] = []
    try:
        server.wait_ready()
        for number, question in enumerate(questions):
            channel = f"lme-{number}"
            started = time.perf_counter()
            ids = store_haystack(server.stub, channel, question)
            ingest_s += time.perf_counter() - started
            position = {memory_id: i for i, memory_id in enumerate(ids)}
            started = time.perf_counter()
            hits, ms = recall(server.stub, channel, question, RECALL_LIMIT)
            recall_s += time.perf_counter() - started
            scored_ms.append(ms)
            rankings.append([position[memory_id] for memory_id in hits])
            if measure_latency:
                for _ in range(LATENCY_REPEATS):
                    latency_ms.append(recall(server.stub, channel, question, LATENCY_LIMIT)[1])
            if (number + 1) % 10 == 0 or number + 1 == len(questions):
                print(
                    f"  calor: {number + 1}/{len(questions)} questions, ingest {ingest_s:.0f} s",
                    flush=True,
                )
        exit_code = server.stop()
    finally:
        server.close()
    timing: Json = {
        "ingest_s": round(ingest_s, 1),
        "turns_per_s": round(sum(len(q.turns) for q in questions) / ingest_s, 2),
        "recall_s": round(recall_s, 1),
        "recall_limit_100": summarize(scored_ms),
        "exit_code": exit_code,
    }
    if latency_ms:
        timing["recall_latency_limit_10"] = summarize(latency_ms)
    return {"rankings": rankings, "timing": timing}


def run_baselines(questions: Sequence[Question], cache: VectorCache) -> Json:
    """The baselines' rankings, cut to Calor's depth, and what they cost."""
    started = time.perf_counter()
    rankings = baselines.rank_questions(questions, cache, RECALL_LIMIT)
    return {
        "rankings": rankings,
        "timing": {
            "seconds": round(time.perf_counter() - started, 1),
            "embedded_texts": cache.embedded_texts,
            "embed_s": round(cache.embed_seconds, 1),
        },
    }


def embedding_times(embedder: OnnxEmbedder, questions: Sequence[Question]) -> Json:
    """The share of recall latency that is the model: each question embedded alone,
    in this process, ``LATENCY_REPEATS`` times, with the server stopped."""
    times: list[float] = []
    for question in questions:
        for _ in range(LATENCY_REPEATS):
            started = time.perf_counter()
            embedder.embed_query(question.text)
            times.append((time.perf_counter() - started) * 1000)
    return summarize(times)


def evaluate_split(split: str, limit: int | None) -> Json:
    """One split: Calor through the server, the baselines beside it, all scored."""
    questions = longmemeval.load(split, limit)
    turns = sum(len(q.turns) for q in questions)
    print(f"{split}: {len(questions)} questions, {turns} turns", flush=True)
    started = time.perf_counter()
    cache = VectorCache(OnnxEmbedder.load(threads=2))
    plain = run_baselines(questions, cache)
    print(f"  baselines: {plain['timing']}", flush=True)
    calor = run_calor(questions, measure_latency=split == "s")
    if split == "s":
        calor["timing"]["query_embedding_alone"] = embedding_times(cache.embedder, questions)
    systems = {"calor": calor["rankings"], **plain["rankings"]}
    scores = {
        name: scoring.aggregate(
            questions, [scoring.score(q, r) for q, r in zip(questions, ranked, strict=True)]
        )
        for name, ranked in systems.items()
    }
    return {
        "questions": len(questions),
        "turns": turns,
        "mean_turns": round(turns / len(questions), 1),
        "seconds": round(time.perf_counter() - started, 1),
        "calor_timing": calor["timing"],
        "baseline_timing": plain["timing"],
        "scores": scores,
    }


def render(report: Json) -> str:
    """Every split as rows of metrics by columns of systems: all metrics overall, the
    headline ones per question type (the JSON holds every metric for every type)."""
    lines = [
        f"Calor recall quality on LongMemEval (commit {report['machine']['git_commit']}"
        f"{'+dirty' if report['machine']['git_dirty'] else ''}, {report['timestamp']})",
    ]
    header = f"    {'':34}" + "".join(f"{name:>8}" for name in SYSTEMS)
    for split, result in report["splits"].items():
        timing, scores = result["calor_timing"], result["scores"]
        lines += [
            "",
            f"{split}: {result['questions']} questions, {result['turns']} turns "
            f"(mean {result['mean_turns']}/question), {result['seconds'] / 60:.1f} min "
            f"(calor ingest {timing['ingest_s']:.0f} s at {timing['turns_per_s']} turns/s)",
        ]
        groups = ["overall"] + [g for g in scores["calor"] if g != "overall"]
        for group in groups:
            metrics = scoring.METRICS if group == "overall" else scoring.HEADLINE
            lines.append(f"  {group} ({int(scores['calor'][group]['questions'])} questions)")
            lines.append(header)
            for metric in metrics:
                values = "".join(f"{scores[name][group][metric]:>8.1f}" for name in SYSTEMS)
                lines.append(f"    {metric:34}{values}")
        if "recall_latency_limit_10" in timing:
            s = timing["recall_latency_limit_10"]
            lines.append(
                f"  recall latency, {result['mean_turns']:.0f}-turn channels, limit 10, peek, "
                f"query embedding included: p50 {s['p50_ms']:.1f} ms, p90 {s['p90_ms']:.1f}, "
                f"p99 {s['p99_ms']:.1f} (n={s['n']})"
            )
            e = timing["query_embedding_alone"]
            lines.append(
                f"  of which the query embedding alone (same questions, in-process, 2 threads): "
                f"p50 {e['p50_ms']:.1f} ms, p90 {e['p90_ms']:.1f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", default="oracle,s", help="comma-separated: oracle, s")
    parser.add_argument("--questions", type=int, default=50, help="scored S-split questions")
    parser.add_argument(
        "--oracle-questions", type=int, default=None, help="scored oracle questions (all)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    timestamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    report: Json = {"timestamp": timestamp, "machine": machine_info(), "splits": {}}
    for split in splits:
        limit = args.questions if split == "s" else args.oracle_questions
        report["splits"][split] = evaluate_split(split, limit)
    table = render(report)
    print("\n" + table)
    report["table"] = table
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2) + "\n"
    stamp = timestamp.replace(":", "").replace("-", "")
    (args.out / f"quality-{stamp}.json").write_text(text)
    (args.out / "quality-latest.json").write_text(text)
    print(f"\nwrote {args.out / f'quality-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
