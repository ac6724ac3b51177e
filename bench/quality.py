"""Recall quality on LongMemEval, Calor against plain retrieval: `make bench-quality`.

For each scored question (abstention questions skipped) of each split, and for each
protocol, a fresh ``calor serve`` subprocess gets the question's haystack in its own
channel through one ``StoreStream`` call: one memory per turn, ``role: content`` as
text, ``created_at`` from the session date. Under the ``metadata`` protocol each turn is
also episodic, has a ``session`` tag holding an opaque counter (0, 1, 2… in haystack
order; never the dataset's session id, nor ``has_answer``), and ``source`` human for the
user's turns, agent for the assistant's (DESIGN §3: human is "a person said it"; the
text's role label says the same); under ``bare`` it has nothing more (a client storing
plain text). Then it is asked the question: ``Recall(limit=100, peek=True,
include_archived=True)``, ``as_of=<question date>`` under ``metadata`` only. On the same
turns, outside Calor, the three baselines of ``baselines.py`` rank every turn.
``scoring.py`` scores them all the authors' way; Calor's column per protocol.

Two splits by default: ``oracle`` (all 470 scored questions, evidence sessions only) and
``s`` (the first 50 scored questions, about 490 turns each; ``--questions N`` for more).
A third is built from S (``longreplies.py``): ``--splits long-replies`` (the first 100
questions asked about what the user said, among 25 sessions of long assistant replies,
about 300 turns each).
The ``s`` channels are also where recall latency is measured: ``LATENCY_REPEATS``
sequential ``Recall(limit=10, peek=True)`` per question, timed on the client, query
embedding included.

Prints one table and writes JSON to ``bench/results/`` (``quality-<stamp>.json`` and
``quality-latest.json``).

    .venv/bin/python bench/quality.py [--splits oracle,s,long-replies] [--questions 50]
        [--protocols metadata,bare]
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
from longmemeval import Question, Turn
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
# Calor's column under each protocol: "calor" keeps its name from before there were two.
CALOR_COLUMNS = {"metadata": "calor", "bare": "bare"}

Json = dict[str, Any]


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def _store_request(channel: str, turn: Turn, protocol: str) -> pb.StoreRequest:
    told = longmemeval.told(turn, protocol)
    request = pb.StoreRequest(
        channel=channel, text=turn.text, created_at=_timestamp(turn.created_at), tags=told.tags
    )
    if told.memory_type:
        request.memory_type = memory_pb2.MemoryType.Value("MEMORY_TYPE_" + told.memory_type.upper())
    if told.source:
        request.source = memory_pb2.Source.Value("SOURCE_" + told.source.upper())
    return request


def store_haystack(
    stub: pb_grpc.MemoryServiceStub, channel: str, question: Question, protocol: str
) -> list[str]:
    """The question's turns stored in ``channel`` through one StoreStream, as ``protocol``
    tells them; their ids."""
    requests = (
        pb.StoreStreamRequest(store=_store_request(channel, turn, protocol))
        for turn in question.turns
    )
    ids = list(stub.StoreStream(requests, timeout=CALL_TIMEOUT_S).ids)
    if len(ids) != len(question.turns):
        raise RuntimeError(f"StoreStream answered {len(ids)} ids for {len(question.turns)} turns")
    return ids


def recall(
    stub: pb_grpc.MemoryServiceStub, channel: str, question: Question, limit: int, protocol: str
) -> tuple[list[str], float]:
    """The ids Calor recalls for the question, best first, and the call's milliseconds."""
    request = pb.RecallRequest(
        channel=channel, query=question.text, limit=limit, peek=True, include_archived=True
    )
    moment = longmemeval.as_of(question, protocol)
    if moment is not None:
        request.as_of.CopyFrom(_timestamp(moment))
    started = time.perf_counter()
    reply = stub.Recall(request, timeout=60.0)
    return [hit.memory.id for hit in reply.hits], (time.perf_counter() - started) * 1000


