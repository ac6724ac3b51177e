"""The synchronous Calor client: typed methods over the MemoryService and health calls."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.client import _convert
from calor.client._convert import EnumArg
from calor.client.errors import translate_rpc_errors
from calor.v1 import memory_pb2, memory_service_pb2, memory_service_pb2_grpc

__all__ = ["CalorClient"]


class CalorClient(_convert.ClientBase):
    """A blocking client of one Calor server, working in one default channel.

    Making one does no I/O: the gRPC channel connects on the first call. Every
    failed call raises a :class:`~calor.client.errors.CalorClientError`.

    Example::

        with CalorClient("localhost:50051", channel="agent-7") as calor:
            memory = calor.store("The user is allergic to peanuts.", memory_type="core")
            hits = calor.recall("what is the user allergic to?").hits

    Args:
        target: The server's ``host:port``.
        channel: The memory channel calls use unless they pass ``channel=``.
        timeout: Seconds each call may take; None waits for ever.
        grpc_channel: A ready ``grpc.Channel`` to use instead of an insecure
            channel to ``target`` (for TLS or interceptors). The caller keeps it:
            :meth:`close` leaves it open.
    """

    def __init__(
        self,
        target: str = "localhost:50051",
        *,
        channel: str = "default",
        timeout: float | None = 30.0,
        grpc_channel: grpc.Channel | None = None,
    ) -> None:
        super().__init__(target, channel, timeout)
        self._owns_channel = grpc_channel is None
        self._grpc_channel = grpc.insecure_channel(target) if grpc_channel is None else grpc_channel
        self._stub = memory_service_pb2_grpc.MemoryServiceStub(self._grpc_channel)
        self._health = health_pb2_grpc.HealthStub(self._grpc_channel)

    def close(self) -> None:
        """Close the gRPC channel the client made (not one it was given)."""
        if self._owns_channel:
            self._grpc_channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def store(
        self,
        text: str,
        *,
        channel: str | None = None,
        memory_type: EnumArg | None = None,
        importance: float | None = None,
        keystone: bool = False,
        tags: Mapping[str, str] | None = None,
        source: EnumArg | None = None,
        confidence: EnumArg | None = None,
        idempotency_key: str | None = None,
        created_at: datetime | None = None,
    ) -> memory_pb2.Memory:
        """Store one memory; it is durable once this returns.

        Args:
            text: What to remember.
            channel: The channel to store in, instead of the client's.
            memory_type: ``"fact"``, ``"episodic"``, … or a ``MemoryType``; None lets
                the server classify the text.
            importance: 0..1; None lets the server estimate it.
            keystone: Pin the memory so it does not decay.
            tags: Free labels, filterable in recall and listing.
            source: ``"human"``, ``"agent"``, ``"extracted"`` or ``"ingest"``.
            confidence: ``"observed"``, ``"inferred"`` or ``"asserted"``.
            idempotency_key: A retry with the same key returns the first memory and
                stores nothing; use one when retrying after a deadline.
            created_at: When it happened, to import history (naive means UTC); the
                memory has decayed since.

        Returns:
            The stored memory, with its id, type and current heat.
        """
        request = _convert.store_request(
            self._in(channel),
            text,
            memory_type=memory_type,
            importance=importance,
            keystone=keystone,
            tags=tags,
            source=source,
            confidence=confidence,
            idempotency_key=idempotency_key,
            created_at=created_at,
        )
        with translate_rpc_errors():
            return self._stub.Store(request, timeout=self.timeout).memory

    def store_many(
        self,
        items: Iterable[str | memory_service_pb2.StoreRequest],
        *,
        channel: str | None = None,
        memory_type: EnumArg | None = None,
        importance: float | None = None,
        keystone: bool = False,
        tags: Mapping[str, str] | None = None,
        source: EnumArg | None = None,
        confidence: EnumArg | None = None,
        created_at: datetime | None = None,
    ) -> list[str]:
        """Store many memories in one stream, embedded in batches on the server.

        Args:
            items: Texts, which take the options below, or whole ``StoreRequest``
                messages, sent as they are (in ``channel`` if they name none).
            channel: The channel to store in, instead of the client's.
            memory_type: As for :meth:`store`, for the text items.
            importance: As for :meth:`store`, for the text items.
            keystone: As for :meth:`store`, for the text items.
            tags: As for :meth:`store`, for the text items.
            source: As for :meth:`store`, for the text items.
            confidence: As for :meth:`store`, for the text items.
            created_at: As for :meth:`store`, for the text items.

        Returns:
            The new ids, in the order of ``items``.
        """
        messages = _convert.stream_requests(
            self._in(channel),
            items,
            memory_type=memory_type,
            importance=importance,
            keystone=keystone,
            tags=tags,
            source=source,
            confidence=confidence,
            created_at=created_at,
        )
        if not messages:
            return []
        with translate_rpc_errors():
            return list(self._stub.StoreStream(iter(messages), timeout=self.timeout).ids)

    def recall(
        self,
        query: str,
        *,
        channel: str | None = None,
        limit: int = 10,
        channels: Iterable[str] = (),
        memory_types: Iterable[EnumArg] = (),
        states: Iterable[EnumArg] = (),
        tags: Mapping[str, str] | None = None,
        time_from: datetime | None = None,
        time_to: datetime | None = None,
        min_heat: float = 0.0,
        peek: bool = False,
        include_archived: bool = False,
        as_of: datetime | None = None,
    ) -> memory_service_pb2.RecallResponse:
        """Find the memories that answer a query, ranked by meaning and heat.

        Recalling warms what it returns (unless ``peek``), so what an agent keeps
        using stays at hand.

        Args:
            query: What to look for, in plain words ("what did we decide yesterday?").
            channel: The channel to search, instead of the client's.
            limit: At most this many hits.
            channels: Further channels to search.
            memory_types: Only these types (names or ``MemoryType`` values).
            states: Only these states (names or ``MemoryState`` values).
            tags: Only memories carrying all these tags.
            time_from: Only memories created at or after this moment.
            time_to: Only memories created at or before this moment.
            min_heat: Only memories at least this warm.
            peek: Change nothing: no warming, no counts.
            include_archived: Search cold storage too.
            as_of: The moment relative phrases such as "yesterday" are read against.

        Returns:
            The hits, best first, each with its score parts and band, and the time
            window the query named, if any.
        """
        request = _convert.recall_request(
            self._in(channel),
            query,
            limit=limit,
            channels=channels,
            memory_types=memory_types,
            states=states,
            tags=tags,
            time_from=time_from,
            time_to=time_to,
            min_heat=min_heat,
            peek=peek,
            include_archived=include_archived,
            as_of=as_of,
        )
        with translate_rpc_errors():
            return self._stub.Recall(request, timeout=self.timeout)

    def inspect(
        self, memory_id: str, *, channel: str | None = None
    ) -> memory_service_pb2.InspectResponse:
        """One memory, in any state, and its graph edges.

        Raises:
            NotFoundError: No memory has that id in the channel.
        """
        request = memory_service_pb2.InspectRequest(channel=self._in(channel), id=memory_id)
        with translate_rpc_errors():
            return self._stub.Inspect(request, timeout=self.timeout)

    def list_memories(
        self,
        *,
        channel: str | None = None,
        page_size: int = 100,
        page_token: str = "",
        memory_types: Iterable[EnumArg] = (),
        states: Iterable[EnumArg] = (),
        tags: Mapping[str, str] | None = None,
        time_from: datetime | None = None,
        time_to: datetime | None = None,
    ) -> memory_service_pb2.ListMemoriesResponse:
        """One page of a channel's memories; pass ``next_page_token`` back for the next.

        The filters are those of :meth:`recall`; :meth:`iter_memories` walks every page.
        """
        request = _convert.list_request(
            self._in(channel),
            page_size=page_size,
            page_token=page_token,
            memory_types=memory_types,
            states=states,
            tags=tags,
            time_from=time_from,
            time_to=time_to,
        )
        with translate_rpc_errors():
            return self._stub.ListMemories(request, timeout=self.timeout)

    def iter_memories(
        self,
        *,
        channel: str | None = None,
        page_size: int = 100,
        memory_types: Iterable[EnumArg] = (),
        states: Iterable[EnumArg] = (),
        tags: Mapping[str, str] | None = None,
        time_from: datetime | None = None,
        time_to: datetime | None = None,
    ) -> Iterator[memory_pb2.Memory]:
        """Every memory that :meth:`list_memories` would page through, fetched page by page."""
        request = _convert.list_request(
            self._in(channel),
            page_size=page_size,
            memory_types=memory_types,
            states=states,
            tags=tags,
            time_from=time_from,
            time_to=time_to,
        )
        while True:
            with translate_rpc_errors():
                page = self._stub.ListMemories(request, timeout=self.timeout)
            yield from page.memories
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def update(
        self,
        memory_id: str,
        *,
        channel: str | None = None,
        text: str | None = None,
        memory_type: EnumArg | None = None,
        tags: Mapping[str, str] | None = None,
        importance: float | None = None,
        supersedes: str = "",
    ) -> memory_pb2.Memory:
        """Correct a memory; only the fields given change (a new text is re-embedded).

        Args:
            memory_id: The memory to correct.
            channel: Its channel, instead of the client's.
            text: The corrected text.
            memory_type: The corrected type.
            tags: The new tags, replacing the old ones (``{}`` clears them).
            importance: The new importance, 0..1.
            supersedes: The id of an older memory this one replaces; it is deprecated.

        Returns:
            The memory as corrected.
        """
        request = _convert.update_request(
            self._in(channel),
            memory_id,
            text=text,
            memory_type=memory_type,
            tags=tags,
            importance=importance,
            supersedes=supersedes,
        )
        with translate_rpc_errors():
            return self._stub.Update(request, timeout=self.timeout).memory

    def keystone(
        self, memory_id: str, on: bool = True, *, channel: str | None = None
    ) -> memory_pb2.Memory:
        """Pin a memory as a keystone (it stops decaying), or unpin it with ``on=False``."""
        request = memory_service_pb2.KeystoneRequest(
            channel=self._in(channel), id=memory_id, keystone=on
        )
        with translate_rpc_errors():
            return self._stub.Keystone(request, timeout=self.timeout).memory

    def boost(
        self, memory_id: str, delta: float = 0.0, *, channel: str | None = None
    ) -> memory_pb2.Memory:
        """Add heat to a memory: ``delta`` in [-1, 1]; 0 means the channel's boost_delta."""
        request = memory_service_pb2.BoostRequest(
            channel=self._in(channel), id=memory_id, delta=delta
        )
        with translate_rpc_errors():
            return self._stub.Boost(request, timeout=self.timeout).memory

    def forget(self, ids: str | Iterable[str], *, channel: str | None = None) -> int:
        """Forget one memory or many by id; returns how many were forgotten."""
        request = _convert.forget_request(self._in(channel), ids)
        with translate_rpc_errors():
            return int(self._stub.Forget(request, timeout=self.timeout).forgotten)

    def identity(self, *, channel: str | None = None) -> memory_service_pb2.IdentityResponse:
        """The channel's status: counts by state and type, heat, gates, conflicts, settings."""
        request = memory_service_pb2.IdentityRequest(channel=self._in(channel))
        with translate_rpc_errors():
            return self._stub.Identity(request, timeout=self.timeout)

    def health(self) -> str:
        """The server's overall health: ``"SERVING"`` or ``"NOT_SERVING"`` (while stopping)."""
        with translate_rpc_errors():
            # The health stubs declare HealthStub without its methods.
            response = self._health.Check(  # type: ignore[attr-defined, unused-ignore]
                health_pb2.HealthCheckRequest(service=""), timeout=self.timeout
            )
        return _convert.serving_status(response.status)
