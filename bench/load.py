"""Load on a real Calor server: concurrent clients mixing store and recall.

N client threads (default 32), each with its own gRPC channel, spread over N/4
channels, call for S seconds (default 60) in a weighted mix: ``Store`` 45%,
``Recall`` 40% (a third of them ``peek``), ``Context`` 8%, ``Identity`` 7%. Texts and
queries are generated sentences, every stored text unique. A call the server answers
``RESOURCE_EXHAUSTED`` is *throttled* (the client waits the retry delay the status
names, or 50 ms, and goes on); any other failure is an *unexpected* error.

Afterwards every stored memory is checked: it is listed in its channel
(``ListMemories``), and a ``Recall(peek)`` of its own text finds it.

It reports requests/s sustained (over the whole run and over its slowest 5 s window),
p50/p99/max latency per RPC measured on the client, errors, and the server's resident
memory once it is ready and at the end; prints a table and writes JSON
(``bench/results/load-<UTC timestamp>.json`` and ``load-latest.json``, or ``--json``).
It exits 1 when there was an unexpected error or a stored memory was not found.

It starts ``calor serve`` on a fresh data dir itself (``bench/_server.py``), or drives
a running server with ``--target`` (RSS then needs ``--pid``).

    .venv/bin/python bench/load.py [--clients 32] [--seconds 60] [--json FILE] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

# Beside this script, so on sys.path when it runs as `python bench/load.py`.
from _server import Server, rss_mb
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results"
MIX = (("Store", 45), ("Recall", 40), ("Context", 8), ("Identity", 7))
CALL_TIMEOUT_S = 30.0
WINDOW_S = 5.0

SUBJECTS = (
    "the heron",
    "Ana",
    "the build server",
    "our landlord",
    "the night train",
    "Kofi",
    "the billing service",
    "grandmother",
    "the river cabin",
    "the cello",
    "Mateus",
    "the garden",
    "the staging cluster",
    "the dentist",
    "Priya",
    "the old laptop",
)
VERBS = (
    "moved to",
    "asked about",
    "was late for",
    "fixed",
    "forgot",
    "paid for",
    "complained about",
    "recommended",
    "cancelled",
    "photographed",
    "rebuilt",
    "visited",
)
OBJECTS = (
    "the quarterly report",
    "a blue umbrella",
    "the Lisbon offsite",
    "the flaky test",
    "the spare key",
    "a jar of honey",
    "the invoice from March",
    "the piano lesson",
    "the firewall rules",
    "a ticket to Porto",
    "the compost bin",
    "the database migration",
)
WHEN = ("on Monday", "yesterday", "last week", "at dawn", "after lunch", "in April", "")


@dataclass
class Tally:
    """What all clients saw: latencies per RPC, errors, and the stored memories."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    finished_at: list[float] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    throttled: int = 0
    stored: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ok(self, rpc: str, seconds: float, at: float) -> None:
        with self.lock:
            self.latencies[rpc].append(seconds)
            self.finished_at.append(at)


def sentence(rng: random.Random, tag: str) -> str:
    """A plausible note, made unique by ``tag``."""
    when = rng.choice(WHEN)
    text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    return f"{text} {when} (note {tag})." if when else f"{text} (note {tag})."


