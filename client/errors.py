"""The one error tree of the Calor client, mapped from ``grpc.RpcError`` at one boundary.

    CalorClientError              any failed call; carries ``.code`` and ``.details``
    ├── InvalidArgumentError      INVALID_ARGUMENT    bad input; nothing was changed
    ├── NotFoundError             NOT_FOUND           no such memory in this channel
    ├── AlreadyExistsError        ALREADY_EXISTS      a trigger id, or an imported memory
    │                                                 id, is taken (import: ``remap_ids``)
    ├── PermissionDeniedError     PERMISSION_DENIED   the caller's key is not granted that
    │   └── UnauthenticatedError  UNAUTHENTICATED     no API key, or one the server does not know
    ├── ResourceExhaustedError    RESOURCE_EXHAUSTED  a gate or overload; ``.retry_after``
    ├── UnavailableError          UNAVAILABLE         no server, or it is starting or stopping
    ├── DeadlineExceededError     DEADLINE_EXCEEDED   the call ran out of time (it may have
    │                                                 committed: retry with an idempotency key)
    ├── UnimplementedError        UNIMPLEMENTED       declared in the API, not built yet
    ├── OutOfRangeError           OUT_OF_RANGE        a subscription's resume point is past the
    │                                                 log's end or older than it retains;
    │                                                 ``.last_seq`` / ``.oldest_seq``
    └── ServerError               anything else       INTERNAL, UNKNOWN, FAILED_PRECONDITION, …

The clients translate every ``grpc.RpcError`` with ``raise from_rpc_error(e) from e``
(through :func:`translate_rpc_errors`), so callers catch these and never grpc's own.
Arguments the client can reject before sending (an unknown memory type) raise
:class:`InvalidArgumentError` too, as the server would.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, cast, runtime_checkable

import grpc
from google.rpc import error_details_pb2  # type: ignore[import-untyped, unused-ignore]
from grpc_status import rpc_status

__all__ = [
    "AlreadyExistsError",
    "CalorClientError",
    "DeadlineExceededError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "ServerError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "from_rpc_error",
    "translate_rpc_errors",
]


class CalorClientError(Exception):
    """Base of every error a Calor client raises.

    Attributes:
        code: The gRPC status code of the failed call.
        details: The server's message (or the client's, for a local rejection).
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidArgumentError(CalorClientError):
    """The request was malformed; nothing was changed."""


class NotFoundError(CalorClientError):
    """The named memory does not exist in the channel."""


class AlreadyExistsError(CalorClientError):
    """What the call would create exists already (a trigger id, an imported memory id)."""


class PermissionDeniedError(CalorClientError):
    """The caller's API key is not granted what the call needs (a channel, or admin)."""


class UnauthenticatedError(PermissionDeniedError):
    """The call came without an API key, or with one the server does not know (revoked).

    A kind of :class:`PermissionDeniedError`, so one ``except`` catches every refusal.
    """


class ResourceExhaustedError(CalorClientError):
    """A gate is closed or the server is overloaded.

    Attributes:
        retry_after: Seconds the server asked the caller to wait before retrying,
            from the status's ``google.rpc.RetryInfo``; None when it gave none.
    """

    def __init__(
        self, code: grpc.StatusCode, details: str, retry_after: float | None = None
    ) -> None:
        super().__init__(code, details)
        self.retry_after = retry_after


class UnavailableError(CalorClientError):
    """The server could not be reached, or is starting or shutting down."""


class DeadlineExceededError(CalorClientError):
    """The call did not finish in time; a write may still have committed."""


class UnimplementedError(CalorClientError):
    """The server does not implement this call."""


class OutOfRangeError(CalorClientError):
    """A subscription asked to resume where the server's event log cannot serve it.

    Resubscribing the same way fails the same way, so it is raised, never retried.

    Attributes:
        last_seq: The log's last sequence, when the resume point was past it (the
            server lost its log, or the number came from another server).
        oldest_seq: The oldest sequence the log retains, when retention dropped
            events after the resume point; subscribe with
            ``from_oldest_retained=True`` to continue from it, accepting the loss.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        last_seq: int | None = None,
        oldest_seq: int | None = None,
    ) -> None:
        super().__init__(code, details)
        self.last_seq = last_seq
        self.oldest_seq = oldest_seq


class ServerError(CalorClientError):
    """Any other failure: an internal error, an unknown status, a failed precondition."""


_BY_CODE: dict[grpc.StatusCode, type[CalorClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
}


@runtime_checkable
class _Call(Protocol):
    """What both ``grpc.Call`` errors and ``grpc.aio.AioRpcError`` offer."""

    def code(self) -> grpc.StatusCode: ...

    def details(self) -> str | None: ...

    def trailing_metadata(self) -> Any: ...


def from_rpc_error(err: grpc.RpcError) -> CalorClientError:
    """Translate a failed gRPC call into the client's error tree.

    Args:
        err: The error grpc raised (sync ``grpc.Call`` or ``grpc.aio.AioRpcError``).

    Returns:
        The matching :class:`CalorClientError` subclass; the caller raises it
        ``from err`` so the original stays attached.
    """
    if not isinstance(err, _Call):
        return ServerError(grpc.StatusCode.UNKNOWN, str(err) or type(err).__name__)
    code = err.code()
    details = err.details() or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ResourceExhaustedError(code, details, retry_after=_retry_after(err))
    if code == grpc.StatusCode.OUT_OF_RANGE:
        trailing = _trailing_numbers(err)
        return OutOfRangeError(
            code,
            details,
            last_seq=trailing.get(_LOG_LAST_SEQ_KEY),
            oldest_seq=trailing.get(_LOG_OLDEST_SEQ_KEY),
        )
    return _BY_CODE.get(code, ServerError)(code, details)


@contextmanager
def translate_rpc_errors() -> Iterator[None]:
    """Run a block of gRPC calls and raise any ``grpc.RpcError`` as a client error.

    It wraps awaited calls too: ``with translate_rpc_errors(): await stub.X(req)``.
    """
    try:
        yield
    except grpc.RpcError as err:
        raise from_rpc_error(err) from err


_LOG_LAST_SEQ_KEY = "calor-log-last-seq"
_LOG_OLDEST_SEQ_KEY = "calor-log-oldest-seq"


def _trailing_numbers(call: _Call) -> dict[str, int]:
    """The call's trailing metadata entries whose values are whole numbers."""
    numbers: dict[str, int] = {}
    for key, value in call.trailing_metadata() or ():
        try:
            numbers[key] = int(value)
        except (TypeError, ValueError):
            continue
    return numbers


def _retry_after(call: _Call) -> float | None:
    """The delay of the ``google.rpc.RetryInfo`` in a call's rich status, if any."""
    try:
        # from_call reads only code(), details() and trailing_metadata(), which aio
        # errors have too, though they are no grpc.Call.
        status = rpc_status.from_call(cast(grpc.Call, call))
    except ValueError:
        # The rich status disagrees with the plain one: trust neither's details.
        return None
    if status is None:
        return None
    details: Sequence[Any] = status.details
    for detail in details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return None
