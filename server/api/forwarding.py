"""Cluster mode: a call that reaches a node which does not own the store is forwarded to
the node that does, and its answer (messages, status, trailing metadata) passed back.

The forwarding is the innermost layer: the call has been observed, its key checked and
its request decoded here, as on any node. The caller's metadata goes along (its API key
included) with ``calor-forwarded-by`` added, so that an owner which has just lost the
store does not forward it again. Every answer of a forwarded call carries
``calor-owner`` (the owner's address) in its trailing metadata.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc

from calor.server.api.decoding import HANDLER_KINDS

__all__ = ["FORWARDED_BY", "OWNER", "ForwardingInterceptor"]

FORWARDED_BY = "calor-forwarded-by"
OWNER = "calor-owner"
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


class ForwardingInterceptor(grpc.aio.ServerInterceptor):
    """Forwards a call to ``owner()`` when it names another node (None: answer here),
    over TLS with ``credentials`` (plaintext without)."""

    def __init__(
        self,
        owner: Callable[[], str | None],
        node_id: str,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._owner = owner
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
        local = cast(
            Callable[..., Any],
            handler.unary_unary
            or handler.unary_stream
            or handler.stream_unary
            or handler.stream_stream,
        )
        streaming_out = handler.response_streaming

        if streaming_out:

            async def streaming(request: Any, context: _Context) -> AsyncIterator[Any]:
                target = self._target(context)
                if target is None:
                    async for response in local(request, context):
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
                target = self._target(context)
                if target is None:
                    return await local(request, context)
                call = self._call(target, method, handler, request, context)
                try:
                    response = await call
                except grpc.aio.AioRpcError as error:
                    await _relay_failure(error, context, target)
                context.set_trailing_metadata((*await call.trailing_metadata(), (OWNER, target)))
                return response

            behaviour = answering
        kind = HANDLER_KINDS[(handler.request_streaming, handler.response_streaming)]
        original = handler.response_serializer
        return kind(
            behaviour,
            request_deserializer=handler.request_deserializer,
            response_serializer=lambda r: r if isinstance(r, bytes) else original(r),
        )

    def _target(self, context: _Context) -> str | None:
        """Where the call goes: None to answer it here."""
        target = self._owner()
        if target is None:
            return None
        if any(key == FORWARDED_BY for key, _ in context.invocation_metadata() or ()):
            return None  # forwarded to us as the owner: answer (or refuse) here, never again
        return target

    def _call(
        self,
        target: str,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        request: Any,
        context: _Context,
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


async def _relay_failure(error: grpc.aio.AioRpcError, context: _Context, target: str) -> None:
    """End the call as the owner ended it (or as it failed to reach the owner)."""
    context.set_trailing_metadata((*(error.trailing_metadata() or ()), (OWNER, target)))
    await context.abort(error.code(), error.details() or "")
