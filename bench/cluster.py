"""Cluster mode beside the embedded single node, and what losing nodes costs:
`make bench-cluster`.

What it measures, in order, all on this machine:

1. **Writes and recalls, embedded**: a fresh single-node ``calor serve`` takes N texts
   through StoreStream calls of 64, then 200 single ``Store`` calls, then 200
   ``Recall(limit=10, peek=True)``.
2. **The same through a cluster** of 3 ``nats-server`` (JetStream, R3) and 3 Calor
   nodes over ``--shards`` shards (3): once through the node that owns the channel's
   shard, once through a node that forwards to it. ``cluster / embedded`` is the cost of
   the replicated log (and of forwarding). Each target also takes the texts into one
   channel per shard at once (3 client threads, ``ingest_spread``): on the cluster each
   shard has its own owner and log. Last, each query again as a recall of one of those
   channels naming the others (``recall_across``: on the cluster, each shard's owner
   ranks its channel and the first channel's owner merges).
3. **Kills under load** (``--kills K``, :mod:`calor.server.cluster.drill`): 8 client
   threads store and recall over 4 channels through every live node, and a subscriber
   follows their events, while each round the owning Calor node and one NATS server are
   killed with -9 at the same moment; the round's recovery time is from the kill until
   a write to each channel through a live node is acknowledged. Both are restarted
   before the next round. At the end every acknowledged write must be readable, once,
   through every node, and the subscriber must have seen every event once, in order.

Results are printed and written as JSON to ``bench/results/`` (``cluster-*.json``).

    .venv/bin/python bench/cluster.py [--memories 2000] [--kills 20] [--shards 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
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

from calor.server.api.routing import shard_of
from calor.server.cluster.drill import Drill
from calor.server.cluster.drill_load import owns_the_store
from calor.server.cluster.local import LocalCluster
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results"
CHANNEL = "bench"
BATCH = 64
CALL_TIMEOUT_S = 60.0
Json = dict[str, Any]


def ingest(stub: pb_grpc.MemoryServiceStub, texts: Sequence[str], channel: str = CHANNEL) -> float:
    """Store the texts through StoreStream calls of ``BATCH``; memories per second."""
    started = time.perf_counter()
    for at in range(0, len(texts), BATCH):
        requests = [
            pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel, text=text))
            for text in texts[at : at + BATCH]
        ]
        stub.StoreStream(iter(requests), timeout=CALL_TIMEOUT_S)
    return len(texts) / (time.perf_counter() - started)


def spread_channels(shards: int) -> list[str]:
    """One channel name per shard of ``shards``."""
    names: dict[int, str] = {}
    for n in range(1000):
        names.setdefault(shard_of(f"spread-{n}", shards), f"spread-{n}")
        if len(names) == shards:
            break
    return [names[shard] for shard in sorted(names)]


def ingest_spread(stub: pb_grpc.MemoryServiceStub, texts: Sequence[str], shards: int) -> float:
    """Store the texts into one channel per shard at once, a client thread each;
    memories per second in all."""
    channels = spread_channels(shards)
    parts = [texts[n :: len(channels)] for n in range(len(channels))]
    threads = [
        threading.Thread(target=ingest, args=(stub, part, channel))
        for part, channel in zip(parts, channels, strict=True)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(texts) / (time.perf_counter() - started)


def recall_across_times(
    stub: pb_grpc.MemoryServiceStub, channels: Sequence[str], queries: Sequence[str]
) -> list[float]:
    """Milliseconds of each sequential Recall(limit=10, peek=True) of the first channel
    naming the others (on a cluster, one per shard: asked of each shard's owner)."""
    times: list[float] = []
    for query in queries:
        request = pb.RecallRequest(
            channel=channels[0], channels=channels[1:], query=query, limit=10, peek=True
        )
        started = time.perf_counter()
        reply = stub.Recall(request, timeout=CALL_TIMEOUT_S)
        times.append((time.perf_counter() - started) * 1000)
        if not reply.hits:
            raise RuntimeError(f"Recall across channels found nothing for {query!r}")
    return times


def measure(
    stub: pb_grpc.MemoryServiceStub, texts: Sequence[str], queries: Sequence[str], shards: int
) -> Json:
    """Ingest, single stores and recalls through one stub. Each query is asked three
    times: first embedded by the server (``recall_peek``), then again with its vector in
    the server's query cache (``recall_cached``: the engine and the hops alone), then of
    one channel per shard at once (``recall_across``)."""
    ingest(stub, texts[:BATCH])  # warm the model
    return {
        "ingest_memories_per_s": round(ingest(stub, texts), 1),
        "ingest_spread_memories_per_s": round(ingest_spread(stub, texts, shards), 1),
        "store_single": summarize(store_times(stub, CHANNEL, 200)),
        "recall_peek": summarize(recall_times(stub, CHANNEL, queries, peek=True)),
        "recall_cached": summarize(recall_times(stub, CHANNEL, queries, peek=True)),
        "recall_across": summarize(recall_across_times(stub, spread_channels(shards), queries)),
    }


def owner(stubs: Sequence[pb_grpc.MemoryServiceStub], within: float = 120.0) -> int:
    """The node that owns the bench channel's shard, once every node answers: the one
    whose answers name no other owner."""
    give_up = time.monotonic() + within
    while True:
        try:
            answers = [owns_the_store(stub, CHANNEL) for stub in stubs]  # every node answers
            if True in answers:
                return answers.index(True)
        except grpc.RpcError:  # a node still joining, or no owner yet
            if time.monotonic() > give_up:
                raise
        time.sleep(0.2)


def run(
    memories: int, queries: int, kills: int, seed: int, shards: int, keep: bool = False
) -> Json:
    corpus = build_corpus(memories, queries)
    texts, questions = corpus.texts, corpus.queries
    report: Json = {
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "memories": memories,
        "shards": shards,
    }
    server = Server()
    try:
        server.wait_ready()
        print("embedded single node...", flush=True)
        report["embedded"] = measure(server.stub, texts, questions[0::2], shards)
        server.stop()
    finally:
        server.close()
    root = Path(tempfile.mkdtemp(prefix="calor-cluster-"))
    cluster = LocalCluster(root)
    cluster.options = ["--shards", str(shards)]
    channels = [grpc.insecure_channel(target) for target in cluster.targets()]
    stubs = [pb_grpc.MemoryServiceStub(channel) for channel in channels]
    try:
        cluster.start()
        first = owner(stubs)
        other = (first + 1) % len(stubs)
        print(f"cluster, through the owner (node-{first})...", flush=True)
        report["cluster_owner"] = measure(stubs[first], texts, questions[0::2], shards)
        print(f"cluster, through node-{other}, which forwards...", flush=True)
        # Other queries: the owner's cache holds the first half's vectors.
        report["cluster_forwarded"] = measure(stubs[other], texts, questions[1::2], shards)
        if kills:
            print(f"{kills} kills of the owner and a NATS server under load...", flush=True)
            drill = Drill(cluster, seed, lambda line: print(f"  {line}", flush=True))
            try:
                report["kills"] = drill.run(["owner+nats"] * kills).as_json()
            finally:
                drill.close()
    finally:
        for channel in channels:
            channel.close()
        cluster.stop()
        if keep:
            print(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return report


def render(report: Json) -> str:
    machine = report["machine"]
    lines = [
        f"Calor cluster bench: {report['memories']:,} memories, {report['shards']} shards "
        f"(commit {machine['git_commit']}, {machine['nproc']} CPUs: {machine['cpu']})",
        "",
        f"  {'':<26}{'ingest mem/s':>13}{'spread':>9}{'store p50':>11}{'p99':>9}"
        f"{'recall p50':>12}{'p99':>9}{'cached p50':>12}{'p99':>9}"
        f"{'across p50':>12}{'p99':>9}",
    ]
    base = report["embedded"]["ingest_memories_per_s"]
    spread_base = report["embedded"]["ingest_spread_memories_per_s"]
    for label, key in (
        ("embedded single node", "embedded"),
        ("cluster, owner", "cluster_owner"),
        ("cluster, forwarded", "cluster_forwarded"),
    ):
        row = report[key]
        store, recall, cached = row["store_single"], row["recall_peek"], row["recall_cached"]
        across = row["recall_across"]
        lines.append(
            f"  {label:<26}{row['ingest_memories_per_s']:>13.1f}"
            f"{row['ingest_spread_memories_per_s']:>9.1f}{store['p50_ms']:>11.2f}"
            f"{store['p99_ms']:>9.2f}{recall['p50_ms']:>12.2f}{recall['p99_ms']:>9.2f}"
            f"{cached['p50_ms']:>12.2f}{cached['p99_ms']:>9.2f}"
            f"{across['p50_ms']:>12.2f}{across['p99_ms']:>9.2f}"
            f"   ingest x{row['ingest_memories_per_s'] / base:.2f}, spread "
            f"x{row['ingest_spread_memories_per_s'] / spread_base:.2f}"
        )
    kills = report.get("kills")
    if kills:
        recovery = kills["recovery_s"]
        lines += [
            "",
            f"  kills: {kills['kills']} (a shard's owner + one NATS server at once); writes "
            "acknowledged "
            f"{kills['writes_acknowledged']}, lost {kills['lost']}, duplicated "
            f"{kills['duplicated']}; subscriber: events missed {kills['events_missed']}, "
            f"repeated {kills['events_repeated']}, out of order "
            f"{kills['events_out_of_order']}, resubscribed {kills['resubscriptions']} times; "
            f"triggers: firings missed {kills['firings_missed']}, repeated "
            f"{kills['firings_repeated']}; "
            f"calls failed during recoveries {kills['calls_failed']}; every channel answering "
            f"again: median {recovery['median']} s, max {recovery['max']} s, "
            f"{recovery['within_10_s']} of {kills['kills']} within 10 s",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shards", type=int, default=3, help="the cluster's shards (3)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--keep", action="store_true", help="keep the nodes' data and logs")
    args = parser.parse_args(argv)
    report = run(args.memories, args.queries, args.kills, args.seed, args.shards, args.keep)
    print()
    print(render(report))
    path = write_results(report, args.out, name="cluster")
    print(f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