def retry_delay(error: grpc.RpcError) -> float:
    """The retry delay a RESOURCE_EXHAUSTED status names, or 50 ms."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status is not None else ():
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return 0.05


class Client(threading.Thread):
    """One client: its own channel, a weighted mix of calls until ``stop``."""

    def __init__(
        self, number: int, target: str, channel: str, seed: int, tally: Tally, stop: threading.Event
    ) -> None:
        super().__init__(name=f"load-client-{number}", daemon=True)
        self.number, self.target, self.channel = number, target, channel
        self.rng = random.Random(seed)
        self.tally, self.stop = tally, stop
        self.count = 0

    def run(self) -> None:
        with grpc.insecure_channel(self.target) as channel:
            stub = pb_grpc.MemoryServiceStub(channel)
            calls: dict[str, Callable[[], None]] = {
                "Store": lambda: self.store(stub),
                "Recall": lambda: self.recall(stub),
                "Context": lambda: self.context(stub),
                "Identity": lambda: self.identity(stub),
            }
            names = [name for name, _ in MIX]
            weights = [weight for _, weight in MIX]
            while not self.stop.is_set():
                rpc = self.rng.choices(names, weights)[0]
                self.call(rpc, calls[rpc])

    def call(self, rpc: str, body: Callable[[], None]) -> None:
        started = time.perf_counter()
        try:
            body()
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                with self.tally.lock:
                    self.tally.throttled += 1
                time.sleep(retry_delay(error))
                return
            with self.tally.lock:
                self.tally.unexpected.append(f"{rpc}: {error.code().name}: {error.details()}")
            return
        done = time.perf_counter()
        self.tally.ok(rpc, done - started, done)

    def store(self, stub: pb_grpc.MemoryServiceStub) -> None:
        self.count += 1
        text = sentence(self.rng, f"{self.number}-{self.count}")
        reply = stub.Store(pb.StoreRequest(channel=self.channel, text=text), timeout=CALL_TIMEOUT_S)
        with self.tally.lock:
            self.tally.stored.append((self.channel, reply.memory.id, text))

    def recall(self, stub: pb_grpc.MemoryServiceStub) -> None:
        query = f"what about {self.rng.choice(SUBJECTS)} and {self.rng.choice(OBJECTS)}?"
        peek = self.rng.random() < 1 / 3
        request = pb.RecallRequest(channel=self.channel, query=query, limit=10, peek=peek)
        stub.Recall(request, timeout=CALL_TIMEOUT_S)

    def context(self, stub: pb_grpc.MemoryServiceStub) -> None:
        message = f"Remind me what {self.rng.choice(SUBJECTS)} did {self.rng.choice(WHEN)}."
        request = pb.ContextRequest(channel=self.channel, message=message, token_budget=400)
        stub.Context(request, timeout=CALL_TIMEOUT_S)

    def identity(self, stub: pb_grpc.MemoryServiceStub) -> None:
        stub.Identity(pb.IdentityRequest(channel=self.channel), timeout=CALL_TIMEOUT_S)


def percentile(values: list[float], share: float) -> float:
    """The value below which ``share`` of ``values`` fall (nearest rank)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))
    return ordered[index]


