"""One node's connection to the NATS servers, on an event loop thread of its own, so that
the blocking threads of the store and the placement loop can wait on JetStream."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoServersError
from nats.js.api import KeyValueConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from calor.server.cluster.nats_install import FIXED_VERSION
from calor.server.errors import CalorError, UnavailableError

__all__ = ["JOIN_SECONDS", "NatsConnection", "bucket_config"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_MOST_PAUSE_SECONDS = 0.1
"""The longest pause between two tries of a request no server answered at once: a
stream's new leader (JetStream elects one seconds after the old one died) is found
within this of its election (a try that timed out is made again without a pause)."""

JOIN_SECONDS = 60.0
"""How long a starting node waits for JetStream (a cluster starting with it may take
several seconds to elect its leaders)."""


class NatsConnection:
    """A NATS client that reconnects to any of its servers, and a way to run its calls
    from other threads (:meth:`run`) and to retry them while no server answers
    (:meth:`persist`)."""

    def __init__(
        self,
        client: Client,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        timeout: float,
        retry_seconds: float,
    ) -> None:
        self.client = client
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.js: JetStreamContext = client.jetstream(timeout=timeout)
        self._loop = loop
        self._thread = thread

    @classmethod
    def open(
        cls, servers: list[str], *, timeout: float = 1.0, retry_seconds: float = 15.0
    ) -> NatsConnection:
        """Connect to any of ``servers``. ``timeout`` bounds each request: short, so that
        a request lost with a dying server (or a stream electing a new leader) is asked
        again soon, by :meth:`persist`.

        Raises:
            UnavailableError: None of them answered.
        """
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="calor-nats", daemon=True)
        thread.start()

        connect_timeout = max(timeout, 5.0)  # each server's TCP connect, in turn

        async def opened() -> Client:
            return await nats.connect(
                servers,
                name="calor",
                connect_timeout=connect_timeout,
                max_reconnect_attempts=-1,
                allow_reconnect=True,
                reconnect_time_wait=0.25,  # a server died: the next one at once
                ping_interval=5,  # a connection gone quiet is found within seconds
                max_outstanding_pings=2,
            )

        try:
            connecting = asyncio.run_coroutine_threadsafe(opened(), loop)
            client = connecting.result(connect_timeout * (len(servers) + 1))
        except (NoServersError, OSError, TimeoutError) as error:
            _end(loop, thread)
            raise UnavailableError(f"no NATS server answered at {','.join(servers)}") from error
        version = client.connected_server_version
        running = (version.major, version.minor, version.patch)
        if running < FIXED_VERSION:
            log.warning(
                "nats-server %s lets two concurrent writes naming the same last sequence "
                "both through (nats-io/nats-server#4320): two nodes may then take one "
                "lease; run %s or later (`make nats-server` fetches Debian's 2.10)",
                ".".join(map(str, running)),
                ".".join(map(str, FIXED_VERSION)),
            )
        return cls(client, loop, thread, timeout, retry_seconds)

    def run(self, work: Coroutine[Any, Any, _T], seconds: float | None = None) -> _T:
        """Run ``work`` on the connection's loop and wait for its result (blocking), for
        up to ``seconds`` (twice a request's timeout if None)."""
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            return future.result(self.timeout * 2 if seconds is None else seconds)
        except TimeoutError:
            future.cancel()
            raise

    async def call(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Await ``work`` on the connection's loop from another event loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    def persist(
        self,
        work: Callable[[], Coroutine[Any, Any, _T]],
        what: str,
        seconds: float | None = None,
        attempt_seconds: float | None = None,
    ) -> _T:
        """:meth:`run` ``work()``, and again while no server answers (one died and the
        client moves to another; a stream elects a new leader; the cluster is still
        forming), for up to ``seconds`` (``retry_seconds`` if None); each attempt may
        take ``attempt_seconds`` (as :meth:`run`). A :class:`CalorError` it raises is
        not retried.

        Raises:
            UnavailableError: Still no answer after that long.
        """
        give_up = time.monotonic() + (self.retry_seconds if seconds is None else seconds)
        pause = 0.05
        while True:
            try:
                return self.run(work(), attempt_seconds)
            except CalorError:
                raise
            except (NatsError, TimeoutError, OSError) as error:
                if time.monotonic() + pause > give_up:
                    raise UnavailableError(f"could not {what} on JetStream: {error}") from error
                log.warning("nats: could not %s (%s); trying again", what, error)
                if _waited(error):
                    continue  # the try itself took its timeout
            time.sleep(pause)
            pause = min(pause * 2, _MOST_PAUSE_SECONDS)

    def key_value(self, config: KeyValueConfig, what: str) -> KeyValue:
        """The key-value bucket ``config.bucket``, made with ``config`` if it does not
        exist yet (waiting up to :data:`JOIN_SECONDS` for JetStream)."""

        async def bucket() -> KeyValue:
            try:
                return await self.js.key_value(config.bucket)
            except BucketNotFoundError:
                return await self.js.create_key_value(config)

        return self.persist(bucket, f"open the {what} bucket", JOIN_SECONDS)

    def close(self) -> None:
        """Drain and close the connection, and stop its loop."""
        try:
            self.run(self.client.drain())
        except Exception:  # closing: what is left to drain no longer matters
            log.debug("nats: drain on close failed", exc_info=True)
        _end(self._loop, self._thread)


def bucket_config(name: str, replicas: int, *, ttl: float | None = None) -> KeyValueConfig:
    """A replicated key-value bucket on disk keeping each key's last value, whose entries
    expire ``ttl`` seconds after they were written (None: never). Any of its servers
    answers a read (while its leader is being elected, too); writes go to the leader."""
    return KeyValueConfig(
        bucket=name,
        history=1,
        ttl=ttl,
        replicas=replicas,
        storage=StorageType.FILE,
        direct=True,
    )


def _waited(error: Exception) -> bool:
    """Whether a failed try took its whole timeout (no server answered in time), rather
    than failing at once (nobody listens on the subject, the connection is down)."""
    return isinstance(error, TimeoutError)  # nats' own timeouts are TimeoutErrors too


def _end(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop the connection's loop, wait for its thread, and close the loop."""
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    if not thread.is_alive():
        loop.close()
