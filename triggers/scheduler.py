"""on_decay at the moment of crossing: crossing times solved from the heat formula, kept in a
heap, slept on; nothing scans the memories to find them.

A change to a memory's heat (store, recall, resonance, boost, pin) reschedules it;
stale entries are recognised when they come due (the crossing is solved again from
the memory as it is then). Crossings that fell while the server was down fire at
start, marked late; a durable watermark says up to when crossings were handled.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable
from typing import Any

from calor.server.clock import Clock
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.errors import NotFoundError
from calor.server.events import EventRecord
from calor.triggers.registry import TriggerRegistry
from calor.triggers.rules import TriggerRule

__all__ = ["DecayScheduler"]

Run = Callable[..., Awaitable[Any]]
Fire = Callable[[TriggerRule, str, bool, float], Awaitable[None]]
_WATERMARK_EVERY = 1.0


class DecayScheduler:
    """Fires on_decay rules when a memory's heat crosses below their threshold."""

    def __init__(
        self,
        memories: MemoryEngine,
        registry: TriggerRegistry,
        clock: Clock,
        run: Run,
        fire: Fire,
    ) -> None:
        self._memories = memories
        self._registry = registry
        self._clock = clock
        self._run = run
        self._fire = fire
        self._heap: list[tuple[float, str, str, str]] = []  # moment, channel, id, memory
        self._changed = asyncio.Event()
        self._last_watermark = 0.0

    def _rules(self, channel: str) -> list[TriggerRule]:
        return self._registry.rules(channel=channel, event="on_decay")

    async def _schedule(self, rule: TriggerRule, memory_id: str, late_after: float | None) -> None:
        found = await self._run(
            self._memories.channels.decay_crossing, rule.channel, memory_id, rule.threshold
        )
        if found is None:
            return
        moment, t0, _ = found
        now = self._clock.now()
        if moment <= now:
            if late_after is not None and moment > late_after:
                if not await self._run(self._registry.decay_fired, rule, memory_id, t0):
                    await self._fire(rule, memory_id, True, t0)
            return
        heapq.heappush(self._heap, (moment, rule.channel, rule.id, memory_id))
        self._changed.set()

    async def load(self) -> None:
        """Schedule every on_decay rule's memories; fire, late, what fell while down."""
        watermark = await self._run(self._registry.watermark)
        for rule in self._registry.rules(event="on_decay"):
            await self.add_rule(rule, late_after=watermark or None)

    async def add_rule(self, rule: TriggerRule, late_after: float | None = None) -> None:
        """Schedule a (new) rule over the memories its channel holds now."""
        for memory_id in await self._run(self._memories.channels.memory_ids, rule.channel):
            await self._schedule(rule, memory_id, late_after)

    async def touch(self, event: EventRecord) -> None:
        """A memory's heat changed: solve its crossings again (and those it warmed)."""
        rules = self._rules(event.channel)
        if not rules:
            return
        warmed = [m for m in event.payload.get("resonated", "").split(",") if m]
        for memory_id in (event.memory_id, *warmed):
            for rule in rules:
                await self._schedule(rule, memory_id, None)

    async def run(self) -> None:
        """Sleep until the next crossing, fire what is due, repeat."""
        while True:
            now = self._clock.now()
            while self._heap and self._heap[0][0] <= now:
                _, channel, rule_id, memory_id = heapq.heappop(self._heap)
                rule = self._registry.get(channel, rule_id)
                if rule is not None:
                    await self._due(rule, memory_id)
            if now - self._last_watermark >= _WATERMARK_EVERY:
                self._last_watermark = now
                await self._run(self._registry.set_watermark, now)
            self._changed.clear()
            timeout = None
            if self._heap:  # wake at the next crossing, and each second for the watermark
                timeout = max(0.0, min(self._heap[0][0] - self._clock.now(), _WATERMARK_EVERY))
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=timeout)
            except TimeoutError:
                pass

    async def _due(self, rule: TriggerRule, memory_id: str) -> None:
        """A scheduled crossing came due: fire if the memory really crossed, else resolve."""
        found = await self._run(
            self._memories.channels.decay_crossing, rule.channel, memory_id, rule.threshold
        )
        if found is not None and found[0] > self._clock.now():
            heapq.heappush(self._heap, (found[0], rule.channel, rule.id, memory_id))  # warmed
            return
        try:
            now, _ = await self._run(self._memories.inspect, rule.channel, memory_id)
        except NotFoundError:
            return
        record = now.record
        level = rule.threshold
        if level is None:
            level = self._memories.channels.policy(rule.channel).cold_threshold
        if now.heat > level + 1e-9:
            return  # kept warm by something the heap did not hear of
        if await self._run(self._registry.decay_fired, rule, memory_id, record.t0):
            return
        await self._fire(rule, memory_id, False, record.t0)
