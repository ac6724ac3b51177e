"""Recall latency of this checkout against an earlier commit, side by side in one run.

Two ``calor serve`` run at once on this machine: this checkout's and the one of
``--rev`` (a git worktree of it, imported ahead of this checkout's code; the generated
stubs are this checkout's, which only ever add fields). Both take the same N short
memories (``corpus.build_short_corpus``); then every query goes to both, in a random
order per query, so whatever else the machine does in a moment falls on both sides
alike. Run one after the other, two servers drift apart by more than a change to recall
costs (0.5 to 1.5 ms of 8 on a busy 2-core VM); interleaved they do not. The table gives
each side's p50 / p90 / p99 / mean end to end (query embedding included: each query is
new to both servers) and the median of the per-query differences.

```
.venv/bin/python bench/versus.py --rev 126ebd9 [--memories 10000] [--queries 1200] [--no-peek]
```
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _server import Server
from corpus import build_short_corpus
from throughput import machine_info, stream_store, write_results

from calor.v1 import memory_service_pb2 as pb

Json = dict[str, Any]
CHANNEL = "versus"
WARM = 50  # queries per side before timing starts
REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("server", "client", "models", "triggers")  # calor.<name> → <tree>/<name>


def earlier_tree(rev: str, workdir: Path) -> dict[str, str]:
    """A worktree of ``rev`` and the environment whose ``calor`` imports it."""
    tree = workdir / "tree"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), rev], check=True
    )
    package = workdir / "path" / "calor"
    package.mkdir(parents=True)
    for name in PACKAGES:
        (package / name).symlink_to(tree / name)
    (package / "v1").symlink_to(REPO / "client" / "v1")
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    probe = "import calor.server.recall.ranking as m; print(m.__file__)"
    imported = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    if not imported.startswith(str(package)):
        raise SystemExit(f"the earlier server would import {imported}, not {package}")
    return env


def summary(times: Sequence[float]) -> Json:
    values = np.asarray(times)
    return {
        "n": len(values),
        **{f"p{q}_ms": round(float(np.percentile(values, q)), 3) for q in (50, 90, 99)},
        "mean_ms": round(float(values.mean()), 3),
    }


def interleave(servers: dict[str, Server], queries: Sequence[str], peek: bool) -> Json:
    """Each query to every server in a random order; the timings after the warm-up."""
    order, rng = list(servers), random.Random(7)
    times: dict[str, list[float]] = {name: [] for name in servers}
    for position, query in enumerate(queries):
        rng.shuffle(order)
        for name in order:
            request = pb.RecallRequest(channel=CHANNEL, query=query, limit=10, peek=peek)
            started = time.perf_counter()
            servers[name].stub.Recall(request, timeout=60.0)
            if position >= WARM:
                times[name].append((time.perf_counter() - started) * 1000)
    differences = np.subtract(times["now"], times["earlier"])
    return {
        **{name: summary(values) for name, values in times.items()},
        "median_difference_ms": round(float(np.median(differences)), 3),
    }


def render(report: Json) -> str:
    machine, result = report["machine"], report["result"]
    flags = " ".join(flag for flag, has in machine["cpu_flags"].items() if has) or "none"
    lines = [
        f"Recall(limit=10, peek={report['peek']}) at {report['memories']} memories, "
        f"{report['queries']} queries interleaved",
        f"  {machine['cpu']}, {machine['nproc']} CPUs, flags: {flags}",
        f"  {'server':<22}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'mean ms':>9}",
    ]
    now = f"{machine['git_commit'] or 'now'}{' (changed)' if machine['git_dirty'] else ''}"
    for name, label in (("earlier", report["rev"]), ("now", now)):
        row = result[name]
        lines.append(
            f"  {label:<22}{row['p50_ms']:>9.2f}{row['p90_ms']:>9.2f}"
            f"{row['p99_ms']:>9.2f}{row['mean_ms']:>9.2f}"
        )
    difference = result["median_difference_ms"]
    lines.append(f"  median of (now - earlier), per query: {difference:+.3f} ms")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=1_200)
    parser.add_argument("--peek", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    corpus = build_short_corpus(args.memories, args.queries + WARM)
    workdir = Path(tempfile.mkdtemp(prefix="calor-versus-"))
    servers: dict[str, Server] = {}
    try:
        env = earlier_tree(args.rev, workdir)
        servers = {"now": Server(), "earlier": Server(env=env)}
        for server in servers.values():
            server.wait_ready()
            stream_store(server.stub, CHANNEL, corpus.texts)
        report: Json = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rev": args.rev,
            "memories": len(corpus.texts),
            "queries": len(corpus.queries) - WARM,
            "peek": args.peek,
            "machine": machine_info(),
            "result": interleave(servers, corpus.queries, args.peek),
        }
    finally:
        for server in servers.values():
            server.close()
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(workdir / "tree")],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(report))
    print(f"wrote {write_results(report, args.out, name='versus')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
