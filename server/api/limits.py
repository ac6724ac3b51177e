"""What one caller may take: a request rate per key, open subscriptions per key, and the
call's deadline handed to the work it starts.

A caller is its API key (``caller.key_id()``); on a server running open, where no call
has a key, it is the peer's address, so every client of one host shares one budget.
Over the rate a call ends RESOURCE_EXHAUSTED with a ``google.rpc.RetryInfo`` saying when
a request will be let through; over the subscription cap ``Subscribe`` ends
RESOURCE_EXHAUSTED until one of the caller's streams closes. Health and reflection are
never limited.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from calor.server import deadline
from calor.server.api import caller
from calor.server.api.decoding import wrapped
from calor.server.api.rpc import abort_with
from calor.server.errors import ResourceExhaustedError
from calor.v1 import trigger_service_pb2

__all__ = ["LimitsInterceptor", "TokenBuckets", "caller_name"]

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Context = grpc.aio.ServicerContext[Any, Any]

_UNLIMITED = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_SUBSCRIBE = "/{}/Subscribe".format(
    trigger_service_pb2.DESCRIPTOR.services_by_name["TriggerService"].full_name
)
# Past this many callers tracked, the ones whose bucket has refilled are forgotten (a
# full bucket is what a caller never seen before gets anyway).
_TRACKED = 10_000


@dataclass
class _Bucket:
    tokens: float
    at: float


class TokenBuckets:
    """A token bucket per caller: ``rate`` requests a second, ``burst`` at once.

    Args:
        rate: Tokens added per second; each request takes one.
        burst: Most tokens a bucket holds (a new caller starts full); at least 1.
        clock: Seconds, monotonic (``time.monotonic``; tests pass their own).
    """

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate: {rate} is not a positive number of requests a second")
        if not (math.isfinite(burst) and burst >= 1):
            raise ValueError(f"burst: {burst} is not at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, name: str) -> float | None:
        """Take a token for ``name``'s request: None when it may go on, else the seconds
        until a token is there."""
        now = self._clock()
        bucket = self._buckets.get(name)
        if bucket is None:
            if len(self._buckets) >= _TRACKED:
                self._forget_full(now)
            bucket = self._buckets[name] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        return (1 - bucket.tokens) / self.rate

    def _forget_full(self, now: float) -> None:
        full = [
            name
            for name, bucket in self._buckets.items()
            if bucket.tokens + (now - bucket.at) * self.rate >= self.burst
        ]
        for name in full:
            del self._buckets[name]


def caller_name(context: _Context) -> str:
    """Whose budget a call spends: its key id, or on an open server the peer's host."""
    key = caller.key_id()
    if key:
        return f"key {key}"
    peer = context.peer() or "unknown"
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return f"peer {address.rpartition(':')[0] or address}"  # the host, not the port
    return f"peer {peer}"


class _Once:
    """A function that runs the first time it is called, and never again."""

    def __init__(self, function: Callable[[], None]) -> None:
        self._function: Callable[[], None] | None = function

    def __call__(self) -> None:
        function, self._function = self._function, None
        if function is not None:
            function()


class LimitsInterceptor(grpc.aio.ServerInterceptor):
    """Rates and subscription caps per caller, and each call's deadline made readable
    (:mod:`calor.server.deadline`) to the work it starts.

    Args:
        rate: Requests a second one caller may make; 0 means no limit.
        burst: Requests a caller may make at once; 0 means one second's worth (at least 1).
        max_subscriptions: Subscribe streams one caller may hold open; 0 means no limit.
        max_answer_bytes: The largest answer message the server sends (gRPC's send
            limit); a larger one ends the call RESOURCE_EXHAUSTED here, saying so, where
            every layer outside sees it. 0 means no limit.
    """

    def __init__(
        self,
        rate: float = 0.0,
        burst: float = 0.0,
        max_subscriptions: int = 0,
        max_answer_bytes: int = 0,
    ) -> None:
        self.buckets = TokenBuckets(rate, burst or max(1.0, rate)) if rate > 0 else None
        self.max_subscriptions = max_subscriptions
        self.max_answer_bytes = max_answer_bytes
        self.subscriptions: dict[str, int] = {}
        """Open Subscribe streams by caller."""
        self.open_calls = 0
        """Calls let through that have not ended (answered, failed or given up on)."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(_UNLIMITED):
            return handler
        subscribing = method == _SUBSCRIBE and self.max_subscriptions > 0

        @asynccontextmanager
        async def limited(context: _Context) -> AsyncIterator[None]:
            self.open_calls += 1
            try:
                async with self._limited(context, subscribing):
                    yield
            finally:
                self.open_calls -= 1

        return wrapped(handler, scope=limited, answer=self._check_answer)

    async def _check_answer(self, response: Any, context: _Context) -> None:
        """End the call RESOURCE_EXHAUSTED if its answer is larger than the server sends
        (gRPC would refuse it too, after every layer had seen the call succeed)."""
        if not self.max_answer_bytes or not isinstance(response, Message):
            return
        size = response.ByteSize()
        if size > self.max_answer_bytes:
            message = (
                f"the answer is {size} bytes, over this server's limit of "
                f"{self.max_answer_bytes} (--max-message-bytes); ask for less at a time"
            )
            await abort_with(context, ResourceExhaustedError(message))

    @asynccontextmanager
    async def _limited(self, context: _Context, subscribing: bool) -> AsyncIterator[None]:
        """One call within its caller's rate (and subscription cap), with its deadline."""
        deadline.set_deadline(context.time_remaining())
        name = caller_name(context)
        await self._take_token(context, name)
        if not subscribing:
            yield
            return
        held = self.subscriptions.get(name, 0)
        if held >= self.max_subscriptions:
            await abort_with(
                context,
                ResourceExhaustedError(
                    f"{name} holds {held} open subscriptions, the most allowed; close one "
                    "before subscribing again"
                ),
            )
        self.subscriptions[name] = held + 1
        # Released when the stream ends, whichever way: the servicer's end, or the call's
        # (a client that goes away).
        release = _Once(lambda: self._release(name))
        # (The stubs type the callback as a class of their own; any callable does.)
        context.add_done_callback(lambda _context: release())  # type: ignore[arg-type]
        try:
            yield
        finally:
            release()

    async def _take_token(self, context: _Context, name: str) -> None:
        """End the call RESOURCE_EXHAUSTED, with when to retry, if its caller is over
        its rate."""
        if self.buckets is None:
            return
        wait = self.buckets.take(name)
        if wait is not None:
            message = (
                f"{name} is over its rate of {self.buckets.rate:g} requests a second; "
                f"retry in {wait:.3g} s"
            )
            await abort_with(context, ResourceExhaustedError(message, retry_after=wait))

    def _release(self, name: str) -> None:
        left = self.subscriptions.get(name, 1) - 1
        if left > 0:
            self.subscriptions[name] = left
        else:
            self.subscriptions.pop(name, None)
