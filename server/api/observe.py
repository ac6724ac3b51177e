"""Observation of every call: metrics per RPC and status, and one request log line each.

The outermost interceptor, so what access control and the limits refuse is counted and
logged too. A call is measured from the moment its handler starts to the moment it
ends (a stream when it ends), and reported once with its final status. The log line
names the RPC, the status, the milliseconds, the channel the request names (if it
names one) and the id of the caller's key; never the key, a text or a query.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from google.protobuf.message import Message

from calor.server import stages
from calor.server.api import caller
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.metrics import Metrics, ServerCounts, data_bytes
from calor.v1 import memory_service_pb2 as pb

__all__ = ["Observer", "counts_reader"]

log = logging.getLogger("calor.request")

_Context = grpc.aio.ServicerContext[Any, Any]
if TYPE_CHECKING:  # generic only in the type stubs
    _Handler = grpc.RpcMethodHandler[Any, Any]
_QUIET_SERVICES = ("grpc.health.v1.Health/", "grpc.reflection.")
_SERVER_FAULTS = frozenset({"UNKNOWN", "INTERNAL", "DATA_LOSS", "UNAVAILABLE"})


_OPERATIONS = {  # the GenAI memory operation each RPC is
    "calor.v1.MemoryService/Store": "create_memory",
    "calor.v1.MemoryService/StoreStream": "create_memory",
    "calor.v1.MemoryService/Import": "create_memory",
    "calor.v1.MemoryService/Share": "create_memory",
    "calor.v1.MemoryService/Recall": "search_memory",
    "calor.v1.MemoryService/Context": "search_memory",
    "calor.v1.MemoryService/Update": "update_memory",
    "calor.v1.MemoryService/Boost": "update_memory",
    "calor.v1.MemoryService/Keystone": "update_memory",
    "calor.v1.MemoryService/Connect": "update_memory",
    "calor.v1.MemoryService/Forget": "delete_memory",
    "calor.v1.MemoryService/DropChannel": "delete_memory_store",
}


def _records(response: object) -> int | None:
    """How many memory records an answer returned, created or deleted, if it says."""
    match response:
        case pb.StoreResponse() | pb.ShareResponse():
            return 1
        case pb.StoreStreamResponse() | pb.ImportResponse():
            return len(response.ids)
        case pb.RecallResponse():
            return len(response.hits)
        case pb.ContextResponse():
            return len(response.items)
        case pb.ForgetResponse():
            return response.forgotten
        case pb.DropChannelResponse():
            return response.dropped
    return None


class Observer(grpc.aio.ServerInterceptor):
    """Counts, times and logs every call that reaches a handler."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED itself
        method = handler_call_details.method.lstrip("/")
        return _wrapped(handler, lambda: _Call(self._metrics, method))


class _Call:
    """One call being observed: when it began, the channel it names, how it ended."""

    def __init__(self, metrics: Metrics, method: str) -> None:
        self._metrics = metrics
        self.method = method
        self.channel = ""
        self._started = time.perf_counter()
        self.stopwatch, _ = stages.start()

    def saw(self, request: object) -> None:
        """Note the channel a request message names (the first one that names one)."""
        if not self.channel and isinstance(request, Message):
            self.channel = _channel_of(request)

    def ended(self, context: _Context, response: object) -> None:
        """The handler returned: OK, unless it set another code without raising."""
        code = context.code()
        self._report(code.name if code is not None else "OK", response)

    def failed(self, context: _Context, error: BaseException) -> None:
        """The handler raised: the status it aborted with, or what gRPC answers instead."""
        code = context.code()
        if code is not None and code != grpc.StatusCode.OK:
            name = code.name
        elif isinstance(error, Exception):
            name = "UNKNOWN"  # what gRPC answers for an exception a handler let out
        else:  # cancelled: by the client, or by its deadline
            remaining = context.time_remaining()
            name = "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
        self._report(name, None)

    def _report(self, code: str, response: object) -> None:
        seconds = time.perf_counter() - self._started
        self._metrics.call(self.method, code, seconds)
        if code == "OK":
            self._metrics.stages(self.method, self.stopwatch.seconds)
        operation = _OPERATIONS.get(self.method)
        if operation is not None:
            self._metrics.operation(operation, seconds, "" if code == "OK" else code)
            records = _records(response)
            if records is not None:
                self._metrics.record_count(operation, records)
        if isinstance(response, pb.RecallResponse) and response.hits:
            self._metrics.recall(max(hit.similarity for hit in response.hits))
        self._log(code, seconds)

    def _log(self, code: str, seconds: float) -> None:
        quiet = self.method.startswith(_QUIET_SERVICES) and code == "OK"
        level = (
            logging.DEBUG if quiet else logging.WARNING if code in _SERVER_FAULTS else logging.INFO
        )
        if not log.isEnabledFor(level):
            return
        fields: dict[str, object] = {"rpc": self.method, "status": code}
        fields["ms"] = round(seconds * 1000, 3)
        if self.channel:
            fields["channel"] = self.channel
        fields["key_id"] = caller.key_id()
        log.log(level, "request", extra={"fields": fields})


