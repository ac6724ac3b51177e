"""Cluster mode beside the embedded single node, and what losing nodes costs:
`make bench-cluster`.

What it measures, in order, all on this machine:

1. **Writes and recalls, embedded**: a fresh single-node ``calor serve`` takes N texts
   through StoreStream calls of 64, then 200 single ``Store`` calls, then 200
   ``Recall(limit=10, peek=True)``.
2. **The same through a cluster** of 3 ``nats-server`` (JetStream, R3) and 3 Calor
   nodes: once through the node that owns the store, once through a node that forwards
   to it. ``cluster / embedded`` is the cost of the replicated log (and of forwarding).
3. **Kills under load** (``--kills K``): 8 client threads store and recall through
   every live node while, each round, the owning Calor node and one NATS server are
   killed with -9 at the same moment; the round's recovery time is from the kill until
   a write through another node is acknowledged. Both are restarted before the next
   round. At the end every acknowledged write must be readable, once, through every node.

Results are printed and written as JSON to ``bench/results/`` (``cluster-*.json``).

    .venv/bin/python bench/cluster.py [--memories 2000] [--kills 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

# Beside this script, so on sys.path when it runs as `python bench/cluster.py`.
from _server import Server
from corpus import build_corpus
from throughput import machine_info, recall_times, store_times, summarize, write_results

from calor.server.cluster.local import NatsServers, free_port, kill9, start_node, wait_for_port
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results"
CHANNEL = "bench"
LOAD_CHANNEL = "load"
BATCH = 64
CLIENTS = 8
CALL_TIMEOUT_S = 60.0
Json = dict[str, Any]


def ingest(stub: pb_grpc.MemoryServiceStub, texts: Sequence[str]) -> float:
    """Store the texts through StoreStream calls of ``BATCH``; memories per second."""
    started = time.perf_counter()
    for at in range(0, len(texts), BATCH):
        requests = [
            pb.StoreStreamRequest(store=pb.StoreRequest(channel=CHANNEL, text=text))
            for text in texts[at : at + BATCH]
        ]
        stub.StoreStream(iter(requests), timeout=CALL_TIMEOUT_S)
    return len(texts) / (time.perf_counter() - started)


def measure(stub: pb_grpc.MemoryServiceStub, texts: Sequence[str], queries: Sequence[str]) -> Json:
    """Ingest, single stores and recalls through one stub. Each query is asked twice:
    first embedded by the server (``recall_peek``), then again with its vector in the
    server's query cache (``recall_cached``: the engine and the hops alone)."""
    ingest(stub, texts[:BATCH])  # warm the model
    return {
        "ingest_memories_per_s": round(ingest(stub, texts), 1),
        "store_single": summarize(store_times(stub, CHANNEL, 200)),
        "recall_peek": summarize(recall_times(stub, CHANNEL, queries, peek=True)),
        "recall_cached": summarize(recall_times(stub, CHANNEL, queries, peek=True)),
    }


