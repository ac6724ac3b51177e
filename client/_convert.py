"""What the sync and async clients share: memory requests, timestamps, call defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

import grpc
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp

from calor.client._enums import (
    EnumArg,
    parse_confidence,
    parse_order,
    parse_source,
    parse_state,
    parse_type,
)
from calor.client.errors import InvalidArgumentError
from calor.v1 import memory_service_pb2

__all__ = [
    "ClientBase",
    "ContextOptions",
    "FilterOptions",
    "ForgetOptions",
    "ListOptions",
    "RATING_NAMES",
    "RecallOptions",
    "StoreOptions",
    "UpdateOptions",
    "check_options",
    "feedback_request",
    "context_request",
    "forget_request",
    "list_request",
    "parse_rating",
    "recall_request",
    "store_request",
    "stream_requests",
    "timestamp",
    "tune_request",
    "update_request",
]


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
        time_from: Listing: only memories created at or after this moment. Recall:
            boost the memories created in the window (a boost, not a filter), instead
            of a window the query names.
        time_to: Listing: only memories created at or before this moment. Recall: the
            window's end (default now).
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
        min_band: Leave out hits whose confidence band is below this one: ``"low"``,
            ``"mid"`` or ``"high"`` (default ``""``: keep every band).
    """

    limit: int
    channels: Iterable[str]
    min_heat: float
    peek: bool
    include_archived: bool
    as_of: datetime | None
    min_band: str


class ListOptions(FilterOptions, total=False):
    """The options of listing, each optional: the :class:`FilterOptions` and these.

    ``list_memories`` and ``iter_memories`` on both clients take them as keyword
    arguments.

    Attributes:
        page_size: At most this many memories a page (default 100).
        order: ``"id"`` (the default: oldest first) or ``"heat"`` (hottest first, each
            page cut from the order as it stands when it is asked for).
        heat_sparklines: Also answer each memory's heat a week either side of now
            (``heat_sparklines``, centred on ``sparkline_now``).
    """

    page_size: int
    order: EnumArg
    heat_sparklines: bool


class UpdateOptions(TypedDict, total=False):
    """The corrections of ``update``: a field left out (or None) is left alone.

    Attributes:
        text: The corrected text; it is re-embedded.
        memory_type: The corrected type.
        tags: The new tags, replacing the old ones (``{}`` clears them).
        importance: The new importance, 0..1.
        supersedes: The id of an older memory this one replaces; it is deprecated.
        clear_merge: Restore a merged memory to its own life; the pair is never merged
            again.
    """

    text: str | None
    memory_type: EnumArg | None
    tags: Mapping[str, str] | None
    importance: float | None
    supersedes: str
    clear_merge: bool


def check_options(options: Mapping[str, object], known: frozenset[str]) -> None:
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
    check_options(options, StoreOptions.__optional_keys__)
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
    check_options(options, StoreOptions.__optional_keys__)
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
    check_options(options, RecallOptions.__optional_keys__)
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
        min_band=options.get("min_band", ""),
    )


def list_request(
    channel: str, page_token: str, /, **options: Unpack[ListOptions]
) -> memory_service_pb2.ListMemoriesRequest:
    """The ``ListMemoriesRequest`` for one page and its :class:`ListOptions`."""
    check_options(options, ListOptions.__optional_keys__)
    return memory_service_pb2.ListMemoriesRequest(
        channel=channel,
        page_size=options.get("page_size", 100),
        page_token=page_token,
        order=parse_order(options.get("order")),
        heat_sparklines=options.get("heat_sparklines", False),
        **_filters(options),
    )


def update_request(
    channel: str, memory_id: str, /, **options: Unpack[UpdateOptions]
) -> memory_service_pb2.UpdateRequest:
    """The ``UpdateRequest`` whose ``update_mask`` names exactly the fields given.

    A field left out or None is left alone on the server; ``tags={}`` clears the tags.
    """
    check_options(options, UpdateOptions.__optional_keys__)
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
        clear_merge=options.get("clear_merge", False),
        update_mask=FieldMask(paths=paths),
    )


