"""Cluster mode: a call is answered by the node that owns its channel's shard. One this
node serves is answered here; another is forwarded to its owner, and the answer
(messages, status, trailing metadata) passed back.

The routing is the innermost layer: the call has been observed, its key checked and its
request decoded here, as on any node. The caller's metadata goes along (its API key
included) with ``calor-forwarded-by`` added, so that an owner which has just lost the
shard does not forward it again. Every answer of a forwarded call carries
``calor-owner`` (the owner's address) in its trailing metadata.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import grpc

from calor.server.api.decoding import HANDLER_KINDS
from calor.server.api.routing import GATHERED
from calor.server.api.rpc import abort_with
from calor.server.errors import CalorError, FailedPreconditionError

__all__ = [
    "FORWARDED_BY",
    "OWNER",
    "SHARD",
    "Fanout",
    "ForwardingInterceptor",
    "Gather",
    "Place",
]

FORWARDED_BY = "calor-forwarded-by"
OWNER = "calor-owner"
SHARD = "calor-shard"
"""The shard a call is asked of, in a call to that shard's owner (a fan-out to every
shard, or a gather of other shards' answers)."""
_Context = grpc.aio.ServicerContext[Any, Any]
_DROPPED = ("user-agent", "grpc-", ":")
# The channel's call of each kind, by (request streaming, response streaming).
_CALL_KINDS = {
    (False, False): "unary_unary",
    (False, True): "unary_stream",
    (True, False): "stream_unary",
    (True, True): "stream_stream",
}


def _serialize(message: Any) -> bytes:
    return cast(bytes, message.SerializeToString())


@dataclass(frozen=True)
class Fanout:
    """A call every shard answers: each shard's owner (this node's own address for a
    shard it serves) is asked, and ``merge`` makes one reply of the answers that were
    not NOT_FOUND (serialized)."""

    targets: tuple[tuple[int, str], ...]
    merge: Callable[[list[bytes]], Any]


@dataclass(frozen=True)
class Gather:
    """A call answered here with what other shards add: each of ``targets`` (shard,
    owner address) is asked ``asked`` at once (a call of ``method``, the call's own if
    empty), then ``local`` answers the call with their answers (serialized) in
    :data:`~calor.server.api.routing.GATHERED`. ``metadata``, if given, makes metadata
    to ask them with (a failure leaves it out)."""

    targets: tuple[tuple[int, str], ...]
    asked: Any
    local: Callable[..., Any]
    method: str = ""
    metadata: Callable[[], Awaitable[list[tuple[str, bytes]]]] | None = None


Place = Callable[[str, Any, bool, int | None], Callable[..., Any] | str | Fanout | Gather]
"""Where a call goes, from its method, its (first) request, whether another node
forwarded it here, and the shard it was asked of (a fanned-out call): the behaviour that
answers it here, the address of the node that does, every shard's, or this node's with
others' answers. A :class:`CalorError` refuses the call."""


