"""Kill drills on a local cluster: clients storing and recalling through every live node,
a trigger firing on each store, a subscriber following the events across node deaths,
and Calor nodes and NATS servers killed with -9 at random moments; then the check that
no acknowledged write was lost or applied twice, that each store fired its trigger
once, and that the subscriber saw every event once.

    python -m calor.server.cluster.drill [--kills 20] [--kinds owner+nats] [--seed N]

prints a line per kill and a summary (the cluster tests and ``make bench-cluster`` run
the same drill).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from calor.server.api.forwarding import OWNER
from calor.server.cluster.local import LocalCluster, wait_for_port
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub

__all__ = ["CHANNELS", "KINDS", "Drill", "Report", "owns_the_store"]

CHANNELS = ("drill-a", "drill-b", "drill-c", "drill-d")
KINDS = ("node", "owner", "nats", "both", "owner+nats")
"""What a round kills: a random Calor node, the node that owns the first channel's shard,
a random NATS server, or a random node or that owner with a NATS server at the same
moment."""
CLIENTS = 8
_CALL_SECONDS = 10.0
_ANSWER_SECONDS = 120.0
_STORED, _NOTIFIED = tpb.EVENT_KIND_ON_STORE, tpb.EVENT_KIND_NOTIFY
_WORDS = ["deploy", "coffee", "invoice", "rotation", "backup", "holiday", "budget", "review"]


def owns_the_store(stub: MemoryServiceStub, channel: str = CHANNELS[0]) -> bool:
    """Whether the node behind ``stub`` answers a call to ``channel`` itself (it owns the
    channel's shard): its answer names no other node as the owner (``calor-owner``).

    Raises:
        grpc.RpcError: The node did not answer (starting, or no owner yet).
    """
    request = pb.ListMemoriesRequest(channel=channel, page_size=1)
    _, call = stub.ListMemories.with_call(request, timeout=5.0)
    return not any(key == OWNER for key, _ in call.trailing_metadata() or ())


class _Nodes:
    """A stub per node, and which nodes run."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._channels = [grpc.insecure_channel(target) for target in cluster.targets()]
        self.memory = [MemoryServiceStub(channel) for channel in self._channels]
        self.triggers = [TriggerServiceStub(channel) for channel in self._channels]

    def any_live(self, rng: random.Random) -> int:
        return rng.choice(self.cluster.live())

    def owner(self) -> int | None:
        """The node whose answers name no other owner (None while there is none)."""
        for number in self.cluster.live():
            try:
                if owns_the_store(self.memory[number]):
                    return number
            except grpc.RpcError:
                continue  # starting, or forwarding to an owner that is
        return None

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


@dataclass
class _Writes:
    """What the clients were told: acknowledged texts and their ids."""

    acked: dict[str, str] = field(default_factory=dict)
    failed_calls: int = 0
    recalls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def store(self, nodes: _Nodes, rng: random.Random, channel: str, text: str) -> bool:
        """Store ``text`` through a live node, retried under one idempotency key until
        acknowledged or ``_ANSWER_SECONDS`` passed; whether it was acknowledged."""
        request = pb.StoreRequest(channel=channel, text=text, idempotency_key=uuid.uuid4().hex)
        give_up = time.monotonic() + _ANSWER_SECONDS
        while time.monotonic() < give_up:
            try:
                reply = nodes.memory[nodes.any_live(rng)].Store(request, timeout=_CALL_SECONDS)
            except grpc.RpcError:
                with self.lock:
                    self.failed_calls += 1
                time.sleep(0.05)
                continue
            with self.lock:
                self.acked[text] = reply.memory.id
            return True
        return False


class _Load:
    """``CLIENTS`` threads storing (each text once, retried under its idempotency key) and
    recalling (half of the recalls heat their hits: writes too) through every live node."""

    def __init__(self, nodes: _Nodes, writes: _Writes) -> None:
        self._nodes, self._writes = nodes, writes
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), name=f"drill-client-{n}", daemon=True)
            for n in range(CLIENTS)
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
            channel = rng.choice(CHANNELS)
            if rng.random() < 0.6:
                count += 1
                text = f"client {client} note {count}: {rng.choice(_WORDS)} {rng.random():.6f}"
                self._writes.store(self._nodes, rng, channel, text)
                continue
            request = pb.RecallRequest(
                channel=channel, query=rng.choice(_WORDS), limit=5, peek=rng.random() < 0.5
            )
            try:
                self._nodes.memory[self._nodes.any_live(rng)].Recall(request, timeout=_CALL_SECONDS)
                with self._writes.lock:
                    self._writes.recalls += 1
            except grpc.RpcError:
                with self._writes.lock:
                    self._writes.failed_calls += 1
                time.sleep(0.05)


