"""Trigger and subscription requests, built the same way for the sync and async clients."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypedDict, Unpack

import grpc

from calor.client._convert import check_options
from calor.client._enums import (
    EnumArg,
    parse_action,
    parse_event,
    parse_trigger_rating,
    parse_type,
)
from calor.client.errors import InvalidArgumentError
from calor.v1 import trigger_service_pb2

__all__ = ["TriggerOptions", "subscribe_request", "trigger_request"]


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
    check_options(options, TriggerOptions.__optional_keys__)
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
    own_channel: str,
    channels: str | Iterable[str] | None,
    kinds: EnumArg | Iterable[EnumArg],
    trigger_ids: str | Iterable[str],
    after_seq: int | None,
    from_oldest_retained: bool,
) -> trigger_service_pb2.SubscribeRequest:
    """The ``SubscribeRequest`` a client's ``subscribe`` makes; an empty filter field
    matches everything.

    ``channels`` None is the client's own (``own_channel``); an empty list is every
    channel the caller may read. ``after_seq`` None starts from now, unless
    ``from_oldest_retained`` asks for the oldest event the log holds; 0 starts from
    that oldest event too. A lone string (or number, for ``kinds``) counts as a list
    of one, so that ``channels="agent-7"`` does not become seven one-letter channels.

    Raises:
        InvalidArgumentError: A kind is unknown, or ``after_seq`` is negative.
    """
    if after_seq is not None and after_seq < 0:
        raise InvalidArgumentError(
            grpc.StatusCode.INVALID_ARGUMENT, f"after_seq must be 0 or more, got {after_seq}"
        )
    if channels is None:
        channels = [own_channel]
    kind_list = [kinds] if isinstance(kinds, str | int) else list(kinds)
    return trigger_service_pb2.SubscribeRequest(
        channels=[channels] if isinstance(channels, str) else list(channels),
        kinds=[parse_event(kind) for kind in kind_list],
        trigger_ids=[trigger_ids] if isinstance(trigger_ids, str) else list(trigger_ids),
        after_seq=after_seq or 0,
        from_oldest_retained=from_oldest_retained,
        from_now=after_seq is None and not from_oldest_retained,
    )


def feedback_request(
    channel: str, trigger_id: str, cause_seq: int, rating: EnumArg
) -> trigger_service_pb2.TriggerFeedbackRequest:
    """The ``TriggerFeedbackRequest`` rating the firing ``cause_seq`` caused."""
    return trigger_service_pb2.TriggerFeedbackRequest(
        channel=channel,
        trigger_id=trigger_id,
        cause_seq=cause_seq,
        rating=parse_trigger_rating(rating),
    )
