"""Build and serve the Calor gRPC server; load in the background; shut down cleanly.

Health answers NOT_SERVING until the model is loaded and every channel's index is
rebuilt from RocksDB, then SERVING; on SIGTERM it goes NOT_SERVING, in-flight calls
drain for the grace period, and RocksDB is closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from calor.models.embedder import Embedder
from calor.server.api.memory_service import MemoryServicer
from calor.server.api.runtime import Runtime
from calor.server.api.settings_service import SettingsServicer
from calor.server.clock import Clock, SystemClock
from calor.server.config import ServerConfig
from calor.server.embedding import EmbeddingQueue, load_model
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.heap import settle
from calor.server.storage.store import MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from calor.triggers.engine import TriggerEngine
from calor.triggers.trigger_service import TriggerServicer
from calor.triggers.webhook import WebhookPolicy
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
        self._trigger_api = TriggerServicer(self.runtime)
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._store: MemoryStore | None = None
        self._embeddings: EmbeddingQueue | None = None
        self._loading: asyncio.Task[None] | None = None
        self._triggers: TriggerEngine | None = None

    async def start(self) -> int:
        """Bind the port and begin loading; returns the bound port."""
        server = grpc.aio.server(
            interceptors=self._interceptors(),
            options=[
                ("grpc.max_receive_message_length", 16 * 1024 * 1024),
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ]
        )
        memory_service_pb2_grpc.add_MemoryServiceServicer_to_server(
            MemoryServicer(self.runtime), server
        )
        trigger_service_pb2_grpc.add_TriggerServiceServicer_to_server(self._trigger_api, server)
        settings_service_pb2_grpc.add_SettingsServiceServicer_to_server(
            SettingsServicer(self.runtime), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*_SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        address = f"{self.config.host}:{self.config.port}"
        self.port = server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"could not bind {address}")
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        self._server = server
        self._loading = asyncio.create_task(self._load(), name="calor-load")
        return self.port

    def _interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """What every call passes through, outermost first: observation (metrics and the
        request log), access control, then decoding and limits."""
        return []

    async def _set_health(self, status: int) -> None:
        for name in ("", *_SERVICE_NAMES):
            await self._health.set(name, status)

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        factory = self.embedder_factory or self._load_model
        embedder = await loop.run_in_executor(None, factory)
        store = await loop.run_in_executor(
            None,
            lambda: MemoryStore.open(
                self.config.data_dir,
                model_id=embedder.model_id,
                dim=embedder.dim,
                sync=self.config.sync_writes,
            ),
        )
        self._store = store
        engine = await loop.run_in_executor(
            None, MemoryEngine.open, store, self.clock, ChannelPolicy()
        )
        engine.background = self.runtime.executor.submit
        settle()  # the channels just loaded live until forgotten: out of the collector's view
        self._embeddings = EmbeddingQueue(embedder)
        triggers = TriggerEngine(
            store,
            engine,
            self.clock,
            self.runtime.run,
            WebhookPolicy(allowed_hosts=frozenset(self.config.webhook_allow)),
            retention_events=self.config.event_retention,
            retention_seconds=self.config.event_retention_seconds,
            queue_size=self.config.subscriber_queue,
            max_chain_depth=self.config.max_chain_depth,
        )
        await triggers.start()
        self._triggers = triggers
        self._trigger_api.attach(triggers)
        self.runtime.attach(engine, self._embeddings)
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "calor ready on %s:%d (data in %s)", self.config.host, self.port, self.config.data_dir
        )

    def _load_model(self) -> Embedder:
        return load_model(self.config.model_dir, threads=self.config.model_threads)

    async def ready(self) -> None:
        """Wait until loading is done; re-raises what made loading fail."""
        if self._loading is None:
            raise RuntimeError("start() the server first")
        await self._loading

    async def stop(self, grace: float | None = None) -> None:
        """Go NOT_SERVING, let in-flight calls finish, then close the store."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        if self._triggers is not None:
            await self._triggers.stop()  # subscriptions end with a status naming their resume point
        if self._server is not None:
            await self._server.stop(self.config.grace_seconds if grace is None else grace)
        if self._embeddings is not None:
            await self._embeddings.close()
        self.runtime.executor.shutdown(wait=True)
        if self._store is not None:
            self._store.close()


async def _run(config: ServerConfig) -> None:
    server = CalorServer(config)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
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
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # A thread waiting for the GIL gets it within this long: a recall's few Python steps
    # are not held 5 ms each (the default) behind another client's batch being built.
    sys.setswitchinterval(_GIL_SWITCH_SECONDS)
    asyncio.run(_run(config))
