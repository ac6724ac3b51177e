"""The Python client of Calor: ``CalorClient``, ``AsyncCalorClient`` and their errors."""

from calor.client._subscription import Backoff, EventStream
from calor.client.aio import AsyncCalorClient
from calor.client.client import CalorClient
from calor.client.errors import (
    CalorClientError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ServerError,
    UnavailableError,
    UnimplementedError,
    from_rpc_error,
)

__all__ = [
    "AsyncCalorClient",
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
    "UnavailableError",
    "UnimplementedError",
    "from_rpc_error",
]
