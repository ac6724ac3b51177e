"""The write log on a NATS JetStream stream, replicated by its servers (Raft).

Each commit is one message on the stream's write subject. It is published with a
message id (so that a retry after a lost answer is deduplicated: JetStream answers
with the first copy's position) and with the position the writer last saw
(``Nats-Expected-Last-Subject-Sequence``), so a writer that has not seen every entry
before its own is refused instead of forking the history. The client runs on its own
event loop thread; :meth:`JetStreamLog.append` blocks the committing thread until the
stream acknowledges (or refuses) the entry.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from functools import partial
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoServersError
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    PubAck,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from calor.server.errors import CalorError, FailedPreconditionError, UnavailableError

__all__ = ["JetStreamLog", "STREAM", "WRITES"]

log = logging.getLogger(__name__)

STREAM = "CALOR_WRITES"
WRITES = "calor.writes"
"""The subject every commit is published on (one shard: the whole store)."""

# JetStream's error code for an expected-last-sequence check that failed.
_WRONG_LAST_SEQUENCE = 10071
_DEDUPLICATE_SECONDS = 120.0
_FETCH = 256
_T = TypeVar("_T")


class JetStreamLog:
    """The write log (:class:`calor.server.storage.logged.WriteLog`) on a JetStream
    stream with ``replicas`` copies."""

    def __init__(
        self,
        client: Client,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        retry_seconds: float = 15.0,
    ) -> None:
        self._client = client
        self._loop = loop
        self._timeout = timeout
        self._retry_seconds = retry_seconds
        self._js: JetStreamContext = client.jetstream(timeout=timeout)

    @classmethod
    def connect(
        cls, servers: list[str], *, replicas: int = 3, timeout: float = 5.0
    ) -> JetStreamLog:
        """Connect to the NATS servers and make sure the write stream exists.

        Raises:
            UnavailableError: No server answered, or JetStream could not make the stream
                (too few servers for ``replicas``, say).
            FailedPreconditionError: The stream exists with another replica count.
        """
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="calor-jetstream", daemon=True)
        thread.start()

        async def opened() -> Client:
            return await nats.connect(
                servers,
                name="calor",
                connect_timeout=timeout,
                max_reconnect_attempts=-1,
                allow_reconnect=True,
            )

        try:
            client = asyncio.run_coroutine_threadsafe(opened(), loop).result(timeout * 3)
        except (NoServersError, OSError, TimeoutError) as error:
            loop.call_soon_threadsafe(loop.stop)
            raise UnavailableError(f"no NATS server answered at {','.join(servers)}") from error
        stream = cls(client, loop, timeout)
        stream._persist(lambda: stream._ensure_stream(replicas), "find the write stream")
        return stream

    async def _ensure_stream(self, replicas: int) -> None:
        try:
            info = await self._js.stream_info(STREAM)
        except NotFoundError:
            config = StreamConfig(
                name=STREAM,
                subjects=[WRITES],
                num_replicas=replicas,
                storage=StorageType.FILE,
                duplicate_window=_DEDUPLICATE_SECONDS,
            )
            await self._js.add_stream(config)  # refused while the cluster forms: tried again
            log.info("write log: made stream %s with %d replicas", STREAM, replicas)
            return
        if info.config.num_replicas != replicas:
            raise FailedPreconditionError(
                f"the write stream {STREAM} has {info.config.num_replicas} replicas, this "
                f"node was started for {replicas}"
            )

    def append(self, entry: bytes, after: int) -> int:
        """See :meth:`calor.server.storage.logged.WriteLog.append`. While no server
        answers (one died and the client moves to another, the stream elects a new
        leader) the entry is offered again with the same message id, for up to
        ``retry_seconds``: an entry the stream did take is found, not written twice."""
        headers = {
            "Nats-Msg-Id": uuid.uuid4().hex,
            "Nats-Expected-Last-Subject-Sequence": str(after),
        }
        ack = self._persist(lambda: self._publish(entry, headers), "append a write")
        return int(ack.seq)

    async def _publish(self, entry: bytes, headers: dict[str, str]) -> PubAck:
        try:
            return await self._js.publish(WRITES, entry, headers=headers)
        except APIError as error:
            if error.err_code == _WRONG_LAST_SEQUENCE:
                raise UnavailableError(
                    "the write log holds entries this node has not applied; it must catch "
                    "up (restart it)"
                ) from error
            raise

    def entries_after(self, position: int) -> Iterator[tuple[int, bytes]]:
        """See :meth:`calor.server.storage.logged.WriteLog.entries_after`."""
        last = self._persist(self._last_position, "read the write log's end")
        seen = position
        while seen < last:
            chunk = self._persist(partial(self._chunk, seen + 1), "read the write log")
            for seen, data in chunk:
                yield seen, data

    async def _chunk(self, start: int) -> list[tuple[int, bytes]]:
        """The entries from position ``start`` on, as many as one fetch brings."""
        subscription = await self._js.pull_subscribe(
            WRITES,
            stream=STREAM,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=start,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=30.0,
            ),
        )
        try:
            messages = await subscription.fetch(_FETCH, timeout=self._timeout)
        finally:
            await subscription.unsubscribe()
        return [(message.metadata.sequence.stream, message.data) for message in messages]

    async def _last_position(self) -> int:
        info = await self._js.stream_info(STREAM)
        return int(info.state.last_seq)

    def close(self) -> None:
        """Drain and close the connection, and stop its loop."""
        try:
            self._run(self._client.drain())
        except Exception:  # closing: what is left to drain no longer matters
            log.debug("write log: drain on close failed", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _persist(self, work: Callable[[], Coroutine[Any, Any, _T]], what: str) -> _T:
        """Run ``work`` on the client's loop, again while no server answers (one died and
        the client moves to another; the stream elects a new leader), for up to
        ``retry_seconds``.

        Raises:
            UnavailableError: Still no answer after that long.
        """
        give_up = time.monotonic() + self._retry_seconds
        pause = 0.05
        while True:
            try:
                return self._run(work())
            except CalorError:
                raise
            except (NatsError, TimeoutError, OSError) as error:
                if time.monotonic() + pause > give_up:
                    raise UnavailableError(f"could not {what} on JetStream: {error!r}") from error
                log.warning("write log: could not %s (%r); trying again", what, error)
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _run(self, work: Coroutine[Any, Any, _T]) -> _T:
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        return future.result(self._timeout * 2)
