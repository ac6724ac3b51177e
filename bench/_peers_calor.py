"""Calor's side of the peers bench: a fresh ``calor serve`` per size, driven over gRPC.

In order: warm the server's model with a 64-text ``StoreStream`` into another channel,
read its RSS (model loaded, channel empty), ingest the texts through ONE
``StoreStream``, read the RSS again, and once more when the server has indexed them (its
HNSW graph built past 20,000); time single-client recalls (peek, then non-peek)
and 8 concurrent clients (peek, each its own gRPC channel, queries asked nowhere
else); stop the server, measure the data dir, start it again on the same data and
time it to SERVING.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import grpc
import numpy as np
from _peers_common import Call, ClientFactory, Json, Workload, run_clients
from _peers_server import PeerServer
from _server import rss_kb
from throughput import recall_times, stream_store, summarize

from calor.server.config import APPROXIMATE_ABOVE
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import memory_service_pb2_grpc as pb_grpc

CHANNEL = "bench"
WARMUP_CHANNEL = "bench-warmup"
WARMUP_TEXTS = 64
LIMIT = 10


def measure_calor(work: Workload, embed_ms: dict[str, float]) -> Json:
    """Every Calor measurement at one size.

    Args:
        work: The texts, queries and concurrent run's shape.
        embed_ms: Each query's median in-process embedding time, subtracted from its
            end-to-end time for the "query embedding excluded" figures.
    """
    server = PeerServer()
    try:
        result: Json = {"ready_s": round(server.wait_ready(), 2)}
        result |= _ingest(server, work.texts)
        result["graph_wait_s"] = _graph_built(server, len(work.texts))
        result |= _indexed_rss(server, result["rss_before_kb"], len(work.texts))
        result |= _recalls(server, work, embed_ms)
        result["exit_code"] = server.stop()
        disk = server.data_bytes()
        result["disk_bytes"] = disk
        result["disk_kb_per_memory"] = round(disk / 1024 / len(work.texts), 3)
        result |= _restart(server, work.peek[0])
        server.stop()
    finally:
        server.close()
    return result


def _ingest(server: PeerServer, texts: Sequence[str]) -> Json:
    stream_store(server.stub, WARMUP_CHANNEL, texts[:WARMUP_TEXTS])  # warms the model
    before = rss_kb(server.pid)
    seconds = stream_store(server.stub, CHANNEL, texts)
    after = rss_kb(server.pid)
    per_memory = None if before is None or after is None else (after - before) / len(texts)
    return {
        "ingest": {
            "memories": len(texts),
            "seconds": round(seconds, 3),
            "per_s": round(len(texts) / seconds, 1),
        },
        "rss_before_kb": before,
        "rss_after_kb": after,
        "rss_kb_per_memory": None if per_memory is None else round(per_memory, 3),
    }


def _indexed_rss(server: PeerServer, before: int | None, memories: int) -> Json:
    """The server's RSS once it has indexed what it took in (past ``APPROXIMATE_ABOVE``
    an HNSW graph is built in the background after the stream returns, from a snapshot
    of the vectors: the RSS read as the stream returns holds that build's scratch)."""
    indexed = rss_kb(server.pid)
    per_memory = None if before is None or indexed is None else (indexed - before) / memories
    return {
        "rss_indexed_kb": indexed,
        "rss_kb_per_memory_indexed": None if per_memory is None else round(per_memory, 3),
    }


def _graph_built(server: PeerServer, memories: int, timeout: float = 1800.0) -> float | None:
    """Past the server's ``approximate_above`` the channel is searched through an HNSW
    graph built in the background: wait until the server logs it is in place, so the
    recalls measure the index the channel settles on. Seconds waited; None below it."""
    if memories <= APPROXIMATE_ABOVE:
        return None
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if "searched through an HNSW graph" in server.log_path.read_text(errors="replace"):
            return round(time.perf_counter() - started, 1)
        time.sleep(0.5)
    raise TimeoutError(f"no HNSW graph after {timeout:.0f} s:\n{server.log_tail()}")


def _recalls(server: PeerServer, work: Workload, embed_ms: dict[str, float]) -> Json:
    stub = server.stub
    recall_times(stub, CHANNEL, work.warmup, peek=True)
    logged = len(server.call_ms())
    peek = recall_times(stub, CHANNEL, work.peek, peek=True)
    peek_server = server.call_ms()[logged:]
    nonpeek = recall_times(stub, CHANNEL, work.nonpeek, peek=False)
    clients = run_clients(_client_factory(server.port, work), work.clients, work.seconds)
    clients["repeated_queries"] = work.repeats(clients["calls"])
    return {
        "peek": summarize(peek),
        "peek_excl": summarize(_minus(peek, [embed_ms[q] for q in work.peek])),
        "nonpeek": summarize(nonpeek),
        "nonpeek_excl": summarize(_minus(nonpeek, [embed_ms[q] for q in work.nonpeek])),
        "clients": clients,
        "peek_split": _split(peek, peek_server, [embed_ms[q] for q in work.peek]),
        "rss_end_kb": rss_kb(server.pid),
    }


def _restart(server: PeerServer, query: str) -> Json:
    """Start-up to SERVING on the data just written, the first recall after it, and the
    resident memory then (the store loaded, the model run once)."""
    startup = server.restart()
    first = recall_times(server.stub, CHANNEL, [query], peek=True)[0]
    return {
        "startup_s": round(startup, 2),
        "first_recall_ms": round(first, 2),
        "rss_restarted_kb": rss_kb(server.pid),
    }


def _minus(total_ms: Sequence[float], part_ms: Sequence[float]) -> list[float]:
    return [t - p for t, p in zip(total_ms, part_ms, strict=True)]


def _split(client_ms: list[float], server_ms: list[float], embed_ms: list[float]) -> Json | None:
    """Where one client's peek recalls spent their time, as medians over calls: the
    server's handler (from its request log), of which the query embedding (the
    in-process median for the same query) and the rest (Calor's own work, including any
    wait in the embedding queue); and outside it (gRPC, conversion, the client)."""
    if len(server_ms) != len(client_ms):
        return None  # the log did not give one line per call
    client, server, embed = (np.asarray(x) for x in (client_ms, server_ms, embed_ms))

    def p50(values: np.ndarray) -> float:
        return round(float(np.median(values)), 2)

    return {
        "end_to_end_p50_ms": p50(client),
        "server_p50_ms": p50(server),
        "embedding_p50_ms": p50(embed),
        "server_minus_embedding_p50_ms": p50(server - embed),
        "outside_server_p50_ms": p50(client - server),
        "server_p99_ms": round(float(np.percentile(server, 99)), 2),
    }


def _client_factory(port: int, work: Workload) -> ClientFactory:
    """Opens client ``number``: a gRPC channel of its own, peek recalls of its share of
    the workload's concurrent pool."""

    @contextmanager
    def open_client(number: int) -> Iterator[Call]:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.MemoryServiceStub(channel)

        def call(i: int) -> object:
            query = work.concurrent_query(number, i)
            request = pb.RecallRequest(channel=CHANNEL, query=query, limit=LIMIT, peek=True)
            return stub.Recall(request, timeout=60.0)

        try:
            yield call
        finally:
            channel.close()

    return open_client
