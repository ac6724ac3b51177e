"""Requests that are not what their RPC takes answer INVALID_ARGUMENT, never UNKNOWN.

Bytes that do not parse as the RPC's request message, and messages holding an enum
number their enum does not define (``Subscribe(kinds=[99])``), are refused before the
servicer runs, for unary calls and for each message of a client stream (the stream ends
at the bad message; StoreStream and Import commit nothing of it). The check is generic:
it reads the request types from the method handlers and the enum fields from their
descriptors, so a new RPC or field is covered without a line here.

gRPC decodes a request before any interceptor's behaviour sees it and turns a decoding
exception into UNKNOWN, so the deserializer here never raises: it hands an
:class:`Undecodable` on, which the layers outside pass by (access control reads only
decoded requests) and the behaviour here, the innermost, refuses.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

__all__ = ["HANDLER_KINDS", "DecodingInterceptor", "Undecodable", "enum_problem", "wrapped"]

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Context = grpc.aio.ServicerContext[Any, Any]
HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


@dataclass(frozen=True)
class Undecodable:
    """A request that is not a valid message of its RPC; ``problem`` says why."""

    problem: str


async def _pass(request: Any, context: _Context) -> None:
    return None


def _same(requests: AsyncIterator[Any], context: _Context) -> AsyncIterator[Any]:
    return requests


@asynccontextmanager
async def _no_scope(context: _Context) -> AsyncIterator[None]:
    yield


def wrapped(
    handler: grpc.RpcMethodHandler[_Req, _Resp],
    *,
    check: Callable[[Any, _Context], Awaitable[None]] = _pass,
    messages: Callable[[AsyncIterator[Any], _Context], AsyncIterator[Any]] = _same,
    scope: Callable[[_Context], AbstractAsyncContextManager[None]] = _no_scope,
    deserializer: Callable[[bytes], Any] | None = None,
    answer: Callable[[Any, _Context], Awaitable[None]] = _pass,
) -> grpc.RpcMethodHandler[_Req, _Resp]:
    """``handler`` with its behaviour wrapped: the whole call runs inside ``scope``; a
    unary request passes ``check`` first, a client stream's messages pass through
    ``messages``; each answer (a unary one, or each message of a stream) passes
    ``answer`` before it is sent; ``deserializer`` replaces the handler's when given.

    The wrapper is of the same kind as the behaviour (an async generator, or a coroutine
    for unary answers and for servicers that answer with ``context.write``), since gRPC
    serves each kind differently.
    """
    inner = cast(
        Callable[..., Any],
        handler.unary_unary
        or handler.unary_stream
        or handler.stream_unary
        or handler.stream_stream,
    )

    async def arguments(request: Any, context: _Context) -> Any:
        if handler.request_streaming:
            return messages(request, context)
        await check(request, context)
        return request

    if handler.response_streaming and inspect.isasyncgenfunction(inner):

        async def streaming(request: Any, context: _Context) -> AsyncIterator[Any]:
            async with scope(context):
                async for response in inner(await arguments(request, context), context):
                    await answer(response, context)
                    yield response

        behaviour: Callable[..., Any] = streaming
    else:

        async def answering(request: Any, context: _Context) -> Any:
            async with scope(context):
                response = await inner(await arguments(request, context), context)
                if response is not None:  # None: a servicer that wrote with context.write
                    await answer(response, context)
                return response

        behaviour = answering
    kind = HANDLER_KINDS[(handler.request_streaming, handler.response_streaming)]
    made = kind(
        behaviour,
        request_deserializer=deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    return cast("grpc.RpcMethodHandler[_Req, _Resp]", made)


def enum_problem(message: Message, path: str = "") -> str | None:
    """What is wrong with the first enum field of ``message`` (nested messages, lists and
    maps included) that holds a number its enum does not define; None when none does."""
    if not _has_enums(cast(Descriptor, message.DESCRIPTOR)):
        return None
    for field, value in message.ListFields():
        name = f"{path}{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            items = [(f"{name}[{key!r}]", item) for key, item in value.items()]
            problem = _values_problem(entry, items)
        elif field.is_repeated:
            problem = _values_problem(field, [(f"{name}[{n}]", v) for n, v in enumerate(value)])
        else:
            problem = _values_problem(field, [(name, value)])
        if problem is not None:
            return problem
    return None


def _values_problem(field: FieldDescriptor, values: list[tuple[str, Any]]) -> str | None:
    if field.enum_type is not None:
        known = field.enum_type.values_by_number
        for name, number in values:
            if number not in known:
                return f"{name}: {number} is not a {field.enum_type.full_name} value"
    elif field.message_type is not None:
        for name, value in values:
            problem = enum_problem(value, f"{name}.")
            if problem is not None:
                return problem
    return None


_ENUMS: dict[str, bool] = {}


def _has_enums(descriptor: Descriptor) -> bool:
    """Whether a message type holds an enum field, itself or in a message it holds."""
    known = _ENUMS.get(descriptor.full_name)
    if known is None:
        _ENUMS[descriptor.full_name] = False  # a type that holds itself is being looked at
        known = any(
            field.enum_type is not None
            or (field.message_type is not None and _has_enums(field.message_type))
            for field in descriptor.fields
        )
        _ENUMS[descriptor.full_name] = known
    return known


def _lenient(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``decode`` that answers an :class:`Undecodable` instead of raising."""
    kind = getattr(decode, "__self__", None)
    descriptor = getattr(kind, "DESCRIPTOR", None)
    name = descriptor.full_name if isinstance(descriptor, Descriptor) else "request message"

    def lenient(data: bytes) -> Any:
        try:
            request = decode(data)
        except DecodeError as error:
            reason = str(error).rpartition("': ")[2] or "it does not parse"
            return Undecodable(f"the request is not a valid {name}: {reason}")
        if isinstance(request, Message):
            problem = enum_problem(request)
            if problem is not None:
                return Undecodable(problem)
        return request

    return lenient


class DecodingInterceptor(grpc.aio.ServerInterceptor):
    """Refuses requests that are not valid messages of their RPC with INVALID_ARGUMENT."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return wrapped(
            handler,
            check=_refuse_undecodable,
            messages=_checked,
            deserializer=_lenient(handler.request_deserializer),
        )


async def _refuse_undecodable(request: Any, context: _Context) -> None:
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.problem)


async def _checked(requests: AsyncIterator[Any], context: _Context) -> AsyncIterator[Any]:
    """A client stream's messages; the call ends INVALID_ARGUMENT at the first bad one."""
    count = 0
    async for request in requests:
        if isinstance(request, Undecodable):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"message {count}: {request.problem}"
            )
        count += 1
        yield request
