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
4. **Single Store latency**: 200 sequential ``Store`` calls of short texts.

The corpus is LongMemEval user/assistant turns (``role: content``, capped at 1,000
characters, deduplicated, in file order) from ``../shared/data``: the oracle split
first, topped up from the ``_s`` split when the oracle runs short, and from generated
sentences when neither file is there. Recall queries are the LongMemEval questions.

Results are printed as a table and written as JSON to ``bench/results/``
(``throughput-<UTC timestamp>.json`` and ``throughput-latest.json``).

    .venv/bin/python bench/throughput.py [--memories 10000] [--queries 300] [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
ORACLE = DATA / "longmemeval_oracle.json"
LONGMEMEVAL_S = DATA / "longmemeval_s_498.json.gz"
DEFAULT_OUT = REPO / "bench" / "results"

MAX_CHARS = 1000
WARMUP_TEXTS = 64
WARMUP_RECALLS = 50
WRITE_RECALLS = 100
SINGLE_STORES = 200
TARGET_RATIO = 0.7
CHANNEL = "bench"
WARMUP_CHANNEL = "bench-warmup"
READY_TIMEOUT_S = 180.0
CALL_TIMEOUT_S = 3600.0

Json = dict[str, Any]


# --- corpus ---------------------------------------------------------------------------


@dataclass
class Corpus:
    """The texts to store, the queries to recall with, and where the texts came from."""

    texts: list[str]
    queries: list[str]
    sources: dict[str, int] = field(default_factory=dict)

    def describe(self) -> Json:
        lengths = [len(text) for text in self.texts]
        return {
            "texts": len(self.texts),
            "queries": len(self.queries),
            "sources": self.sources,
            "mean_chars": round(float(np.mean(lengths)), 1) if lengths else 0.0,
            "median_chars": float(np.median(lengths)) if lengths else 0.0,
        }


def load_questions(path: Path) -> list[Json]:
    """The LongMemEval questions in a file (plain or gzipped JSON); [] when it is missing."""
    if not path.is_file():
        return []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        questions: list[Json] = json.load(f)
    return questions


def turn_texts(questions: Iterable[Json]) -> Iterator[str]:
    """Every turn of every haystack session, as ``role: content``, capped, in order."""
    for question in questions:
        for session in question.get("haystack_sessions", []):
            for turn in session:
                text = f"{turn['role']}: {turn['content']}"[:MAX_CHARS].strip()
                if text:
                    yield text


def generated_sentences(seed: int = 7) -> Iterator[str]:
    """An endless supply of plausible memory-sized texts, 1 to 6 sentences each."""
    rng = random.Random(seed)
    subjects = ["The user", "Maya", "Our team", "The agent", "My sister", "The landlord"]
    verbs = ["prefers", "booked", "mentioned", "cancelled", "is planning", "asked about"]
    objects = [
        "a window seat on the morning flight",
        "oat milk in every coffee",
        "the quarterly budget review",
        "a hiking trip to the Dolomites",
        "a refund for the broken blender",
        "moving the standup to 9:30",
        "learning Portuguese before July",
    ]
    times = ["yesterday", "last week", "on Friday", "every morning", "in March", "twice"]
    while True:
        sentences = [
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} "
            f"{rng.choice(times)} (note {rng.randrange(10**6)})."
            for _ in range(rng.randint(1, 6))
        ]
        yield " ".join(sentences)


def generated_queries() -> Iterator[str]:
    """An endless supply of recall questions for when no LongMemEval file is there."""
    for text in generated_sentences(seed=11):
        yield "What do I know about " + text.split(" (note")[0].lower() + "?"


def take_unique(
    supply: Iterable[str], want: int, seen: set[str], into: list[str], source: str
) -> dict[str, int]:
    """Append unseen texts from ``supply`` to ``into`` until it holds ``want``."""
    added = 0
    for text in supply:
        if len(into) >= want:
            break
        if text not in seen:
            seen.add(text)
            into.append(text)
            added += 1
    return {source: added} if added else {}


def build_corpus(memories: int, queries: int) -> Corpus:
    """N memory texts and Q queries, LongMemEval first, generated only to fill a gap."""
    texts: list[str] = []
    seen: set[str] = set()
    oracle = load_questions(ORACLE)
    sources = take_unique(turn_texts(oracle), memories, seen, texts, "longmemeval_oracle")
    if len(texts) < memories:
        extra = load_questions(LONGMEMEVAL_S)  # about 1.6 GB parsed; freed right after
        sources |= take_unique(turn_texts(extra), memories, seen, texts, "longmemeval_s")
        del extra
        gc.collect()
    sources |= take_unique(generated_sentences(), memories, seen, texts, "generated")
    asked: list[str] = []
    questions = (str(q["question"]).strip() for q in oracle if q.get("question"))
    take_unique(questions, queries, set(), asked, "questions")
    take_unique(generated_queries(), queries, set(asked), asked, "generated")
    return Corpus(texts, asked, sources)


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


# --- the server -----------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def calor_command() -> str:
    """The ``calor`` entry point of this interpreter's environment."""
    beside = Path(sys.executable).parent / "calor"
    found = str(beside) if beside.exists() else shutil.which("calor")
    if found is None:
        raise SystemExit("cannot find the `calor` command; run `make` first")
    return found


class Server:
    """``calor serve`` as a subprocess on a free port with a fresh data dir."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="calor-bench-"))
        self.data_dir = self.workdir / "data"
        self.port = free_port()
        self.log_path = self.workdir / "server.log"
        self._log = self.log_path.open("wb")
        command = [calor_command(), "serve", "--data-dir", str(self.data_dir)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.MemoryServiceStub(self.channel)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Poll health until SERVING; returns the seconds it took."""
        health = health_pb2_grpc.HealthStub(self.channel)
        request = health_pb2.HealthCheckRequest(service="")
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited early:\n{self.log_tail()}")
            try:
                status = health.Check(request, timeout=1.0).status
            except grpc.RpcError:
                status = health_pb2.HealthCheckResponse.UNKNOWN
            if status == health_pb2.HealthCheckResponse.SERVING:
                return time.perf_counter() - started
            time.sleep(0.1)
        raise TimeoutError(f"the server was not SERVING after {timeout:.0f} s:\n{self.log_tail()}")

    def rss_mb(self) -> float | None:
        """The server's resident memory in MB (Linux), or None."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
        return None

    def data_mb(self) -> float:
        """The size of the data dir in MB."""
        total = sum(p.stat().st_size for p in self.data_dir.rglob("*") if p.is_file())
        return round(total / 2**20, 1)

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        self.channel.close()
        code: int | None = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        else:
            code = self.process.returncode
        return code

    def close(self) -> None:
        """Kill whatever is left and remove the data dir."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


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


def machine_info() -> Json:
    import onnxruntime

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "nproc": len(affinity) if affinity else os.cpu_count(),
        "cpu": cpu_model(),
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


def write_results(report: Json, out_dir: Path) -> Path:
    """Write the report as a timestamped JSON file and as throughput-latest.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = report["timestamp"].replace(":", "").replace("-", "")
    path = out_dir / f"throughput-{stamp}.json"
    text = json.dumps(report, indent=2) + "\n"
    path.write_text(text)
    (out_dir / "throughput-latest.json").write_text(text)
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