class ForgetOptions(TypedDict, total=False):
    """A filter of ``forget``: every memory matching all the filters given is forgotten.

    Attributes:
        memory_types: Only memories of these types (names or ``MemoryType`` values).
        states: Only memories in these states (names or ``MemoryState`` values).
        tags: Only memories carrying all these tags.
        created_before: Only memories created at or before this moment (naive means UTC).
    """

    memory_types: Iterable[EnumArg]
    states: Iterable[EnumArg]
    tags: Mapping[str, str] | None
    created_before: datetime | None


def forget_request(
    channel: str,
    ids: str | Iterable[str],
    /,
    reject: bool = False,
    **options: Unpack[ForgetOptions],
) -> memory_service_pb2.ForgetRequest:
    """The ``ForgetRequest`` for one id or many, and a filter when one is given.

    Filters left out or empty send no filter at all, so ids alone forget only them.
    """
    check_options(options, ForgetOptions.__optional_keys__)
    request = memory_service_pb2.ForgetRequest(
        channel=channel, ids=[ids] if isinstance(ids, str) else list(ids), reject=reject
    )
    spec = memory_service_pb2.ForgetFilter(
        memory_types=[parse_type(t) for t in options.get("memory_types", ())],
        states=[parse_state(s) for s in options.get("states", ())],
        tags=options.get("tags"),
        created_before=_optional_timestamp(options.get("created_before")),
    )
    if spec.ListFields():
        request.filter.CopyFrom(spec)
    return request


class ContextOptions(TypedDict, total=False):
    """The options of a context block, each optional (``context`` on both clients).

    Attributes:
        token_budget: Tokens the block may take, counted with the model's own
            tokenizer; 0 (the default) means the server's default (1000).
        heat: Warm the memories the block shows, as a recall would (default False:
            the block reads without changing anything).
        max_nodes: At most this many memories; 0 (the default) means 200.
        max_chars: At most this many characters; 0 (the default) means 50,000.
    """

    token_budget: int
    heat: bool
    max_nodes: int
    max_chars: int


def context_request(
    channel: str, message: str, /, **options: Unpack[ContextOptions]
) -> memory_service_pb2.ContextRequest:
    """The ``ContextRequest`` for a message and its :class:`ContextOptions`."""
    check_options(options, ContextOptions.__optional_keys__)
    return memory_service_pb2.ContextRequest(
        channel=channel,
        message=message,
        token_budget=options.get("token_budget", 0),
        heat=options.get("heat", False),
        max_nodes=options.get("max_nodes", 0),
        max_chars=options.get("max_chars", 0),
    )


RATING_NAMES = ("helpful", "unhelpful", "partial")
"""What a recall can be rated, by short name."""


def parse_rating(value: EnumArg) -> memory_service_pb2.FeedbackRating.ValueType:
    """A ``FeedbackRating`` from ``"helpful"``, ``"FEEDBACK_RATING_HELPFUL"`` or 1.

    Raises:
        InvalidArgumentError: The name or number is not a rating.
    """
    ratings = memory_service_pb2.FeedbackRating
    for name in RATING_NAMES:
        number = ratings.Value(f"FEEDBACK_RATING_{name.upper()}")
        if value == number or (
            isinstance(value, str) and value.strip().upper() in (name.upper(), ratings.Name(number))
        ):
            return number
    raise InvalidArgumentError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"unknown rating {value!r} (expected one of {', '.join(RATING_NAMES)})",
    )


def feedback_request(
    channel: str, recall_id: str, rating: EnumArg, memory_ids: str | Iterable[str]
) -> memory_service_pb2.FeedbackRequest:
    """The ``FeedbackRequest`` rating one recall, about one memory, some or (none) all.

    Raises:
        InvalidArgumentError: ``rating`` is not helpful, unhelpful or partial.
    """
    return memory_service_pb2.FeedbackRequest(
        channel=channel,
        recall_id=recall_id,
        rating=parse_rating(rating),
        memory_ids=[memory_ids] if isinstance(memory_ids, str) else list(memory_ids),
    )


def tune_request(channel: str, dry_run: bool) -> memory_service_pb2.TuneRequest:
    """The ``TuneRequest`` fitting one channel's recall weights (or only reporting it)."""
    return memory_service_pb2.TuneRequest(channel=channel, dry_run=dry_run)


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