def run_calor(questions: Sequence[Question], protocol: str, measure_latency: bool) -> Json:
    """Every question through a fresh server, stored and asked as ``protocol`` says:
    rankings, timings, latencies."""
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
            ids = store_haystack(server.stub, channel, question, protocol)
            ingest_s += time.perf_counter() - started
            position = {memory_id: i for i, memory_id in enumerate(ids)}
            started = time.perf_counter()
            hits, ms = recall(server.stub, channel, question, RECALL_LIMIT, protocol)
            recall_s += time.perf_counter() - started
            scored_ms.append(ms)
            rankings.append([position[memory_id] for memory_id in hits])
            if measure_latency:
                for _ in range(LATENCY_REPEATS):
                    latency_ms.append(
                        recall(server.stub, channel, question, LATENCY_LIMIT, protocol)[1]
                    )
            if (number + 1) % 10 == 0 or number + 1 == len(questions):
                print(
                    f"  calor ({protocol}): {number + 1}/{len(questions)} questions, "
                    f"ingest {ingest_s:.0f} s",
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
    cache.fill(questions)  # each text once, however many haystacks hold it
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


def evaluate_split(split: str, limit: int | None, protocols: Sequence[str]) -> Json:
    """One split: Calor through the server under each protocol, the baselines beside it,
    all scored."""
    questions = longmemeval.load(split, limit)
    turns = sum(len(q.turns) for q in questions)
    print(f"{split}: {len(questions)} questions, {turns} turns", flush=True)
    started = time.perf_counter()
    cache = VectorCache(OnnxEmbedder.load(threads=2))
    plain = run_baselines(questions, cache)
    print(f"  baselines: {plain['timing']}", flush=True)
    calor = {
        protocol: run_calor(questions, protocol, measure_latency=split == "s")
        for protocol in protocols
    }
    if split == "s":
        alone = embedding_times(cache.embedder, questions)
        for run in calor.values():
            run["timing"]["query_embedding_alone"] = alone
    systems = {
        **{CALOR_COLUMNS[protocol]: run["rankings"] for protocol, run in calor.items()},
        **plain["rankings"],
    }
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
        "protocols": list(protocols),
        "calor_timing": {protocol: run["timing"] for protocol, run in calor.items()},
        "baseline_timing": plain["timing"],
        "scores": scores,
    }


def render(report: Json) -> str:
    """Every split as rows of metrics by columns of systems (Calor once per protocol): all
    metrics overall, the headline ones per question type (the JSON holds every metric
    for every type)."""
    lines = [
        f"Calor recall quality on LongMemEval (commit {report['machine']['git_commit']}"
        f"{'+dirty' if report['machine']['git_dirty'] else ''}, {report['timestamp']})",
        "  columns: " + ", ".join(f"{c} = Calor, {p} protocol" for p, c in CALOR_COLUMNS.items()),
    ]
    for split, result in report["splits"].items():
        timings, scores = result["calor_timing"], result["scores"]
        systems = [CALOR_COLUMNS[p] for p in result["protocols"]] + list(baselines.NAMES)
        header = f"    {'':34}" + "".join(f"{name:>8}" for name in systems)
        lines += [
            "",
            f"{split}: {result['questions']} questions, {result['turns']} turns "
            f"(mean {result['mean_turns']}/question), {result['seconds'] / 60:.1f} min",
        ]
        for protocol, timing in timings.items():
            lines.append(
                f"  calor ({protocol}): ingest {timing['ingest_s']:.0f} s at "
                f"{timing['turns_per_s']} turns/s"
            )
        first = systems[0]
        groups = ["overall"] + [g for g in scores[first] if g != "overall"]
        for group in groups:
            metrics = scoring.METRICS if group == "overall" else scoring.HEADLINE
            lines.append(f"  {group} ({int(scores[first][group]['questions'])} questions)")
            lines.append(header)
            for metric in metrics:
                values = "".join(f"{scores[name][group][metric]:>8.1f}" for name in systems)
                lines.append(f"    {metric:34}{values}")
        for protocol, timing in timings.items():
            if "recall_latency_limit_10" not in timing:
                continue
            s = timing["recall_latency_limit_10"]
            lines.append(
                f"  recall latency ({protocol}), {result['mean_turns']:.0f}-turn channels, "
                f"limit 10, peek, query embedding included: p50 {s['p50_ms']:.1f} ms, "
                f"p90 {s['p90_ms']:.1f}, p99 {s['p99_ms']:.1f} (n={s['n']})"
            )
        alone = next(
            (t["query_embedding_alone"] for t in timings.values() if "query_embedding_alone" in t),
            None,
        )
        if alone is not None:
            lines.append(
                f"  of which the query embedding alone (same questions, in-process, 2 threads): "
                f"p50 {alone['p50_ms']:.1f} ms, p90 {alone['p90_ms']:.1f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--splits",
        default="oracle,s",
        help="comma-separated: " + ", ".join(longmemeval.SPLIT_NAMES),
    )
    parser.add_argument("--questions", type=int, default=50, help="scored S-split questions")
    parser.add_argument(
        "--oracle-questions", type=int, default=None, help="scored oracle questions (all)"
    )
    parser.add_argument(
        "--long-replies-questions", type=int, default=100, help="long-replies questions"
    )
    parser.add_argument(
        "--protocols",
        default=",".join(longmemeval.PROTOCOLS),
        help="comma-separated: " + ", ".join(longmemeval.PROTOCOLS),
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    unknown = set(protocols) - set(longmemeval.PROTOCOLS)
    if unknown or not protocols:
        parser.error(f"--protocols: one or more of {', '.join(longmemeval.PROTOCOLS)}")
    timestamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    if set(splits) - set(longmemeval.SPLIT_NAMES) or not splits:
        parser.error(f"--splits: one or more of {', '.join(longmemeval.SPLIT_NAMES)}")
    limits = {"s": args.questions, "long-replies": args.long_replies_questions}
    report: Json = {"timestamp": timestamp, "machine": machine_info(), "splits": {}}
    for split in splits:
        limit = limits.get(split, args.oracle_questions)
        report["splits"][split] = evaluate_split(split, limit, protocols)
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
