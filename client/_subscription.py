"""Subscriptions that survive their streams: resume after the last event, back off, retry.

A ``Subscribe`` stream ends with RESOURCE_EXHAUSTED when the subscriber fell too far
behind and with UNAVAILABLE when the server shuts down (or cannot be reached). Both
are resumable: the server's log still holds what the subscriber missed, so asking
again with ``after_seq`` set to the last event the caller received continues the
stream without a gap. :class:`Resumer` keeps that sequence number and decides, after
each failure, whether and when to ask again (by default for as long as it takes,
with jittered exponential backoff); :class:`EventStream` is the blocking iterator
that the sync client returns (the async client runs the same :class:`Resumer` in an
async generator). OUT_OF_RANGE (the log cannot serve the resume point) and every
other status are raised, never retried.

The resume point is the last event handed to the caller, counted here, not the
``calor-last-seq`` trailing metadata the server sends: what the client received is
what matters, and a stream cut by the network carries no metadata at all. The
metadata is only compared, and a disagreement logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, Self

import grpc

from calor.client.errors import ResourceExhaustedError, from_rpc_error
from calor.v1 import trigger_service_pb2

__all__ = [
    "BACKOFF",
    "LAST_SEQ_KEY",
    "AsyncEventStream",
    "Backoff",
    "EventStream",
    "Resumer",
    "server_last_seq",
]

log = logging.getLogger("calor.client.subscribe")

LAST_SEQ_KEY = "calor-last-seq"
"""The trailing metadata key in which the server names the last sequence it delivered."""

# CANCELLED that reaches here came from the server's side (a server stopping cancels the
# streams still open when its grace ends): a call this client cancels ends the stream
# before it is asked to resume.
_RESUMABLE = frozenset(
    {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
)


@dataclass(frozen=True)
class Backoff:
    """How patiently a subscription resumes.

    The default retries for ever: a subscription outlives any outage until its caller
    stops it, and the random share of each wait keeps many clients from reconnecting
    to a restarted server in one burst.

    Attributes:
        initial: Seconds to wait before the first resubscription after a failure.
        maximum: The longest wait; each consecutive failure doubles it up to this.
        attempts: Consecutive failures tolerated, the next one being raised; None
            retries for ever.
        reset_after: A stream that stayed open this many seconds counts as having
            recovered, even if it delivered nothing (a quiet filter), so that rare
            restarts hours apart never add up to a give-up.
        jitter: The share of each wait drawn at random: a wait is between
            ``(1 - jitter)`` and 1 times the doubled delay. 0 waits exactly.
    """

    initial: float = 0.2
    maximum: float = 10.0
    attempts: int | None = None
    reset_after: float = 10.0
    jitter: float = 0.5

    def delay(self, failures: int, draw: Callable[[], float] = random.random) -> float:
        """The wait after the ``failures``-th consecutive failure (counting from 1).

        Args:
            failures: Consecutive failures so far, at least 1.
            draw: A number in [0, 1): the random part (a test passes its own).
        """
        doublings = min(max(failures - 1, 0), 64)  # past 64 the cap holds anyway
        ceiling = min(self.maximum, self.initial * 2.0**doublings)
        return float(ceiling * (1.0 - self.jitter * draw()))


BACKOFF = Backoff()
"""The policy of every subscription (read when a subscription starts)."""


def _status(err: grpc.RpcError) -> tuple[grpc.StatusCode | None, str, Any]:
    """The code, details and trailing metadata of a failed call, when it has them."""
    code = getattr(err, "code", None)
    details = getattr(err, "details", None)
    trailing = getattr(err, "trailing_metadata", None)
    return (
        code() if callable(code) else None,
        (details() if callable(details) else None) or "",
        trailing() if callable(trailing) else None,
    )


def server_last_seq(metadata: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    """The ``calor-last-seq`` value in (trailing) metadata, if present and a number."""
    for key, value in metadata or ():
        if key == LAST_SEQ_KEY:
            try:
                return int(value)
            except ValueError:
                return None
    return None


class Resumer:
    """One subscription's state across its calls: the resume point and the failures.

    Args:
        request: The filter and the starting ``after_seq``.
        resume: Whether to resubscribe after a resumable failure at all.
        backoff: The waiting policy; None means :data:`BACKOFF`.
    """

    def __init__(
        self,
        request: trigger_service_pb2.SubscribeRequest,
        *,
        resume: bool = True,
        backoff: Backoff | None = None,
    ) -> None:
        self._request = request
        self._resume = resume
        self._backoff = BACKOFF if backoff is None else backoff
        self.last_seq: int = request.after_seq
        """The sequence number of the last event handed over (or the starting one)."""
        self.failures = 0
        """Consecutive failed streams since the last sign of health."""
        self._opened_at = time.monotonic()

    def request(self) -> trigger_service_pb2.SubscribeRequest:
        """The request for the next call: the filter, after the last event handed over.

        ``from_oldest_retained`` is kept only until an event arrives: after that a
        gap is a loss the caller must hear about, not skip.
        """
        request = trigger_service_pb2.SubscribeRequest()
        request.CopyFrom(self._request)
        request.after_seq = self.last_seq
        request.from_oldest_retained = (
            self._request.from_oldest_retained and self.last_seq == self._request.after_seq
        )
        return request

    @property
    def starting(self) -> bool:
        """Whether the stream is from now and the server has not said where it starts."""
        return self._request.from_now

    def opened(self) -> None:
        """Note that a call was just made."""
        self._opened_at = time.monotonic()

    def accept(self, response: trigger_service_pb2.SubscribeResponse) -> bool:
        """Whether to hand the response's event over; an event at or before the resume
        point is not, nor the first answer of a stream from now (no event: where it
        starts, which becomes the resume point).

        An accepted event moves the resume point and clears the failure count.
        """
        if not response.HasField("event"):
            self._request.from_now = False
            self._request.after_seq = self.last_seq = response.start_seq
            return False
        event = response.event
        if event.seq <= self.last_seq:
            return False
        self.last_seq = event.seq
        self.failures = 0
        return True

    def retry_delay(self, err: grpc.RpcError) -> float | None:
        """Seconds to wait before resubscribing after ``err``; None to raise it instead.

        RESOURCE_EXHAUSTED waits as long as the server's ``RetryInfo`` asks (capped
        at the backoff's maximum), else like UNAVAILABLE: ``initial`` doubling up to
        ``maximum``, jittered. Any other status (OUT_OF_RANGE among them), resuming
        turned off, or more than ``attempts`` consecutive failures gives None.
        """
        code, details, trailing = _status(err)
        if not self._resume or code not in _RESUMABLE:
            return None
        if time.monotonic() - self._opened_at >= self._backoff.reset_after:
            self.failures = 0
        self.failures += 1
        limit = self._backoff.attempts
        if limit is not None and self.failures > limit:
            log.warning(
                "subscription failed again after %d retries (%s: %s); giving up",
                limit,
                code.name if code else "?",
                details,
            )
            return None
        error = from_rpc_error(err)
        if isinstance(error, ResourceExhaustedError) and error.retry_after is not None:
            delay = min(max(error.retry_after, 0.0), self._backoff.maximum)
        else:
            delay = self._backoff.delay(self.failures)
        claimed = server_last_seq(trailing)
        if claimed is not None and claimed != self.last_seq:
            log.warning(
                "server says it delivered up to seq %d, the client received up to %d",
                claimed,
                self.last_seq,
            )
        log.log(
            logging.INFO if code == grpc.StatusCode.RESOURCE_EXHAUSTED else logging.WARNING,
            "subscription ended (%s: %s); resubscribing after seq %d in %.1f s (attempt %d%s)",
            code.name if code else "?",
            details,
            self.last_seq,
            delay,
            self.failures,
            "" if limit is None else f" of {limit}",
        )
        return delay


class _StreamCall(Protocol):
    """What the sync client needs of a server-streaming call."""

    def __next__(self) -> trigger_service_pb2.SubscribeResponse: ...

    def cancel(self) -> bool: ...


class EventStream(Iterator[trigger_service_pb2.Event]):
    """The events of one subscription, each once and in order, across resubscriptions.

    Iterate it (blocking until the next event); :meth:`close` it, or leave a
    ``with`` block, to end it: that cancels the call underneath. :meth:`close` may
    be called from another thread, which ends a ``for`` loop blocked on the stream.
    A failure that is not resumed (or no longer) is raised from the iteration as a
    :class:`~calor.client.errors.CalorClientError`; after that, or after
    :meth:`close`, the iteration is over.

    Args:
        open_call: Starts one ``Subscribe`` call for a request.
        resumer: The subscription's resume point and retry policy.
    """

    def __init__(
        self,
        open_call: Callable[[trigger_service_pb2.SubscribeRequest], _StreamCall],
        resumer: Resumer,
    ) -> None:
        self._open = open_call
        self._resumer = resumer
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._call: _StreamCall | None = None

    @property
    def last_seq(self) -> int:
        """The sequence number of the last event yielded: pass it as ``after_seq`` later."""
        return self._resumer.last_seq

    @property
    def closed(self) -> bool:
        """Whether the stream has ended (closed, or failed for good)."""
        return self._closed.is_set()

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> trigger_service_pb2.Event:
        while True:
            response = self._response()
            if self._resumer.accept(response):
                return response.event

    def start(self) -> Self:
        """Open the call now and wait until the server says where the stream starts
        (a stream from now: every event logged after this returns is delivered);
        StopIteration when the stream ended first."""
        while self._resumer.starting:
            self._resumer.accept(self._response())
        return self

    def _response(self) -> trigger_service_pb2.SubscribeResponse:
        """The next answer of the subscription, resubscribing as the policy allows."""
        while True:
            call = self._current()
            try:
                return next(call)
            except StopIteration:  # the server ended the stream cleanly: so do we
                self.close()
                raise
            except grpc.RpcError as err:
                self._forget(call)
                if self._closed.is_set():  # cancelled by close()
                    raise StopIteration from None
                delay = self._resumer.retry_delay(err)
                if delay is None:
                    self.close()
                    raise from_rpc_error(err) from err
                if self._closed.wait(delay):
                    raise StopIteration from None

    def _current(self) -> _StreamCall:
        """The open call, made now if there is none; StopIteration once closed."""
        with self._lock:
            if self._closed.is_set():
                raise StopIteration
            if self._call is None:
                self._call = self._open(self._resumer.request())
                self._resumer.opened()
            return self._call

    def _forget(self, call: _StreamCall) -> None:
        with self._lock:
            if self._call is call:
                self._call = None

    def close(self) -> None:
        """End the subscription and cancel its call; safe from any thread, and twice."""
        with self._lock:
            self._closed.set()
            call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _AsyncStreamCall(Protocol):
    """What the async client needs of a server-streaming call."""

    def __aiter__(self) -> AsyncIterator[trigger_service_pb2.SubscribeResponse]: ...

    def cancel(self) -> bool: ...


class AsyncEventStream(AsyncIterator[trigger_service_pb2.Event]):
    """:class:`EventStream` for asyncio: iterate it with ``async for``; ``aclose()``
    cancels the call underneath.

    A stream from now starts when it is awaited (``events = await calor.subscribe()``:
    every event logged after that is delivered) or, not awaited, at its first
    ``anext``.

    Args:
        open_call: Starts one ``Subscribe`` call for a request.
        resumer: The subscription's resume point and retry policy.
    """

    def __init__(
        self,
        open_call: Callable[[trigger_service_pb2.SubscribeRequest], _AsyncStreamCall],
        resumer: Resumer,
    ) -> None:
        self._open = open_call
        self._resumer = resumer
        self._call: _AsyncStreamCall | None = None
        self._responses: AsyncIterator[trigger_service_pb2.SubscribeResponse] | None = None
        self._closed = False

    @property
    def last_seq(self) -> int:
        """The sequence number of the last event yielded: pass it as ``after_seq`` later."""
        return self._resumer.last_seq

    def __await__(self) -> Generator[Any, None, Self]:
        return self.start().__await__()

    async def start(self) -> Self:
        """Open the call now and wait until the server says where a stream from now
        starts; StopAsyncIteration when the stream ended first."""
        while self._resumer.starting:
            self._resumer.accept(await self._response())
        return self

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> trigger_service_pb2.Event:
        while True:
            response = await self._response()
            if self._resumer.accept(response):
                return response.event

    async def _response(self) -> trigger_service_pb2.SubscribeResponse:
        """The next answer, resubscribing as the policy allows."""
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._responses is None:
                self._call = self._open(self._resumer.request())
                self._responses = self._call.__aiter__()
                self._resumer.opened()
            try:
                return await anext(self._responses)
            except StopAsyncIteration:  # the server ended the stream cleanly
                await self.aclose()
                raise
            except grpc.RpcError as err:
                self._drop_call()
                delay = self._resumer.retry_delay(err)
                if delay is None:
                    await self.aclose()
                    raise from_rpc_error(err) from err
            await asyncio.sleep(delay)

    def _drop_call(self) -> None:
        if self._call is not None:
            self._call.cancel()
        self._call, self._responses = None, None

    async def aclose(self) -> None:
        """End the subscription and cancel its call; safe twice."""
        self._closed = True
        self._drop_call()
