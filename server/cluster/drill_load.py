"""The drill's clients (:mod:`calor.server.cluster.drill`): stubs on every node, the
writes they were told were acknowledged, the load of storing and recalling clients, and
a subscriber following the events across node deaths."""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc

from calor.server.api.forwarding import OWNER
from calor.server.cluster.local import LocalCluster
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub

__all__ = [
    "ANSWER_SECONDS",
    "CALL_SECONDS",
    "CHANNELS",
    "CLIENTS",
    "NOTIFIED",
    "STORED",
    "Follower",
    "Load",
    "Nodes",
    "Seen",
    "Writes",
    "owns_the_store",
]

CHANNELS = ("drill-a", "drill-b", "drill-c", "drill-d")
CLIENTS = 8
CALL_SECONDS = 10.0
ANSWER_SECONDS = 120.0
STORED, NOTIFIED = tpb.EVENT_KIND_ON_STORE, tpb.EVENT_KIND_NOTIFY
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


class Nodes:
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
class Writes:
    """What the clients were told: acknowledged texts and their ids."""

    acked: dict[str, str] = field(default_factory=dict)
    failed_calls: int = 0
    recalls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def store(self, nodes: Nodes, rng: random.Random, channel: str, text: str) -> bool:
        """Store ``text`` through a live node, retried under one idempotency key until
        acknowledged or ``ANSWER_SECONDS`` passed; whether it was acknowledged."""
        request = pb.StoreRequest(channel=channel, text=text, idempotency_key=uuid.uuid4().hex)
        give_up = time.monotonic() + ANSWER_SECONDS
        while time.monotonic() < give_up:
            try:
                reply = nodes.memory[nodes.any_live(rng)].Store(request, timeout=CALL_SECONDS)
            except grpc.RpcError:
                with self.lock:
                    self.failed_calls += 1
                time.sleep(0.05)
                continue
            with self.lock:
                self.acked[text] = reply.memory.id
            return True
        return False


class Load:
    """``CLIENTS`` threads storing (each text once, retried under its idempotency key) and
    recalling (half of the recalls heat their hits: writes too) through every live node."""

    def __init__(self, nodes: Nodes, writes: Writes) -> None:
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
                self._nodes.memory[self._nodes.any_live(rng)].Recall(request, timeout=CALL_SECONDS)
                with self._writes.lock:
                    self._writes.recalls += 1
            except grpc.RpcError:
                with self._writes.lock:
                    self._writes.failed_calls += 1
                time.sleep(0.05)


@dataclass(frozen=True)
class Seen:
    """An event as the subscriber received it."""

    seq: int
    kind: int
    memory_id: str


class Follower:
    """A subscriber to the drill's ON_STORE events and its triggers' NOTIFY events, through
    the owner of the first channel's shard, that, when its stream ends (its node died),
    subscribes again through a live node after the last event seen."""

    def __init__(self, nodes: Nodes) -> None:
        self._nodes = nodes
        self.seen: list[Seen] = []  # in the order received
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
                kinds=[STORED, NOTIFIED],
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
                    self.seen.append(Seen(event.seq, event.kind, event.memory_id))
            except grpc.RpcError:
                pass  # the node died, or is starting: resume through a live node
            self.node = None
            if len(self.seen) > received and not self._stop.is_set():
                self.resumed += 1  # a stream that delivered events ended
            self._stop.wait(0.1)
