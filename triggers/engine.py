"""The trigger engine: reads the event log in order, feeds subscribers, fires matching rules.

The log is the source: every commit wakes the dispatcher, which reads the new events
back from RocksDB, so a crash between a change and its triggers loses nothing (the
dispatcher's cursor is durable and it resumes after it). Rules fired by an event that
a trigger itself caused carry the chain of triggers behind it: a rule never fires
twice in one chain (cycle detection) and chains stop at ``MAX_CHAIN_DEPTH``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from calor.server.clock import Clock
from calor.server.engine import MemoryEngine
from calor.server.errors import NotFoundError
from calor.server.events import Cause, EventRecord
from calor.server.store import MemoryStore
from calor.triggers.actions import ActionContext, run_action
from calor.triggers.registry import Firing, TriggerRegistry
from calor.triggers.rules import EVENTS, TriggerRule, matches
from calor.triggers.scheduler import DecayScheduler
from calor.triggers.subscriptions import SubscriptionHub
from calor.triggers.webhook import WebhookPolicy

__all__ = ["MAX_CHAIN_DEPTH", "TriggerEngine"]

log = logging.getLogger("calor.triggers")

MAX_CHAIN_DEPTH = 8
_CURSOR = b"s:cursor"
_HEAT_EVENTS = frozenset({"on_store", "on_recall", "on_boost", "pin"})
Run = Callable[..., Awaitable[Any]]


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
    ) -> None:
        self._store = store
        self._memories = memories
        self._clock = clock
        self._run = run
        self._webhooks = webhooks
        self._retention = retention_events
        self._retention_seconds = retention_seconds
        self.registry = TriggerRegistry(store)
        self.hub = SubscriptionHub(lambda seq, n: run(store.events_after, seq, n), queue_size)
        self.scheduler = DecayScheduler(memories, self.registry, clock, run, self._fire_decay)
        self._wake = asyncio.Event()
        self._cursor = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[str]] = set()

    async def start(self) -> None:
        """Load rules, resume after the durable cursor, start dispatching and scheduling."""
        await self._run(self.registry.load)
        saved = await self._run(self._store.get_raw, _CURSOR)
        self._cursor = int(saved) if saved is not None else self._store.last_seq
        self.hub.published_seq = self._cursor
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
                    await self._handle(event)
                self._cursor = events[-1].seq
                await self._run(self._save_cursor, self._cursor)

    def _save_cursor(self, seq: int) -> None:
        with self._store.batch() as batch:
            batch.put_raw(_CURSOR, str(seq).encode())
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
        try:
            if event.kind in _HEAT_EVENTS and event.memory_id:
                await self.scheduler.touch(event)
            if event.kind not in EVENTS or event.kind == "on_decay":
                return  # decay rules fire from the scheduler, at their own thresholds
            for rule in self.registry.rules(channel=event.channel, event=event.kind):
                await self._consider(rule, event, Cause.of(event))
        except Exception:  # one bad event must not stop the log
            log.exception("trigger dispatch failed for event %d", event.seq)

    async def _fire_decay(self, rule: TriggerRule, memory_id: str, late: bool, t0: float) -> None:
        payload = {"threshold": repr(rule.threshold), **({"late": "true"} if late else {})}
        event = EventRecord(
            kind="on_decay",
            channel=rule.channel,
            at=self._clock.now(),
            memory_id=memory_id,
            payload=payload,
        )
        await self._consider(rule, event, (), decay_t0=t0)

    # --- firing ------------------------------------------------------------------

    async def _consider(
        self,
        rule: TriggerRule,
        event: EventRecord,
        chain: tuple[str, ...],
        decay_t0: float | None = None,
    ) -> str | None:
        """Fire ``rule`` for ``event`` if its filters, limits and the chain allow it."""
        if rule.id in chain or len(chain) >= MAX_CHAIN_DEPTH:
            return None
        now = self._clock.now()
        if not self.registry.can_fire(rule, now):
            return None
        try:
            record, _ = await self._run(self._memories.inspect, event.channel, event.memory_id)
        except NotFoundError:
            return None
        heat = self._memories.heat(record)
        if not matches(
            rule,
            event=event.kind,
            channel=event.channel,
            memory_type=record.memory_type,
            text=record.text,
            heat=heat,
        ):
            return None
        cause = Cause(rule.id, (*chain, rule.id))
        ctx = ActionContext(
            rule, event, record, heat, cause, self._memories, self._run, self._webhooks, now
        )
        if rule.action == "webhook":
            task = asyncio.create_task(self._act(ctx, decay_t0))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return "webhook scheduled"
        return await self._act(ctx, decay_t0)

    async def _act(self, ctx: ActionContext, decay_t0: float | None) -> str:
        try:
            if ctx.rule.action == "chain":
                outcome = await self._chain(ctx)
            else:
                outcome = await run_action(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # isolated: the outcome says what went wrong
            log.warning("trigger %s failed: %s", ctx.rule.id, error)
            outcome = f"error: {error}"
        late = ctx.event.payload.get("late") == "true"
        firing = Firing(ctx.rule.id, ctx.record.id, ctx.now, outcome, ctx.event.seq, late)
        await self._run(self.registry.record, firing, decay_t0)
        return outcome

    async def _chain(self, ctx: ActionContext) -> str:
        target = self.registry.get(ctx.rule.config_value("trigger_id", ""))
        if target is None:
            return "chain target is gone"
        await self._run(
            self._memories.log,
            EventRecord(
                kind="chain",
                channel=ctx.record.channel,
                at=ctx.now,
                memory_id=ctx.record.id,
                trigger_id=ctx.rule.id,
                message=f"chained to {target.id}",
                payload={**ctx.cause.payload(), "target": target.id},
            ),
        )
        if target.id in ctx.cause.chain or len(ctx.cause.chain) >= MAX_CHAIN_DEPTH:
            return f"chain to {target.id} stopped (cycle or depth {MAX_CHAIN_DEPTH})"
        event = EventRecord(
            kind=target.event,
            channel=ctx.event.channel,
            at=ctx.now,
            memory_id=ctx.event.memory_id,
            seq=ctx.event.seq,
            payload=ctx.event.payload,
        )
        # The target acts on the same memory, whatever its own event filter says.
        chained = await self._consider_chained(target, event, ctx.cause.chain)
        return f"chained to {target.id}: {chained or 'did not fire'}"

    async def _consider_chained(
        self, rule: TriggerRule, event: EventRecord, chain: tuple[str, ...]
    ) -> str | None:
        if rule.event != event.kind:
            event = EventRecord(
                kind=rule.event,
                channel=event.channel,
                at=event.at,
                memory_id=event.memory_id,
                seq=event.seq,
                payload=event.payload,
            )
        return await self._consider(rule, event, chain)

    # --- dry run -----------------------------------------------------------------

    async def would_fire(self, channel: str, event_kind: str, memory_id: str) -> list[TriggerRule]:
        """The rules that would fire for this event on this memory now (nothing is done)."""
        record, _ = await self._run(self._memories.inspect, channel, memory_id)
        heat = self._memories.heat(record)
        now = self._clock.now()
        return [
            rule
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
