"""Enum names for the clients and the CLI: parsing short names, naming values back."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import grpc
from grpc_health.v1 import health_pb2

from calor.client.errors import InvalidArgumentError
from calor.v1 import memory_pb2, memory_service_pb2, trigger_service_pb2

if TYPE_CHECKING:
    # Only the stubs name the generic wrapper class that every generated enum's type is.
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

__all__ = [
    "ACTION_KIND_NAMES",
    "EVENT_KIND_NAMES",
    "MEMORY_STATE_NAMES",
    "MEMORY_TYPE_NAMES",
    "TRIGGER_EVENT_NAMES",
    "EnumArg",
    "action_name",
    "edge_name",
    "event_name",
    "parse_action",
    "parse_confidence",
    "parse_event",
    "parse_order",
    "parse_source",
    "parse_state",
    "parse_type",
    "serving_status",
    "short_name",
    "state_name",
    "type_name",
]

EnumArg = str | int
"""An enum given by its short name (``"fact"``), its full name or its number."""

_V = TypeVar("_V", bound=int)

_TYPE_PREFIX = "MEMORY_TYPE_"
_STATE_PREFIX = "MEMORY_STATE_"
_EVENT_PREFIX = "EVENT_KIND_"
_ACTION_PREFIX = "ACTION_KIND_"


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

EVENT_KIND_NAMES = _short_names(trigger_service_pb2.EventKind, _EVENT_PREFIX)
"""Every kind of logged event by short name: ``("on_store", …, "notify", "dream", …)``."""

TRIGGER_EVENT_NAMES = tuple(name for name in EVENT_KIND_NAMES if name.startswith("on_"))
"""The events a trigger can react to: ``("on_store", "on_recall", "on_boost", "on_decay")``."""

ACTION_KIND_NAMES = _short_names(trigger_service_pb2.ActionKind, _ACTION_PREFIX)
"""What a trigger can do, by short name: ``("notify", "boost", "pin", …)``."""


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


def parse_order(value: EnumArg | None) -> memory_service_pb2.MemoryOrder.ValueType:
    """A listing's ``MemoryOrder`` from ``"id"`` or ``"heat"`` (hottest first); None
    means by id."""
    if value is None:
        return memory_service_pb2.MEMORY_ORDER_UNSPECIFIED
    return _enum(memory_service_pb2.MemoryOrder, "MEMORY_ORDER_", value, "order")


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


def parse_event(value: EnumArg) -> trigger_service_pb2.EventKind.ValueType:
    """An ``EventKind`` from ``"on_store"``, ``"EVENT_KIND_ON_STORE"`` or 1.

    Raises:
        InvalidArgumentError: The name or number is not an event kind.
    """
    return _enum(trigger_service_pb2.EventKind, _EVENT_PREFIX, value, "event kind")


TRIGGER_RATING_NAMES = _short_names(trigger_service_pb2.TriggerRating, "TRIGGER_RATING_")


def parse_trigger_rating(value: EnumArg) -> trigger_service_pb2.TriggerRating.ValueType:
    """A ``TriggerRating`` from ``"useful"``, ``"noise"``, a full name or a number.

    Raises:
        InvalidArgumentError: The name or number is not a trigger rating.
    """
    return _enum(trigger_service_pb2.TriggerRating, "TRIGGER_RATING_", value, "trigger rating")


def parse_action(value: EnumArg) -> trigger_service_pb2.ActionKind.ValueType:
    """An ``ActionKind`` from ``"notify"``, ``"ACTION_KIND_NOTIFY"`` or 1.

    Raises:
        InvalidArgumentError: The name or number is not an action kind.
    """
    return _enum(trigger_service_pb2.ActionKind, _ACTION_PREFIX, value, "action kind")


def event_name(value: int) -> str:
    """The short name of an event kind: ``EVENT_KIND_ON_STORE`` → ``"on_store"``."""
    return short_name(trigger_service_pb2.EventKind, _EVENT_PREFIX, value)


def action_name(value: int) -> str:
    """The short name of an action kind: ``ACTION_KIND_NOTIFY`` → ``"notify"``."""
    return short_name(trigger_service_pb2.ActionKind, _ACTION_PREFIX, value)


def type_name(value: int) -> str:
    """The short name of a memory type: ``MEMORY_TYPE_FACT`` → ``"fact"``."""
    return short_name(memory_pb2.MemoryType, _TYPE_PREFIX, value)


def edge_name(value: int) -> str:
    """The short name of an edge kind: ``EDGE_KIND_SEMANTIC`` → ``"semantic"``."""
    return short_name(memory_pb2.EdgeKind, "EDGE_KIND_", value)


def state_name(value: int) -> str:
    """The short name of a memory state: ``MEMORY_STATE_ACTIVE`` → ``"active"``."""
    return short_name(memory_pb2.MemoryState, _STATE_PREFIX, value)


def serving_status(status: int) -> str:
    """The name of a ``grpc.health.v1`` serving status: ``"SERVING"``, ``"NOT_SERVING"``, …"""
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    return name
