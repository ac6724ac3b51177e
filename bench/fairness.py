"""Recall latency on one channel while another channel takes a big batch: `make bench`.

One client keeps asking ``Recall(limit=10, peek=True)`` on a channel of ``--memories``
memories, one call after another, while a second client pushes ``--batch`` items into
another channel. The reader's latency is measured end to end (query embedding
included) in four phases:

1. **idle**: nothing else runs (the yardstick);
2. **StoreStream**: one ``StoreStream`` of ``--batch`` items into another channel;
3. **Import**: one ``Import`` of ``--batch`` Markdown notes into another channel;
4. **two batches**: a ``--batch`` StoreStream, and after a second a small one
   (``SMALL_BATCH`` items) from a third client: how long the small one takes beside the
   big one, against alone, says whether one client can monopolise ingest.

The acceptance bound is printed beside the figures: the worst recall under load within
5x the idle worst case and under 250 ms. Results are printed and written as JSON to
``bench/results/fairness-<UTC timestamp>.json`` and ``fairness-latest.json``.

    .venv/bin/python bench/fairness.py [--memories 2000] [--batch 5000] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from _server import Server
from corpus import build_corpus
from throughput import machine_info, stream_store, summarize, write_results

from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results"
READER, WRITER = "reader", "writer"
IDLE_RECALLS = 300
SMALL_BATCH = 200
BOUND_RATIO, BOUND_MS = 5.0, 250.0
CALL_TIMEOUT_S = 3600.0

Json = dict[str, Any]


class RecallLoop:
    """Sequential peek recalls on one channel in a thread, until stopped."""

    def __init__(self, stub: pb_grpc.MemoryServiceStub, queries: Sequence[str]) -> None:
        self._stub = stub
        self._queries = queries
        self._stop = threading.Event()
        self.times_ms: list[float] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        i = 0
        while not self._stop.is_set():
            query = self._queries[i % len(self._queries)]
            request = pb.RecallRequest(channel=READER, query=query, limit=10, peek=True)
            started = time.perf_counter()
            try:
                self._stub.Recall(request, timeout=60.0)
            except grpc.RpcError as error:  # counted, and its time kept: a failed recall
                self.errors.append(str(error.code()))
            self.times_ms.append((time.perf_counter() - started) * 1000)
            i += 1

    def __enter__(self) -> RecallLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def import_notes(stub: pb_grpc.MemoryServiceStub, channel: str, texts: Sequence[str]) -> float:
    """Import every text as a Markdown note in one call; returns the seconds it took."""

    def requests() -> Iterator[pb.ImportRequest]:
        yield pb.ImportRequest(channel=channel, markdown="")
        for start in range(0, len(texts), 100):
            notes = "".join("- " + " ".join(t.split()) + "\n" for t in texts[start : start + 100])
            yield pb.ImportRequest(markdown=notes)

    started = time.perf_counter()
    reply = stub.Import(requests(), timeout=CALL_TIMEOUT_S)
    seconds = time.perf_counter() - started
    if len(reply.ids) != len(texts):
        raise RuntimeError(f"Import answered {len(reply.ids)} ids for {len(texts)} notes")
    return seconds


def under_load(
    stub: pb_grpc.MemoryServiceStub, queries: Sequence[str], load: Callable[[], float]
) -> Json:
    """The reader's latencies while ``load`` runs, and how long the load took."""
    with RecallLoop(stub, queries) as loop:
        seconds = load()
    return {"load_s": round(seconds, 2), "errors": loop.errors, **summarize(loop.times_ms)}


def two_batches(server: Server, big: Sequence[str], small: Sequence[str]) -> Json:
    """How long a small StoreStream takes alone, and beside a big one started first."""
    alone = stream_store(server.stub, "small-alone", small)
    done: dict[str, float] = {}
    worker = threading.Thread(
        target=lambda: done.update(big=stream_store(server.stub, "big", big)), daemon=True
    )
    worker.start()
    time.sleep(1.0)
    beside = stream_store(server.stub, "small-beside", small)
    worker.join()
    return {
        "small_items": len(small),
        "small_alone_s": round(alone, 2),
        "small_beside_big_s": round(beside, 2),
        "big_s": round(done["big"], 2),
    }


