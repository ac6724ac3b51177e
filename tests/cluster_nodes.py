"""Calor nodes in cluster mode for the cluster tests: a ``calor serve --cluster`` process
with a stub on it, and the NATS servers they share."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from calor.server.cluster.local import NatsServers
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.calor_process import CalorProcess


def nats_cluster(factory: pytest.TempPathFactory) -> Iterator[NatsServers]:
    """Three clustered ``nats-server`` with JetStream, for one test module."""
    servers = NatsServers(factory.mktemp("nats"))
    servers.start()
    yield servers
    servers.stop()


CHANNEL = "fleet"
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServers]:
    cluster = NatsServers(tmp_path_factory.mktemp("nats"))
    cluster.start()
    yield cluster
    cluster.stop()


class Node:
    """One ``calor serve --cluster`` process and a stub on it."""

    def __init__(
        self,
        nats: NatsServers,
        data_dir: Path,
        name: str,
        *options: str,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.process = CalorProcess(
            data_dir,
            data_dir.parent / f"{name}.log",
            "--cluster",
            ",".join(nats.urls),
            "--node-id",
            name,
            *options,
        )
        self.process.credentials = credentials
        self._channel: grpc.Channel | None = None

    def __enter__(self) -> Node:
        self.process.start()  # SERVING: it answers, or forwards to the owner
        target, credentials = self.process.target, self.process.credentials
        self._channel = (
            grpc.insecure_channel(target)
            if credentials is None
            else grpc.secure_channel(target, credentials)
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._channel is not None:
            self._channel.close()
        self.process.close()

    @property
    def stub(self) -> MemoryServiceStub:
        assert self._channel is not None
        return MemoryServiceStub(self._channel)

    @property
    def triggers(self) -> TriggerServiceStub:
        assert self._channel is not None
        return TriggerServiceStub(self._channel)

    def subscribe(self, channel: str, after_seq: int = 0) -> Any:
        """A channel's ON_STORE events after ``after_seq``, as a stream."""
        request = tpb.SubscribeRequest(
            channels=[channel], kinds=[tpb.EVENT_KIND_ON_STORE], after_seq=after_seq
        )
        return self.triggers.Subscribe(request, timeout=TIMEOUT)

    def answering(self, within: float = 30.0) -> float:
        """Wait until a call through this node is answered (by it or by the owner it
        forwards to); the seconds that took."""
        started = time.monotonic()
        while True:
            try:
                self.texts(timeout=2.0)
                return time.monotonic() - started
            except grpc.RpcError as error:  # no owner yet, or the one it forwards to is hung
                if error.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
                if time.monotonic() - started > within:
                    tail = self.process.log_tail()
                    raise AssertionError(f"no answer in {within} s:\n{tail}") from error
                time.sleep(0.1)

    def store(self, text: str, channel: str = CHANNEL, *, within: float = 0.0) -> str:
        """Store through this node; for ``within`` seconds, an answer that no node owns the
        store right now (UNAVAILABLE, before anything is written: call again) is called
        again."""
        request = pb.StoreRequest(channel=channel, text=text)
        started = time.monotonic()
        while True:
            try:
                return str(self.stub.Store(request, timeout=TIMEOUT).memory.id)
            except grpc.RpcError as error:
                ownerless = "has no owner right now" in (error.details() or "")  # type: ignore[attr-defined]
                if not ownerless or time.monotonic() - started > within:
                    raise
                time.sleep(0.1)

    def texts(self, timeout: float = TIMEOUT) -> dict[str, str]:
        """Every live memory of the channel: id -> text."""
        request = pb.ListMemoriesRequest(channel=CHANNEL, page_size=1000)
        page = self.stub.ListMemories(request, timeout=timeout)
        return {m.id: m.text for m in page.memories}

    def recall(self, query: str) -> list[str]:
        request = pb.RecallRequest(channel=CHANNEL, query=query, limit=3, peek=True)
        return [hit.memory.text for hit in self.stub.Recall(request, timeout=TIMEOUT).hits]


@contextmanager
def owner_and_other(nats: NatsServers, tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    """Node "a", started first and so the owner, and node "b", which forwards to it."""
    with Node(nats, tmp_path / "a", "a") as owner:
        owner.answering()
        with Node(nats, tmp_path / "b", "b") as other:
            yield owner, other
