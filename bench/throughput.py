"""Throughput and latency of a real Calor server: `make bench`.

What it measures, in order:

1. **Raw model throughput**: the bench process loads the embedder (2 threads) and
   embeds the whole corpus in one ``embed_passages`` call after a 64-text warm-up.
   The model is then freed so it does not compete with the server.
2. **Ingest throughput**: a fresh ``calor serve`` subprocess takes the same corpus
   through ONE ``StoreStream`` call into one channel, timed from the first send to the
   response. ``ingest / raw`` is the headline figure (target >= 0.7): how much of the
   model's speed survives validation, batching, RocksDB, FAISS and BM25.
3. **Recall latency** at N memories, end to end on the client (query embedding
   included): 300 sequential ``Recall(limit=10, peek=True)`` after 50 warm-ups, then
   100 with ``peek=False`` (heat bumps persisted).
4. **Context latency** at N memories, end to end (message embedding included): each
   query once as a ``Context(token_budget=1000)`` message after 20 warm-ups of other
   messages, so every block is assembled; then the first 100 again, answered from the
   reuse window (no model).
5. **Single Store latency**: 200 sequential ``Store`` calls of short texts.

The corpus (``bench/corpus.py``) is LongMemEval user/assistant turns from
``../shared/data``, topped up with generated sentences when the files run short;
recall queries are the LongMemEval questions. The server subprocess is driven by
``bench/_server.py``.

Results are printed as a table and written as JSON to ``bench/results/``
(``throughput-<UTC timestamp>.json`` and ``throughput-latest.json``).

    .venv/bin/python bench/throughput.py [--memories 10000] [--queries 300] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np

# Beside this script, so on sys.path when it runs as `python bench/throughput.py`.
from _server import Server
from corpus import Corpus, build_corpus

from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results"

WARMUP_TEXTS = 64
WARMUP_RECALLS = 50
WRITE_RECALLS = 100
WARMUP_CONTEXTS = 20
REUSED_CONTEXTS = 100
CONTEXT_BUDGET = 1000
SINGLE_STORES = 200
TARGET_RATIO = 0.7
CHANNEL = "bench"
WARMUP_CHANNEL = "bench-warmup"
CALL_TIMEOUT_S = 3600.0

Json = dict[str, Any]


# --- raw model ------------------------------------------------------------------------


def measure_raw(texts: Sequence[str]) -> Json:
    """Embed the whole corpus in this process after a warm-up; then free the model."""
    from calor.models.embedder import OnnxEmbedder

    started = time.perf_counter()
    embedder = OnnxEmbedder.load(threads=2)
    loaded = time.perf_counter() - started
    embedder.embed_passages(list(texts[:WARMUP_TEXTS]))
    started = time.perf_counter()
    vectors = embedder.embed_passages(list(texts))
    seconds = time.perf_counter() - started
    assert vectors.shape[0] == len(texts)
    del embedder, vectors
    gc.collect()
    return {
        "texts": len(texts),
        "load_s": round(loaded, 3),
        "seconds": round(seconds, 3),
        "texts_per_s": round(len(texts) / seconds, 1),
    }


# --- measurements ---------------------------------------------------------------------


def stream_store(stub: pb_grpc.MemoryServiceStub, channel: str, texts: Sequence[str]) -> float:
    """Store every text through one StoreStream call; returns the seconds it took."""
    requests = [
        pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel, text=t)) for t in texts
    ]
    started = time.perf_counter()
    reply = stub.StoreStream(iter(requests), timeout=CALL_TIMEOUT_S)
    seconds = time.perf_counter() - started
    if len(reply.ids) != len(texts) or len(set(reply.ids)) != len(texts):
        raise RuntimeError(f"StoreStream answered {len(reply.ids)} ids for {len(texts)} texts")
    return seconds


def recall_times(
    stub: pb_grpc.MemoryServiceStub, channel: str, queries: Sequence[str], peek: bool
) -> list[float]:
    """Milliseconds of each sequential Recall(limit=10), end to end."""
    times: list[float] = []
    for query in queries:
        request = pb.RecallRequest(channel=channel, query=query, limit=10, peek=peek)
        started = time.perf_counter()
        reply = stub.Recall(request, timeout=60.0)
        times.append((time.perf_counter() - started) * 1000)
        if not reply.hits:
            raise RuntimeError(f"Recall found nothing for {query!r}")
    return times


def context_times(
    stub: pb_grpc.MemoryServiceStub, channel: str, messages: Sequence[str]
) -> tuple[list[float], int]:
    """Milliseconds of each sequential Context(token_budget=1000), end to end, and how
    many blocks came back from the reuse window."""
    times: list[float] = []
    reused = 0
    for message in messages:
        request = pb.ContextRequest(channel=channel, message=message, token_budget=CONTEXT_BUDGET)
        started = time.perf_counter()
        reply = stub.Context(request, timeout=60.0)
        times.append((time.perf_counter() - started) * 1000)
        if not reply.block or reply.tokens_used > CONTEXT_BUDGET:
            raise RuntimeError(f"Context gave {reply.tokens_used} tokens for {message!r}")
        reused += reply.reused
    return times, reused


def store_times(stub: pb_grpc.MemoryServiceStub, channel: str, count: int) -> list[float]:
    """Milliseconds of each of ``count`` sequential single Store calls of short texts."""
    rng = random.Random(3)
    times: list[float] = []
    for i in range(count):
        text = f"Note {i}: the user wants tea at {rng.randrange(7, 22)}:{rng.randrange(60):02d}."
        started = time.perf_counter()
        stub.Store(pb.StoreRequest(channel=channel, text=text), timeout=60.0)
        times.append((time.perf_counter() - started) * 1000)
    return times


def summarize(times_ms: Sequence[float]) -> Json:
    """Count, p50, p90, p99 and mean of latencies in milliseconds."""
    values = np.asarray(times_ms, dtype=np.float64)
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "n": int(values.size),
        "p50_ms": round(float(p50), 2),
        "p90_ms": round(float(p90), 2),
        "p99_ms": round(float(p99), 2),
        "mean_ms": round(float(values.mean()), 2),
        "max_ms": round(float(values.max()), 2),
    }


def measure_server(corpus: Corpus, server: Server) -> Json:
    """Ingest, recall and store against a ready server."""
    stub = server.stub
    results: Json = {"ready_s": round(server.wait_ready(), 2)}
    stream_store(stub, WARMUP_CHANNEL, corpus.texts[:WARMUP_TEXTS])  # warm the server's model
    seconds = stream_store(stub, CHANNEL, corpus.texts)
    results["ingest"] = {
        "memories": len(corpus.texts),
        "seconds": round(seconds, 3),
        "memories_per_s": round(len(corpus.texts) / seconds, 1),
    }
    results["rss_after_ingest_mb"] = server.rss_mb()
    warmup = [corpus.queries[i % len(corpus.queries)] for i in range(WARMUP_RECALLS)]
    recall_times(stub, CHANNEL, warmup, peek=True)
    results["recall_peek"] = summarize(recall_times(stub, CHANNEL, corpus.queries, peek=True))
    writes = corpus.queries[:WRITE_RECALLS]
    results["recall_write"] = summarize(recall_times(stub, CHANNEL, writes, peek=False))
    queries = corpus.queries
    warm = [f"{queries[i % len(queries)]} (warm-up)" for i in range(WARMUP_CONTEXTS)]
    context_times(stub, CHANNEL, warm)
    built, reused = context_times(stub, CHANNEL, queries)
    results["context"] = {**summarize(built), "reused": reused}
    again, reused = context_times(stub, CHANNEL, queries[:REUSED_CONTEXTS])
    results["context_reused"] = {**summarize(again), "reused": reused}
    results["store_single"] = summarize(store_times(stub, CHANNEL, SINGLE_STORES))
    results["rss_end_mb"] = server.rss_mb()
    results["data_dir_mb"] = server.data_mb()
    return results


# --- report ---------------------------------------------------------------------------


def git(*args: str) -> str | None:
    """What a git command prints in the repository, or None outside git."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def cpu_model() -> str:
    """The CPU's model name (Linux), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile")


def cpu_flags() -> dict[str, bool]:
    """Which of the flags that move ONNX and FAISS figures the CPU has (Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    for line in info.splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return {flag: flag in present for flag in CPU_FLAGS}
    return {}


def machine_info() -> Json:
    import onnxruntime

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "nproc": len(affinity) if affinity else os.cpu_count(),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "grpcio": grpc.__version__,
        "git_commit": git("rev-parse", "--short", "HEAD") or None,
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def render_table(report: Json) -> str:
    """The results as aligned plain text."""
    corpus, raw, ingest = report["corpus"], report["raw"], report["server"]["ingest"]
    machine, ratio = report["machine"], report["ingest_over_raw"]
    sources = ", ".join(f"{name} {count}" for name, count in corpus["sources"].items())
    verdict = "ok" if ratio >= TARGET_RATIO else "BELOW TARGET"
    lines = [
        f"Calor throughput: {corpus['texts']:,} memories, {corpus['queries']} queries "
        f"(commit {machine['git_commit']}{'+dirty' if machine['git_dirty'] else ''}, "
        f"{machine['nproc']} CPUs, "
        f"Python {machine['python']})",
        "",
        f"  {'corpus':<22}{corpus['texts']:>9,} texts, mean {corpus['mean_chars']:.0f} chars"
        f" ({sources})",
        f"  {'raw model':<22}{raw['texts_per_s']:>9.1f} texts/s   ({raw['seconds']:.1f} s)",
        f"  {'ingest (StoreStream)':<22}{ingest['memories_per_s']:>9.1f} mem/s     "
        f"({ingest['seconds']:.1f} s)",
        f"  {'ingest / raw':<22}{ratio:>9.2f}           (target >= {TARGET_RATIO}: {verdict})",
        "",
        f"  {'latency (ms)':<22}{'n':>6}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}{'max':>9}",
    ]
    server = report["server"]
    for label, key in (
        ("recall peek=True", "recall_peek"),
        ("recall peek=False", "recall_write"),
        (f"context ({CONTEXT_BUDGET:,} tokens)", "context"),
        ("context reused", "context_reused"),
        ("store (single)", "store_single"),
    ):
        s = server[key]
        lines.append(
            f"  {label:<22}{s['n']:>6}{s['p50_ms']:>9.2f}{s['p90_ms']:>9.2f}"
            f"{s['p99_ms']:>9.2f}{s['mean_ms']:>9.2f}{s['max_ms']:>9.2f}"
        )
    lines += [
        "",
        f"  server RSS after ingest {server['rss_after_ingest_mb']} MB, at end "
        f"{server['rss_end_mb']} MB; data dir {server['data_dir_mb']} MB; "
        f"ready in {server['ready_s']} s",
    ]
    return "\n".join(lines)


def write_results(report: Json, out_dir: Path, name: str = "throughput") -> Path:
    """Write the report as ``<name>-<timestamp>.json`` and as ``<name>-latest.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = report["timestamp"].replace(":", "").replace("-", "")
    path = out_dir / f"{name}-{stamp}.json"
    text = json.dumps(report, indent=2) + "\n"
    path.write_text(text)
    (out_dir / f"{name}-latest.json").write_text(text)
    return path


# --- main -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000, help="corpus size N")
    parser.add_argument("--queries", type=int, default=300, help="recall queries timed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    args = parser.parse_args(argv)
    if args.memories < WARMUP_TEXTS or args.queries < 1:
        parser.error(f"--memories must be at least {WARMUP_TEXTS} and --queries at least 1")
    return args


def run(memories: int, queries: int) -> Json:
    """Every measurement, as one report."""
    timestamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    corpus = build_corpus(memories, queries)
    print(f"corpus: {corpus.describe()}", flush=True)
    print("embedding the corpus in-process (raw model throughput)...", flush=True)
    raw = measure_raw(corpus.texts)
    print(f"raw: {raw}", flush=True)
    server = Server()
    try:
        print(f"server pid {server.pid} on port {server.port}; ingesting...", flush=True)
        measured = measure_server(corpus, server)
        measured["exit_code"] = server.stop()
    finally:
        server.close()
    return {
        "timestamp": timestamp,
        "machine": machine_info(),
        "corpus": corpus.describe(),
        "raw": raw,
        "server": measured,
        "ingest_over_raw": round(measured["ingest"]["memories_per_s"] / raw["texts_per_s"], 3),
        "target_ratio": TARGET_RATIO,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args.memories, args.queries)
    print()
    print(render_table(report))
    path = write_results(report, args.out)
    print(f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
