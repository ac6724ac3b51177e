"""Fan-out of logged events to subscribers: bounded queues, gap-free resume, clean ends.

Modelled on grpc's async health ``Watch``: a subscriber registers, gets what the log
holds after its ``after_seq``, then live events, each exactly once and in order. A
subscriber that falls ``queue_size`` events behind is cut off with the last sequence
it received, so it can resume from there; the server never buffers without bound.
A resume point the log cannot serve (past its end, or older than what retention
kept) is refused with OUT_OF_RANGE naming the bound, never skipped silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from calor.server.errors import OutOfRangeError, ResourceExhaustedError, UnavailableError
from calor.server.events import LOG_LAST_SEQ_KEY, LOG_OLDEST_SEQ_KEY, EventRecord

__all__ = ["LOG_LAST_SEQ_KEY", "LOG_OLDEST_SEQ_KEY", "EventFilter", "SubscriptionHub"]


@dataclass(frozen=True)
class EventFilter:
    """Which events a subscriber wants; an empty field matches everything.

    ``readable`` says which channels the subscriber may read (its key's grants); None
    means all of them (a server without keys).
    """

    channels: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()
    trigger_ids: frozenset[str] = frozenset()
    readable: Callable[[str], bool] | None = None

    def wants(self, event: EventRecord) -> bool:
        """Whether the event passes the filter."""
        return (
            (self.readable is None or self.readable(event.channel))
            and (not self.channels or event.channel in self.channels)
            and (not self.kinds or event.kind in self.kinds)
            and (not self.trigger_ids or event.trigger_id in self.trigger_ids)
        )


@dataclass(eq=False)
class _Subscriber:
    filter: EventFilter
    queue: asyncio.Queue[EventRecord]
    overflowed: bool = False
    closed: bool = False
    relay: bool = False  # the server's own: not counted among the subscribers
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
        last_logged: Callable[[], int] | None = None,
    ) -> None:
        self._read_after = read_after
        self._last_logged = last_logged
        """The sequence of the last event committed to the log, which may be ahead of
        what has been published (events reach the loop moments after their commit)."""
        self._queue_size = queue_size
        self._replay_chunk = replay_chunk
        self._subscribers: set[_Subscriber] = set()
        self.published_seq = 0
        self.dropped = 0
        """Streams cut off since start because they fell ``queue_size`` events behind."""
        self._closing = False

    @property
    def subscriber_count(self) -> int:
        """How many streams are open (the server's own relays left out)."""
        return sum(1 for subscriber in self._subscribers if not subscriber.relay)

    async def last_seq(self) -> int:
        """The sequence of the last event logged (0 for none), published or about to be:
        a stream from there holds nothing committed before it was asked for."""
        logged = self._last_logged() if self._last_logged is not None else 0
        return max(self.published_seq, logged)

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
                    self.dropped += 1
                    subscriber.wake.set()

    async def subscribe(
        self,
        wanted: EventFilter,
        after_seq: int,
        *,
        from_oldest: bool = False,
        relay: bool = False,
        until_seq: int = 0,
    ) -> AsyncIterator[EventRecord]:
        """Events after ``after_seq`` that pass the filter: first from the log, then live
        (``until_seq``: up to that event of the log, and no further).

        ``after_seq`` 0 starts at the oldest event the log retains, as does any older
        resume point with ``from_oldest``; otherwise a resume point whose next events
        retention dropped is refused, as is one past the end of the log. A ``relay``
        (the server's own, passing events on) is not counted among the subscribers.

        Raises:
            OutOfRangeError: ``after_seq`` is past the log's last sequence, or events
                after it (or after a point reached while replaying) are no longer
                retained; the message and ``trailing`` name the bound.
            ResourceExhaustedError: the subscriber fell too far behind; the message
                names the last sequence delivered, to resume from.
            UnavailableError: the server is shutting down.
        """
        subscriber = _Subscriber(wanted, asyncio.Queue(self._queue_size), relay=relay)
        self._subscribers.add(subscriber)
        last = after_seq
        may_skip = after_seq == 0 or from_oldest
        try:
            horizon = self.published_seq
            if after_seq > horizon:
                await self._check_end(after_seq, horizon)
            if until_seq:
                _check_until(until_seq, horizon)
                horizon = until_seq
            while last < horizon:
                chunk = await self._read_after(last, self._replay_chunk)
                chunk = [e for e in chunk if e.seq <= horizon]
                oldest = chunk[0].seq if chunk else horizon + 1
                # Sequence numbers have no holes, so a jump means retention dropped events.
                if oldest > last + 1 and not (may_skip and last == after_seq):
                    raise _pruned(last, oldest)
                if not chunk:
                    break
                for event in chunk:
                    if wanted.wants(event):
                        yield event
                    last = event.seq
            last = max(last, horizon)
            while not until_seq:
                event = await self._next(subscriber, last)
                if event.seq > last:
                    last = event.seq
                    yield event
        finally:
            self._subscribers.discard(subscriber)

    async def _check_end(self, after_seq: int, horizon: int) -> None:
        """Refuse ``after_seq`` past the log's last sequence (it is past ``horizon``,
        what has been published, but may be logged and about to be)."""
        if await self._read_after(after_seq - 1, 1):
            return
        end = horizon
        while True:  # what was logged after the horizon: usually nothing, or a few
            chunk = await self._read_after(end, self._replay_chunk)
            end = chunk[-1].seq if chunk else end
            if end >= after_seq:
                return
            if len(chunk) < self._replay_chunk:
                break
        raise OutOfRangeError(
            f"after_seq={after_seq} is beyond the end of the event log: its last sequence "
            f"is {end}; resume with after_seq={end} or less",
            ((LOG_LAST_SEQ_KEY, str(end)),),
        )

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


def _check_until(until_seq: int, last: int) -> None:
    """Refuse an end past the log's last sequence (nothing is known of it yet)."""
    if until_seq > last:
        raise OutOfRangeError(
            f"until_seq={until_seq} is beyond the end of the event log: its last sequence "
            f"is {last}",
            ((LOG_LAST_SEQ_KEY, str(last)),),
        )


def _pruned(last: int, oldest: int) -> OutOfRangeError:
    """The refusal of a resume point after which retention dropped events."""
    return OutOfRangeError(
        f"events after seq {last} are no longer retained: the oldest retained sequence is "
        f"{oldest}, so {oldest - last - 1} event(s) would be missed; resubscribe with "
        f"from_oldest_retained (or after_seq={oldest - 1}) to continue from it",
        ((LOG_OLDEST_SEQ_KEY, str(oldest)),),
    )
