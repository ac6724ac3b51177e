"""The cluster's events: one replicated JetStream stream (``CALOR_EVENTS``) that each
shard's owner appends the shard's events to, in order and once each, and that
``Subscribe`` on any node reads from ``after_seq``. The stream's sequence numbers the
events cluster-wide, so a subscriber resumes on any node.

A shard's events are published on ``calor.events.<shard>.e``; those that quote a
memory's text on ``calor.events.<shard>.m.<channel>.<memory id>`` (the channel as a
hash), purged when the memory is forgotten or its channel dropped
(:meth:`ClusterEvents.forget`). Each message id is ``<shard>:<the event's
number in its shard>``, so an event offered twice (a retry, or a new owner starting
again from the last number recorded) is kept once; the last number a shard published
is recorded in the KV bucket ``calor_events``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from typing import Any, Protocol, TypeVar

from nats.errors import Error as NatsError
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from calor.server.cluster.connection import JOIN_SECONDS, NatsConnection, bucket_config
from calor.server.errors import OutOfRangeError, ResourceExhaustedError, UnavailableError
from calor.server.events import LOG_LAST_SEQ_KEY, LOG_OLDEST_SEQ_KEY, EventRecord

__all__ = ["ClusterEvents"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

STREAM = "CALOR_EVENTS"
_SUBJECTS = "calor.events.>"
_BUCKET = "calor_events"
_DEDUPLICATE_SECONDS = 600.0
_RETRY_SECONDS = 0.25
_ELECTION_SECONDS = 10.0
"""How long a subscription waits for NATS to answer (JetStream elects a leader 4 to 9 s
after the last one died)."""
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


class _Filter(Protocol):
    def wants(self, event: EventRecord) -> bool: ...


def _quoting(shard: int, channel: str, memory_id: str) -> str:
    """The subject of a shard's events that quote a memory of a channel (``*``: any)."""
    channel_key = hashlib.blake2b(channel.encode(), digest_size=8).hexdigest()
    token = (
        memory_id if memory_id == "*" or _TOKEN.fullmatch(memory_id) else memory_id.encode().hex()
    )
    return f"calor.events.{shard}.m.{channel_key}.{token}"