@dataclass(frozen=True)
class _Seen:
    """An event as the subscriber received it."""

    seq: int
    kind: int
    memory_id: str


class _Follower:
    """A subscriber to the drill's ON_STORE events and its triggers' NOTIFY events, through
    the owner of the first channel's shard, that, when its stream ends (its node died),
    subscribes again through a live node after the last event seen."""

    def __init__(self, nodes: _Nodes) -> None:
        self._nodes = nodes
        self.seen: list[_Seen] = []  # in the order received
        self.resumed = 0
        """Streams that delivered events and then ended (a death), each followed by a new
        subscription after the last event seen."""
        self.node: int | None = None
        """The node its stream is open on."""
        self._stream: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drill-subscriber", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        self._thread.join()

    def _owner_or_any(self, rng: random.Random, seconds: float = 10.0) -> int:
        """The owner of the first channel's shard, once there is one (a live node if
        there is none for ``seconds``)."""
        give_up = time.monotonic() + seconds
        while time.monotonic() < give_up and not self._stop.is_set():
            number = self._nodes.owner()
            if number is not None:
                return number
            time.sleep(0.1)
        return self._nodes.any_live(rng)

    def _run(self) -> None:
        rng = random.Random(-1)
        while not self._stop.is_set():
            request = tpb.SubscribeRequest(
                channels=list(CHANNELS),
                kinds=[_STORED, _NOTIFIED],
                after_seq=self.seen[-1].seq if self.seen else 0,
            )
            received = len(self.seen)
            try:
                # Through the owner of the first channel's shard, the node an owner round
                # kills: the stream ends with it, and resumes through a live node.
                number = self._owner_or_any(rng)
                self.node = number
                self._stream = self._nodes.triggers[number].Subscribe(request)
                if self._stop.is_set():
                    self._stream.cancel()
                for response in self._stream:
                    event = response.event
                    self.seen.append(_Seen(event.seq, event.kind, event.memory_id))
            except grpc.RpcError:
                pass  # the node died, or is starting: resume through a live node
            self.node = None
            if len(self.seen) > received and not self._stop.is_set():
                self.resumed += 1  # a stream that delivered events ended
            self._stop.wait(0.1)


