"""TriggerService: thin async servicers over the trigger engine, and the Subscribe stream.

A trigger id is its channel's own, so nothing a key can ask about an id tells it of
another channel's triggers: creating a trigger under an id that another channel uses
makes this channel's own, and deleting it or reading its history finds the trigger among
the channels the caller administers only, answering for one elsewhere exactly as for an
id that names nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc

from calor.server.api import caller
from calor.server.api.grants import EVERY_CHANNEL, Permission
from calor.server.api.rpc import abort_with, rpc_errors
from calor.server.api.runtime import Runtime
from calor.server.api.wire import (
    decode_page_token,
    encode_page_token,
    enum_name,
    full_name,
    timestamp_message,
)
from calor.server.errors import (
    AlreadyExistsError,
    CalorError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    UnavailableError,
)
from calor.server.events import EventRecord
from calor.server.ids import new_id
from calor.triggers.engine import TriggerEngine
from calor.triggers.feedback import Rating, Standing, standing
from calor.triggers.registry import Firing
from calor.triggers.rule_config import TRIGGER_ID
from calor.triggers.rules import EVENTS, TriggerRule, rule_from_message, rule_message
from calor.triggers.subscriptions import EventFilter
from calor.triggers.webhook import WebhookPolicy
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1 import trigger_service_pb2_grpc

__all__ = ["TriggerServicer", "event_message"]

_Context = grpc.aio.ServicerContext[Any, Any]
_KIND_PREFIX = "EVENT_KIND_"
_MAX_PAGE = 1000


def event_message(event: EventRecord) -> tpb.Event:
    """The API view of a logged event."""
    return tpb.Event(
        seq=event.seq,
        kind=tpb.EventKind.Value(full_name(_KIND_PREFIX, event.kind)),
        channel=event.channel,
        memory_id=event.memory_id,
        trigger_id=event.trigger_id,
        at=timestamp_message(event.at),
        message=event.message,
        payload=event.payload,
    )


def _kind_name(value: int, field: str) -> str:
    name = enum_name(tpb.EventKind, _KIND_PREFIX, value)
    if name is None:
        raise InvalidArgumentError(f"{field}: unknown event kind {value}")
    if value == tpb.EVENT_KIND_UNSPECIFIED:
        raise InvalidArgumentError(f"{field}: EVENT_KIND_UNSPECIFIED is not an event kind")
    return name


def _page(token: str, size: int, valid: Callable[[str], bool]) -> tuple[str, int]:
    """The position a page token resumes after ('' for the first page) and the page size.

    Raises:
        InvalidArgumentError: The size is out of range, or the token is not one this
            server issued (``valid`` checks the position it holds).
    """
    if size < 0 or size > _MAX_PAGE:
        raise InvalidArgumentError(f"page_size: {size} is outside 0..{_MAX_PAGE}")
    return decode_page_token(token, valid=valid), size or 100


def _readable() -> Callable[[str], bool] | None:
    """The channels the caller may read, as a test (None: all of them). Subscribe's
    empty channel list means these; access control has checked any it names."""
    access = caller.grants()
    return (
        None if access.allows(EVERY_CHANNEL, Permission.READ) else access.predicate(Permission.READ)
    )


def _not_administered(trigger_id: str) -> PermissionDeniedError:
    """The answer to a key that names a trigger none of its channels has (whether another
    channel has one or not: the words are the same)."""
    return PermissionDeniedError(
        f"trigger {trigger_id[:64]}: not a trigger of a channel this key administers"
    )


def _position(rule: TriggerRule) -> str:
    """Where a listing of triggers, in (id, channel) order, stands after ``rule``."""
    return f"{rule.id} {rule.channel}"


def _split_position(position: str) -> tuple[str, str | None]:
    """A listing position as (id, channel); a bare id (None) stands past all of its
    channels (a cluster's merged listing gives one)."""
    trigger_id, _, channel = position.partition(" ")
    return trigger_id, channel or None


def _is_list_position(value: str) -> bool:
    trigger_id, channel = _split_position(value)
    return TRIGGER_ID.fullmatch(trigger_id) is not None and (channel is None or " " not in channel)


def _past(rule: TriggerRule, position: str) -> bool:
    """Whether ``rule`` comes after ``position`` in a listing ('' for the start)."""
    if not position:
        return True
    trigger_id, channel = _split_position(position)
    if channel is None:
        return rule.id > trigger_id
    return (rule.id, rule.channel) > (trigger_id, channel)


def _is_offset(value: str) -> bool:
    """Whether a history position is an offset as the server writes one: digits, no sign."""
    return value.isascii() and value.isdigit() and str(int(value)) == value


class EventSource(Protocol):
    """Where ``Subscribe`` reads events: a hub's ``subscribe``."""

    def subscribe(
        self, wanted: EventFilter, after_seq: int, *, from_oldest: bool = False, until_seq: int = 0
    ) -> AsyncIterator[EventRecord]: ...

    async def last_seq(self) -> int:
        """The sequence of the last event logged (0 for none)."""
        ...


class TriggerServicer(trigger_service_pb2_grpc.TriggerServiceServicer):
    """The gRPC face of the trigger engine."""

    def __init__(self, runtime: Runtime, webhooks: WebhookPolicy) -> None:
        self._rt = runtime
        self._webhooks = webhooks
        self._engine: TriggerEngine | None = None
        self._events: EventSource | None = None

    def attach(self, triggers: TriggerEngine) -> None:
        """Serve this trigger engine, once the server has loaded it."""
        self._engine = triggers

    def stream_from(self, events: EventSource) -> None:
        """Subscribe to ``events`` rather than the trigger engine's (a cluster node: the
        cluster's events stream)."""
        self._events = events

    def _triggers(self) -> TriggerEngine:
        if self._engine is None:
            raise UnavailableError("the server is starting: the model and indexes are loading")
        return self._engine

    def _channel_of(self, trigger_id: str, channel: str) -> str | None:
        """The channel of the trigger a request names: ``channel`` when it gives one
        (access control has checked that the caller administers it), else the one
        channel the caller administers that has a trigger of this id. None when there
        is none, for a caller who administers every channel.

        Raises:
            PermissionDeniedError: No channel the caller administers has a trigger of
                this id: the same answer, word for word, whether another channel has
                one or none has.
            InvalidArgumentError: Several of them have one: the request must say which.
        """
        if channel:
            return self._rt.validator.channel(channel)
        access = caller.grants()
        held = [
            rule.channel
            for rule in self._triggers().registry.named(trigger_id)
            if access.allows(rule.channel, Permission.ADMIN)
        ]
        if len(held) > 1:
            raise InvalidArgumentError(
                f"channel: triggers of id {trigger_id} are in {len(held)} channels "
                f"({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}): name one"
            )
        if held:
            return held[0]
        if access.allows(EVERY_CHANNEL, Permission.ADMIN):
            return None
        raise _not_administered(trigger_id)

    def _check_chain(self, rule: TriggerRule) -> None:
        """Refuse a chain whose target is named in another channel than its own. A chain
        fires a trigger of its own channel (on the memory of its cause, which is there),
        so its ``trigger_id`` is looked up there, at each firing; no other channel's
        triggers are looked at, now or then, so neither reveals whether one exists."""
        named = rule.config_value("channel")
        if not named or named == rule.channel:
            return
        target = self._rt.validator.channel(named, "config.channel")
        if not caller.grants().allows(target, Permission.ADMIN):
            raise PermissionDeniedError(
                f"config.channel: a chain's target must be a trigger of a channel this key "
                f"administers, and {target} is not one"
            )
        raise InvalidArgumentError(
            f"config.channel: a chain fires a trigger of its own channel ({rule.channel}), "
            f"not of {target}; leave config.channel empty or make it {rule.channel}"
        )

    def _check_webhook(self, url: str) -> None:
        """Refuse a webhook URL whose host and port are not on the server's allow-list."""
        try:
            self._webhooks.check(url)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"config.url: {exc} (the server's operator allows a host and port with "
                "calor serve --webhook-allow HOST:PORT)"
            ) from None

    @rpc_errors
    async def CreateTrigger(
        self, request: tpb.CreateTriggerRequest, context: _Context
    ) -> tpb.CreateTriggerResponse:
        engine = self._triggers()
        trigger_id = request.trigger.id or new_id()
        if TRIGGER_ID.fullmatch(trigger_id) is None:
            raise InvalidArgumentError(
                "trigger.id: 1-64 letters, digits or _.:- (or leave it empty for a new id)"
            )
        rule = rule_from_message(
            request.trigger,
            trigger_id=trigger_id,
            now=self._rt.clock.now(),
            validate_channel=self._rt.validator.channel,
        )
        if engine.registry.get(rule.channel, trigger_id) is not None:  # this channel's only
            raise AlreadyExistsError(f"trigger {trigger_id} already exists in {rule.channel}")
        if rule.action == "webhook":
            self._check_webhook(rule.config_value("url"))
        if rule.action == "chain":
            self._check_chain(rule)
        await self._rt.run(engine.registry.add, rule)
        if rule.event == "on_decay":
            await engine.scheduler.add_rule(rule)
        return tpb.CreateTriggerResponse(trigger=rule_message(rule, 0))

    @rpc_errors
    async def ListTriggers(
        self, request: tpb.ListTriggersRequest, context: _Context
    ) -> tpb.ListTriggersResponse:
        engine = self._triggers()
        after, size = _page(request.page_token, request.page_size, _is_list_position)
        channel = self._rt.validator.channel(request.channel) if request.channel else None
        visible = caller.grants().predicate(Permission.ADMIN)
        rules = [
            r
            for r in engine.registry.rules(channel=channel)
            if _past(r, after) and visible(r.channel)
        ]
        page = rules[:size]
        more = len(rules) > size
        standings = await self._rt.run(lambda: [self._standing(r) for r in page])
        return tpb.ListTriggersResponse(
            triggers=[
                rule_message(r, engine.registry.fires(r), standing)
                for r, standing in zip(page, standings, strict=True)
            ],
            next_page_token=encode_page_token(_position(page[-1])) if more and page else "",
        )

    @rpc_errors
    async def DeleteTrigger(
        self, request: tpb.DeleteTriggerRequest, context: _Context
    ) -> tpb.DeleteTriggerResponse:
        if not request.id:
            raise InvalidArgumentError("id: a trigger id is required")
        channel = self._channel_of(request.id, request.channel)
        registry = self._triggers().registry
        if channel is None or not await self._rt.run(registry.remove, channel, request.id):
            if not caller.grants().allows(EVERY_CHANNEL, Permission.ADMIN):
                raise _not_administered(request.id)
            raise NotFoundError(f"no trigger {request.id}")
        return tpb.DeleteTriggerResponse(deleted=True)

    @rpc_errors
    async def TriggerHistory(
        self, request: tpb.TriggerHistoryRequest, context: _Context
    ) -> tpb.TriggerHistoryResponse:
        if not request.trigger_id:
            raise InvalidArgumentError("trigger_id: a trigger id is required")
        channel = self._channel_of(request.trigger_id, request.channel)
        after, size = _page(request.page_token, request.page_size, _is_offset)
        start = int(after) if after else 0
        registry = self._triggers().registry
        firings: list[Firing] = (
            []
            if channel is None
            else await self._rt.run(lambda: list(registry.history(channel, request.trigger_id)))
        )
        if request.newest_first:
            firings.reverse()
        rest = firings[start:]
        page = rest[:size]
        ratings = (
            {}
            if channel is None
            else await self._rt.run(registry.ratings, channel, request.trigger_id)
        )
        reply = tpb.TriggerHistoryResponse(
            firings=[
                tpb.TriggerFiring(
                    trigger_id=f.trigger_id,
                    memory_id=f.memory_id,
                    at=timestamp_message(f.at),
                    outcome=f.outcome,
                    seq=f.seq,
                    late=f.late,
                    rating=_rating_name(ratings.get(f.seq)),
                )
                for f in page
            ],
            next_page_token=encode_page_token(str(start + size)) if len(rest) > size else "",
        )
        if channel is not None:
            held = standing(ratings.values(), self._rt.clock.now(), self._min_precision(channel))
            if held.precision is not None:
                reply.precision = held.precision
            reply.rated = held.rated
        return reply

    @rpc_errors
    async def TriggerFeedback(
        self, request: tpb.TriggerFeedbackRequest, context: _Context
    ) -> tpb.TriggerFeedbackResponse:
        channel = self._rt.validator.channel(request.channel)
        if not request.trigger_id:
            raise InvalidArgumentError("trigger_id: a trigger id is required")
        if not request.cause_seq:
            raise InvalidArgumentError("cause_seq: the seq of the event that fired it is required")
        if request.rating not in (tpb.TRIGGER_RATING_USEFUL, tpb.TRIGGER_RATING_NOISE):
            raise InvalidArgumentError("rating: give TRIGGER_RATING_USEFUL or TRIGGER_RATING_NOISE")
        engine = self._triggers()
        rule = engine.registry.get(channel, request.trigger_id)
        if rule is None:
            raise NotFoundError(f"no trigger {request.trigger_id} in channel {channel!r}")
        rule = await self._rt.run(
            self._rate, rule, request.cause_seq, request.rating == tpb.TRIGGER_RATING_USEFUL
        )
        return tpb.TriggerFeedbackResponse(
            trigger=rule_message(rule, engine.registry.fires(rule), self._standing(rule))
        )

    def _rate(self, rule: TriggerRule, cause_seq: int, useful: bool) -> TriggerRule:
        """Rate the firing ``cause_seq`` caused; pause the rule if its channel says to and
        the rating leaves it flagged. The rule as it stands after."""
        registry = self._triggers().registry
        fired = [f for f in registry.history(rule.channel, rule.id) if f.seq == cause_seq]
        if not fired:
            raise NotFoundError(f"trigger {rule.id} did not fire for event {cause_seq}")
        now = self._rt.clock.now()
        registry.rate(rule, fired[-1], useful, now)
        policy = self._rt.engine.channels.policy(rule.channel)
        held = self._standing(rule)
        if not (held.flagged and policy.trigger_auto_pause and not rule.paused):
            return rule
        reason = held.reason(policy.trigger_min_precision)
        paused = registry.pause(rule, reason)
        self._rt.engine.log(
            EventRecord(
                kind="notify",
                channel=rule.channel,
                at=now,
                trigger_id=rule.id,
                message=f"trigger {rule.id} paused: {reason}",
                payload={"paused": "true", "precision": f"{held.precision:.4f}"},
            )
        )
        return paused

    def _standing(self, rule: TriggerRule) -> Standing:
        """A rule's precision over its rated firings now (reads the store)."""
        ratings = self._triggers().registry.ratings(rule.channel, rule.id)
        now = self._rt.clock.now()
        return standing(ratings.values(), now, self._min_precision(rule.channel))

    def _min_precision(self, channel: str) -> float:
        return self._rt.engine.channels.policy(channel).trigger_min_precision

    @rpc_errors
    async def EvaluateTriggers(
        self, request: tpb.EvaluateTriggersRequest, context: _Context
    ) -> tpb.EvaluateTriggersResponse:
        channel = self._rt.validator.channel(request.channel)
        kind = _kind_name(request.event, "event")
        if kind not in EVENTS:
            raise InvalidArgumentError(f"event: {kind} is not a trigger event")
        memory_id = self._rt.validator.memory_id(request.memory_id, "memory_id")
        engine = self._triggers()
        rules = await engine.would_fire(channel, kind, memory_id)
        return tpb.EvaluateTriggersResponse(
            matches=[
                tpb.TriggerMatch(trigger=rule_message(r, engine.registry.fires(r)), would=would)
                for r, would in rules
            ]
        )

    async def Subscribe(
        self, request: tpb.SubscribeRequest, context: _Context
    ) -> AsyncIterator[tpb.SubscribeResponse]:
        """Logged events after ``after_seq`` (or, ``from_now``, after the last one
        logged, said first) that pass the filter, then live ones.

        A resume point the log cannot serve ends the call with OUT_OF_RANGE, its bound
        named in the message and the trailing metadata (see ``SubscribeRequest``).
        """
        last = request.after_seq
        try:
            wanted = EventFilter(
                channels=frozenset(
                    self._rt.validator.channel(c, "channels") for c in request.channels
                ),
                kinds=frozenset(_kind_name(k, "kinds") for k in request.kinds),
                trigger_ids=frozenset(request.trigger_ids),
                readable=_readable(),
            )
            source = self._events or self._triggers().hub
            if request.from_now:
                last = await source.last_seq()
                yield tpb.SubscribeResponse(start_seq=last)
            events = source.subscribe(
                wanted,
                last,
                from_oldest=request.from_oldest_retained and not request.from_now,
                until_seq=request.until_seq,
            )
            async for event in events:
                yield tpb.SubscribeResponse(event=event_message(event))
                last = event.seq
        except CalorError as error:
            bounds = error.trailing if isinstance(error, OutOfRangeError) else ()
            await abort_with(context, error, (("calor-last-seq", str(last)), *bounds))


def _rating_name(rating: Rating | None) -> str:
    """How a firing was rated: "useful", "noise", or "" when it was not."""
    if rating is None:
        return ""
    return "useful" if rating.useful else "noise"