class Cluster:
    """3 NATS servers and 3 Calor nodes in a temporary folder."""

    def __init__(self, nodes: int = 3) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="calor-cluster-"))
        self.nats = NatsServers(self.root / "nats")
        self.ports = [free_port() for _ in range(nodes)]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * nodes
        self.channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for port in self.ports]
        self.stubs = [pb_grpc.MemoryServiceStub(channel) for channel in self.channels]

    def start(self) -> None:
        self.nats.start()
        for number in range(len(self.ports)):
            self.start_node(number)
        self.answering(0)

    def start_node(self, number: int) -> None:
        name = f"node-{number}"
        self.processes[number] = start_node(
            self.nats.urls,
            name,
            self.ports[number],
            self.root / name,
            self.root / f"{name}.log",
        )
        wait_for_port(self.ports[number], 120.0)

    def kill_node(self, number: int) -> None:
        kill9(self.processes, number)

    def answering(self, number: int, within: float = 120.0) -> float:
        """Seconds until a write through node ``number`` is acknowledged."""
        started = time.monotonic()
        while True:
            try:
                request = pb.StoreRequest(channel="probe", text=f"probe {time.time_ns()}")
                self.stubs[number].Store(request, timeout=5.0)
                return time.monotonic() - started
            except grpc.RpcError:
                if time.monotonic() - started > within:
                    raise
                time.sleep(0.05)

    def owner(self) -> int:
        """The node that owns the store: the one whose answers name no other owner."""
        for number, stub in enumerate(self.stubs):
            if self.processes[number] is None:
                continue
            request = pb.ListMemoriesRequest(channel="probe", page_size=1)
            try:
                _, call = stub.ListMemories.with_call(request, timeout=5.0)
            except grpc.RpcError:
                continue  # starting, or forwarding to an owner that is
            if not any(key == "calor-owner" for key, _ in call.trailing_metadata() or ()):
                return number
        raise RuntimeError("no node owns the store")

    def close(self, keep: bool = False) -> None:
        for channel in self.channels:
            channel.close()
        for number, process in enumerate(self.processes):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    self.kill_node(number)
        self.nats.stop()
        if keep:
            print(f"logs kept in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


class Load:
    """``CLIENTS`` threads storing (each text once, never retried) and recalling through
    every live node, keeping what was acknowledged."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.acked: dict[str, str] = {}  # text -> id
        self.failed = 0
        self.recalls = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(CLIENTS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self, client: int) -> None:
        rng = random.Random(client)
        count = 0
        while not self._stop.is_set():
            live = [n for n, p in enumerate(self.cluster.processes) if p is not None]
            stub = self.cluster.stubs[rng.choice(live)]
            try:
                if rng.random() < 0.6:
                    count += 1
                    text = f"client {client} note {count}: {rng.choice(WORDS)} {rng.random():.6f}"
                    reply = stub.Store(
                        pb.StoreRequest(channel=LOAD_CHANNEL, text=text), timeout=10.0
                    )
                    with self._lock:
                        self.acked[text] = reply.memory.id
                else:
                    request = pb.RecallRequest(
                        channel=LOAD_CHANNEL, query=rng.choice(WORDS), limit=5, peek=True
                    )
                    stub.Recall(request, timeout=10.0)
                    with self._lock:
                        self.recalls += 1
            except grpc.RpcError:
                with self._lock:
                    self.failed += 1
                time.sleep(0.05)


WORDS = ["deploy", "coffee", "invoice", "rotation", "backup", "holiday", "budget", "review"]


def every_text(stub: pb_grpc.MemoryServiceStub) -> list[tuple[str, str]]:
    """Every live memory of the load channel: (id, text), page by page."""
    found: list[tuple[str, str]] = []
    token = ""
    while True:
        request = pb.ListMemoriesRequest(channel=LOAD_CHANNEL, page_size=1000, page_token=token)
        page = stub.ListMemories(request, timeout=CALL_TIMEOUT_S)
        found += [(m.id, m.text) for m in page.memories]
        token = page.next_page_token
        if not token:
            return found


def kill_rounds(cluster: Cluster, kills: int, seed: int) -> Json:
    """Kill the owner and a NATS server at once, ``kills`` times, under load."""
    rng = random.Random(seed)
    load = Load(cluster)
    load.start()
    rounds: list[Json] = []
    try:
        for round_ in range(kills):
            time.sleep(rng.uniform(1.0, 3.0))
            owner = cluster.owner()
            server = rng.randrange(3)
            cluster.kill_node(owner)
            cluster.nats.kill(server)
            survivor = rng.choice([n for n in range(len(cluster.ports)) if n != owner])
            recovered = cluster.answering(survivor)
            rounds.append(
                {"round": round_, "owner": owner, "nats": server, "recovery_s": recovered}
            )
            print(
                f"  round {round_}: killed node-{owner} and nats n{server}; a write through "
                f"node-{survivor} answered after {recovered:.2f} s",
                flush=True,
            )
            cluster.nats.start_server(server)
            cluster.start_node(owner)
        time.sleep(2.0)
    finally:
        load.stop()
    views = [every_text(stub) for stub in cluster.stubs]
    lost = duplicated = 0
    for view in views:
        by_text: dict[str, list[str]] = {}
        for memory_id, text in view:
            by_text.setdefault(text, []).append(memory_id)
        lost += sum(
            1 for text, memory_id in load.acked.items() if memory_id not in by_text.get(text, [])
        )
        duplicated += sum(1 for ids in by_text.values() if len(ids) > 1)
    recoveries = sorted(r["recovery_s"] for r in rounds)
    return {
        "kills": kills,
        "writes_acknowledged": len(load.acked),
        "calls_failed": load.failed,
        "recalls_answered": load.recalls,
        "lost_in_any_node": lost,
        "duplicated_in_any_node": duplicated,
        "recovery_s": {
            "max": round(recoveries[-1], 2) if recoveries else None,
            "median": round(recoveries[len(recoveries) // 2], 2) if recoveries else None,
        },
        "rounds": rounds,
    }


def run(memories: int, queries: int, kills: int, seed: int, keep: bool = False) -> Json:
    corpus = build_corpus(memories, queries)
    texts, questions = corpus.texts, corpus.queries
    report: Json = {
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "memories": memories,
    }
    server = Server()
    try:
        server.wait_ready()
        print("embedded single node...", flush=True)
        report["embedded"] = measure(server.stub, texts, questions[0::2])
        server.stop()
    finally:
        server.close()
    cluster = Cluster()
    try:
        cluster.start()
        owner = cluster.owner()
        other = (owner + 1) % len(cluster.ports)
        print(f"cluster, through the owner (node-{owner})...", flush=True)
        report["cluster_owner"] = measure(cluster.stubs[owner], texts, questions[0::2])
        print(f"cluster, through node-{other}, which forwards...", flush=True)
        # Other queries: the owner's cache holds the first half's vectors.
        report["cluster_forwarded"] = measure(cluster.stubs[other], texts, questions[1::2])
        if kills:
            print(f"{kills} kills of the owner and a NATS server under load...", flush=True)
            report["kills"] = kill_rounds(cluster, kills, seed)
    finally:
        cluster.close(keep)
    return report


def render(report: Json) -> str:
    machine = report["machine"]
    lines = [
        f"Calor cluster bench: {report['memories']:,} memories (commit {machine['git_commit']}, "
        f"{machine['nproc']} CPUs: {machine['cpu']})",
        "",
        f"  {'':<26}{'ingest mem/s':>13}{'store p50':>11}{'p99':>9}{'recall p50':>12}{'p99':>9}"
        f"{'cached p50':>12}{'p99':>9}",
    ]
    base = report["embedded"]["ingest_memories_per_s"]
    for label, key in (
        ("embedded single node", "embedded"),
        ("cluster, owner", "cluster_owner"),
        ("cluster, forwarded", "cluster_forwarded"),
    ):
        row = report[key]
        store, recall, cached = row["store_single"], row["recall_peek"], row["recall_cached"]
        lines.append(
            f"  {label:<26}{row['ingest_memories_per_s']:>13.1f}{store['p50_ms']:>11.2f}"
            f"{store['p99_ms']:>9.2f}{recall['p50_ms']:>12.2f}{recall['p99_ms']:>9.2f}"
            f"{cached['p50_ms']:>12.2f}{cached['p99_ms']:>9.2f}"
            f"   ingest x{row['ingest_memories_per_s'] / base:.2f}"
        )
    kills = report.get("kills")
    if kills:
        lines += [
            "",
            f"  kills: {kills['kills']} (owner + one NATS server at once); writes acknowledged "
            f"{kills['writes_acknowledged']}, lost {kills['lost_in_any_node']}, duplicated "
            f"{kills['duplicated_in_any_node']}; calls failed during recoveries "
            f"{kills['calls_failed']}; recovery median {kills['recovery_s']['median']} s, "
            f"max {kills['recovery_s']['max']} s",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--keep", action="store_true", help="keep the nodes' data and logs")
    args = parser.parse_args(argv)
    report = run(args.memories, args.queries, args.kills, args.seed, args.keep)
    print()
    print(render(report))
    path = write_results(report, args.out, name="cluster")
    print(f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