class ClusterEvents:
    """The events stream, as one node publishes its shards' events to it and reads
    them for its subscribers."""

    def __init__(self, nats: NatsConnection, cursors: KeyValue, queue_size: int) -> None:
        self._nats = nats
        self._cursors = cursors
        self.queue_size = queue_size
        """Events a subscriber may fall behind before its stream is ended."""
        self.subscribers = 0
        """Subscriptions open through this node."""
        self.dropped = 0
        """Subscriptions ended since start because they fell too far behind."""

    @classmethod
    def open(
        cls,
        nats: NatsConnection,
        *,
        replicas: int,
        keep_events: int,
        keep_seconds: float,
        queue_size: int,
    ) -> ClusterEvents:
        """The events stream and the cursors' bucket on ``nats``, made if missing; the
        stream keeps the last ``keep_events`` events, none older than ``keep_seconds``.
        """

        async def ensure() -> None:
            try:
                await nats.js.stream_info(STREAM)
            except NotFoundError:
                config = StreamConfig(
                    name=STREAM,
                    subjects=[_SUBJECTS],
                    num_replicas=replicas,
                    storage=StorageType.FILE,
                    retention=RetentionPolicy.LIMITS,
                    max_msgs=keep_events,
                    max_age=keep_seconds,
                    duplicate_window=_DEDUPLICATE_SECONDS,
                )
                await nats.js.add_stream(config)

        nats.persist(ensure, "find the events stream", JOIN_SECONDS)
        cursors = nats.key_value(bucket_config(_BUCKET, replicas), "event cursors")
        return cls(nats, cursors, queue_size)

    def published(self, shard: int) -> int:
        """The number (in its shard) of the last event of ``shard`` recorded as
        published; 0 before the first."""

        async def read() -> int:
            try:
                entry = await self._cursors.get(f"shard-{shard}")
            except (KeyNotFoundError, KeyDeletedError):
                return 0
            return int(entry.value or b"0")

        return self._nats.persist(read, "read where the shard's events stand")

    async def publish(self, shard: int, event: EventRecord) -> None:
        """Append one of ``shard``'s events (numbered in the shard), again until the
        stream takes it; an event the stream holds already is not added twice."""
        subject = (
            _quoting(shard, event.channel, event.memory_id)
            if event.may_quote()
            else f"calor.events.{shard}.e"
        )
        headers = {"Nats-Msg-Id": f"{shard}:{event.seq}"}
        while True:
            try:
                publishing = self._nats.js.publish(subject, event.to_json(), headers=headers)
                await self._nats.call(publishing)
                return
            except Exception:
                log.warning("an event could not be published yet; trying again", exc_info=True)
                await asyncio.sleep(_RETRY_SECONDS)

    async def record(self, shard: int, seq: int) -> None:
        """Record ``seq`` as the last of ``shard``'s events published; when NATS cannot
        take it now, a later event's number is recorded instead (a new owner offers
        again what it cannot know was published, and the stream keeps it once)."""
        try:
            await self._nats.call(self._cursors.put(f"shard-{shard}", str(seq).encode()))
        except Exception:
            log.warning("shard %d: its published events' place not recorded", shard)

    async def forget(
        self, shard: int, memories: Iterable[tuple[str, str]], channels: Iterable[str]
    ) -> None:
        """Drop the events that quote these memories (channel, id) and any memory of
        these channels: they were forgotten, or their channels dropped."""
        subjects = [_quoting(shard, channel, memory_id) for channel, memory_id in memories]
        subjects += [_quoting(shard, channel, "*") for channel in channels]
        for subject in subjects:
            await self._nats.call(self._nats.js.purge_stream(STREAM, subject=subject))

    async def _bounds(self) -> tuple[int, int]:
        info = await self._while_electing(lambda: self._nats.js.stream_info(STREAM))
        return int(info.state.first_seq), int(info.state.last_seq)

    async def _while_electing(self, work: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        """``work()`` on the NATS loop, asked again while no server answers (the stream,
        or the cluster's meta leader that makes consumers, being elected) for up to
        :data:`_ELECTION_SECONDS`: a subscriber starts late rather than failing.

        Raises:
            UnavailableError: Still no answer.
        """
        give_up = time.monotonic() + _ELECTION_SECONDS
        while True:
            try:
                return await self._nats.call(work())
            except (NatsError, TimeoutError) as error:
                if time.monotonic() > give_up:
                    raise UnavailableError(
                        "the events stream cannot be read now: call again"
                    ) from error
            await asyncio.sleep(_RETRY_SECONDS)

    async def last_seq(self) -> int:
        """The stream's last sequence (0 while it is empty)."""
        return (await self._bounds())[1]

    async def subscribe(
        self, wanted: _Filter, after_seq: int, *, from_oldest: bool = False, until_seq: int = 0
    ) -> AsyncIterator[EventRecord]:
        """The events after ``after_seq`` (numbered by the stream) that ``wanted`` keeps:
        first those the stream holds, then live ones (``until_seq``: up to that event of
        the stream, and no further).

        Raises:
            OutOfRangeError: ``after_seq`` is past the stream's last event, or events
                after it are no longer kept (unless ``from_oldest``, or it is 0).
            UnavailableError: The stream cannot be read (NATS away).
        """
        first, last = await self._bounds()
        if after_seq > last:
            raise OutOfRangeError(
                f"after_seq={after_seq} is beyond the end of the event log: its last "
                f"sequence is {last}; resume with after_seq={last} or less",
                ((LOG_LAST_SEQ_KEY, str(last)),),
            )
        if until_seq > last:
            raise OutOfRangeError(
                f"until_seq={until_seq} is beyond the end of the event log: its last "
                f"sequence is {last}",
                ((LOG_LAST_SEQ_KEY, str(last)),),
            )
        if after_seq and after_seq + 1 < first and not from_oldest:
            raise OutOfRangeError(
                f"events after seq {after_seq} are no longer retained: the oldest retained "
                f"sequence is {first}, so {first - after_seq - 1} event(s) would be missed; "
                f"resubscribe with from_oldest_retained (or after_seq={first - 1}) to "
                "continue from it",
                ((LOG_OLDEST_SEQ_KEY, str(first)),),
            )
        if until_seq and (until_seq <= after_seq or until_seq < first):
            return  # nothing (retained) up to it
        queue: asyncio.Queue[Any] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def deliver(message: Any) -> None:  # on the NATS loop: never blocks it
            loop.call_soon_threadsafe(queue.put_nowait, message)

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1
        )
        subscription = await self._while_electing(
            lambda: self._nats.js.subscribe(
                _SUBJECTS, ordered_consumer=True, config=config, cb=deliver
            )
        )
        seen = after_seq
        self.subscribers += 1
        try:
            while True:
                if queue.qsize() > self.queue_size:
                    self.dropped += 1
                    raise ResourceExhaustedError(
                        f"subscriber fell more than {self.queue_size} events behind; "
                        f"resume with after_seq={seen}",
                        retry_after=0.0,
                    )
                message = await queue.get()
                seen = int(message.metadata.sequence.stream)
                event = EventRecord.from_json(message.data).with_seq(seen)
                if wanted.wants(event):
                    yield event
                if until_seq and seen >= until_seq:
                    return
        finally:
            self.subscribers -= 1
            await self._nats.call(subscription.unsubscribe())
