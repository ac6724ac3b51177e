"""The one boundary where server errors become gRPC statuses."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from calor.server.errors import CalorError, ResourceExhaustedError

__all__ = ["abort_with", "rpc_errors"]

log = logging.getLogger("calor.server")

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


async def abort_with(
    context: grpc.aio.ServicerContext[Any, Any],
    error: CalorError,
    trailing: tuple[tuple[str, str], ...] = (),
) -> None:
    """End the call with the error's status; a retry delay rides in the status details,
    and ``trailing`` in the trailing metadata."""
    if isinstance(error, ResourceExhaustedError) and error.retry_after is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(error.retry_after * 1000))
        detail = error_details_pb2.RetryInfo(retry_delay=delay)
        status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=error.message)
        status.details.add().Pack(detail)
        grpc_status = rpc_status.to_status(status)
        if trailing:
            grpc_status = _with_trailing(grpc_status, trailing)
        await context.abort_with_status(grpc_status)
    await context.abort(error.code, error.message, trailing)


@dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def _with_trailing(status: grpc.Status, trailing: tuple[tuple[str, str], ...]) -> grpc.Status:
    return _Status(status.code, status.details, (*status.trailing_metadata, *trailing))


def rpc_errors(method: _F) -> _F:
    """Translate CalorError (and anything unexpected) raised by a unary RPC into a status."""

    @functools.wraps(method)
    async def wrapper(self: object, request: object, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except CalorError as error:
            await abort_with(context, error)
        except (grpc.aio.AbortError, grpc.RpcError):
            raise
        except Exception:
            log.exception("internal error in %s", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server log")

    return wrapper  # type: ignore[return-value]