@dataclass
class Report:
    """What a drill found."""

    rounds: list[dict[str, Any]]
    writes_acknowledged: int
    calls_failed: int
    recalls_answered: int
    lost: int
    """Acknowledged writes missing from what some node answers."""
    duplicated: int
    """Texts stored more than once, in what some node answers."""
    events_missed: int
    """Memories in the store whose ON_STORE event the subscriber never saw."""
    events_repeated: int
    """Events the subscriber saw more than once."""
    events_out_of_order: int
    resubscriptions: int
    firings_missed: int
    """Stores whose trigger (a notify on every store) never fired."""
    firings_repeated: int
    """Stores whose trigger fired more than once."""

    @property
    def recoveries(self) -> list[float]:
        """Seconds from each kill until every channel took a write again, sorted."""
        return sorted(r["recovery_s"] for r in self.rounds)

    def as_json(self) -> dict[str, Any]:
        recoveries = self.recoveries
        return {
            **{k: v for k, v in self.__dict__.items() if k != "rounds"},
            "kills": len(self.rounds),
            "recovery_s": {
                "median": round(recoveries[len(recoveries) // 2], 2) if recoveries else None,
                "max": round(recoveries[-1], 2) if recoveries else None,
                "within_10_s": sum(1 for r in recoveries if r <= 10.0),
            },
            "rounds": self.rounds,
        }


class Drill:
    """Kill rounds on ``cluster`` (started) under the load of ``CLIENTS`` clients and one
    subscriber; ``say`` hears a line per round."""

    def __init__(
        self, cluster: LocalCluster, seed: int, say: Callable[[str], None] = print
    ) -> None:
        self.cluster = cluster
        self._rng = random.Random(seed)
        self._say = say
        self._nodes = _Nodes(cluster)
        self._writes = _Writes()

    def run(self, kinds: Sequence[str]) -> Report:
        """One round per kind in ``kinds``, then the check."""
        for channel in CHANNELS:  # a notify on each store, fired on the owner
            trigger = tpb.Trigger(
                id=f"notify-{channel}",
                channel=channel,
                event=_STORED,
                action=tpb.ACTION_KIND_NOTIFY,
                config={"message": "a store in the drill"},
            )
            self._create(tpb.CreateTriggerRequest(trigger=trigger))
        self.every_channel_answers()
        load, follower = _Load(self._nodes, self._writes), _Follower(self._nodes)
        load.start()
        follower.start()
        rounds: list[dict[str, Any]] = []
        try:
            for number, kind in enumerate(kinds):
                time.sleep(self._rng.uniform(1.0, 3.0))
                rounds.append(self._round(number, kind, follower))
            time.sleep(2.0)
        finally:
            load.stop()
        for number in self.cluster.exited():
            self._say(f"node-{number} stopped by itself; started again for the check")
            self.cluster.start_node(number)
        self.every_channel_answers()
        self._wait_for_events(follower)
        follower.stop()
        return self._check(rounds, follower)

    def _create(self, request: tpb.CreateTriggerRequest) -> None:
        """Create a trigger through a live node, tried again until one answers."""
        give_up = time.monotonic() + _ANSWER_SECONDS
        while True:
            node = self._nodes.any_live(self._rng)
            try:
                self._nodes.triggers[node].CreateTrigger(request, timeout=_CALL_SECONDS)
                return
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.ALREADY_EXISTS:
                    return  # an earlier try made it; its answer was lost
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.1)

    def _round(self, number: int, kind: str, follower: _Follower) -> dict[str, Any]:
        rng, cluster = self._rng, self.cluster
        node = server = None
        owner = self._nodes.owner()
        if kind in ("owner", "owner+nats") and owner is not None:
            node = owner
        elif kind in ("node", "both", "owner", "owner+nats"):
            node = rng.choice(cluster.live())
        if kind in ("nats", "both", "owner+nats"):
            server = rng.randrange(len(cluster.nats.client_ports))
        killed_at = time.time()
        cut = node is not None and node == follower.node
        if node is not None:
            cluster.kill_node(node)
        if server is not None:
            cluster.nats.kill(server)
        recovered = self.every_channel_answers()
        killed = []
        if node is not None:
            killed.append(f"node-{node}" + (" (the owner)" if node == owner else ""))
        if server is not None:
            killed.append(f"NATS server n{server}")
        self._say(
            f"round {number} ({kind}): killed {' and '.join(killed)}; every channel answered after "
            f"{recovered:.2f} s"
        )
        stopped = cluster.exited()  # nodes that found they lost the store stop themselves
        if stopped:
            self._say(f"  nodes that stopped by themselves, started again: {stopped}")
        if server is not None:
            cluster.nats.start_server(server)
            wait_for_port(cluster.nats.client_ports[server], 60.0)
        for number in [*stopped, *([] if node is None else [node])]:
            cluster.start_node(number)
        return {
            "round": number,
            "kind": kind,
            "node": node,
            "owner_killed": node is not None and node == owner,
            "subscriber_cut": cut,
            "nats": server,
            "stopped_by_themselves": stopped,
            "killed_at": round(killed_at, 3),
            "recovery_s": round(recovered, 3),
        }

    def every_channel_answers(self) -> float:
        """Seconds until a write to each channel through a live node is acknowledged."""
        started = time.monotonic()
        for channel in CHANNELS:
            text = f"probe of {channel} at {time.time_ns()}"
            if not self._writes.store(self._nodes, self._rng, channel, text):
                raise TimeoutError(f"{channel} did not answer in {_ANSWER_SECONDS} s")
        return time.monotonic() - started

    def _stored(self, number: int) -> dict[str, list[tuple[str, str]]]:
        """Every live memory of each drill channel, as node ``number`` answers (asked
        again while a shard is between owners: a node that came back takes its share)."""
        found: dict[str, list[tuple[str, str]]] = {}
        for channel in CHANNELS:
            token, found[channel] = "", []
            while True:
                request = pb.ListMemoriesRequest(channel=channel, page_size=1000, page_token=token)
                page = self._list(number, request)
                found[channel] += [(m.id, m.text) for m in page.memories]
                token = page.next_page_token
                if not token:
                    break
        return found

    def _list(self, number: int, request: pb.ListMemoriesRequest) -> pb.ListMemoriesResponse:
        give_up = time.monotonic() + _ANSWER_SECONDS
        while True:
            try:
                return self._nodes.memory[number].ListMemories(request, timeout=_CALL_SECONDS)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > give_up:
                    raise
            time.sleep(0.1)

    def _wait_for_events(self, follower: _Follower, seconds: float = 60.0) -> None:
        """Let the subscriber catch up with the stores made (and not told) last, and with
        their triggers' firings."""
        stored = {i for view in self._stored(self.cluster.live()[0]).values() for i, _ in view}
        give_up = time.monotonic() + seconds
        while time.monotonic() < give_up:
            seen = list(follower.seen)
            stores = {e.memory_id for e in seen if e.kind == _STORED and e.memory_id in stored}
            notified = {e.memory_id for e in seen if e.kind == _NOTIFIED}
            if len(stores) >= len(stored) and stores <= notified:
                return
            time.sleep(0.2)

    def _check(self, rounds: list[dict[str, Any]], follower: _Follower) -> Report:
        lost = duplicated = 0
        every_id: set[str] = set()
        for number in self.cluster.live():
            views = self._stored(number)
            texts = Counter(text for view in views.values() for _, text in view)
            ids = {text: i for view in views.values() for i, text in view}
            every_id |= set(ids.values())
            duplicated += sum(1 for count in texts.values() if count > 1)
            lost += sum(1 for text, i in self._writes.acked.items() if ids.get(text) != i)
        seen = follower.seen
        seqs = [e.seq for e in seen]
        events = Counter(seqs)
        stores = {e.memory_id for e in seen if e.kind == _STORED}
        fired = Counter(e.memory_id for e in seen if e.kind == _NOTIFIED)
        return Report(
            rounds=rounds,
            writes_acknowledged=len(self._writes.acked),
            calls_failed=self._writes.failed_calls,
            recalls_answered=self._writes.recalls,
            lost=lost,
            duplicated=duplicated,
            events_missed=len(every_id - {e.memory_id for e in seen if e.kind == _STORED}),
            events_repeated=sum(count - 1 for count in events.values()),
            events_out_of_order=sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b <= a),
            resubscriptions=follower.resumed,
            firings_missed=len(stores - set(fired)),
            firings_repeated=sum(1 for count in fired.values() if count > 1),
        )

    def close(self) -> None:
        self._nodes.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run a drill on a fresh local cluster in a temporary folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="rounds (default 20)")
    parser.add_argument(
        "--kinds",
        default="owner+nats",
        help=f"what rounds kill, in turn, comma-separated, of {', '.join(KINDS)}",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--shards", type=int, default=1, help="the cluster's shards (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' data and logs")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    root = Path(tempfile.mkdtemp(prefix="calor-drill-"))
    cluster = LocalCluster(root)
    cluster.options = ["--shards", str(args.shards)]
    print(f"drill in {root}, seed {seed}, {args.shards} shards", flush=True)
    try:
        cluster.start()
        drill = Drill(cluster, seed, lambda line: print(line, flush=True))
        try:
            report = drill.run([kinds[n % len(kinds)] for n in range(args.kills)])
        finally:
            drill.close()
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report.as_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
