"""The trigger engine: reads the event log in order, feeds subscribers, fires matching rules.

The log is the source: every commit wakes the dispatcher, which reads the new events
back from RocksDB, so a crash between a change and its triggers loses nothing (the
dispatcher's cursor is durable and it resumes after it). Rules fired by an event that
a trigger itself caused carry the chain of triggers behind it: a rule never fires
twice in one chain (cycle detection) and a chain fires at most ``max_chain_depth``
triggers (a server flag, ``calor serve --max-chain-depth``).

Internal actions happen exactly once: each commits its change in one batch with the
cursor advance (the event being handled, and which of its rules are done) and the
trigger's fire count and history, so after a crash either all of it is durable or none
is. A chain logs a ``chain`` event that way, and its target fires when the dispatcher
reads that event. Events that fire nothing move the cursor in batches (reading them
again does nothing). Webhooks are at-least-once: the delivery is written to the outbox
with the cursor advance, sent with an idempotency key, and dropped with its outcome;
what a crash cut short is sent again at start, under the same key.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace
from functools import partial
from typing import Any

from calor.server.clock import Clock
from calor.server.config import DEFAULT_MAX_CHAIN_DEPTH
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.errors import NotFoundError
from calor.server.events import Cause, EventRecord
from calor.server.records import DELETED
from calor.server.storage.ops import DeleteKey, PutKey, Quote
from calor.server.storage.store import Keys, MemoryStore
from calor.triggers.actions import (
    ActionContext,
    describe,
    message_fields,
    outcome_event,
    outcome_summary,
    run_action,
    webhook_delivery,
)
from calor.triggers.outbox import Delivery, drop_delivery, pending_deliveries, put_delivery
from calor.triggers.registry import Counter, Firing, TriggerRegistry
from calor.triggers.rules import EVENTS, TriggerRule, matches
from calor.triggers.scheduler import DecayScheduler
from calor.triggers.subscriptions import SubscriptionHub
from calor.triggers.webhook import WebhookOutcome, WebhookPolicy, send_webhook

__all__ = ["TriggerEngine"]

log = logging.getLogger("calor.triggers")

_HEAT_EVENTS = frozenset({"on_store", "on_recall", "on_boost", "pin"})
_CARRIED = ("late", "t0")  # what a chained firing keeps of its cause's event payload
Run = Callable[..., Awaitable[Any]]
_Chain = tuple[str, ...]


def _cursor_value(seq: int, done: Collection[str]) -> bytes:
    """The durable cursor: every event up to ``seq`` is handled, and of the next one the
    rules in ``done`` have fired."""
    return json.dumps({"seq": seq, "done": sorted(done)}).encode()


def _read_cursor(saved: bytes | None, default: int) -> tuple[int, frozenset[str]]:
    if saved is None:
        return default, frozenset()
    data = json.loads(saved)
    return int(data["seq"]), frozenset(data.get("done", ()))


class _Bookkeeping:
    """What one firing writes beside its action, in the action's batch: its fire count,
    its history entry, its decay marker, and the dispatcher's cursor advance. The count
    is applied in memory only once the batch is durable (:meth:`applied`)."""

    def __init__(
        self,
        registry: TriggerRegistry,
        rule: TriggerRule,
        firing: Firing,
        position: int | None,
        done: frozenset[str],
        decay_t0: float | None,
    ) -> None:
        self._registry = registry
        self._rule = rule
        self._firing = firing
        self._position = position
        self._done = done
        self._decay_t0 = decay_t0
        self._counter: Counter | None = None

    def writes(self, outcome: str | None) -> list[PutKey]:
        """The writes for this firing with ``outcome`` (None: no history entry yet)."""
        firing, rule = self._firing, self._rule
        self._counter, counted = self._registry.count(rule, firing.at)
        writes = [counted]
        if outcome is not None:
            entry = replace(firing, outcome=outcome)
            writes.append(self._registry.history_entry(rule.channel, entry))
        if self._decay_t0 is not None:
            writes.append(self._registry.decay_mark(rule, firing.memory_id, self._decay_t0))
        if self._position is not None:
            done = self._done | {firing.trigger_id}
            writes.append(PutKey(Keys.CURSOR, _cursor_value(self._position - 1, done)))
        return writes

    def applied(self) -> None:
        """The batch holding :meth:`writes` is durable: count the firing in memory."""
        if self._counter is not None:
            self._registry.apply_count(self._rule, self._counter)


class TriggerEngine:
    """Dispatches logged events to subscribers and rules, and runs the decay scheduler."""

    def __init__(
        self,
        store: MemoryStore,
        memories: MemoryEngine,
        clock: Clock,
        run: Run,
        webhooks: WebhookPolicy,
        retention_events: int = 1_000_000,
        queue_size: int = 1024,
        retention_seconds: float = 7 * 86_400.0,
        max_chain_depth: int = DEFAULT_MAX_CHAIN_DEPTH,
    ) -> None:
        if max_chain_depth < 1:
            raise ValueError(f"max_chain_depth must be at least 1, got {max_chain_depth}")
        self._store = store
        self._max_depth = max_chain_depth
        self._memories = memories
        self._clock = clock
        self._run = run
        self._webhooks = webhooks
        self._retention = retention_events
        self._retention_seconds = retention_seconds
        self.registry = TriggerRegistry(store)
        memories.owners.append(self.registry)  # a dropped channel's triggers go with it
        self.hub = SubscriptionHub(
            lambda seq, n: run(store.events_after, seq, n),
            queue_size,
            last_logged=lambda: store.last_seq,
        )
        self.scheduler = DecayScheduler(memories, self.registry, clock, run, self._fire_decay)
        self._wake = asyncio.Event()
        self._cursor = 0  # every event up to here is handled
        self._done: frozenset[str] = frozenset()  # rules already fired for the next one
        self._firing = asyncio.Lock()  # the dispatcher and the decay scheduler take turns
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Load rules, resume after the durable cursor, send again the webhooks a crash
        cut short, start dispatching and scheduling."""
        await self._run(self.registry.load)
        saved = await self._run(self._store.get, Keys.CURSOR)
        self._cursor, self._done = _read_cursor(saved, self._store.last_seq)
        self.hub.published_seq = self._cursor
        for delivery in await self._run(pending_deliveries, self._store):
            self._send(delivery)
        loop = asyncio.get_running_loop()

        def wake(_events: list[EventRecord]) -> None:
            loop.call_soon_threadsafe(self._wake.set)

        self._store.on_commit(wake)
        self._wake.set()
        await self.scheduler.load()
        self._tasks = [
            asyncio.create_task(self._dispatch(), name="calor-dispatch"),
            asyncio.create_task(self.scheduler.run(), name="calor-decay"),
        ]

    async def stop(self) -> None:
        """End subscriptions and background work."""
        self.hub.close()
        tasks: list[asyncio.Task[Any]] = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- dispatch ----------------------------------------------------------------

    async def _dispatch(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                events = await self._run(self._store.events_after, self._cursor, 256)
                if not events:
                    break
                self.hub.publish(events)
                for event in events:
                    if event.seq != self._cursor + 1:
                        self._done = frozenset()  # partial progress is only for the next one
                    await self._handle(event)
                    self._cursor, self._done = event.seq, frozenset()
                await self._run(self._save_cursor, self._cursor)

    def _save_cursor(self, seq: int) -> None:
        """Note the events handled, up to ``seq``. A firing moved the cursor past its own
        event in its batch, on disk before it answered; this is the advance past the
        events that fired nothing since, so it does not wait for the disk (synced
        moments later: a power cut in that moment hands them to the rules again)."""
        cursor = PutKey(Keys.CURSOR, _cursor_value(seq, ()))
        self._memories.log(extra=[cursor], synced=False)
        self._trim(seq)

    def _trim(self, cursor: int) -> None:
        """Retention: keep at most ``retention_events`` events, none older than
        ``retention_seconds``, and never drop one the dispatcher has not handled."""
        first = self._store.first_seq()
        if not first:
            return
        keep_after = max(0, cursor - self._retention)
        cutoff = self._clock.now() - self._retention_seconds
        page = 1  # the oldest event is usually young enough: look at it alone first
        while keep_after < cursor:
            events = self._store.events_after(max(first - 1, keep_after), page)
            old = [e for e in events if e.at < cutoff and e.seq <= cursor]
            if old:
                keep_after = old[-1].seq
            if len(old) < len(events) or not events:
                break
            page = 256
        if keep_after >= first:
            self._store.trim_events(keep_after)

    async def _handle(self, event: EventRecord) -> None:
        """Fire the rules ``event`` calls for that have not fired for it yet; each in
        isolation, so one bad rule or event never stops the log."""
        if event.kind in _HEAT_EVENTS and event.memory_id:
            try:
                await self.scheduler.touch(event)
            except Exception:
                log.exception("decay scheduling failed for event %d", event.seq)
        for rule, cause_event, chain in self._fired_by(event):
            if rule.id in self._done:
                continue  # fired before a crash, in the batch that saved the cursor
            try:
                await self._consider(rule, cause_event, chain, position=event.seq)
            except Exception:
                log.exception("trigger %s failed for event %d", rule.id, event.seq)

    def _fired_by(self, event: EventRecord) -> list[tuple[TriggerRule, EventRecord, _Chain]]:
        """The rules a logged event may fire, each with the event it fires on and the
        chain of triggers behind it. A ``chain`` event fires its target, a trigger of the
        event's channel, on the memory of the original cause, whatever the target's own
        event filter says."""
        if event.kind == "chain":
            target = self.registry.get(event.channel, event.payload.get("target", ""))
            if target is None:
                return []
            cause = EventRecord(
                kind=target.event,
                channel=event.channel,
                at=event.at,
                memory_id=event.memory_id,
                seq=int(event.payload.get("cause_seq", "0") or 0),
                payload={k: v for k, v in event.payload.items() if k in _CARRIED},
            )
            return [(target, cause, Cause.of(event))]
        if event.kind not in EVENTS or event.kind == "on_decay":
            return []  # decay rules fire from the scheduler, at their own thresholds
        chain = Cause.of(event)
        rules = self.registry.rules(channel=event.channel, event=event.kind)
        return [(rule, event, chain) for rule in rules]

    async def _fire_decay(self, rule: TriggerRule, memory_id: str, late: bool, t0: float) -> None:
        payload = {
            "threshold": repr(rule.threshold),
            "t0": repr(t0),
            **({"late": "true"} if late else {}),
        }
        event = EventRecord(
            kind="on_decay",
            channel=rule.channel,
            at=self._clock.now(),
            memory_id=memory_id,
            payload=payload,
        )
        await self._consider(rule, event, (), position=None, decay_t0=t0)

    # --- firing ------------------------------------------------------------------

    async def _consider(
        self,
        rule: TriggerRule,
        event: EventRecord,
        chain: tuple[str, ...],
        position: int | None,
        decay_t0: float | None = None,
    ) -> None:
        """Fire ``rule`` for ``event`` if its filters, limits and the chain allow it.

        ``position`` is the sequence number of the logged event being handled (None
        for a decay crossing): the firing's batch moves the cursor there.
        """
        if rule.id in chain or len(chain) >= self._max_depth:
            return
        async with self._firing:
            now = self._clock.now()
            if not self.registry.can_fire(rule, now):
                return
            try:
                found, _ = await self._run(self._memories.inspect, event.channel, event.memory_id)
            except NotFoundError:
                return
            record, heat = found.record, found.heat
            if record.state == DELETED:
                return  # a forgotten memory fires nothing
            if not matches(
                rule,
                event=event.kind,
                channel=event.channel,
                memory_type=record.memory_type,
                text=record.text,
                heat=heat,
            ):
                return
            late = event.payload.get("late") == "true"
            firing = Firing(rule.id, record.id, now, "", event.seq, late)
            book = _Bookkeeping(self.registry, rule, firing, position, self._done, decay_t0)
            cause = Cause(rule.id, (*chain, rule.id), event.seq)
            ctx = ActionContext(
                rule, event, record, heat, cause, self._memories, self._run, now, book.writes
            )
            await self._act(ctx, book)
            if position is not None:
                self._done = self._done | {rule.id}

    async def _act(self, ctx: ActionContext, book: _Bookkeeping) -> None:
        try:
            if ctx.rule.action == "chain":
                await self._chain(ctx)
            elif ctx.rule.action == "webhook":
                await self._queue_webhook(ctx, book)
            else:
                await run_action(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # isolated: the outcome says what went wrong
            log.warning("trigger %s failed: %s", ctx.rule.id, error)
            outcome = f"error: {error}"
            await self._run(partial(self._memories.log, extra=book.writes(outcome)))
        book.applied()

    async def _chain(self, ctx: ActionContext) -> str:
        """Log a ``chain`` event naming the target; the target fires when it is read.

        The target is the trigger of that id in the chain's own channel: the only one
        that can fire on the memory, and one the chain's creator administers. No trigger
        of another channel is looked at, so the outcome says nothing of them.
        """
        channel = ctx.rule.channel
        target_id = ctx.rule.config_value("trigger_id", "")
        target = self.registry.get(channel, target_id)
        if target is None:
            outcome = f"chain target {target_id[:64]} is not a trigger of channel {channel}"
            await self._run(partial(self._memories.log, extra=ctx.writes(outcome)))
            return outcome
        if target.id in ctx.cause.chain or len(ctx.cause.chain) >= self._max_depth:
            outcome = f"chain to {target.id} stopped (cycle or depth {self._max_depth})"
        else:
            outcome = f"chained to {target.id}"
        carried = {k: v for k, v in ctx.event.payload.items() if k in _CARRIED}
        event = EventRecord(
            kind="chain",
            channel=ctx.record.channel,
            at=ctx.now,
            memory_id=ctx.record.id,
            trigger_id=ctx.rule.id,
            message=f"chained to {target.id}",
            payload={**carried, **ctx.cause.payload(), "target": target.id},
        )
        await self._run(partial(self._memories.log, event, extra=ctx.writes(outcome)))
        return outcome

    # --- webhooks ----------------------------------------------------------------

    async def _queue_webhook(self, ctx: ActionContext, book: _Bookkeeping) -> None:
        """Make the delivery durable with the cursor advance and the fire count, then
        send it in the background (its history entry is written with its outcome)."""
        delivery = webhook_delivery(ctx)
        writes: list[PutKey | Quote] = [*book.writes(None), put_delivery(delivery)]
        await self._run(partial(self._memories.log, extra=writes))
        self._send(delivery)

    def _send(self, delivery: Delivery) -> None:
        task = asyncio.create_task(self._deliver(delivery), name=f"calor-webhook-{delivery.key}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _deliver(self, delivery: Delivery) -> None:
        """Send one delivery; log its outcome and drop it from the outbox in one batch."""
        try:
            try:
                outcome = await send_webhook(
                    delivery.url,
                    delivery.body,
                    secret=delivery.secret,
                    policy=self._webhooks,
                    timeout=delivery.timeout,
                    retries=delivery.retries,
                    idempotency_key=delivery.key,
                )
            except ValueError as error:  # a delivery that can never be sent: give up
                outcome = WebhookOutcome(delivered=False, status=None, attempts=0, error=str(error))
            firing = Firing(
                delivery.trigger_id,
                delivery.memory_id,
                delivery.at,
                outcome_summary(outcome),
                delivery.cause_seq,
                delivery.late,
            )

            finish: list[PutKey | DeleteKey] = [
                self.registry.history_entry(delivery.channel, firing),
                *drop_delivery(delivery),
            ]
            event = outcome_event(delivery, outcome, self._clock.now())
            await self._run(partial(self._memories.log, event, extra=finish))
        except asyncio.CancelledError:
            raise
        except Exception:  # it stays in the outbox and is sent again at the next start
            log.exception("webhook %s could not be finished", delivery.key)

    # --- dry run -----------------------------------------------------------------

    async def would_fire(
        self, channel: str, event_kind: str, memory_id: str
    ) -> list[tuple[TriggerRule, str]]:
        """The rules that would fire for this event on this memory now, each with what it
        would do in words (a notify's message rendered); nothing is done."""
        found, _ = await self._run(self._memories.inspect, channel, memory_id)
        record, heat = found.record, found.heat
        now = self._clock.now()
        return [
            (rule, describe(rule, message_fields(record, heat, event_kind, rule.id)))
            for rule in self.registry.rules(channel=channel, event=event_kind)
            if self.registry.can_fire(rule, now)
            and matches(
                rule,
                event=event_kind,
                channel=channel,
                memory_type=record.memory_type,
                text=record.text,
                heat=heat,
            )
        ]
