"""Fan-out of logged events to subscribers: bounded queues, gap-free resume, clean ends.

Modelled on grpc's async health ``Watch``: a subscriber registers, gets what the log
holds after its ``after_seq``, then live events, each exactly once and in order. A
subscriber that falls ``queue_size`` events behind is cut off with the last sequence
it received, so it can resume from there; the server never buffers without bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from calor.server.errors import ResourceExhaustedError, UnavailableError
from calor.server.events import EventRecord

__all__ = ["EventFilter", "SubscriptionHub"]


@dataclass(frozen=True)
class EventFilter:
    """Which events a subscriber wants; an empty field matches everything."""

    channels: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()
    trigger_ids: frozenset[str] = frozenset()

    def wants(self, event: EventRecord) -> bool:
        """Whether the event passes the filter."""
        return (
            (not self.channels or event.channel in self.channels)
            and (not self.kinds or event.kind in self.kinds)
            and (not self.trigger_ids or event.trigger_id in self.trigger_ids)
        )


@dataclass(eq=False)
class _Subscriber:
    filter: EventFilter
    queue: asyncio.Queue[EventRecord]
    overflowed: bool = False
    closed: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class SubscriptionHub:
    """Hands each newly logged event to every subscriber whose filter wants it.

    ``publish`` must be called on the event loop, in sequence order, once per event.
    """

    def __init__(
        self,
        read_after: Callable[[int, int], Awaitable[list[EventRecord]]],
        queue_size: int = 1024,
        replay_chunk: int = 512,
    ) -> None:
        self._read_after = read_after
        self._queue_size = queue_size
        self._replay_chunk = replay_chunk
        self._subscribers: set[_Subscriber] = set()
        self.published_seq = 0
        self._closing = False

    @property
    def subscriber_count(self) -> int:
        """How many streams are open."""
        return len(self._subscribers)

    def publish(self, events: Sequence[EventRecord]) -> None:
        """Offer logged events (in sequence order) to every subscriber."""
        for event in events:
            if event.seq <= self.published_seq:
                continue
            self.published_seq = event.seq
            for subscriber in self._subscribers:
                if subscriber.overflowed or not subscriber.filter.wants(event):
                    continue
                try:
                    subscriber.queue.put_nowait(event)
                except asyncio.QueueFull:
                    subscriber.overflowed = True
                    subscriber.wake.set()

    async def subscribe(self, wanted: EventFilter, after_seq: int) -> AsyncIterator[EventRecord]:
        """Events after ``after_seq`` that pass the filter: first from the log, then live.

        Raises:
            ResourceExhaustedError: the subscriber fell too far behind; the message
                names the last sequence delivered, to resume from.
            UnavailableError: the server is shutting down.
        """
        subscriber = _Subscriber(wanted, asyncio.Queue(self._queue_size))
        self._subscribers.add(subscriber)
        last = after_seq
        try:
            horizon = self.published_seq
            while last < horizon:
                chunk = await self._read_after(last, self._replay_chunk)
                chunk = [e for e in chunk if e.seq <= horizon]
                if not chunk:
                    break
                for event in chunk:
                    if wanted.wants(event):
                        yield event
                    last = event.seq
            last = max(last, horizon)
            while True:
                event = await self._next(subscriber, last)
                if event.seq > last:
                    last = event.seq
                    yield event
        finally:
            self._subscribers.discard(subscriber)

    async def _next(self, subscriber: _Subscriber, last: int) -> EventRecord:
        while True:
            if not subscriber.queue.empty():
                return subscriber.queue.get_nowait()
            if subscriber.overflowed:
                raise ResourceExhaustedError(
                    f"subscriber fell more than {self._queue_size} events behind; "
                    f"resume with after_seq={last}",
                    retry_after=0.0,
                )
            if subscriber.closed or self._closing:
                raise UnavailableError(f"the server is shutting down; resume with after_seq={last}")
            subscriber.wake.clear()
            getter = asyncio.ensure_future(subscriber.queue.get())
            waker = asyncio.ensure_future(subscriber.wake.wait())
            try:
                await asyncio.wait({getter, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waker.cancel()
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()

    def close(self) -> None:
        """End every stream (server shutdown); each ends with UNAVAILABLE and its resume point."""
        self._closing = True
        for subscriber in self._subscribers:
            subscriber.closed = True
            subscriber.wake.set()
