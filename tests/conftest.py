"""Shared fixtures: a real Calor server (real model, RocksDB in tmp, FAISS) on a free port."""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

from calor.client import CalorClient
from calor.client.cli import main
from calor.models.embedder import Embedder, OnnxEmbedder
from calor.server.app import CalorServer
from calor.server.clock import Clock, ManualClock, SystemClock
from calor.server.config import ServerConfig
from calor.v1 import memory_service_pb2_grpc
from tests.helpers import Run

_counter = itertools.count()


class ServerThread:
    """A CalorServer running on its own event loop in a background thread."""

    def __init__(
        self,
        config: ServerConfig,
        clock: Clock,
        embedder_factory: Callable[[], Embedder],
        wait_ready: bool = True,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = CalorServer(config, clock=clock, embedder_factory=embedder_factory)
        self.port = self.call(self.server.start())
        if wait_ready:
            self.call(self.server.ready())
        self.target = f"127.0.0.1:{self.port}"

    def call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=60)

    def stop(self) -> None:
        self.call(self.server.stop(1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(scope="session")
def embedder() -> OnnxEmbedder:
    """The real BGE-small model, loaded once for the whole run."""
    return OnnxEmbedder.load()


@pytest.fixture(scope="session")
def start_server(
    embedder: OnnxEmbedder, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ServerThread]]:
    """Start servers on free ports with their own data dirs; all stopped at the end."""
    started: list[ServerThread] = []

    def start(
        data_dir: Path | None = None, clock: Clock | None = None, **options: Any
    ) -> ServerThread:
        folder = data_dir or tmp_path_factory.mktemp("calor-data")
        config = ServerConfig(data_dir=folder, host="127.0.0.1", port=0, **options)
        server = ServerThread(config, clock or SystemClock(), lambda: embedder)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def calor_server(start_server: Callable[..., ServerThread]) -> ServerThread:
    """One shared server on wall-clock time; tests keep apart by channel."""
    return start_server()


@pytest.fixture(scope="session")
def calor_target(calor_server: ServerThread) -> str:
    """The address of the shared server."""
    return calor_server.target


@pytest.fixture
def channel_name(request: pytest.FixtureRequest) -> str:
    """A channel no other test uses."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:60]
    return f"t{next(_counter)}-{name}"


@pytest.fixture
def client(calor_target: str, channel_name: str) -> Iterator[CalorClient]:
    """A Python client on the shared server, in a channel of the test's own."""
    with CalorClient(calor_target, channel=channel_name) as calor:
        yield calor


@pytest.fixture
def calor(calor_target: str, channel_name: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run ``calor --target … --channel … ARGS``; returns (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        status = main(["--target", calor_target, "--channel", channel_name, *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture(scope="session")
def grpc_channel(calor_target: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(calor_target) as channel:
        yield channel


@pytest.fixture(scope="session")
def memories(grpc_channel: grpc.Channel) -> memory_service_pb2_grpc.MemoryServiceStub:
    """A MemoryService stub on the shared server."""
    return memory_service_pb2_grpc.MemoryServiceStub(grpc_channel)


@pytest.fixture
def manual_server(
    start_server: Callable[..., ServerThread],
) -> Iterator[tuple[ServerThread, ManualClock, memory_service_pb2_grpc.MemoryServiceStub]]:
    """A server of its own whose clock the test moves."""
    clock = ManualClock(1_780_000_000.0)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        yield server, clock, memory_service_pb2_grpc.MemoryServiceStub(channel)
