"""What the sync and async clients share: request building, enum names, call defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

import grpc
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2

from calor.client.errors import InvalidArgumentError
from calor.v1 import memory_pb2, memory_service_pb2

if TYPE_CHECKING:
    # Only the stubs name the generic wrapper class that every generated enum's type is.
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

__all__ = [
    "MEMORY_STATE_NAMES",
    "MEMORY_TYPE_NAMES",
    "ClientBase",
    "EnumArg",
    "forget_request",
    "list_request",
    "parse_confidence",
    "parse_source",
    "parse_state",
    "parse_type",
    "recall_request",
    "serving_status",
    "short_name",
    "state_name",
    "store_request",
    "stream_requests",
    "timestamp",
    "type_name",
    "update_request",
]

EnumArg = str | int
"""An enum given by its short name (``"fact"``), its full name or its number."""

_V = TypeVar("_V", bound=int)

_TYPE_PREFIX = "MEMORY_TYPE_"
_STATE_PREFIX = "MEMORY_STATE_"


def _short_names(wrapper: _EnumTypeWrapper[_V], prefix: str) -> tuple[str, ...]:
    return tuple(
        name.removeprefix(prefix).lower()
        for name in wrapper.keys()
        if not name.endswith("_UNSPECIFIED")
    )


MEMORY_TYPE_NAMES = _short_names(memory_pb2.MemoryType, _TYPE_PREFIX)
"""The memory types by short name, in enum order: ``("working", "episodic", …)``."""

MEMORY_STATE_NAMES = _short_names(memory_pb2.MemoryState, _STATE_PREFIX)
"""The memory states by short name, in enum order: ``("active", "cold", …)``."""


def _enum(wrapper: _EnumTypeWrapper[_V], prefix: str, value: EnumArg, what: str) -> _V:
    """Resolve a short name, full name or number to a value of ``wrapper``."""
    if isinstance(value, str):
        name = value.strip().upper()
        if not name.startswith(prefix):
            name = prefix + name
        if name in wrapper.keys():
            return wrapper.Value(name)
    else:
        for number in wrapper.values():
            if number == value:
                return number
    choices = ", ".join(_short_names(wrapper, prefix))
    raise InvalidArgumentError(
        grpc.StatusCode.INVALID_ARGUMENT, f"unknown {what} {value!r} (expected one of {choices})"
    )


def short_name(wrapper: _EnumTypeWrapper[_V], prefix: str, value: int) -> str:
    """The lower-case name of an enum value without its prefix; the number if unknown."""
    for name, number in wrapper.items():
        if number == value:
            return name.removeprefix(prefix).lower()
    return str(value)


def parse_type(value: EnumArg | None) -> memory_pb2.MemoryType.ValueType:
    """A ``MemoryType`` from ``"fact"``, ``"MEMORY_TYPE_FACT"`` or 6; None means unspecified.

    Raises:
        InvalidArgumentError: The name or number is not a memory type.
    """
    if value is None:
        return memory_pb2.MEMORY_TYPE_UNSPECIFIED
    return _enum(memory_pb2.MemoryType, _TYPE_PREFIX, value, "memory type")


def parse_state(value: EnumArg) -> memory_pb2.MemoryState.ValueType:
    """A ``MemoryState`` from ``"active"``, ``"MEMORY_STATE_ACTIVE"`` or 1.

    Raises:
        InvalidArgumentError: The name or number is not a memory state.
    """
    return _enum(memory_pb2.MemoryState, _STATE_PREFIX, value, "memory state")


def parse_source(value: EnumArg | None) -> memory_pb2.Source.ValueType:
    """A ``Source`` from ``"human"``, ``"agent"``, ``"extracted"`` or ``"ingest"``."""
    if value is None:
        return memory_pb2.SOURCE_UNSPECIFIED
    return _enum(memory_pb2.Source, "SOURCE_", value, "source")


def parse_confidence(value: EnumArg | None) -> memory_pb2.Confidence.ValueType:
    """A ``Confidence`` from ``"observed"``, ``"inferred"`` or ``"asserted"``."""
    if value is None:
        return memory_pb2.CONFIDENCE_UNSPECIFIED
    return _enum(memory_pb2.Confidence, "CONFIDENCE_", value, "confidence")


def type_name(value: int) -> str:
    """The short name of a memory type: ``MEMORY_TYPE_FACT`` → ``"fact"``."""
    return short_name(memory_pb2.MemoryType, _TYPE_PREFIX, value)


def state_name(value: int) -> str:
    """The short name of a memory state: ``MEMORY_STATE_ACTIVE`` → ``"active"``."""
    return short_name(memory_pb2.MemoryState, _STATE_PREFIX, value)


def serving_status(status: int) -> str:
    """The name of a ``grpc.health.v1`` serving status: ``"SERVING"``, ``"NOT_SERVING"``, …"""
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    return name


def timestamp(moment: datetime) -> Timestamp:
    """A protobuf ``Timestamp`` of a datetime; a naive datetime is read as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    stamp = Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC))
    return stamp


def _optional_timestamp(moment: datetime | None) -> Timestamp | None:
    return None if moment is None else timestamp(moment)