def _channel_of(request: Message) -> str:
    """The channel a request names: its own ``channel`` field, or that of the message it
    carries (a streamed store's ``store``, a new trigger); "" when it names none."""
    channel = getattr(request, "channel", None)
    if isinstance(channel, str):
        return channel
    for descriptor, value in request.ListFields():
        if descriptor.message_type is not None and isinstance(value, Message):
            inner = getattr(value, "channel", None)
            if isinstance(inner, str) and inner:
                return inner
    return ""


def _wrapped(handler: _Handler, begin: Callable[[], _Call]) -> _Handler:
    """The same handler, with each call observed from start to end."""
    deserialize, serialize = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _unary(handler.unary_unary, begin, stream_in=False), deserialize, serialize
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _unary(handler.stream_unary, begin, stream_in=True), deserialize, serialize
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _streaming(handler.unary_stream, begin, stream_in=False), deserialize, serialize
        )
    assert handler.stream_stream is not None  # a handler has one of the four kinds
    return grpc.stream_stream_rpc_method_handler(
        _streaming(handler.stream_stream, begin, stream_in=True), deserialize, serialize
    )


def _tap(requests: AsyncIterator[object], call: _Call) -> AsyncIterator[object]:
    async def tapped() -> AsyncIterator[object]:
        async for message in requests:
            call.saw(message)
            yield message

    return tapped()


def _unary(
    inner: Callable[..., Any], begin: Callable[[], _Call], stream_in: bool
) -> Callable[[Any, _Context], Awaitable[Any]]:
    async def behaviour(request: Any, context: _Context) -> Any:
        call = begin()
        if stream_in:
            request = _tap(request, call)
        else:
            call.saw(request)
        try:
            response = inner(request, context)
            if inspect.isawaitable(response):
                response = await response
        except BaseException as error:
            call.failed(context, error)
            raise
        call.ended(context, response)
        return response

    return behaviour


def _streaming(
    inner: Callable[..., Any], begin: Callable[[], _Call], stream_in: bool
) -> Callable[[Any, _Context], AsyncIterator[Any]]:
    async def behaviour(request: Any, context: _Context) -> AsyncIterator[Any]:
        call = begin()
        if stream_in:
            request = _tap(request, call)
        else:
            call.saw(request)
        try:
            responses = inner(request, context)
            if inspect.isawaitable(responses):
                await responses  # a handler that writes through ``context.write``
            else:
                try:
                    async for response in responses:
                        yield response
                finally:
                    close = getattr(responses, "aclose", None)
                    if close is not None:
                        await close()  # its own clean-up (a subscriber leaving) runs now
        except BaseException as error:
            call.failed(context, error)
            raise
        call.ended(context, None)

    return behaviour


class _Hub(Protocol):
    """What the counts read of the subscription hub."""

    @property
    def subscriber_count(self) -> int: ...

    dropped: int


def counts_reader(
    engine: MemoryEngine, last_seq: Callable[[], int], hub: _Hub, data_dir: Path
) -> Callable[[], ServerCounts]:
    """What the server holds, read from the counts its parts keep (for metrics and
    ``ServerStatus``); blocking (it walks the data directory), so run it off the loop."""

    def counts() -> ServerCounts:
        channels, states = engine.channels.census()
        return ServerCounts(
            channels=channels,
            memories_by_state=states,
            last_seq=last_seq(),
            subscribers=hub.subscriber_count,
            dropped_subscribers=hub.dropped,
            data_bytes=data_bytes(data_dir),
        )

    return counts
