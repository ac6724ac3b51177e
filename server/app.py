"""Build and serve the Calor gRPC server; load in the background; shut down cleanly.

Health answers NOT_SERVING until the model is loaded and every channel's index is
rebuilt from RocksDB, then SERVING; on SIGTERM it goes NOT_SERVING, in-flight calls
drain for the grace period, and RocksDB is closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from calor.models.embedder import Embedder
from calor.server.api import auth_file
from calor.server.api.access import AccessControl, loopback
from calor.server.api.cluster_keys import ClusterKeys
from calor.server.api.decoding import DecodingInterceptor
from calor.server.api.forwarding import Fanout, ForwardingInterceptor, Gather
from calor.server.api.limits import LimitsInterceptor
from calor.server.api.observe import Observer
from calor.server.api.runtime import Runtime
from calor.server.clock import Clock, SystemClock
from calor.server.config import ServerConfig
from calor.server.embedding import EmbeddingQueue, load_model
from calor.server.errors import (
    CalorError,
    FailedPreconditionError,
    UnavailableError,
)
from calor.server.heap import limit_arenas
from calor.server.listening import in_use, listen_refused, port_in_use
from calor.server.logs import configure_logging
from calor.server.metrics import Metrics, ServerCounts
from calor.server.shard import Shard
from calor.server.storage.store import MemoryStore
from calor.server.tls import check_certificate, peer_credentials, server_credentials
from calor.triggers.webhook import WebhookPolicy

if TYPE_CHECKING:
    from calor.server.cluster_host import ClusterHost

from calor.v1 import (
    memory_service_pb2,
    memory_service_pb2_grpc,
    settings_service_pb2,
    settings_service_pb2_grpc,
    trigger_service_pb2,
    trigger_service_pb2_grpc,
)

__all__ = ["CalorServer", "serve"]

log = logging.getLogger("calor.server")

_GIL_SWITCH_SECONDS = 0.001

_SUBSCRIBE = "/calor.v1.TriggerService/Subscribe"
_SERVICE_NAMES = (
    memory_service_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name,
    settings_service_pb2.DESCRIPTOR.services_by_name["SettingsService"].full_name,
    trigger_service_pb2.DESCRIPTOR.services_by_name["TriggerService"].full_name,
)


@dataclass
class CalorServer:
    """One Calor server: gRPC services over a runtime that loads in the background.

    Build it, ``await start()`` (binds and returns the port at once), then
    ``await ready()`` or watch health; ``await stop()`` drains and closes.
    ``embedder_factory`` replaces loading the model from ``config.model_dir``
    (tests share one loaded model across servers).
    """

    config: ServerConfig
    clock: Clock = field(default_factory=SystemClock)
    embedder_factory: Callable[[], Embedder] | None = None
    runtime: Runtime = field(init=False)
    port: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.runtime = Runtime(self.config, self.clock)
        self._webhooks = WebhookPolicy(allowed_hosts=frozenset(self.config.webhook_allow))
        self._shard = Shard(self.runtime, self._webhooks, self.server_counts)
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._cluster: ClusterHost | None = None
        self._cluster_keys: ClusterKeys | None = None
        config = self.config
        peers = (
            peer_credentials(
                config.tls_cert, config.tls_key, config.peer_ca or config.tls_client_ca
            )
            if config.cluster
            else None
        )
        self._forwarding = ForwardingInterceptor(self._place, self._shard_of, config.node_id, peers)
        self._embeddings: EmbeddingQueue | None = None
        self._loading: asyncio.Task[None] | None = None
        self._access = AccessControl(None)
        self.limits = LimitsInterceptor(
            rate=self.config.rate_per_key,
            burst=self.config.rate_burst,
            max_subscriptions=self.config.max_subscriptions_per_key,
            max_answer_bytes=self.config.max_message_bytes,
        )
        """Rates and subscription caps per caller; it knows the calls in flight."""
        self.metrics = Metrics()
        self.metrics_port = 0  # where /metrics is served; 0 while it is not

    async def start(self) -> int:
        """Bind the port and begin loading; returns the bound port.

        Raises:
            AddressInUseError: Another process listens on the port or the metrics port.
            FailedPreconditionError: A port cannot be listened on for another reason,
                or the access settings are refused.
        """
        self._access = self._access_control()
        server = grpc.aio.server(
            interceptors=self._interceptors(),
            options=[
                ("grpc.max_receive_message_length", self.config.max_message_bytes),
                ("grpc.max_send_message_length", self.config.max_message_bytes),
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                # gRPC sets SO_REUSEPORT by default: a second server on this port would
                # start too, and the kernel would split new connections between the two.
                ("grpc.so_reuseport", 0),
            ],
        )
        shard = self._shard
        memory_service_pb2_grpc.add_MemoryServiceServicer_to_server(shard.memory_api, server)
        trigger_service_pb2_grpc.add_TriggerServiceServicer_to_server(shard.trigger_api, server)
        settings_service_pb2_grpc.add_SettingsServiceServicer_to_server(shard.settings_api, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*_SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        host, port = self.config.host, self.config.port
        if port and in_use(host, port):
            # gRPC listens on what it can of a host's addresses ("localhost": ::1 and
            # 127.0.0.1): one taken would split the clients between two servers.
            raise port_in_use(host, port, "--port")
        try:
            self.port = self._bind(server, f"{host}:{port}")
        except RuntimeError as error:  # grpc: "Failed to bind to address …", no reason
            raise listen_refused(host, port, "--port", error) from error
        if self.port == 0:  # how older grpc versions say it
            raise listen_refused(host, port, "--port", None)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.config.metrics_port:
            try:
                self.metrics_port = self.metrics.serve(host, self.config.metrics_port)
            except OSError as error:
                await server.stop(None)  # bound, not started: the port is let go
                refused = listen_refused(host, self.config.metrics_port, "--metrics-port", error)
                raise refused from error
            log.info("metrics on http://%s:%d/metrics", host, self.metrics_port)
        await server.start()
        self._server = server
        self._loading = asyncio.create_task(self._load(), name="calor-load")
        return self.port

    def _bind(self, server: grpc.aio.Server, address: str) -> int:
        """Add the listening port: TLS (mutual with a client CA) when the config names a
        certificate, plaintext otherwise; the TLS files are read and checked here, the
        certificate's validity by the server's clock, and its names against the host."""
        config = self.config
        credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
        if credentials is None or config.tls_cert is None:
            return server.add_insecure_port(address)
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        mismatch = check_certificate(config.tls_cert, config.host, now)
        if mismatch is not None:
            log.warning("TLS: %s", mismatch)
        mutual = f"; client certificates of {config.tls_client_ca}" if config.tls_client_ca else ""
        log.info("TLS: %s%s", config.tls_cert, mutual)
        return server.add_secure_port(address, credentials)

    def _interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """What every call passes through, outermost first: observation (metrics and the
        request log), access control, limits (rates, subscriptions, the call's deadline),
        then decoding (requests that are not what the RPC takes)."""
        layers = [Observer(self.metrics), self._access, self.limits, DecodingInterceptor()]
        return [*layers, self._forwarding] if self.config.cluster else layers

    def _place(
        self, method: str, request: Any, forwarded: bool, shard: int | None
    ) -> Callable[..., Any] | str | Fanout | Gather:
        """Cluster mode: where a call goes (see :meth:`ClusterHost.place`); a
        subscription is answered here, from the cluster's events stream."""
        if self._cluster is None:
            raise UnavailableError("the server is starting: it is joining the cluster")
        if method == _SUBSCRIBE:
            return self._shard.trigger_api.Subscribe
        return self._cluster.place(method, request, forwarded, shard)

    def _access_control(self) -> AccessControl:
        """The keys of ``config.auth_file``; without one, open, and on loopback only.

        Raises:
            FailedPreconditionError: The auth file cannot be read or is malformed, or
                the server would run open on a host other hosts can reach.
        """
        config = self.config
        if config.auth_file is not None:
            keys = auth_file.load(config.auth_file)
            log.info("access control: %d API keys from %s", len(keys.keys), config.auth_file)
            return AccessControl(keys, self.clock)
        if not loopback(config.host):
            raise FailedPreconditionError(
                f"refusing to run open on {config.host!r}: --host {config.host} needs "
                "--auth-file FILE (create keys with `calor keys add`), or bind 127.0.0.1"
            )
        log.warning(
            "calor runs open (no --auth-file): any local process may read and change every "
            "channel; serving on loopback %s only",
            config.host,
        )
        return AccessControl(None)

    async def reload_auth(self) -> bool:
        """Read the auth file again and serve its keys from the next call on (SIGHUP).

        Open streams go on, except those of a revoked key (ended UNAUTHENTICATED) and of
        a key whose grants changed (ended UNAVAILABLE, to be called again). A file that
        cannot be read or is malformed leaves the keys in force and logs why. In cluster
        mode the file is published to the cluster, and every node serves it within a
        second or so.

        Returns:
            Whether the file's keys are now in force, or published (False without an
            auth file).
        """
        path = self.config.auth_file
        if path is None:
            log.warning("auth reload asked for, but the server runs open (no --auth-file)")
            return False
        loop = asyncio.get_running_loop()
        try:
            content = await loop.run_in_executor(None, auth_file.read, path)
            keys = auth_file.parse(content, f"auth file {path}")
            if self._cluster_keys is not None:
                await self._cluster_keys.publish(content)
                log.info("access control: published %d API keys from %s", len(keys.keys), path)
                return True  # every node, this one too, serves them once it reads them
        except CalorError as error:
            log.error("auth file not reloaded, the keys in force stay: %s", error.message)
            return False
        self._access.reload(keys)
        log.info("access control: reloaded %d API keys from %s", len(keys.keys), path)
        return True

    def _shard_of(self, method: str, request: Any) -> object:
        """Cluster mode: the shard a request goes to."""
        if self._cluster is None:
            raise UnavailableError("the server is starting: it is joining the cluster")
        return self._cluster.shard_of(method, request)

    async def _join_cluster(self, embedder: Embedder) -> None:
        """Cluster mode: join the cluster, forward calls to the owners of the shards,
        and take this node's share of them."""
        from calor.server.cluster.placement import Owner  # cluster mode only
        from calor.server.cluster_host import ClusterHost

        config, loop = self.config, asyncio.get_running_loop()
        await loop.run_in_executor(None, self._refuse_embedded_store, embedder)
        me = Owner(
            config.node_id or f"{socket.gethostname()}:{self.port}",
            config.advertise or f"{config.host}:{self.port}",
        )
        host = await loop.run_in_executor(None, ClusterHost.join, config, me)
        self._cluster = host
        self._shard.trigger_api.stream_from(host.events)  # Subscribe reads the events stream
        self._embeddings = EmbeddingQueue(embedder, ingest_runs=self.config.model_threads)
        self._embeddings.embedded = self.metrics.embedded
        self.metrics.watch_cluster(host.cluster_counts)
        self.metrics.watch(self.server_counts)
        keys = ClusterKeys(self._access, host.settings.auth, host.settings.publish_auth)
        await keys.start(config.auth_file)
        self._cluster_keys = keys
        model_id, dim, sync = embedder.model_id, embedder.dim, config.sync_writes
        opening = partial(Shard.open_store, model_id=model_id, dim=dim, sync=sync)
        await host.start(opening, self._serve_shard)
        await host.placed()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "cluster node %s (%s) of %d shards: forwarding calls to their owners",
            me.node_id,
            me.address,
            config.shards,
        )

    def _refuse_embedded_store(self, embedder: Embedder) -> None:
        """Refuse a data directory holding a store of the embedded server: its memories
        are in no write log, and no other node would ever see them.

        Raises:
            FailedPreconditionError: It holds one.
        """
        config = self.config
        if not (config.data_dir / "rocksdb").exists():
            return
        store = Shard.open_store(config.data_dir, embedder.model_id, embedder.dim, False)
        try:
            if store.channel_names():
                raise FailedPreconditionError(
                    f"{config.data_dir} holds memories that are not in the cluster's write "
                    "log (a store of the embedded server): start the node on an empty "
                    "--data-dir, and bring them in with `calor export` and `calor import` "
                    "through the cluster"
                )
        finally:
            store.close()

    async def _serve_shard(self, store: MemoryStore, directory: Path) -> Shard:
        """Cluster mode: load a shard this node now owns and answer its calls."""
        assert self._embeddings is not None  # made before the first shard is served
        runtime = Runtime(self.config, self.clock, self.runtime.executor)
        shard = Shard(runtime, self._webhooks, self.server_counts)
        await shard.serve(
            store, self._embeddings, self.clock, self.metrics, self._serving_calls, directory
        )
        return shard

    async def _set_health(self, status: int) -> None:
        for name in ("", *_SERVICE_NAMES):
            await self._health.set(name, status)

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        factory = self.embedder_factory or self._load_model
        embedder = await loop.run_in_executor(None, factory)
        config = self.config
        if config.cluster:
            await self._join_cluster(embedder)
            return
        store = await loop.run_in_executor(
            None,
            Shard.open_store,
            config.data_dir,
            embedder.model_id,
            embedder.dim,
            config.sync_writes,
        )
        self._embeddings = EmbeddingQueue(embedder, ingest_runs=self.config.model_threads)
        self._embeddings.embedded = self.metrics.embedded
        await self._shard.serve(
            store, self._embeddings, self.clock, self.metrics, self._serving_calls, config.data_dir
        )
        self.metrics.watch(self.server_counts)
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("calor ready on %s:%d (data in %s)", config.host, self.port, config.data_dir)

    def _serving_calls(self) -> bool:
        """Whether calls other than open subscriptions are in flight."""
        return self.limits.open_calls > sum(self.limits.subscriptions.values())

    def server_counts(self) -> ServerCounts:
        """What the server holds now (blocking: run it off the event loop); a cluster
        node, what the shards it serves hold."""
        if self._cluster is not None:
            return self._cluster.counts()
        counts = self._shard.counts()
        if counts is None:
            raise UnavailableError("the server is starting: the model and indexes are loading")
        return counts

    def _load_model(self) -> Embedder:
        return load_model(self.config.model_dir, threads=self.config.model_threads)

    async def ready(self) -> None:
        """Wait until loading is done; re-raises what made loading fail (a
        :class:`~calor.server.errors.StoreInUseError` when another process holds the
        data directory, a missing model, …)."""
        if self._loading is None:
            raise RuntimeError("start() the server first")
        await self._loading

    async def stop(self, grace: float | None = None) -> None:
        """Go NOT_SERVING, let in-flight calls finish, then close the store."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        # Subscriptions end with a status naming their resume point; a cluster node's
        # shards are handed on (their calls drained and their leases given up).
        await self._shard.stop_serving()
        if self._cluster is not None:
            await self._cluster.stop()
        if self._server is not None:
            await self._server.stop(self.config.grace_seconds if grace is None else grace)
        if self._embeddings is not None:
            await self._embeddings.close()
        self.runtime.executor.shutdown(wait=True)
        self.metrics.close()
        if self._cluster_keys is not None:
            self._cluster_keys.close()
        await self._forwarding.close()
        self._shard.close()  # what the purger has pending is purged at the next start


async def _run(config: ServerConfig) -> None:
    server = CalorServer(config)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    reloads: set[asyncio.Task[bool]] = set()

    def reload_auth() -> None:
        task = asyncio.create_task(server.reload_auth(), name="calor-reload-auth")
        reloads.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload_auth)
    waiter = asyncio.create_task(stopping.wait())
    loading = server._loading
    assert loading is not None
    done, _ = await asyncio.wait({waiter, loading}, return_when=asyncio.FIRST_COMPLETED)
    if loading in done and loading.exception() is not None:
        await server.stop(0)
        raise loading.exception()  # type: ignore[misc]
    await stopping.wait()
    log.info("calor stopping: draining in-flight calls")
    await server.stop()


def serve(config: ServerConfig) -> None:
    """Run a server until SIGTERM or SIGINT."""
    limit_arenas()  # before the server's threads exist
    configure_logging(config.log_format)
    # A thread waiting for the GIL gets it within this long: a recall's few Python steps
    # are not held 5 ms each (the default) behind another client's batch being built.
    sys.setswitchinterval(_GIL_SWITCH_SECONDS)
    asyncio.run(_run(config))
