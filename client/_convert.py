"""What the sync and async clients share: request building, enum names, call defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack

import grpc
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
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
    "ClientBase",
    "EnumArg",
    "FilterOptions",
    "ListOptions",
    "RecallOptions",
    "StoreOptions",
    "TriggerOptions",
    "UpdateOptions",
    "action_name",
    "event_name",
    "forget_request",
    "list_request",
    "parse_action",
    "parse_confidence",
    "parse_event",
    "parse_source",
    "parse_state",
    "parse_type",
    "recall_request",
    "serving_status",
    "short_name",
    "state_name",
    "store_request",
    "stream_requests",
    "subscribe_request",
    "timestamp",
    "trigger_request",
    "type_name",
    "update_request",
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


class StoreOptions(TypedDict, total=False):
    """What a new memory may be given, each optional (``store`` and ``store_many``).

    The one place these options are declared and described: the ``store`` and
    ``store_many`` methods of both clients take them as keyword arguments.

    Attributes:
        memory_type: ``"fact"``, ``"episodic"``, … or a ``MemoryType``; None (the
            default) lets the server classify the text.
        importance: 0..1; None (the default) lets the server estimate it.
        keystone: Pin the memory so it does not decay (default False).
        tags: Free labels, filterable in recall and listing.
        source: ``"human"``, ``"agent"``, ``"extracted"`` or ``"ingest"``.
        confidence: ``"observed"``, ``"inferred"`` or ``"asserted"``.
        created_at: When it happened, to import history (naive means UTC); the
            memory has decayed since.
    """

    memory_type: EnumArg | None
    importance: float | None
    keystone: bool
    tags: Mapping[str, str] | None
    source: EnumArg | None
    confidence: EnumArg | None
    created_at: datetime | None


class FilterOptions(TypedDict, total=False):
    """The filters that recall and listing share; each left out filters nothing.

    Attributes:
        memory_types: Only these types (names or ``MemoryType`` values).
        states: Only these states (names or ``MemoryState`` values).
        tags: Only memories carrying all these tags.
        time_from: Only memories created at or after this moment.
        time_to: Only memories created at or before this moment.
    """

    memory_types: Iterable[EnumArg]
    states: Iterable[EnumArg]
    tags: Mapping[str, str] | None
    time_from: datetime | None
    time_to: datetime | None


class RecallOptions(FilterOptions, total=False):
    """The options of a recall, each optional: the :class:`FilterOptions` and these.

    The one place they are declared and described: ``recall`` on both clients
    takes them as keyword arguments.

    Attributes:
        limit: At most this many hits (default 10).
        channels: Further channels to search.
        min_heat: Only memories at least this warm (default 0.0).
        peek: Change nothing: no warming, no counts (default False).
        include_archived: Search cold storage too (default False).
        as_of: The moment relative phrases such as "yesterday" are read against.
    """

    limit: int
    channels: Iterable[str]
    min_heat: float
    peek: bool
    include_archived: bool
    as_of: datetime | None


class ListOptions(FilterOptions, total=False):
    """The options of listing, each optional: the :class:`FilterOptions` and these.

    ``list_memories`` and ``iter_memories`` on both clients take them as keyword
    arguments.

    Attributes:
        page_size: At most this many memories a page (default 100).
    """

    page_size: int


class UpdateOptions(TypedDict, total=False):
    """The corrections of ``update``: a field left out (or None) is left alone.

    Attributes:
        text: The corrected text; it is re-embedded.
        memory_type: The corrected type.
        tags: The new tags, replacing the old ones (``{}`` clears them).
        importance: The new importance, 0..1.
        supersedes: The id of an older memory this one replaces; it is deprecated.
    """

    text: str | None
    memory_type: EnumArg | None
    tags: Mapping[str, str] | None
    importance: float | None
    supersedes: str


class TriggerOptions(TypedDict, total=False):
    """What a new trigger may be given besides its event and action, each optional.

    The one place these options are declared and described: ``create_trigger`` on
    both clients takes them as keyword arguments.

    Attributes:
        config: The action's settings, e.g. ``{"message": "…"}`` for notify (a
            template over ``{memory_id}``, ``{text}``, ``{heat}``, …), ``{"delta":
            "0.2"}`` for boost, ``{"key": "…", "value": "…"}`` for tag, ``{"url":
            "…"}`` for webhook, ``{"trigger_id": "…"}`` for chain.
        filter_memory_type: Only memories of this type (a name or ``MemoryType``).
        filter_pattern: Only memories whose text matches this regular expression.
        filter_heat_above: Only memories hotter than this.
        filter_heat_below: Only memories colder than this.
        max_fires: Fire at most this many times; 0 (the default) means no limit.
        cooldown_seconds: Wait at least this long between two firings (default 0).
        threshold: For ``on_decay``: the heat whose downward crossing fires it;
            None (the default) means the channel's cold threshold.
    """

    config: Mapping[str, str] | None
    filter_memory_type: EnumArg | None
    filter_pattern: str
    filter_heat_above: float | None
    filter_heat_below: float | None
    max_fires: int
    cooldown_seconds: float
    threshold: float | None


def _check(options: Mapping[str, object], known: frozenset[str]) -> None:
    """Refuse an option not in ``known``, as a signature would.

    ``**options: Unpack[...]`` is checked by type checkers only: at run time it
    takes any name, and a misspelt filter must not be dropped without a word.

    Raises:
        TypeError: An option has a name that is not in ``known``.
    """
    for name in options:
        if name not in known:
            raise TypeError(
                f"unexpected keyword argument {name!r} (expected one of {', '.join(sorted(known))})"
            )


def store_request(
    channel: str, text: str, idempotency_key: str | None, /, **options: Unpack[StoreOptions]
) -> memory_service_pb2.StoreRequest:
    """The ``StoreRequest`` for one text, its idempotency key and its :class:`StoreOptions`."""
    _check(options, StoreOptions.__optional_keys__)
    return memory_service_pb2.StoreRequest(
        channel=channel,
        text=text,
        memory_type=parse_type(options.get("memory_type")),
        importance=options.get("importance"),
        keystone=options.get("keystone", False),
        tags=options.get("tags"),
        source=parse_source(options.get("source")),
        confidence=parse_confidence(options.get("confidence")),
        idempotency_key=idempotency_key or "",
        created_at=_optional_timestamp(options.get("created_at")),
    )


def stream_requests(
    channel: str,
    items: Iterable[str | memory_service_pb2.StoreRequest],
    /,
    **options: Unpack[StoreOptions],
) -> list[memory_service_pb2.StoreStreamRequest]:
    """The messages of one ``StoreStream`` call, built up front.

    Building every message before the stream opens means a bad item fails the
    call before anything is sent, instead of cancelling it half-way. A string
    item takes the shared :class:`StoreOptions`; a ``StoreRequest`` item is sent
    as given, in ``channel`` when it names none.
    """
    _check(options, StoreOptions.__optional_keys__)
    messages: list[memory_service_pb2.StoreStreamRequest] = []
    for item in items:
        if isinstance(item, str):
            request = store_request(channel, item, None, **options)
        else:
            request = memory_service_pb2.StoreRequest()
            request.CopyFrom(item)
            request.channel = request.channel or channel
        messages.append(memory_service_pb2.StoreStreamRequest(store=request))
    return messages


def _filters(options: FilterOptions) -> dict[str, Any]:
    """The request fields of :class:`FilterOptions`, converted.

    ``RecallRequest`` and ``ListMemoriesRequest`` share these fields; the builders
    splice them in where they stand so that a bad value fails as it did before.
    """
    return {
        "memory_types": [parse_type(t) for t in options.get("memory_types", ())],
        "states": [parse_state(s) for s in options.get("states", ())],
        "tags": options.get("tags"),
        "time_from": _optional_timestamp(options.get("time_from")),
        "time_to": _optional_timestamp(options.get("time_to")),
    }


def recall_request(
    channel: str, query: str, /, **options: Unpack[RecallOptions]
) -> memory_service_pb2.RecallRequest:
    """The ``RecallRequest`` for a query and its :class:`RecallOptions`."""
    _check(options, RecallOptions.__optional_keys__)
    return memory_service_pb2.RecallRequest(
        channel=channel,
        query=query,
        limit=options.get("limit", 10),
        channels=list(options.get("channels", ())),
        **_filters(options),
        min_heat=options.get("min_heat", 0.0),
        peek=options.get("peek", False),
        include_archived=options.get("include_archived", False),
        as_of=_optional_timestamp(options.get("as_of")),
    )


def list_request(
    channel: str, page_token: str, /, **options: Unpack[ListOptions]
) -> memory_service_pb2.ListMemoriesRequest:
    """The ``ListMemoriesRequest`` for one page and its :class:`ListOptions`."""
    _check(options, ListOptions.__optional_keys__)
    return memory_service_pb2.ListMemoriesRequest(
        channel=channel,
        page_size=options.get("page_size", 100),
        page_token=page_token,
        **_filters(options),
    )


def update_request(
    channel: str, memory_id: str, /, **options: Unpack[UpdateOptions]
) -> memory_service_pb2.UpdateRequest:
    """The ``UpdateRequest`` whose ``update_mask`` names exactly the fields given.

    A field left out or None is left alone on the server; ``tags={}`` clears the tags.
    """
    _check(options, UpdateOptions.__optional_keys__)
    fields = ("text", "memory_type", "tags", "importance")
    paths = [name for name in fields if options.get(name) is not None]
    return memory_service_pb2.UpdateRequest(
        channel=channel,
        id=memory_id,
        text=options.get("text"),
        memory_type=parse_type(options.get("memory_type")),
        tags=options.get("tags"),
        importance=options.get("importance"),
        supersedes=options.get("supersedes", ""),
        update_mask=FieldMask(paths=paths),
    )


def forget_request(channel: str, ids: str | Iterable[str]) -> memory_service_pb2.ForgetRequest:
    """The ``ForgetRequest`` for one id or many."""
    return memory_service_pb2.ForgetRequest(
        channel=channel, ids=[ids] if isinstance(ids, str) else list(ids)
    )


def trigger_request(
    channel: str,
    event: EnumArg,
    action: EnumArg,
    trigger_id: str,
    /,
    **options: Unpack[TriggerOptions],
) -> trigger_service_pb2.CreateTriggerRequest:
    """The ``CreateTriggerRequest`` for a trigger and its :class:`TriggerOptions`.

    An empty ``trigger_id`` lets the server choose one.

    Raises:
        InvalidArgumentError: The event, action or memory type is unknown.
    """
    _check(options, TriggerOptions.__optional_keys__)
    trigger = trigger_service_pb2.Trigger(
        id=trigger_id,
        channel=channel,
        event=parse_event(event),
        action=parse_action(action),
        config=options.get("config"),
        filter_memory_type=parse_type(options.get("filter_memory_type")),
        filter_pattern=options.get("filter_pattern", ""),
        filter_heat_above=options.get("filter_heat_above"),
        filter_heat_below=options.get("filter_heat_below"),
        max_fires=options.get("max_fires", 0),
        cooldown_seconds=options.get("cooldown_seconds", 0.0),
        threshold=options.get("threshold"),
    )
    return trigger_service_pb2.CreateTriggerRequest(trigger=trigger)


def subscribe_request(
    channels: str | Iterable[str],
    kinds: EnumArg | Iterable[EnumArg],
    trigger_ids: str | Iterable[str],
    after_seq: int,
) -> trigger_service_pb2.SubscribeRequest:
    """The ``SubscribeRequest`` for a filter; an empty filter field matches everything.

    A lone string (or number, for ``kinds``) counts as a list of one, so that
    ``channels="agent-7"`` does not become seven one-letter channels.

    Raises:
        InvalidArgumentError: A kind is unknown, or ``after_seq`` is negative.
    """
    if after_seq < 0:
        raise InvalidArgumentError(
            grpc.StatusCode.INVALID_ARGUMENT, f"after_seq must be 0 or more, got {after_seq}"
        )
    kind_list = [kinds] if isinstance(kinds, str | int) else list(kinds)
    return trigger_service_pb2.SubscribeRequest(
        channels=[channels] if isinstance(channels, str) else list(channels),
        kinds=[parse_event(kind) for kind in kind_list],
        trigger_ids=[trigger_ids] if isinstance(trigger_ids, str) else list(trigger_ids),
        after_seq=after_seq,
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