def store_request(
    channel: str,
    text: str,
    *,
    memory_type: EnumArg | None = None,
    importance: float | None = None,
    keystone: bool = False,
    tags: Mapping[str, str] | None = None,
    source: EnumArg | None = None,
    confidence: EnumArg | None = None,
    idempotency_key: str | None = None,
    created_at: datetime | None = None,
) -> memory_service_pb2.StoreRequest:
    """The ``StoreRequest`` for one text and its options (see ``CalorClient.store``)."""
    return memory_service_pb2.StoreRequest(
        channel=channel,
        text=text,
        memory_type=parse_type(memory_type),
        importance=importance,
        keystone=keystone,
        tags=tags,
        source=parse_source(source),
        confidence=parse_confidence(confidence),
        idempotency_key=idempotency_key or "",
        created_at=_optional_timestamp(created_at),
    )


def stream_requests(
    channel: str,
    items: Iterable[str | memory_service_pb2.StoreRequest],
    *,
    memory_type: EnumArg | None = None,
    importance: float | None = None,
    keystone: bool = False,
    tags: Mapping[str, str] | None = None,
    source: EnumArg | None = None,
    confidence: EnumArg | None = None,
    created_at: datetime | None = None,
) -> list[memory_service_pb2.StoreStreamRequest]:
    """The messages of one ``StoreStream`` call, built up front.

    Building every message before the stream opens means a bad item fails the
    call before anything is sent, instead of cancelling it half-way. A string
    item takes the shared options; a ``StoreRequest`` item is sent as given, in
    ``channel`` when it names none.
    """
    messages: list[memory_service_pb2.StoreStreamRequest] = []
    for item in items:
        if isinstance(item, str):
            request = store_request(
                channel,
                item,
                memory_type=memory_type,
                importance=importance,
                keystone=keystone,
                tags=tags,
                source=source,
                confidence=confidence,
                created_at=created_at,
            )
        else:
            request = memory_service_pb2.StoreRequest()
            request.CopyFrom(item)
            request.channel = request.channel or channel
        messages.append(memory_service_pb2.StoreStreamRequest(store=request))
    return messages


def recall_request(
    channel: str,
    query: str,
    *,
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
) -> memory_service_pb2.RecallRequest:
    """The ``RecallRequest`` for a query and its filters (see ``CalorClient.recall``)."""
    return memory_service_pb2.RecallRequest(
        channel=channel,
        query=query,
        limit=limit,
        channels=list(channels),
        memory_types=[parse_type(t) for t in memory_types],
        states=[parse_state(s) for s in states],
        tags=tags,
        time_from=_optional_timestamp(time_from),
        time_to=_optional_timestamp(time_to),
        min_heat=min_heat,
        peek=peek,
        include_archived=include_archived,
        as_of=_optional_timestamp(as_of),
    )


def list_request(
    channel: str,
    *,
    page_size: int = 100,
    page_token: str = "",
    memory_types: Iterable[EnumArg] = (),
    states: Iterable[EnumArg] = (),
    tags: Mapping[str, str] | None = None,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
) -> memory_service_pb2.ListMemoriesRequest:
    """The ``ListMemoriesRequest`` for one page (see ``CalorClient.list_memories``)."""
    return memory_service_pb2.ListMemoriesRequest(
        channel=channel,
        page_size=page_size,
        page_token=page_token,
        memory_types=[parse_type(t) for t in memory_types],
        states=[parse_state(s) for s in states],
        tags=tags,
        time_from=_optional_timestamp(time_from),
        time_to=_optional_timestamp(time_to),
    )


def update_request(
    channel: str,
    memory_id: str,
    *,
    text: str | None = None,
    memory_type: EnumArg | None = None,
    tags: Mapping[str, str] | None = None,
    importance: float | None = None,
    supersedes: str = "",
) -> memory_service_pb2.UpdateRequest:
    """The ``UpdateRequest`` whose ``update_mask`` names exactly the fields given.

    A field left as None is left alone on the server; ``tags={}`` clears the tags.
    """
    paths = [
        name
        for name, given in (
            ("text", text),
            ("memory_type", memory_type),
            ("tags", tags),
            ("importance", importance),
        )
        if given is not None
    ]
    return memory_service_pb2.UpdateRequest(
        channel=channel,
        id=memory_id,
        text=text,
        memory_type=parse_type(memory_type),
        tags=tags,
        importance=importance,
        supersedes=supersedes,
        update_mask=FieldMask(paths=paths),
    )


def forget_request(channel: str, ids: str | Iterable[str]) -> memory_service_pb2.ForgetRequest:
    """The ``ForgetRequest`` for one id or many."""
    return memory_service_pb2.ForgetRequest(
        channel=channel, ids=[ids] if isinstance(ids, str) else list(ids)
    )


class ClientBase:
    """What the sync and async clients share: the default channel and the call timeout.

    Attributes:
        target: The server address the client was made for.
        channel: The memory channel calls use unless they name another.
        timeout: Seconds each call may take; None waits for ever.
    """

    def __init__(self, target: str, channel: str, timeout: float | None) -> None:
        self.target = target
        self.channel = channel
        self.timeout = timeout

    def _in(self, channel: str | None) -> str:
        """The channel of one call: the one it names, else the client's default."""
        return self.channel if channel is None else channel

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target={self.target!r}, channel={self.channel!r})"
