"""Where a recall's time goes, by stage: py-spy samples ``calor serve`` while one client
recalls, and each sample is put under the stage its stack is in.

A fresh server takes N short memories (``corpus.build_short_corpus``) through one
``StoreStream``; then up to 300 ``Recall(limit=10, peek=True)`` and as many with
``peek=False`` (each with queries of its own: none repeats) run one after another
while py-spy samples every thread of the server (waits left out). The table gives,
per recall, the CPU milliseconds each stage took and its share, beside the client's
end-to-end p50: CPU, not wall time (threads overlap, and waits for the GIL or a thread
hop cost wall time without samples).

```
.venv/bin/python bench/recall_profile.py [--memories 10000] [--recalls 300] [--out DIR]
```
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _server import Server
from corpus import build_short_corpus
from throughput import machine_info, stream_store, write_results

from calor.v1 import memory_service_pb2 as pb

Json = dict[str, Any]
RATE = 250  # samples a second: cheap enough not to move the figures much
CHANNEL = "profile"

# Stages, first match wins: (name, substrings of a frame that put a sample there).
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("query embedding", ("embed_queries", "calor-query")),
    ("heat effects (compute)", ("recall_effects",)),
    ("heat effects (write)", ("changes.py", "MemoryStore.write", "recall_log.py")),
    ("dense search", ("ChannelIndex.dense", "ChannelIndex.similarities")),
    ("lexical search", ("LexicalIndex.match", "Match.top", "Match.scores", "Match.overlap")),
    ("candidate scoring", ("rank_channel",)),
    ("recall, other engine work", ("MemoryEngine.recall",)),
    ("events and triggers", ("/triggers/", "server/events.py")),
    ("reply conversion", ("convert.py", "MemoryServicer.Recall")),
    ("gRPC, interceptors, event loop", ("",)),
)


# Where a thread that waits sits (py-spy's own idle check does not see through every
# kernel): a sample whose innermost frame is one of these is a wait, not work.
IDLE_LEAVES = frozenset(
    {
        "_worker",
        "Condition.wait",
        "Event.wait",
        "EpollSelector.select",
        "Queue.get",
        "SimpleQueue.get",
        "_poll_wrapper",
        "Thread.run",  # gRPC's poller, blocked in C
        "sleep",
    }
)


def stage_of(stack: str) -> str:
    """The stage a sampled stack belongs to."""
    for name, marks in STAGES:
        if any(mark in stack for mark in marks):
            return name
    return STAGES[-1][0]


def record(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Start py-spy sampling a process (raw folded stacks, thread names, no idle)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [spy, "record", "-r", str(RATE), "-f", "raw", "-t", "-o", str(out)]
    return subprocess.Popen(
        [*command, "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def by_stage(folded: Path) -> Counter[str]:
    """Samples per stage from py-spy's folded output."""
    counts: Counter[str] = Counter()
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = stack.rsplit(";", 1)[-1].split(" (")[0]
        if stack and count.isdigit() and leaf not in IDLE_LEAVES:
            counts[stage_of(stack)] += int(count)
    return counts


def recall_loop(server: Server, queries: Sequence[str], peek: bool) -> list[float]:
    """Milliseconds of each recall, end to end on the client."""
    times: list[float] = []
    for query in queries:
        request = pb.RecallRequest(channel=CHANNEL, query=query, limit=10, peek=peek)
        start = time.perf_counter()
        server.stub.Recall(request, timeout=60.0)
        times.append((time.perf_counter() - start) * 1000)
    return times


def profile(server: Server, queries: Sequence[str], peek: bool, workdir: Path) -> Json:
    """Sample the server through one loop of recalls; the stages per recall."""
    folded = workdir / f"spy-{'peek' if peek else 'recall'}.txt"
    spy = record(server.pid, folded)
    time.sleep(1.0)  # py-spy attaches
    times = recall_loop(server, queries, peek)
    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=60)
    counts = by_stage(folded)
    per_recall_ms = {name: counts[name] * 1000 / RATE / len(queries) for name, _ in STAGES}
    ordered = sorted(times)
    return {
        "recalls": len(times),
        "p50_ms": ordered[len(ordered) // 2],
        "cpu_ms_per_recall": per_recall_ms,
        "samples": sum(counts.values()),
    }


def render(report: Json) -> str:
    lines = [
        f"Recall by stage at {report['memories']} memories "
        f"({report['machine']['cpu']}, {report['machine']['nproc']} CPUs)",
        f"  {'stage':<34}{'peek ms':>9}{'share':>8}{'recall ms':>11}{'share':>8}",
    ]
    peek, full = report["peek"], report["recall"]
    peek_total = sum(peek["cpu_ms_per_recall"].values()) or 1.0
    full_total = sum(full["cpu_ms_per_recall"].values()) or 1.0
    for name, _ in STAGES:
        a, b = peek["cpu_ms_per_recall"][name], full["cpu_ms_per_recall"][name]
        lines.append(f"  {name:<34}{a:>9.2f}{a / peek_total:>8.0%}{b:>11.2f}{b / full_total:>8.0%}")
    lines.append(f"  {'CPU in all':<34}{peek_total:>9.2f}{'':>8}{full_total:>11.2f}")
    lines.append(
        f"  {'client p50, end to end':<34}{peek['p50_ms']:>9.2f}{'':>8}{full['p50_ms']:>11.2f}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--recalls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--keep", action="store_true", help="keep py-spy's folded stacks")
    args = parser.parse_args(argv)
    corpus = build_short_corpus(args.memories, 2 * args.recalls + 50)
    # Each loop its own queries: the server keeps recent query vectors, and a repeated
    # query would skip the model.
    queries = corpus.queries
    warm, peek_queries, full_queries = queries[:50], queries[50:][::2], queries[50:][1::2]
    server = Server()
    workdir = Path(tempfile.mkdtemp(prefix="calor-profile-"))
    try:
        server.wait_ready()
        stream_store(server.stub, CHANNEL, corpus.texts)
        recall_loop(server, warm, peek=True)
        report: Json = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "memories": len(corpus.texts),
            "machine": machine_info(),
            "peek": profile(server, peek_queries, True, workdir),
            "recall": profile(server, full_queries, False, workdir),
        }
    finally:
        server.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(render(report))
    if args.keep:
        print(f"py-spy's folded stacks are in {workdir}")
    print(f"wrote {write_results(report, args.out, name='recall-profile')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
