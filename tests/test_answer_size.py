"""Answers and ``--max-message-bytes``: long pages and recalls come back cut to fit, an
answer that cannot fit is refused (and logged and counted as refused), and a recall's
effects reach only the hits an answer carries."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from calor.client import CalorClient
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.config import ServerConfig
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.calor_process import free_port
from tests.conftest import ServerThread
from tests.test_observability import calls, request_log, scrape, settled  # noqa: F401

KIB = 1024
RECALL = "calor.v1.MemoryService/Recall"
INSPECT = "calor.v1.MemoryService/Inspect"
ENTITY_CARD = "calor.v1.MemoryService/EntityCard"


def long_text(n: int, size: int) -> str:
    """A text of ``size`` bytes the model reads in a few tokens (one long word)."""
    return f"note{n} " + "x" * (size - len(f"note{n} "))


@pytest.fixture(scope="module")
def roomy(start_server: Callable[..., ServerThread]) -> ServerThread:
    """A server of this module's own at the default 16 MiB message limit."""
    return start_server()


def test_a_page_of_a_thousand_32_kib_memories_comes_back_in_pieces(roomy: ServerThread) -> None:
    channel = "big-pages"
    requests = (
        pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel, text=long_text(n, 32 * KIB)))
        for n in range(1000)
    )
    with grpc.insecure_channel(roomy.target) as grpc_channel:
        stub = MemoryServiceStub(grpc_channel)
        stored = stub.StoreStream(requests, timeout=300).ids
    assert len(stored) == 1000

    client = CalorClient(roomy.target, channel=channel)
    try:
        first = client.list_memories(page_size=1000)
        # 1,000 × 32 KiB is twice the 16 MiB an answer may be: the page is cut, not failed.
        assert first.truncated and first.next_page_token
        assert 0 < len(first.memories) < 1000
        assert first.ByteSize() <= 16 * 1024 * KIB
        second = client.list_memories(page_size=1000, page_token=first.next_page_token)
        assert {m.id for m in first.memories}.isdisjoint(m.id for m in second.memories)
        every = [m.id for m in client.iter_memories(page_size=1000)]
        hottest = client.list_memories(page_size=1000, order="heat")
        assert hottest.truncated and 0 < len(hottest.memories) < 1000
        rest = client.list_memories(
            page_size=1000, order="heat", page_token=hottest.next_page_token
        )
        by_heat = [m.id for m in [*hottest.memories, *rest.memories]]
    finally:
        client.close()
    assert sorted(every) == sorted(stored)
    assert len(every) == len(set(every))
    assert sorted(by_heat) == sorted(stored)  # the heat order's cut resumes where it stopped


def test_a_recall_cut_to_fit_recalls_only_the_hits_it_carries(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server(max_message_bytes=40 * KIB)
    channel = "cut-recall"
    with grpc.insecure_channel(server.target) as grpc_channel:
        stub = MemoryServiceStub(grpc_channel)
        ids = [
            stub.Store(pb.StoreRequest(channel=channel, text=long_text(n, 12 * KIB))).memory.id
            for n in range(4)
        ]
        reply = stub.Recall(pb.RecallRequest(channel=channel, query="note", limit=4))
        assert reply.truncated
        assert 1 <= len(reply.hits) < 4
        returned = {hit.memory.id for hit in reply.hits}
        for memory_id in ids:
            memory = stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id)).memory
            assert memory.recall_count == (1 if memory_id in returned else 0), memory_id
        # The same recall asked for what fits is whole.
        whole = stub.Recall(pb.RecallRequest(channel=channel, query="note", limit=1, peek=True))
        assert len(whole.hits) == 1 and not whole.truncated


@pytest.fixture
def lowered(embedder: OnnxEmbedder, tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    """Servers on one data dir, one at a time (the limit lowered, then raised again)."""
    running: list[ServerThread] = []

    def start(**options: object) -> ServerThread:
        for server in running:
            server.stop()
        running.clear()
        config = ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=0, **options)  # type: ignore[arg-type]
        running.append(ServerThread(config, SystemClock(), lambda: embedder))
        return running[0]

    yield start
    for server in running:
        server.stop()


def test_an_answer_too_large_to_send_is_refused_logged_and_counted_and_heats_nothing(
    lowered: Callable[..., ServerThread],
    request_log: io.StringIO,  # noqa: F811
) -> None:
    channel = "too-large"
    server = lowered()
    with grpc.insecure_channel(server.target) as grpc_channel:
        stub = MemoryServiceStub(grpc_channel)
        memory_id = stub.Store(
            pb.StoreRequest(channel=channel, text="Ada Lovelace " + long_text(0, 20 * KIB))
        ).memory.id

    server = lowered(max_message_bytes=8 * KIB, metrics_port=free_port())
    with grpc.insecure_channel(server.target) as grpc_channel:
        stub = MemoryServiceStub(grpc_channel)
        asked = (
            (RECALL, lambda: stub.Recall(pb.RecallRequest(channel=channel, query="note"))),
            (INSPECT, lambda: stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id))),
        )
        for _, call in asked:
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-message-bytes" in (refused.value.details() or "")
        samples = settled(
            lambda: scrape(server.server.metrics_port),
            lambda now: calls(now, INSPECT, "RESOURCE_EXHAUSTED") == 1,
        )
    for method, _ in asked:
        assert calls(samples, method, "RESOURCE_EXHAUSTED") == 1
        assert calls(samples, method, "OK") == 0
    logged = [json.loads(line) for line in request_log.getvalue().splitlines()]
    statuses = {line["rpc"]: line["status"] for line in logged if line["rpc"] in (RECALL, INSPECT)}
    assert statuses == {RECALL: "RESOURCE_EXHAUSTED", INSPECT: "RESOURCE_EXHAUSTED"}

    server = lowered()
    with grpc.insecure_channel(server.target) as grpc_channel:
        memory = (
            MemoryServiceStub(grpc_channel)
            .Inspect(pb.InspectRequest(channel=channel, id=memory_id))
            .memory
        )
    assert memory.recall_count == 0
    assert not memory.HasField("last_recalled_at")
