"""The Python client of Calor: ``CalorClient``, ``AsyncCalorClient`` and their errors."""

from calor.client._subscription import EventStream
from calor.client.aio import AsyncCalorClient
from calor.client.client import CalorClient
from calor.client.errors import (
    CalorClientError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ServerError,
    UnavailableError,
    UnimplementedError,
    from_rpc_error,
)

__all__ = [
    "AsyncCalorClient",
    "CalorClient",
    "CalorClientError",
    "DeadlineExceededError",
    "EventStream",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "ServerError",
    "UnavailableError",
    "UnimplementedError",
    "from_rpc_error",
]
