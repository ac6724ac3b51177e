"""A server's Prometheus metrics: one registry per server, its instruments, its HTTP endpoint.

Names follow the OpenTelemetry semantic conventions where one exists, written the way
OpenTelemetry's Prometheus exporters write them (dots become underscores, the unit
becomes a suffix): ``rpc.server.call.duration`` is ``rpc_server_call_duration_seconds``,
``gen_ai.client.operation.duration`` is ``gen_ai_client_operation_duration_seconds``,
and the ``gen_ai.memory.record.count`` attribute becomes the histogram
``gen_ai_memory_record_count``. What the conventions do not name is ``calor_*``.

No label carries a channel name, a key, a text or a query: the endpoint tells how the
server does, never what it holds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ClusterCounts", "Metrics", "ServerCounts", "data_bytes", "rss_bytes", "sum_counts"]

# The buckets gen_ai.client.operation.duration SHOULD have, below them a few for the
# milliseconds most memory operations take.
_OPERATION_SECONDS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
_STAGE_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_RECORD_COUNTS = (0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 20000)
_SIMILARITIES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class ServerCounts:
    """What a server holds right now, read from counts it keeps (never a scan).

    Attributes:
        channels: Channels holding at least one memory that is not forgotten.
        memories_by_state: Memories per state over every channel (``active``, ``cold``, ...).
        last_seq: The last event number the log gave.
        subscribers: Open ``Subscribe`` streams.
        dropped_subscribers: Streams ended since start because they fell too far behind.
        data_bytes: The data directory's size on disk.
    """

    channels: int = 0
    memories_by_state: Mapping[str, int] = field(default_factory=dict)
    last_seq: int = 0
    subscribers: int = 0
    dropped_subscribers: int = 0
    data_bytes: int = 0


@dataclass(frozen=True)
class ClusterCounts:
    """A cluster node's place in its cluster (cluster mode), by shard.

    Attributes:
        owned: Whether this node owns each shard (writes its log) or forwards to the
            node that does.
        log_positions: The last write-log entry this node's store of each shard holds.
    """

    owned: Mapping[int, bool]
    log_positions: Mapping[int, int]


def sum_counts(parts: list[ServerCounts]) -> ServerCounts:
    """What several stores hold together (the shards a cluster node serves)."""
    states: dict[str, int] = {}
    for part in parts:
        for state, count in part.memories_by_state.items():
            states[state] = states.get(state, 0) + count
    return ServerCounts(
        channels=sum(part.channels for part in parts),
        memories_by_state=states,
        last_seq=max((part.last_seq for part in parts), default=0),
        subscribers=sum(part.subscribers for part in parts),
        dropped_subscribers=sum(part.dropped_subscribers for part in parts),
        data_bytes=sum(part.data_bytes for part in parts),
    )


def _labelled(
    name: str, documentation: str, label: str, samples: Mapping[Any, float]
) -> GaugeMetricFamily:
    """A gauge with one sample per value of ``label`` (the keys of ``samples``, sorted)."""
    gauge = GaugeMetricFamily(name, documentation, labels=[label])
    for key, value in sorted(samples.items()):
        gauge.add_metric([str(key)], value)
    return gauge


class _ClusterCollector(Collector):
    """Reads :class:`ClusterCounts` at each scrape."""

    def __init__(self, counts: Callable[[], ClusterCounts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self._counts()
        yield _labelled(
            "calor_cluster_owner",
            "1 while this node owns the shard and writes its log; 0 while it forwards.",
            "shard",
            {shard: int(owned) for shard, owned in counts.owned.items()},
        )
        yield _labelled(
            "calor_cluster_log_position",
            "The last write-log entry this node's store of the shard holds (behind the "
            "owner's: the entries it has still to follow).",
            "shard",
            counts.log_positions,
        )


class _CountsCollector(Collector):
    """Reads :class:`ServerCounts` at each scrape."""

    def __init__(self, counts: Callable[[], ServerCounts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self._counts()
        yield _labelled(
            "calor_memory_records",
            "Memories held, per state, over every channel.",
            "state",
            counts.memories_by_state,
        )
        yield GaugeMetricFamily(
            "calor_channels", "Channels holding at least one memory.", value=counts.channels
        )
        yield CounterMetricFamily(
            "calor_events_appended",
            "Events appended to the event log over the store's life (its last sequence).",
            value=counts.last_seq,
        )
        yield GaugeMetricFamily(
            "calor_subscribers", "Open Subscribe streams.", value=counts.subscribers
        )
        yield CounterMetricFamily(
            "calor_subscribers_dropped",
            "Subscribe streams ended because they fell too far behind.",
            value=counts.dropped_subscribers,
        )
        yield GaugeMetricFamily(
            "calor_data_dir_bytes",
            "Size on disk of the data directory (RocksDB's files).",
            value=counts.data_bytes,
        )


class Metrics:
    """The instruments of one server, in a registry of its own (several servers in one
    process do not collide), and the HTTP endpoint that serves them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.calls = Histogram(
            "rpc_server_call_duration_seconds",
            "Duration of the RPCs the server handled (streams when they end), by method "
            "and gRPC status.",
            ["rpc_method", "rpc_response_status_code"],
            registry=self.registry,
            buckets=_OPERATION_SECONDS,
        )
        self.operations = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "Duration of memory operations (create_memory, search_memory, update_memory, "
            "delete_memory, delete_memory_store) and of embedding batches (embeddings).",
            ["gen_ai_operation_name", "error_type"],
            registry=self.registry,
            buckets=_OPERATION_SECONDS,
        )
        self.records = Histogram(
            "gen_ai_memory_record_count",
            "Memory records an operation returned (search_memory), created "
            "(create_memory) or deleted (delete_memory).",
            ["gen_ai_operation_name"],
            registry=self.registry,
            buckets=_RECORD_COUNTS,
        )
        self.top_similarity = Histogram(
            "calor_recall_top_similarity",
            "The best cosine similarity among a recall's hits (recalls with hits only).",
            registry=self.registry,
            buckets=_SIMILARITIES,
        )
        self.embedding_batch = Histogram(
            "calor_embedding_batch_size",
            "Texts per model run, by kind (query or passage).",
            ["kind"],
            registry=self.registry,
            buckets=_BATCH_SIZES,
        )
        self.stage_seconds = Histogram(
            "calor_rpc_stage_seconds",
            "Seconds a call spent in each stage of its work (validation, embedding queue, "
            "model, executor wait, dense search, lexical search, fusion and scoring, heat "
            "effects, commit, reply, ...), by method; calls that ended OK only.",
            ["rpc_method", "stage"],
            registry=self.registry,
            buckets=_STAGE_SECONDS,
        )
        self.dreams = Histogram(
            "calor_dream_duration_seconds",
            "Duration of dreams, by scope (channel: a whole dream; cold: a consolidation "
            "sweep over the cold memories).",
            ["scope"],
            registry=self.registry,
            buckets=_OPERATION_SECONDS,
        )
        self._http: tuple[WSGIServer, threading.Thread] | None = None

    # --- what the server reports ----------------------------------------------------

    def call(self, method: str, code: str, seconds: float) -> None:
        """One RPC ended with ``code`` after ``seconds``."""
        self.calls.labels(method, code).observe(seconds)

    def operation(self, name: str, seconds: float, error: str = "") -> None:
        """One GenAI operation (``search_memory``, ``embeddings``, ...) took ``seconds``;
        ``error`` names how it failed ("" when it did not)."""
        self.operations.labels(name, error).observe(seconds)

    def record_count(self, operation: str, count: int) -> None:
        """How many memory records one operation returned, created or deleted."""
        self.records.labels(operation).observe(count)

    def stages(self, method: str, seconds: Mapping[str, float]) -> None:
        """The seconds one call spent in each of its stages."""
        for stage, spent in seconds.items():
            self.stage_seconds.labels(method, stage).observe(spent)

    def recall(self, top_similarity: float) -> None:
        """A recall's best similarity among its hits."""
        self.top_similarity.observe(top_similarity)

    def embedded(self, kind: str, texts: int, seconds: float) -> None:
        """One model run embedded ``texts`` texts of ``kind`` (query or passage)."""
        self.embedding_batch.labels(kind).observe(texts)
        self.operations.labels("embeddings", "").observe(seconds)

    def dreamt(self, cold_only: bool, seconds: float) -> None:
        """A dream (or, ``cold_only``, a consolidation sweep) ran for ``seconds``."""
        self.dreams.labels("cold" if cold_only else "channel").observe(seconds)

    def watch(self, counts: Callable[[], ServerCounts]) -> None:
        """Report what ``counts`` answers at every scrape (memories, channels, events,
        subscribers, disk)."""
        self.registry.register(_CountsCollector(counts))

    def watch_cluster(self, counts: Callable[[], ClusterCounts]) -> None:
        """Report this node's place in its cluster at every scrape (cluster mode)."""
        self.registry.register(_ClusterCollector(counts))

    # --- the endpoint -----------------------------------------------------------------

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` over HTTP on ``host:port`` in a thread; returns the port."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = (server, thread)
        return int(server.server_port)

    def close(self) -> None:
        """Stop the endpoint, if it runs."""
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._http = None


def data_bytes(folder: Path) -> int:
    """The size of every file under ``folder`` (0 if it does not exist)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue  # compaction removed it meanwhile
    return total


def rss_bytes() -> int:
    """This process's resident memory, in bytes (0 where the platform does not say)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # not on every platform; peak, not current, where /proc is missing
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if os.uname().sysname == "Darwin" else peak * 1024)
