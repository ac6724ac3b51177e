"""A shard's write log on the cluster's write stream (``CALOR_WRITES``), replicated by
the NATS JetStream servers (Raft).

Every shard's commits go to one stream, each shard on a subject of its own
(``calor.writes.K``): one Raft group for every write, so a NATS server's death makes
writes wait for one leader election at most, however many shards there are. A
shard's positions are the stream's sequence numbers of its messages (not contiguous).

Each commit is one message. It is published with a message id (so that a retry after
a lost answer is deduplicated: JetStream answers with the first copy's position) and
with the position of the shard's entry the writer last saw
(``Nats-Expected-Last-Subject-Sequence``), so a writer that has not seen every entry
before its own is refused instead of forking the history. The stream keeps that header
with each message, so a reader can tell an entry's predecessor and knows when entries
it has not read were trimmed. :meth:`JetStreamLog.append` blocks the committing thread
until the stream acknowledges (or refuses) the entry.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from functools import partial

from nats.errors import Error as NatsError
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    PubAck,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from calor.server.cluster.connection import JOIN_SECONDS, NatsConnection
from calor.server.errors import FailedPreconditionError, LogBehindError, LogTrimmedError

__all__ = ["WRITE_STREAM", "JetStreamLog"]

log = logging.getLogger(__name__)

WRITE_STREAM = "CALOR_WRITES"
"""The stream every shard's commits go to."""
_WRITES = "calor.writes.{shard}"
"""The subject every commit of a shard is published on."""
_EVERY_SHARD = "calor.writes.*"
_AFTER = "Nats-Expected-Last-Subject-Sequence"

# JetStream's error code for an expected-last-sequence check that failed.
_WRONG_LAST_SEQUENCE = 10071
_DEDUPLICATE_SECONDS = 120.0
_FETCH = 256
_NEAR = 1024
"""A tail of at most this many positions is read entry by entry; a longer one through a
consumer, in fetches of :data:`_FETCH`."""