def slowest_window(finished: list[float], began: float, ended: float) -> float:
    """Requests/s over the slowest whole ``WINDOW_S`` window of the run."""
    windows = int((ended - began) // WINDOW_S)
    if windows < 1:
        return len(finished) / max(ended - began, 1e-9)
    counts = [0] * windows
    for at in finished:
        slot = int((at - began) // WINDOW_S)
        if 0 <= slot < windows:
            counts[slot] += 1
    return min(counts) / WINDOW_S


def verify(target: str, stored: list[tuple[str, str, str]]) -> tuple[int, list[str]]:
    """Every stored memory is listed in its channel and found by a recall of its text;
    returns how many were checked and what was missing."""
    missing: list[str] = []
    by_channel: dict[str, set[str]] = defaultdict(set)
    for channel_name, memory_id, _ in stored:
        by_channel[channel_name].add(memory_id)
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.MemoryServiceStub(channel)
        for channel_name, wanted in sorted(by_channel.items()):
            listed = list_ids(stub, channel_name)
            missing += [f"{channel_name}/{i}: not listed" for i in sorted(wanted - listed)]
        for channel_name, memory_id, text in stored:
            request = pb.RecallRequest(channel=channel_name, query=text, limit=20, peek=True)
            hits = stub.Recall(request, timeout=CALL_TIMEOUT_S).hits
            if memory_id not in {hit.memory.id for hit in hits}:
                missing.append(f"{channel_name}/{memory_id}: a recall of its text misses it")
    return len(stored), missing


def list_ids(stub: pb_grpc.MemoryServiceStub, channel: str) -> set[str]:
    """The ids of every memory of a channel, page by page."""
    ids: set[str] = set()
    token = ""
    while True:
        request = pb.ListMemoriesRequest(channel=channel, page_size=1000, page_token=token)
        page = stub.ListMemories(request, timeout=CALL_TIMEOUT_S)
        ids.update(memory.id for memory in page.memories)
        token = page.next_page_token
        if not token:
            return ids


def run_load(target: str, clients: int, seconds: float, seed: int) -> tuple[Tally, float, float]:
    """Drive the server; returns the tally and when the load began and ended."""
    tally, stop = Tally(), threading.Event()
    channels = [f"load-{n}" for n in range(max(1, clients // 4))]
    workers = [
        Client(n, target, channels[n % len(channels)], seed * 1000 + n, tally, stop)
        for n in range(clients)
    ]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    stop.wait(seconds)
    stop.set()
    ended = time.perf_counter()
    for worker in workers:
        worker.join(CALL_TIMEOUT_S + 5)
    return tally, began, ended


def warm_up(target: str) -> None:
    """One store and one recall, so the first measured calls pay no first-call costs."""
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.MemoryServiceStub(channel)
        stub.Store(pb.StoreRequest(channel="load-warm-up", text="warming up"), timeout=60)
        stub.Recall(pb.RecallRequest(channel="load-warm-up", query="warm", peek=True), timeout=60)


def report(
    tally: Tally, began: float, ended: float, args: argparse.Namespace, rss: dict[str, Any]
) -> dict[str, Any]:
    """The run's figures as one JSON-ready document."""
    elapsed = ended - began
    total = sum(len(values) for values in tally.latencies.values())
    rpcs = {
        rpc: {
            "count": len(values),
            "p50_ms": round(percentile(values, 0.50) * 1000, 1),
            "p99_ms": round(percentile(values, 0.99) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1),
        }
        for rpc, values in sorted(tally.latencies.items())
        if values
    }
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "clients": args.clients,
        "seconds": args.seconds,
        "seed": args.seed,
        "elapsed_s": round(elapsed, 2),
        "requests": total,
        "rps": round(total / elapsed, 1),
        "rps_slowest_window": round(slowest_window(tally.finished_at, began, ended), 1),
        "rpcs": rpcs,
        "errors": {
            "unexpected": len(tally.unexpected),
            "throttled": tally.throttled,
            "examples": sorted(set(tally.unexpected))[:20],
        },
        "rss_mb": rss,
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\n{result['clients']} clients for {result['elapsed_s']} s: "
        f"{result['requests']} requests, "
        f"{result['rps']} req/s sustained (slowest {WINDOW_S:.0f} s window "
        f"{result['rps_slowest_window']} req/s)"
    )
    print(f"{'rpc':<10} {'count':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for rpc, row in result["rpcs"].items():
        print(
            f"{rpc:<10} {row['count']:>7} {row['p50_ms']:>8} {row['p99_ms']:>8} {row['max_ms']:>8}"
        )
    errors, rss, checked = result["errors"], result["rss_mb"], result["verified"]
    print(f"errors: {errors['unexpected']} unexpected, {errors['throttled']} throttled")
    for example in errors["examples"]:
        print(f"  {example}")
    print(f"server RSS: {rss.get('start')} MB at start, {rss.get('end')} MB at the end")
    print(f"verified: {checked['stored']} stored, {len(checked['missing'])} missing")
    for line in checked["missing"][:20]:
        print(f"  {line}")


def write(result: dict[str, Any], args: argparse.Namespace) -> Path:
    if args.json is not None:
        paths = [args.json]
    else:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        paths = [args.out / f"load-{stamp}.json", args.out / "load-latest.json"]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    return paths[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--target", help="drive this running server instead of starting one")
    parser.add_argument("--pid", type=int, help="the --target server's pid, for its RSS")
    parser.add_argument("--json", type=Path, help="write the JSON here (else --out)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    server = None if args.target else Server()
    try:
        if server is not None:
            server.wait_ready()
        target = args.target or f"127.0.0.1:{server.port}"  # type: ignore[union-attr]
        pid = server.pid if server is not None else args.pid
        warm_up(target)
        rss: dict[str, Any] = {"start": rss_mb(pid)}
        tally, began, ended = run_load(target, args.clients, args.seconds, args.seed)
        rss["end"] = rss_mb(pid)
        result = report(tally, began, ended, args, rss)
        checked, missing = verify(target, tally.stored)
        result["verified"] = {"stored": checked, "missing": missing}
        if server is not None:
            result["server_exit"] = server.stop()
    finally:
        if server is not None:
            server.close()
    print_table(result)
    print(f"wrote {write(result, args)}")
    stopped_cleanly = server is None or result["server_exit"] == 0
    return 0 if stopped_cleanly and not result["errors"]["unexpected"] and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
