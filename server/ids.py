"""Memory ids: ULIDs (48-bit millisecond time + 80 random bits, Crockford base32).

They sort by creation time, are unique without coordination, and stay stable for
the life of a memory.
"""

from __future__ import annotations

import os
import re
import threading
import time

__all__ = ["is_valid_id", "new_id"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
_lock = threading.Lock()
_last_ms = -1
_last_rand = 0


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(at: float | None = None) -> str:
    """A new id, monotonic within this process even within one millisecond.

    Args:
        at: Seconds since the epoch to stamp into the id; defaults to now. Imported
            history may pass its own creation time so ids sort by it.
    """
    global _last_ms, _last_rand
    ms = int((time.time() if at is None else at) * 1000) & ((1 << 48) - 1)
    with _lock:
        if ms == _last_ms:
            _last_rand = (_last_rand + 1) & ((1 << 80) - 1)
        else:
            _last_ms = ms
            _last_rand = int.from_bytes(os.urandom(10), "big")
        rand = _last_rand
    return _encode(ms, 10) + _encode(rand, 16)


def is_valid_id(value: str) -> bool:
    """Whether ``value`` has the shape of a memory id."""
    return bool(_ID_RE.match(value))
