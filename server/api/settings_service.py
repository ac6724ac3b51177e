"""SettingsService: read and change a channel's policy through ChannelSettings."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from importlib import metadata
from typing import Any

import grpc

from calor.server.api.rpc import rpc_errors
from calor.server.api.runtime import Runtime
from calor.server.api.settings import apply_settings, settings_message
from calor.server.errors import UnavailableError
from calor.server.metrics import ServerCounts, rss_bytes
from calor.v1 import settings_service_pb2 as pb
from calor.v1 import settings_service_pb2_grpc

__all__ = ["SettingsServicer"]

_Context = grpc.aio.ServicerContext[Any, Any]


class SettingsServicer(settings_service_pb2_grpc.SettingsServiceServicer):
    """The gRPC face of channel policies: every read after an update uses the new one."""

    def __init__(self, runtime: Runtime, counts: Callable[[], ServerCounts] | None = None) -> None:
        self._rt = runtime
        self._counts = counts  # what the server holds, for ServerStatus
        self._started = time.monotonic()
        # One lock per channel being updated, so concurrent read-modify-writes of one
        # channel apply in turn and none is lost; a lock nobody holds or waits on is
        # dropped, so the table does not grow with every channel ever updated.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, channel: str) -> asyncio.Lock:
        lock = self._locks.get(channel)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[channel] = lock
        return lock

    @rpc_errors
    async def GetSettings(
        self, request: pb.GetSettingsRequest, context: _Context
    ) -> pb.GetSettingsResponse:
        """The settings in force in a channel (DESIGN's defaults for a new one)."""
        channel = self._rt.validator.channel(request.channel)
        policy = await self._rt.run(self._rt.engine.channels.policy, channel)
        return pb.GetSettingsResponse(settings=settings_message(policy))

    @rpc_errors
    async def UpdateSettings(
        self, request: pb.UpdateSettingsRequest, context: _Context
    ) -> pb.UpdateSettingsResponse:
        """Apply the fields named in ``update_mask``; answer the settings now in force.

        The update is validated whole before anything is stored, so a rejected one
        changes nothing.
        """
        channel = self._rt.validator.channel(request.channel)
        engine = self._rt.engine
        async with self._lock(channel):
            current = await self._rt.run(engine.channels.policy, channel)
            policy = apply_settings(current, request.settings, request.update_mask)
            stored = await self._rt.run(engine.channels.set_policy, channel, policy)
        return pb.UpdateSettingsResponse(settings=settings_message(stored))

    @rpc_errors
    async def ServerStatus(
        self, request: pb.ServerStatusRequest, context: _Context
    ) -> pb.ServerStatusResponse:
        """How the whole server is doing: version, model, uptime, what it holds, its
        subscribers, disk and memory, and whether it asks for keys and speaks TLS."""
        if self._counts is None:
            raise UnavailableError("this server does not report its status")
        embedder = self._rt.embeddings.embedder
        counts = await self._rt.run(self._counts)
        config = self._rt.config
        return pb.ServerStatusResponse(
            version=_version(),
            model_id=embedder.model_id,
            dim=embedder.dim,
            uptime_seconds=time.monotonic() - self._started,
            channels=counts.channels,
            memories_by_state=dict(counts.memories_by_state),
            last_seq=counts.last_seq,
            subscribers=counts.subscribers,
            data_bytes=counts.data_bytes,
            auth_required=config.auth_file is not None,
            tls=config.tls_cert is not None,
            rss_bytes=rss_bytes(),
        )


def _version() -> str:
    """The installed ``calor`` package's version."""
    try:
        return metadata.version("calor")
    except metadata.PackageNotFoundError:
        return "unknown"