class JetStreamLog:
    """Shard ``shard``'s write log (:class:`calor.server.storage.logged.WriteLog`) on the
    cluster's write stream."""

    def __init__(self, nats: NatsConnection, shard: int) -> None:
        self._nats = nats
        self._js = nats.js
        self.stream = WRITE_STREAM
        self._subject = _WRITES.format(shard=shard)

    @classmethod
    def open(cls, nats: NatsConnection, shard: int, *, replicas: int = 3) -> JetStreamLog:
        """Shard ``shard``'s write log on ``nats``, the write stream made if it does not
        exist yet.

        Raises:
            UnavailableError: JetStream could not make the stream in time (too few
                servers for ``replicas``, say).
            FailedPreconditionError: The stream exists with another replica count.
        """
        stream = cls(nats, shard)
        nats.persist(lambda: stream._ensure_stream(replicas), "find the write stream", JOIN_SECONDS)
        return stream

    async def _ensure_stream(self, replicas: int) -> None:
        try:
            info = await self._js.stream_info(self.stream)
        except NotFoundError:
            config = StreamConfig(
                name=self.stream,
                subjects=[_EVERY_SHARD],
                num_replicas=replicas,
                storage=StorageType.FILE,
                duplicate_window=_DEDUPLICATE_SECONDS,
                allow_direct=True,  # any server of the stream reads an entry
            )
            await self._js.add_stream(config)  # refused while the cluster forms: tried again
            log.info("write log: made stream %s with %d replicas", self.stream, replicas)
            return
        if info.config.num_replicas != replicas:
            raise FailedPreconditionError(
                f"the write stream {self.stream} has {info.config.num_replicas} replicas, this "
                f"node was started for {replicas}"
            )

    def append(self, entry: bytes, after: int) -> int:
        """See :meth:`calor.server.storage.logged.WriteLog.append`. While no server
        answers (one died and the client moves to another, the stream elects a new
        leader) the entry is offered again with the same message id, for up to
        ``retry_seconds``: an entry the stream did take is found, not written twice."""
        headers = {
            "Nats-Msg-Id": uuid.uuid4().hex,
            _AFTER: str(after),
        }
        ack = self._nats.persist(lambda: self._publish(entry, headers), "append a write")
        return int(ack.seq)

    async def _publish(self, entry: bytes, headers: dict[str, str]) -> PubAck:
        try:
            return await self._js.publish(self._subject, entry, headers=headers)
        except APIError as error:
            if error.err_code == _WRONG_LAST_SEQUENCE:
                raise LogBehindError(
                    "the write log holds entries this node has not applied; another node "
                    "owns the store now, or this one must catch up"
                ) from error
            raise

    def entries_after(self, position: int) -> Iterator[tuple[int, bytes]]:
        """See :meth:`calor.server.storage.logged.WriteLog.entries_after`. Each entry
        names the one before it; an entry naming another than the last one read means
        the ones between were trimmed."""
        last = self.last()
        seen = position
        while seen < last:
            chunk = self._read(seen + 1, last)
            if not chunk:
                return
            for number, after, data in chunk:
                if after is not None and after != seen:
                    raise LogTrimmedError(
                        f"the write log no longer holds the entries between {seen} and "
                        f"{number} (trimmed past this node's position)"
                    )
                seen = number
                yield number, data

    def _read(self, start: int, last: int) -> list[tuple[int, int | None, bytes]]:
        """The next entries from position ``start`` on: a short tail entry by entry from
        any server, a long one (or one the server that answered does not hold yet)
        through a consumer; entry by entry again while no consumer can be made (the
        cluster elects its meta leader)."""
        near = partial(self._near, start)
        if last - start < _NEAR:
            chunk = self._nats.persist(near, "read the write log")
            if chunk:
                return chunk
        try:
            return self._nats.run(self._chunk(start))
        except (NatsError, TimeoutError):
            log.warning("write log: no consumer can be made now; reading entry by entry")
            return self._nats.persist(near, "read the write log")

    def trim(self, through: int) -> None:
        """Drop the shard's entries before position ``through`` (a snapshot holds them);
        the entry at ``through`` stays, the last one a writer's fence can name."""
        self._nats.persist(
            lambda: self._js.purge_stream(self.stream, seq=through, subject=self._subject),
            "trim the write log",
        )

    async def _near(self, start: int) -> list[tuple[int, int | None, bytes]]:
        """The shard's entries from position ``start`` on, up to :data:`_NEAR` positions
        on and at most :data:`_FETCH` of them, one at a time from any server of the
        stream (a follower's or a new owner's short tail: no consumer to make, so no
        answer of the stream's or the cluster's leader is waited for); as :meth:`_chunk`."""
        found: list[tuple[int, int | None, bytes]] = []
        position = start
        while position < start + _NEAR and len(found) < _FETCH:
            try:
                message = await self._js.get_msg(
                    self.stream, position, self._subject, direct=True, next=True
                )
            except NotFoundError:
                break  # no later entry (yet, on the server that answered)
            number = int(message.seq or 0)
            found.append((number, _after(message.headers), message.data or b""))
            position = number + 1
        return found

    async def _chunk(self, start: int) -> list[tuple[int, int | None, bytes]]:
        """The shard's entries from position ``start`` on, as many as one fetch brings:
        each with its position and the position of the entry before it (``None`` when
        the message does not say)."""
        subscription = await self._js.pull_subscribe(
            self._subject,
            stream=self.stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=start,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=30.0,
            ),
        )
        try:
            messages = await subscription.fetch(_FETCH, timeout=self._nats.timeout)
        finally:
            await subscription.unsubscribe()
        return [
            (message.metadata.sequence.stream, _after(message.headers), message.data)
            for message in messages
        ]

    def bounds(self) -> tuple[int, int]:
        """The positions of the shard's first and last entries (0, 0 before its first)."""

        async def first() -> int:
            try:
                message = await self._js.get_msg(self.stream, 1, self._subject, next=True)
            except NotFoundError:
                return 0
            return int(message.seq or 0)

        return self._nats.persist(first, "read the write log's beginning"), self.last()

    def last(self) -> int:
        """The position of the shard's last entry (0 before its first)."""

        async def read() -> int:
            try:
                message = await self._js.get_last_msg(self.stream, self._subject, direct=True)
            except NotFoundError:
                return 0
            return int(message.seq or 0)

        # Any server of the stream answers, while it elects a leader too. One that lags
        # may name an earlier entry: a follower reads the rest next time, and a writer
        # that missed an entry is refused by the fence (it catches up and tries again).
        return self._nats.persist(read, "read the write log's end")


def _after(headers: dict[str, str] | None) -> int | None:
    """The position an entry was appended after, from its headers."""
    named = (headers or {}).get(_AFTER)
    return int(named) if named is not None else None
