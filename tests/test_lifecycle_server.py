"""The server's life: health transitions, clean restarts, and kill -9 after acknowledged writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.cluster.local import free_port
from calor.server.config import ServerConfig
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.helpers import store, total

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_status(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        return int(reply.status)


def test_health_is_not_serving_until_the_model_and_indexes_are_ready(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    gate = threading.Event()

    def slow_model() -> OnnxEmbedder:
        gate.wait(30)
        return embedder

    config = ServerConfig(data_dir=tmp_path, port=0)
    server = ServerThread(config, SystemClock(), slow_model, wait_ready=False)
    try:
        assert health_status(server.target) == NOT_SERVING
        with grpc.insecure_channel(server.target) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                MemoryServiceStub(channel).Store(pb.StoreRequest(channel="c", text="too early"))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service="")
            )
            assert next(watch).status == NOT_SERVING
            gate.set()
            server.call(server.server.ready())
            assert next(watch).status == SERVING
            stopping = threading.Thread(target=server.call, args=(server.server.stop(2.0),))
            stopping.start()
            assert next(watch).status == NOT_SERVING
            stopping.join(10)
    finally:
        gate.set()
        server.loop.call_soon_threadsafe(server.loop.stop)


def test_clean_restart_keeps_everything(embedder: OnnxEmbedder, tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path, port=0)
    first = ServerThread(config, SystemClock(), lambda: embedder)
    with grpc.insecure_channel(first.target) as channel:
        stub = MemoryServiceStub(channel)
        kept = store(stub, "home", "The spare key is under the blue pot.")
        store(stub, "home", "Recycling goes out on Tuesdays.", idempotency_key="recycle")
        stub.Recall(pb.RecallRequest(channel="home", query="where is the spare key", limit=1))
    first.stop()
    second = ServerThread(config, SystemClock(), lambda: embedder)
    try:
        with grpc.insecure_channel(second.target) as channel:
            stub = MemoryServiceStub(channel)
            assert total(stub, "home") == 2
            reply = stub.Recall(pb.RecallRequest(channel="home", query="spare key", peek=True))
            assert reply.hits[0].memory.id == kept.id
            assert reply.hits[0].memory.recall_count == 1
            again = store(
                stub, "home", "Recycling goes out on Tuesdays.", idempotency_key="recycle"
            )
            assert total(stub, "home") == 2 and again.text.startswith("Recycling")
    finally:
        second.stop()


@contextmanager
def calor_process(data_dir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`calor serve` in a child process, yielded once its health says SERVING."""
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("calor")),
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise AssertionError(f"server exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if health_status(target) == SERVING:
                    break
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "server did not become SERVING in 60 s"
            time.sleep(0.1)
        yield process, target
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


def test_kill_9_right_after_acknowledged_stream_writes_loses_none(tmp_path: Path) -> None:
    notes = [f"Field note {i}: the heron returned to pond {i % 17} at dawn." for i in range(300)]
    with calor_process(tmp_path) as (process, target):
        with grpc.insecure_channel(target) as channel:
            reply = MemoryServiceStub(channel).StoreStream(
                iter(
                    pb.StoreStreamRequest(store=pb.StoreRequest(channel="field", text=t))
                    for t in notes
                )
            )
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    assert len(reply.ids) == 300
    with calor_process(tmp_path) as (_, target), grpc.insecure_channel(target) as channel:
        stub = MemoryServiceStub(channel)
        assert total(stub, "field") == 300
        listed: list[str] = []
        token = ""
        while True:
            page = stub.ListMemories(
                pb.ListMemoriesRequest(channel="field", page_size=1000, page_token=token)
            )
            listed.extend(m.id for m in page.memories)
            token = page.next_page_token
            if not token:
                break
        assert sorted(listed) == sorted(reply.ids)
        for index in (0, 137, 299):
            hits = stub.Recall(
                pb.RecallRequest(channel="field", query=notes[index], limit=3, peek=True)
            )
            assert reply.ids[index] in [h.memory.id for h in hits.hits]


def test_sigterm_drains_and_closes_cleanly(tmp_path: Path) -> None:
    with calor_process(tmp_path) as (process, target):
        with grpc.insecure_channel(target) as channel:
            store(MemoryServiceStub(channel), "c", "Written before SIGTERM.")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    with calor_process(tmp_path) as (_, target), grpc.insecure_channel(target) as channel:
        assert total(MemoryServiceStub(channel), "c") == 1