def measure(memories: int, batch: int) -> Json:
    """Every phase against one fresh server."""
    corpus = build_corpus(memories + 2 * batch, 300)
    resident = corpus.texts[:memories]
    load = corpus.texts[memories : memories + batch]
    other = corpus.texts[memories + batch :]
    server = Server()
    try:
        ready = server.wait_ready()
        stub = server.stub
        stream_store(stub, READER, resident)
        warm = [pb.RecallRequest(channel=READER, query=q, peek=True) for q in corpus.queries[:50]]
        for request in warm:
            stub.Recall(request, timeout=60.0)
        idle: list[float] = []
        for i in range(IDLE_RECALLS):
            request = pb.RecallRequest(
                channel=READER, query=corpus.queries[i % len(corpus.queries)], limit=10, peek=True
            )
            started = time.perf_counter()
            stub.Recall(request, timeout=60.0)
            idle.append((time.perf_counter() - started) * 1000)
        phases: Json = {"idle": summarize(idle)}
        queries = corpus.queries
        phases["store_stream"] = under_load(stub, queries, lambda: stream_store(stub, WRITER, load))
        phases["import"] = under_load(
            stub, queries, lambda: import_notes(stub, WRITER + "-import", other)
        )
        fairness = two_batches(server, load, other[:SMALL_BATCH])
        exit_code = server.stop()
    finally:
        server.close()
    bound = min(BOUND_RATIO * phases["idle"]["max_ms"], BOUND_MS)
    return {
        "memories": memories,
        "batch": batch,
        "ready_s": round(ready, 2),
        "phases": phases,
        "two_batches": fairness,
        "bound_ms": round(bound, 2),
        "within_bound": all(phases[p]["max_ms"] <= bound for p in ("store_stream", "import")),
        "exit_code": exit_code,
    }


def render_table(report: Json) -> str:
    """The results as aligned plain text."""
    machine, m = report["machine"], report["measured"]
    lines = [
        f"Calor recall under another channel's batch: {m['memories']:,} memories in the "
        f"reader's channel, batches of {m['batch']:,} (commit {machine['git_commit']}"
        f"{'+dirty' if machine['git_dirty'] else ''}, {machine['cpu']}, "
        f"{machine['nproc']} CPUs)",
        "",
        f"  {'peek recall (ms)':<26}{'n':>6}{'p50':>9}{'p99':>9}{'max':>9}{'max/idle':>10}"
        f"{'load s':>9}",
    ]
    idle_max = m["phases"]["idle"]["max_ms"]
    for label, key in (
        ("idle", "idle"),
        ("during StoreStream", "store_stream"),
        ("during Import", "import"),
    ):
        s = m["phases"][key]
        load = f"{s['load_s']:>9.1f}" if "load_s" in s else f"{'':>9}"
        lines.append(
            f"  {label:<26}{s['n']:>6}{s['p50_ms']:>9.1f}{s['p99_ms']:>9.1f}"
            f"{s['max_ms']:>9.1f}{s['max_ms'] / idle_max:>10.2f}{load}"
        )
    verdict = "ok" if m["within_bound"] else "OVER"
    two = m["two_batches"]
    lines += [
        "",
        f"  bound: worst under load <= min(5 x idle worst, 250 ms) = {m['bound_ms']:.1f} ms: "
        f"{verdict}",
        f"  {two['small_items']} items alone {two['small_alone_s']:.2f} s; beside a "
        f"{m['batch']:,}-item batch {two['small_beside_big_s']:.2f} s "
        f"(the big one took {two['big_s']:.1f} s)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=2_000, help="the reader's memories")
    parser.add_argument("--batch", type=int, default=5_000, help="items in each batch")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    args = parser.parse_args(argv)
    timestamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    report = {
        "timestamp": timestamp,
        "machine": machine_info(),
        "measured": measure(args.memories, args.batch),
    }
    print(render_table(report))
    path = write_results(report, args.out, "fairness")
    print(f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
