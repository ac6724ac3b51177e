"""The API's small shared forms: timestamps, enum names and page tokens, each made and read
in one place for every servicer.

Enum values are named by the protos as ``<PREFIX><NAME>`` (``MEMORY_TYPE_EPISODIC``);
the engine names them in lower case without the prefix (``episodic``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from calor.server.errors import InvalidArgumentError
from calor.server.ids import is_valid_id

__all__ = [
    "Enum",
    "decode_page_token",
    "encode_page_token",
    "enum_name",
    "enum_text",
    "full_name",
    "seconds_of",
    "short_name",
    "timestamp_message",
]


# A generated protobuf enum class (``memory_pb2.MemoryType``): its ``Name`` and ``Value``
# live on a metaclass, which a Protocol cannot describe to the type checker.
Enum = Any


def timestamp_message(seconds: float) -> Timestamp:
    """A Timestamp of seconds since the epoch, to the nearest nanosecond."""
    stamp = Timestamp()
    whole = int(seconds // 1)
    nanos = int(round((seconds - whole) * 1e9))
    stamp.seconds = whole + nanos // 1_000_000_000
    stamp.nanos = nanos % 1_000_000_000
    return stamp


def seconds_of(stamp: Timestamp) -> float:
    """Seconds since the epoch of a Timestamp."""
    return stamp.seconds + stamp.nanos / 1e9


def full_name(prefix: str, name: str) -> str:
    """The proto name of an engine name (``episodic`` → ``MEMORY_TYPE_EPISODIC``)."""
    return prefix + name.upper()


def short_name(prefix: str, full: str) -> str:
    """The engine name of a proto name (``MEMORY_TYPE_EPISODIC`` → ``episodic``)."""
    return full.removeprefix(prefix).lower()


def enum_name(enum: Enum, prefix: str, number: int) -> str | None:
    """The engine name of a wire number, or None for a number the enum lacks."""
    try:
        full = str(enum.Name(number))
    except ValueError:
        return None
    return short_name(prefix, full)


def enum_text(enum: Enum, number: int) -> str:
    """A wire number as a message names it: its full name, or the number if unknown."""
    try:
        return str(enum.Name(number))
    except ValueError:
        return str(number)


def encode_page_token(position: str) -> str:
    """An opaque token that resumes a listing after ``position`` (a memory id, say)."""
    return base64.urlsafe_b64encode(position.encode()).decode()


def decode_page_token(
    token: str, field: str = "page_token", valid: Callable[[str], bool] = is_valid_id
) -> str:
    """The position a page token resumes after ('' for no token).

    Only a token exactly as :func:`encode_page_token` made it, of a position that
    ``valid`` accepts (by default a memory id), is one this server issued; anything
    else (stray characters, other padding, text where a number belongs) is refused
    rather than read as some other page.

    Raises:
        InvalidArgumentError: The token is not one this server issued.
    """
    if not token:
        return ""
    refused = InvalidArgumentError(
        f"{field}: not a token this server issued; pass next_page_token back unchanged, "
        "or leave it empty for the first page"
    )
    try:
        position = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise refused from None
    if not position or encode_page_token(position) != token or not valid(position):
        raise refused
    return position
