"""The one error tree of the Calor server; each class carries its gRPC status code.

    CalorError
    ├── InvalidArgumentError      INVALID_ARGUMENT   bad input; nothing changed
    ├── NotFoundError             NOT_FOUND          no such memory / trigger in this channel
    ├── AlreadyExistsError        ALREADY_EXISTS     a trigger or memory with that id exists
    ├── PermissionDeniedError     PERMISSION_DENIED  the caller may not use that channel
    ├── ResourceExhaustedError    RESOURCE_EXHAUSTED a gate or overload; may carry a retry delay
    │   └── StorageFullError                         the disk is full: a write was refused
    ├── FailedPreconditionError   FAILED_PRECONDITION the request does not fit the current state
    │   ├── StoreMismatchError                       the data dir was made by another model/schema
    │   ├── StoreInUseError                          another process holds the data dir's store
    │   └── AddressInUseError                        another process listens on the port
    ├── OutOfRangeError           OUT_OF_RANGE       a position past the end (or before the start)
    ├── UnavailableError          UNAVAILABLE        the server is starting or stopping
    │   ├── ModelUnavailableError                    the embedding model is missing or corrupt
    │   └── StorageError                             RocksDB could not write (an I/O error)
    ├── DeadlineExceededError     DEADLINE_EXCEEDED  the call's deadline passed; nothing more done
    └── UnimplementedError        UNIMPLEMENTED      declared in the API, not built yet

Foreign exceptions are translated into these at one boundary (the servicers'
``rpc_errors`` wrapper); everything below raises only these. RocksDB's bare exceptions
on a write are the one kind translated where they happen (``MemoryStore``), so a full
disk reads the same to unary and streaming RPCs and to the trigger engine.
"""

from __future__ import annotations

import grpc

__all__ = [
    "AddressInUseError",
    "AlreadyExistsError",
    "CalorError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "LogBehindError",
    "ModelUnavailableError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "StorageError",
    "StorageFullError",
    "StoreInUseError",
    "StoreMismatchError",
    "UnavailableError",
    "UnimplementedError",
]


class CalorError(Exception):
    """Base of every error the server raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgumentError(CalorError):
    """The request is malformed; nothing was changed."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(CalorError):
    """The named memory or trigger does not exist in the caller's channel."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(CalorError):
    """Something with the requested name exists already."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(CalorError):
    """The caller may not read or write the named channel."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(CalorError):
    """A gate is closed or the server is overloaded; retry after ``retry_after`` seconds."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StorageFullError(ResourceExhaustedError):
    """The disk is full (or a file size limit was reached): the write was refused and
    nothing changed. RocksDB refuses every write after it until the server is restarted
    with space freed; reads go on."""


class FailedPreconditionError(CalorError):
    """The request does not fit the current state of the data."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class OutOfRangeError(CalorError):
    """A position outside what the data holds: a resume point past the end of the event
    log, or before what it retains. ``trailing`` names the bounds as trailing metadata,
    so a client can act on them without parsing the message."""

    code = grpc.StatusCode.OUT_OF_RANGE

    def __init__(self, message: str, trailing: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.trailing = trailing


class StoreMismatchError(FailedPreconditionError):
    """The data directory was written by another schema version or embedding model."""


class StoreInUseError(FailedPreconditionError):
    """Another process (or another store in this one) holds the data directory's
    RocksDB lock: a store is opened by one process at a time."""


class AddressInUseError(FailedPreconditionError):
    """The server's port (gRPC or metrics) is taken on its host: another process
    listens there."""


class UnavailableError(CalorError):
    """The service cannot answer right now."""

    code = grpc.StatusCode.UNAVAILABLE


class LogBehindError(UnavailableError):
    """Cluster mode: the write log holds entries this node has not applied, so it may not
    append (another node owns the store now, or an append's answer was lost)."""


class LogTrimmedError(UnavailableError):
    """Cluster mode: the write log no longer holds the entries after this node's position
    (it was trimmed once a snapshot held them): the node starts from the snapshot."""


class ModelUnavailableError(UnavailableError):
    """The embedding model files are missing or do not match their hashes."""


class StorageError(UnavailableError):
    """RocksDB could not write (an I/O error other than a full disk); nothing changed."""


class DeadlineExceededError(CalorError):
    """The call's deadline passed before the work was done; nothing after that point ran
    or was committed."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class UnimplementedError(CalorError):
    """The RPC is part of the API but not implemented yet."""

    code = grpc.StatusCode.UNIMPLEMENTED
