"""What a trigger does when it fires: each action a small function over the memory engine.

Every action reports an outcome string for the trigger's history; a failing action
is isolated (its error becomes the outcome) and never stops the others. An internal
action commits its change together with the engine's bookkeeping (``ActionContext.writes``:
the dispatcher's cursor, the fire count, the history entry) in one batch, so after a
crash it has happened exactly once. A webhook is not sent here: :func:`webhook_delivery`
says what to send, and the engine makes it durable before sending it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from calor.server.engine.changes import Bookkeeping
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.events import Cause, EventRecord
from calor.server.records import MemoryRecord
from calor.triggers.outbox import Delivery
from calor.triggers.rules import TriggerRule
from calor.triggers.templates import render_message
from calor.triggers.webhook import WebhookOutcome

__all__ = [
    "ActionContext",
    "delivery_key",
    "describe",
    "message_fields",
    "outcome_event",
    "outcome_summary",
    "run_action",
    "webhook_delivery",
]

Run = Callable[..., Awaitable[Any]]

DEFAULT_NOTIFY = "trigger {trigger_id} fired on {event} of memory {memory_id} (heat {heat})"


@dataclass(frozen=True)
class ActionContext:
    """What an action acts on and with.

    ``writes(outcome)`` are the engine's bookkeeping writes for this firing with that
    outcome; the action adds them to the batch of its own change.
    """

    rule: TriggerRule
    event: EventRecord
    record: MemoryRecord
    heat: float
    cause: Cause
    memories: MemoryEngine
    run: Run
    now: float
    writes: Callable[[str], Bookkeeping]


def message_fields(
    record: MemoryRecord, heat: float, event_kind: str, trigger_id: str
) -> dict[str, str]:
    """What a notify template's placeholders stand for, for one memory and event."""
    return {
        "memory_id": record.id,
        "channel": record.channel,
        "text": record.text,
        "heat": f"{heat:.3f}",
        "memory_type": record.memory_type,
        "event": event_kind,
        "trigger_id": trigger_id,
    }


def _fields(ctx: ActionContext) -> dict[str, str]:
    return message_fields(ctx.record, ctx.heat, ctx.event.kind, ctx.rule.id)


def _log(ctx: ActionContext, kind: str, message: str, **extra: str) -> EventRecord:
    payload = {**ctx.cause.payload(), **extra}
    if ctx.event.payload.get("late"):
        payload["late"] = "true"
    return EventRecord(
        kind=kind,
        channel=ctx.record.channel,
        at=ctx.now,
        memory_id=ctx.record.id,
        trigger_id=ctx.rule.id,
        message=message,
        payload=payload,
    )


async def _notify(ctx: ActionContext) -> str:
    template = ctx.rule.config_value("message", DEFAULT_NOTIFY)
    message = render_message(template, _fields(ctx))
    outcome = "notified"
    await ctx.run(
        partial(ctx.memories.log, _log(ctx, "notify", message), extra=ctx.writes(outcome))
    )
    return outcome


async def _boost(ctx: ActionContext) -> str:
    delta = float(ctx.rule.config_value("delta", "0") or 0)
    targets = [ctx.record.id]
    if ctx.rule.config_value("target", "memory") == "neighbours":
        targets = await ctx.run(ctx.memories.channels.neighbours, ctx.record.channel, ctx.record.id)
    outcome = f"boosted {len(targets)}"
    await ctx.run(
        ctx.memories.edits.boost_all,
        ctx.record.channel,
        targets,
        delta,
        ctx.cause,
        ctx.writes(outcome),
    )
    return outcome


async def _pin(ctx: ActionContext) -> str:
    outcome = "pinned"
    channel, memory_id = ctx.record.channel, ctx.record.id
    await ctx.run(
        ctx.memories.edits.keystone, channel, memory_id, True, ctx.cause, ctx.writes(outcome)
    )
    return outcome


async def _tag(ctx: ActionContext) -> str:
    key, value = ctx.rule.config_value("key", ""), ctx.rule.config_value("value", "")
    outcome = f"tagged {key}={value}"
    await ctx.run(
        ctx.memories.edits.tag,
        ctx.record.channel,
        ctx.record.id,
        {key: value},
        ctx.cause,
        ctx.writes(outcome),
    )
    return outcome


