"""What a trigger does when it fires: each action a small function over the memory engine.

Every action reports an outcome string for the trigger's history; a failing action
is isolated (its error becomes the outcome) and never stops the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from calor.server.engine import MemoryEngine
from calor.server.events import Cause, EventRecord
from calor.server.records import MemoryRecord
from calor.triggers.rules import TriggerRule
from calor.triggers.templates import render_message
from calor.triggers.webhook import WebhookPolicy, send_webhook

__all__ = ["ActionContext", "describe", "run_action"]

Run = Callable[..., Awaitable[Any]]

DEFAULT_NOTIFY = "trigger {trigger_id} fired on {event} of memory {memory_id} (heat {heat})"


@dataclass(frozen=True)
class ActionContext:
    """What an action acts on and with."""

    rule: TriggerRule
    event: EventRecord
    record: MemoryRecord
    heat: float
    cause: Cause
    memories: MemoryEngine
    run: Run
    webhooks: WebhookPolicy
    now: float


def _fields(ctx: ActionContext) -> dict[str, str]:
    return {
        "memory_id": ctx.record.id,
        "channel": ctx.record.channel,
        "text": ctx.record.text,
        "heat": f"{ctx.heat:.3f}",
        "memory_type": ctx.record.memory_type,
        "event": ctx.event.kind,
        "trigger_id": ctx.rule.id,
    }


def _log(ctx: ActionContext, kind: str, message: str, **extra: str) -> EventRecord:
    payload = {**ctx.cause.payload(), "cause_seq": str(ctx.event.seq), **extra}
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
    await ctx.run(ctx.memories.log, _log(ctx, "notify", message))
    return "notified"


async def _boost(ctx: ActionContext) -> str:
    delta = float(ctx.rule.config_value("delta", "0") or 0)
    targets = [ctx.record.id]
    if ctx.rule.config_value("target", "memory") == "neighbours":
        targets = await ctx.run(ctx.memories.neighbours, ctx.record.channel, ctx.record.id)
    for memory_id in targets:
        await ctx.run(ctx.memories.boost, ctx.record.channel, memory_id, delta, ctx.cause)
    return f"boosted {len(targets)}"


async def _pin(ctx: ActionContext) -> str:
    await ctx.run(ctx.memories.keystone, ctx.record.channel, ctx.record.id, True, ctx.cause)
    return "pinned"


async def _tag(ctx: ActionContext) -> str:
    key, value = ctx.rule.config_value("key", ""), ctx.rule.config_value("value", "")
    await ctx.run(ctx.memories.tag, ctx.record.channel, ctx.record.id, {key: value}, ctx.cause)
    return f"tagged {key}={value}"


async def _deprecate(ctx: ActionContext) -> str:
    await ctx.run(ctx.memories.deprecate, ctx.record.channel, ctx.record.id, ctx.cause)
    return "deprecated"


async def _webhook(ctx: ActionContext) -> str:
    body = {
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
    outcome = await send_webhook(
        ctx.rule.config_value("url", ""),
        body,
        secret=ctx.rule.config_value("secret", ""),
        policy=ctx.webhooks,
        timeout=float(timeout) if timeout else None,
        retries=int(retries) if retries else None,
    )
    summary = (
        f"delivered (HTTP {outcome.status}, {outcome.attempts} attempt(s))"
        if outcome.delivered
        else f"not delivered: {outcome.error}"
    )
    await ctx.run(
        ctx.memories.log,
        _log(
            ctx,
            "webhook",
            summary,
            delivered=str(outcome.delivered).lower(),
            attempts=str(outcome.attempts),
        ),
    )
    return summary


_ACTIONS: dict[str, Callable[[ActionContext], Awaitable[str]]] = {
    "notify": _notify,
    "boost": _boost,
    "pin": _pin,
    "tag": _tag,
    "deprecate": _deprecate,
    "webhook": _webhook,
}


async def run_action(ctx: ActionContext) -> str:
    """Perform the rule's action (``chain`` is the engine's: it fires another rule)."""
    return await _ACTIONS[ctx.rule.action](ctx)


def describe(rule: TriggerRule) -> str:
    """What the rule would do, in words (for the dry run)."""
    config = rule.config_value
    if rule.action == "notify":
        return "notify: " + config("message", DEFAULT_NOTIFY)
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