class ForwardingInterceptor(grpc.aio.ServerInterceptor):
    """Answers each call where ``place`` says: here, or forwarded to another node over
    TLS with ``credentials`` (plaintext without). The messages of a request stream must
    all have its first one's ``key`` (they go to one shard)."""

    def __init__(
        self,
        place: Place,
        key: Callable[[str, Any], object],
        node_id: str,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._place = place
        self._key = key
        self._node_id = node_id
        self._credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or handler.request_deserializer is None or method.startswith("/grpc."):
            return handler  # health and reflection: every node answers for itself
        where = partial(self._where, method, handler.request_streaming)

        if handler.response_streaming:

            async def streaming(request: Any, context: _Context) -> AsyncIterator[Any]:
                request, target = await where(request, context)
                assert not isinstance(target, Fanout | Gather)  # unary calls only
                if not isinstance(target, str):
                    async for response in target(request, context):
                        yield response
                    return
                call = self._call(target, method, handler, request, context)
                try:
                    async for response in call:
                        yield response
                except grpc.aio.AioRpcError as error:
                    await _relay_failure(error, context, target)
                context.set_trailing_metadata((*await call.trailing_metadata(), (OWNER, target)))

            behaviour: Callable[..., Any] = streaming
        else:

            async def answering(request: Any, context: _Context) -> Any:
                request, target = await where(request, context)
                response = await self._answer(target, method, handler, request, context)
                await _refuse_unalike(request, context)
                return response

            behaviour = answering
        kind = HANDLER_KINDS[(handler.request_streaming, handler.response_streaming)]
        original = handler.response_serializer
        return kind(
            behaviour,
            request_deserializer=handler.request_deserializer,
            response_serializer=lambda r: r if isinstance(r, bytes) else original(r),
        )

    async def _answer(
        self,
        target: Callable[..., Any] | str | Fanout | Gather,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        request: Any,
        context: _Context,
    ) -> Any:
        """A call with one response, answered where ``target`` says."""
        if isinstance(target, Fanout):
            return await self._fan_out(target, method, handler, request, context)
        if isinstance(target, Gather):
            return await self._gather(target, method, handler, request, context)
        if not isinstance(target, str):
            return await target(request, context)
        call = self._call(target, method, handler, request, context)
        try:
            response = await call
        except grpc.aio.AioRpcError as error:
            await _relay_failure(error, context, target)
        context.set_trailing_metadata((*await call.trailing_metadata(), (OWNER, target)))
        return response

    async def _fan_out(
        self,
        fanout: Fanout,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        request: Any,
        context: _Context,
    ) -> Any:
        """Ask every shard's owner at once, and merge what they answer."""
        answers = await self._ask(fanout.targets, method, handler, request, context, True)
        try:
            return fanout.merge(answers)
        except CalorError as error:
            await abort_with(context, error)
            raise  # not reached: abort raises

    async def _gather(
        self,
        gather: Gather,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        request: Any,
        context: _Context,
    ) -> Any:
        """Ask the other shards' owners at once, then answer here with what they said;
        a shard that cannot answer fails the call as it failed."""
        extra: list[tuple[str, bytes]] = []
        if gather.metadata is not None:
            try:
                extra = await gather.metadata()
            except CalorError:  # the call itself will say what is wrong with it
                extra = []
        asked, targets = gather.asked, gather.targets
        answers = await self._ask(
            targets, gather.method or method, handler, asked, context, False, extra
        )
        gathered = GATHERED.set(tuple(answers))
        try:
            return await gather.local(request, context)
        finally:
            GATHERED.reset(gathered)

    async def _ask(
        self,
        targets: tuple[tuple[int, str], ...],
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        request: Any,
        context: _Context,
        missing_ok: bool,
        extra: list[tuple[str, bytes]] | None = None,
    ) -> list[bytes]:
        """Each target's answer to ``request`` (shard, owner address), asked at once; the
        call ends as the first target's failure did (NOT_FOUND left out if
        ``missing_ok``)."""
        calls = [
            self._call(address, method, handler, request, context, shard, extra)
            for shard, address in targets
        ]
        answers: list[bytes] = []
        for (_, address), answer in zip(
            targets, await asyncio.gather(*calls, return_exceptions=True), strict=True
        ):
            if isinstance(answer, grpc.aio.AioRpcError):
                if not missing_ok or answer.code() != grpc.StatusCode.NOT_FOUND:
                    await _relay_failure(answer, context, address)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                answers.append(answer)
        return answers

    async def _where(
        self, method: str, streaming_in: bool, request: Any, context: _Context
    ) -> tuple[Any, Callable[..., Any] | str | Fanout | Gather]:
        """The request (a stream's first message put back) and where the call goes."""
        first = request
        if streaming_in:
            first, request = await _peek(request)
        metadata = dict(context.invocation_metadata() or ())
        forwarded = FORWARDED_BY in metadata
        asked = str(metadata.get(SHARD, ""))
        shard = int(asked) if forwarded and asked.isdigit() else None
        try:
            target = self._place(method, first, forwarded, shard)
        except CalorError as error:
            await abort_with(context, error)
            raise  # not reached: abort raises
        if streaming_in and first is not None:
            request = _Alike(request, partial(self._key, method), self._key(method, first))
        return request, target

    def _call(
        self,
        target: str,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        request: Any,
        context: _Context,
        shard: int | None = None,
        extra: list[tuple[str, bytes]] | None = None,
    ) -> Any:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = (
                grpc.aio.insecure_channel(target)
                if self._credentials is None
                else grpc.aio.secure_channel(target, self._credentials)
            )
        metadata = [
            (key, value)
            for key, value in context.invocation_metadata() or ()
            if not key.startswith(_DROPPED)
        ]
        metadata.append((FORWARDED_BY, self._node_id))
        if shard is not None:
            metadata.append((SHARD, str(shard)))
        metadata += extra or []
        remaining = context.time_remaining()
        timeout = remaining if remaining is not None and remaining < 1e6 else None
        kind = _CALL_KINDS[(handler.request_streaming, handler.response_streaming)]
        make: Callable[..., Any] = getattr(channel, kind)
        stub = make(method, request_serializer=_serialize, response_deserializer=None)
        return stub(request, metadata=metadata, timeout=timeout)

    async def close(self) -> None:
        """Close the channels to other nodes."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


class _Alike:
    """A request stream whose messages all have its first one's key: it ends at the first
    that does not, and ``refused`` says why."""

    def __init__(
        self, requests: AsyncIterator[Any], key: Callable[[Any], object], first: object
    ) -> None:
        self._requests = requests
        self._key = key
        self._first = first
        self.refused: CalorError | None = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Any]:
        async for request in self._requests:
            try:
                alike = self._key(request) == self._first
            except CalorError as error:
                self.refused = error
                return
            if not alike:
                self.refused = FailedPreconditionError(
                    "a stream's messages must all name channels of one shard, the first "
                    "one's; the messages before this one were taken"
                )
                return
            yield request


async def _refuse_unalike(request: Any, context: _Context) -> None:
    """End the call with why its request stream was cut short, if it was."""
    if isinstance(request, _Alike) and request.refused is not None:
        await abort_with(context, request.refused)


async def _peek(requests: AsyncIterator[Any]) -> tuple[Any, AsyncIterator[Any]]:
    """A request stream's first message (None for an empty stream), and the whole
    stream again."""
    first = await anext(aiter(requests), None)

    async def again() -> AsyncIterator[Any]:
        if first is not None:
            yield first
        async for request in requests:
            yield request

    return first, again()


async def _relay_failure(error: grpc.aio.AioRpcError, context: _Context, target: str) -> None:
    """End the call as the owner ended it (or as it failed to reach the owner)."""
    context.set_trailing_metadata((*(error.trailing_metadata() or ()), (OWNER, target)))
    await context.abort(error.code(), error.details() or "")