async def _deprecate(ctx: ActionContext) -> str:
    outcome = "deprecated"
    channel, memory_id = ctx.record.channel, ctx.record.id
    await ctx.run(ctx.memories.edits.deprecate, channel, memory_id, ctx.cause, ctx.writes(outcome))
    return outcome


_ACTIONS: dict[str, Callable[[ActionContext], Awaitable[str]]] = {
    "notify": _notify,
    "boost": _boost,
    "pin": _pin,
    "tag": _tag,
    "deprecate": _deprecate,
}


async def run_action(ctx: ActionContext) -> str:
    """Perform an internal action, its bookkeeping in the same batch (``chain`` and
    ``webhook`` are the engine's: one fires another rule, the other goes through the
    outbox)."""
    return await _ACTIONS[ctx.rule.action](ctx)


def delivery_key(ctx: ActionContext) -> str:
    """The idempotency key of a webhook firing: ``<trigger id>:<cause seq>``.

    A chained firing names its whole chain (``a>b:<cause seq>``), since two chains may
    reach the same trigger from one event; a decay crossing, which has no sequence
    number, names the memory and its heat trajectory instead.
    """
    path = ">".join(ctx.cause.chain)
    if ctx.event.seq:
        return f"{path}:{ctx.event.seq}"
    return f"{path}:decay:{ctx.record.id}:{ctx.event.payload.get('t0', '')}"


def webhook_delivery(ctx: ActionContext) -> Delivery:
    """What a webhook firing will send, and log when it is done."""
    key = delivery_key(ctx)
    body = {
        "idempotency_key": key,
        "trigger_id": ctx.rule.id,
        "event": ctx.event.kind,
        "event_seq": ctx.event.seq,
        "channel": ctx.record.channel,
        "memory": {
            "id": ctx.record.id,
            "text": ctx.record.text,
            "type": ctx.record.memory_type,
            "heat": ctx.heat,
            "tags": ctx.record.tags,
        },
        "at": ctx.now,
    }
    timeout = ctx.rule.config_value("timeout_seconds", "")
    retries = ctx.rule.config_value("retries", "")
    return Delivery(
        key=key,
        url=ctx.rule.config_value("url", ""),
        body=body,
        secret=ctx.rule.config_value("secret", ""),
        timeout=float(timeout) if timeout else None,
        retries=int(retries) if retries else None,
        trigger_id=ctx.rule.id,
        channel=ctx.record.channel,
        memory_id=ctx.record.id,
        cause_seq=ctx.event.seq,
        at=ctx.now,
        payload=_log(ctx, "webhook", "").payload,
    )


def outcome_summary(outcome: WebhookOutcome) -> str:
    """A webhook's outcome in words, for the trigger's history."""
    if outcome.delivered:
        return f"delivered (HTTP {outcome.status}, {outcome.attempts} attempt(s))"
    return f"not delivered: {outcome.error}"


def outcome_event(delivery: Delivery, outcome: WebhookOutcome, at: float) -> EventRecord:
    """The ``webhook`` event that logs how a delivery ended."""
    return EventRecord(
        kind="webhook",
        channel=delivery.channel,
        at=at,
        memory_id=delivery.memory_id,
        trigger_id=delivery.trigger_id,
        message=outcome_summary(outcome),
        payload={
            **delivery.payload,
            "idempotency_key": delivery.key,
            "delivered": str(outcome.delivered).lower(),
            "attempts": str(outcome.attempts),
        },
    )


def describe(rule: TriggerRule, fields: Mapping[str, str]) -> str:
    """What the rule would do, in words (for the dry run); a notify shows its message as
    it would be sent, rendered from ``fields`` (see :func:`message_fields`)."""
    config = rule.config_value
    if rule.action == "notify":
        return "notify: " + render_message(config("message", DEFAULT_NOTIFY), fields)
    if rule.action == "boost":
        amount = config("delta", "") or "the channel's boost_delta"
        return f"boost the {config('target', 'memory')} by {amount}"
    words = {
        "pin": "pin the memory (keystone)",
        "tag": f"tag the memory {config('key', '')}={config('value', '')}",
        "deprecate": "mark the memory deprecated",
        "webhook": "POST the event to " + config("url", ""),
        "chain": "fire trigger " + config("trigger_id", ""),
    }
    return words[rule.action]
