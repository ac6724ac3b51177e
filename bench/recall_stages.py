"""Where one recall's time goes, stage by stage, timed by the server itself.

A fresh ``calor serve`` (metrics on) takes N short memories (``corpus.build_short_corpus``)
through one ``StoreStream``; then 300 ``Recall(limit=10, peek=True)`` and as many with
``peek=False`` run one after another, each with a query of its own (a repeated query
would skip the model). The server times each call's stages (``calor_rpc_stage_seconds``:
validation, the embedding queue, the model, the executor, dense and lexical search,
fusion and scoring, heat effects, the commit, the reply); the table gives each stage's
mean wall milliseconds per recall, the handler's whole time, and what the client saw
beyond it (its gRPC stack, the wire, the server's gRPC and interceptors). Wall time, not
CPU: a stage that waits for a thread or the GIL counts its wait. No profiler runs, so the
figures are the recall's own (``recall_profile.py`` samples with py-spy instead).

```
.venv/bin/python bench/recall_stages.py [--memories 10000] [--recalls 300] [--out DIR]
```
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _server import Server
from corpus import build_short_corpus
from prometheus_client.parser import text_string_to_metric_families
from throughput import machine_info, stream_store, write_results

from calor.server.cluster.local import free_port
from calor.server.config import APPROXIMATE_ABOVE
from calor.server.stages import RECALL_STAGES
from calor.v1 import memory_service_pb2 as pb

Json = dict[str, Any]
CHANNEL = "stages"
RECALL = "calor.v1.MemoryService/Recall"
ORDER = RECALL_STAGES


def graph_wait(server: Server, memories: int, timeout: float = 1800.0) -> None:
    """Past the server's ``approximate_above`` the channel is searched through an HNSW
    graph built in the background: wait until the server logs it is in place, so the
    recalls time the index the channel settles on (and no build competes for the CPU)."""
    if memories <= APPROXIMATE_ABOVE:
        return
    give_up = time.monotonic() + timeout
    while "searched through an HNSW graph" not in server.log_path.read_text(errors="replace"):
        if time.monotonic() > give_up:
            raise TimeoutError(f"no HNSW graph after {timeout:.0f} s:\n{server.log_tail()}")
        time.sleep(0.5)


def scrape(port: int) -> tuple[dict[str, float], float, float]:
    """Recall's seconds in all per stage, and its handler's calls and seconds, so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    stages: dict[str, float] = {}
    calls = handler = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("rpc_method") != RECALL:
                continue
            if sample.name == "calor_rpc_stage_seconds_sum":
                stages[labels["stage"]] = sample.value
            elif sample.name == "rpc_server_call_duration_seconds_sum":
                handler += sample.value
            elif sample.name == "rpc_server_call_duration_seconds_count":
                calls += sample.value
    return stages, calls, handler


def run(server: Server, port: int, queries: Sequence[str], peek: bool) -> Json:
    """One loop of recalls: each stage's mean ms, the handler's, and the client's."""
    stages_before, calls_before, handler_before = scrape(port)
    client_ms: list[float] = []
    for query in queries:
        request = pb.RecallRequest(channel=CHANNEL, query=query, limit=10, peek=peek)
        began = time.perf_counter()
        server.stub.Recall(request, timeout=60.0)
        client_ms.append((time.perf_counter() - began) * 1000)
    stages_after, calls_after, handler_after = scrape(port)
    count = calls_after - calls_before
    per_stage = {
        name: (stages_after.get(name, 0.0) - stages_before.get(name, 0.0)) * 1000 / count
        for name in ORDER
    }
    handler = (handler_after - handler_before) * 1000 / count
    return {
        "recalls": int(count),
        "stage_ms": per_stage,
        "handler_ms": handler,
        "client_mean_ms": statistics.fmean(client_ms),
        "client_p50_ms": statistics.median(client_ms),
    }


def render(report: Json) -> str:
    peek, full = report["peek"], report["recall"]
    lines = [
        f"One recall by stage at {report['memories']:,} memories "
        f"({report['machine']['cpu']}, {report['machine']['nproc']} CPUs), mean ms",
        f"  {'stage':<40}{'peek':>8}{'recall':>9}",
    ]
    for name in ORDER:
        lines.append(f"  {name:<40}{peek['stage_ms'][name]:>8.3f}{full['stage_ms'][name]:>9.3f}")

    def row(label: str, a: float, b: float) -> None:
        lines.append(f"  {label:<40}{a:>8.3f}{b:>9.3f}")

    row(
        "the handler's other work",
        peek["handler_ms"] - sum(peek["stage_ms"].values()),
        full["handler_ms"] - sum(full["stage_ms"].values()),
    )
    row("handler in all (server side)", peek["handler_ms"], full["handler_ms"])
    row(
        "outside the handler (gRPC both ends)",
        peek["client_mean_ms"] - peek["handler_ms"],
        full["client_mean_ms"] - full["handler_ms"],
    )
    row("client mean, end to end", peek["client_mean_ms"], full["client_mean_ms"])
    row("client p50, end to end", peek["client_p50_ms"], full["client_p50_ms"])
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--recalls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    corpus = build_short_corpus(args.memories, 2 * args.recalls + 50)
    queries = corpus.queries
    warm, peek_queries, full_queries = queries[:50], queries[50:][::2], queries[50:][1::2]
    port = free_port()
    server = Server(args=["--metrics-port", str(port)])
    try:
        server.wait_ready()
        stream_store(server.stub, CHANNEL, corpus.texts)
        graph_wait(server, len(corpus.texts))
        run(server, port, warm, peek=True)
        report: Json = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "memories": len(corpus.texts),
            "machine": machine_info(),
            "peek": run(server, port, peek_queries, True),
            "recall": run(server, port, full_queries, False),
        }
    finally:
        server.close()
    print(render(report))
    print(f"wrote {write_results(report, args.out, name='recall-stages')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
