"""The Python client of Calor: ``CalorClient``, ``AsyncCalorClient`` and their errors."""

from calor.client._render import to_dict
from calor.client._subscription import AsyncEventStream, Backoff, EventStream
from calor.client.aio import AsyncCalorClient
from calor.client.client import CalorClient
from calor.client.errors import (
    AlreadyExistsError,
    CalorClientError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ServerError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    from_rpc_error,
)

__all__ = [
    "AlreadyExistsError",
    "AsyncCalorClient",
    "AsyncEventStream",
    "Backoff",
    "CalorClient",
    "CalorClientError",
    "DeadlineExceededError",
    "EventStream",
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
    "to_dict",
]
