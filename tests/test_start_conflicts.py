"""A second server on a port or a data directory a running one holds: it refuses to
start, in one line naming what is taken, and the first goes on answering every call."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from calor.client import CalorClient
from calor.models.embedder import OnnxEmbedder
from calor.server.app import CalorServer
from calor.server.config import ServerConfig
from calor.server.errors import AddressInUseError, StoreInUseError
from tests.calor_process import CalorProcess
from tests.conftest import ServerThread

CHANNEL = "conflicts"
TEXT = "The staging database lives on the host called marlin."
CALLS = 10  # each on a connection of its own: the kernel chose a server per connection


@pytest.fixture
def first(tmp_path: Path) -> Iterator[CalorProcess]:
    """``calor serve`` running on a port and a data dir of its own."""
    server = CalorProcess(tmp_path / "first", tmp_path / "first.log")
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def remembered(first: CalorProcess) -> str:
    """The id of a memory the first server holds."""
    with CalorClient(first.target, channel=CHANNEL) as client:
        return client.store(TEXT).id


def calor_serve(*options: str) -> subprocess.CompletedProcess[str]:
    """Run ``calor serve OPTIONS`` to its end; it should refuse to start, so the timeout
    only keeps a server that did start from hanging the test."""
    command = [str(Path(sys.executable).with_name("calor")), "serve", *options]
    try:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=90,  # within the test's own 120 s
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    except subprocess.TimeoutExpired as running:
        started = f"`calor {' '.join(command[1:])}` started: {running.stderr!r}"
        raise AssertionError(started) from None


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a ``calor serve`` that refused to start."""
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def assert_first_answers(first: CalorProcess, memory_id: str) -> None:
    """Every call, each on a new connection, reaches the first server and its store."""
    for _ in range(CALLS):
        with CalorClient(first.target, channel=CHANNEL) as client:
            assert client.identity().total == 1
            hits = client.recall("where is the staging database?", peek=True).hits
            assert [hit.memory.id for hit in hits] == [memory_id]
            assert client.inspect(memory_id).memory.text == TEXT


def test_a_second_server_on_a_taken_port_refuses_to_start(
    first: CalorProcess, remembered: str, tmp_path: Path
) -> None:
    done = calor_serve("--data-dir", str(tmp_path / "second"), "--port", str(first.port))
    line = refusal(done)
    assert f"port {first.port} is in use" in line
    assert f"127.0.0.1:{first.port}" in line and "--port" in line
    assert not (tmp_path / "second" / "rocksdb").exists()  # refused before opening a store
    assert_first_answers(first, remembered)


def test_a_taken_metrics_port_refuses_the_start(
    first: CalorProcess, remembered: str, tmp_path: Path
) -> None:
    options = ["--data-dir", str(tmp_path / "second"), "--port", "0"]
    done = calor_serve(*options, "--metrics-port", str(first.port))
    line = refusal(done)
    assert f"port {first.port} is in use" in line and "--metrics-port" in line
    assert_first_answers(first, remembered)


def test_a_second_server_on_a_data_dir_in_use_refuses_to_start(
    first: CalorProcess, remembered: str
) -> None:
    done = calor_serve("--data-dir", str(first.data_dir), "--port", "0")
    line = refusal(done)
    assert f"the data directory {first.data_dir} is in use" in line
    assert f"process {first.pid} holds" in line
    assert str(first.data_dir / "rocksdb" / "LOCK") in line
    assert_first_answers(first, remembered)


def test_in_process_servers_refuse_a_taken_port_and_a_store_in_use(
    start_server: Callable[..., ServerThread], embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    running = start_server()
    held = running.server.config.data_dir

    async def start_beside() -> None:
        taken = ServerConfig(data_dir=tmp_path / "other", host="127.0.0.1", port=running.port)
        with pytest.raises(AddressInUseError, match=f"port {running.port} is in use"):
            await CalorServer(taken, embedder_factory=lambda: embedder).start()
        same_dir = ServerConfig(data_dir=held, host="127.0.0.1", port=0)
        server = CalorServer(same_dir, embedder_factory=lambda: embedder)
        await server.start()
        try:
            with pytest.raises(StoreInUseError, match="this process holds its RocksDB lock"):
                await server.ready()
        finally:
            await server.stop(0)

    asyncio.run(start_beside())
    with CalorClient(running.target, channel=CHANNEL) as client:
        assert client.identity().total == 0
