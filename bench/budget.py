"""The CPU a recall cannot do without on this machine, against what the peers bench asks.

Two floors, measured here: the model's CPU per query (BGE-small as the server runs it:
one thread and two, one query at a time and batches of eight), and the CPU of a
``Recall`` through ``calor serve`` that does no work (an empty channel, a query whose
vector the server has cached), client and server, from 8 client threads. Any server
that embeds each new query with this model and answers over gRPC spends at least their
sum per recall. With the machine's cores that bounds its recalls per second; the
report sets that bound beside 1.5 x ChromaDB's 8-client rate from the latest
``peers.py`` run (``--peers``), the target of issue 13.

```
.venv/bin/python bench/budget.py [--peers bench/results/peers-latest.json] [--out DIR]
```
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _server import Server
from corpus import build_short_corpus
from grpc_health.v1 import health_pb2, health_pb2_grpc
from throughput import machine_info, write_results

from calor.server.embedding import load_model
from calor.v1 import memory_service_pb2 as pb

Json = dict[str, Any]
RESULTS = Path(__file__).parent / "results"
QUERIES = 480
CLIENTS = 8
CALLS_PER_CLIENT = 400


def own_cpu_s() -> float:
    """This process's CPU seconds (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """Another process's CPU seconds, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def model_floor(queries: list[str]) -> list[Json]:
    """CPU and wall milliseconds per query of the model alone."""
    rows: list[Json] = []
    for threads in (1, 2):
        model = load_model(threads=threads)
        model.embed_queries(queries[:8])
        for batch in (1, 8):
            cpu, wall = own_cpu_s(), time.perf_counter()
            for start in range(0, len(queries), batch):
                model.embed_queries(queries[start : start + batch])
            cpu, wall = own_cpu_s() - cpu, time.perf_counter() - wall
            rows.append(
                {
                    "threads": threads,
                    "batch": batch,
                    "cpu_ms": 1000 * cpu / len(queries),
                    "wall_ms": 1000 * wall / len(queries),
                }
            )
    return rows


def call_floor(server: Server, call: Callable[[], object]) -> Json:
    """Calls per second from 8 client threads, and the CPU per call on each side."""
    call()

    def client() -> None:
        for _ in range(CALLS_PER_CLIENT):
            call()

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    mine, theirs, wall = own_cpu_s(), process_cpu_s(server.pid), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    calls = CLIENTS * CALLS_PER_CLIENT
    return {
        "per_s": calls / (time.perf_counter() - wall),
        "client_cpu_ms": 1000 * (own_cpu_s() - mine) / calls,
        "server_cpu_ms": 1000 * (process_cpu_s(server.pid) - theirs) / calls,
    }


def ceilings(floor_ms: float, cores: int, peers: Json | None) -> list[Json]:
    """Per size of the peers run: 1.5 x ChromaDB's 8-client rate, the CPU per recall that
    leaves, and the most recalls per second the floor allows."""
    if peers is None:
        return []
    rows = []
    for size in peers.get("sizes", []):
        chroma = size.get("chroma", {}).get("clients", {}).get("per_s")
        if not chroma:
            continue
        target = 1.5 * chroma
        rows.append(
            {
                "memories": size.get("memories"),
                "chroma_per_s": chroma,
                "target_per_s": target,
                "target_cpu_ms": 1000 * cores / target,
                "floor_ms": floor_ms,
                "floor_per_s": 1000 * cores / floor_ms,
            }
        )
    return rows


def render(report: Json) -> str:
    machine = report["machine"]
    lines = [f"CPU a recall cannot do without ({machine['cpu']}, {machine['nproc']} CPUs)"]
    lines.append("  model alone, per query                 CPU ms   wall ms")
    for row in report["model"]:
        label = f"{row['threads']} thread(s), batches of {row['batch']}"
        lines.append(f"    {label:<36} {row['cpu_ms']:>7.2f} {row['wall_ms']:>9.2f}")
    lines.append("  a call through calor serve, 8 clients  calls/s  client CPU ms  server CPU ms")
    for name, row in report["calls"].items():
        lines.append(
            f"    {name:<36} {row['per_s']:>7.0f} {row['client_cpu_ms']:>14.2f}"
            f" {row['server_cpu_ms']:>14.2f}"
        )
    lines.append(
        f"  floor per recall (cheapest model run + an idle Recall): {report['floor_ms']:.2f} ms"
    )
    for row in report["ceilings"]:
        lines.append(
            f"  {row['memories']:>9,} memories: 1.5 x ChromaDB's {row['chroma_per_s']:.0f}/s"
            f" = {row['target_per_s']:.0f}/s, {row['target_cpu_ms']:.2f} ms of CPU per recall;"
            f" the floor alone allows {row['floor_per_s']:.0f}/s"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=Path, default=RESULTS / "peers-latest.json")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    queries = build_short_corpus(1000, QUERIES).queries[:QUERIES]
    model = model_floor(queries)
    server = Server()
    try:
        server.wait_ready()
        health = health_pb2_grpc.HealthStub(server.channel)
        idle = pb.RecallRequest(channel="budget-empty", query=queries[0], limit=10, peek=True)
        calls = {
            "health check": call_floor(
                server, lambda: health.Check(health_pb2.HealthCheckRequest())
            ),
            "Recall, empty channel, cached query": call_floor(
                server, lambda: server.stub.Recall(idle)
            ),
        }
    finally:
        server.stop()
        server.close()
    idle_recall = calls["Recall, empty channel, cached query"]
    floor_ms = min(row["cpu_ms"] for row in model)
    floor_ms += idle_recall["client_cpu_ms"] + idle_recall["server_cpu_ms"]
    machine = machine_info()
    peers = json.loads(args.peers.read_text()) if args.peers.exists() else None
    report: Json = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "model": model,
        "calls": calls,
        "floor_ms": floor_ms,
        "peers": str(args.peers) if peers is not None else None,
        "ceilings": ceilings(floor_ms, int(machine["nproc"]), peers),
    }
    print(render(report))
    print(f"wrote {write_results(report, args.out, name='budget')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
