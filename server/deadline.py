"""A call's deadline, readable wherever its work runs: the servicer, the executor thread
that does its store and index work, and the commit.

The limits layer sets it once per call from the client's deadline; the runtime carries
it into the thread; :func:`check` refuses to go on once it has passed. Work that belongs
to no call (triggers, background sweeps) has no deadline and is never refused.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token

from calor.server.errors import DeadlineExceededError

__all__ = ["check", "remaining", "set_deadline"]

# The moment (time.monotonic) the current call's deadline passes; None for no deadline.
_deadline: ContextVar[float | None] = ContextVar("calor_deadline", default=None)


def set_deadline(seconds_left: float | None) -> Token[float | None]:
    """Give the current call ``seconds_left`` from now; None means no deadline."""
    return _deadline.set(None if seconds_left is None else time.monotonic() + seconds_left)


def remaining() -> float | None:
    """Seconds until the current call's deadline (≤ 0 once passed); None without one."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def check(step: str = "the work") -> None:
    """Go on only while the current call's deadline has not passed.

    Raises:
        DeadlineExceededError: It has; ``step`` says what was not done.
    """
    left = remaining()
    if left is not None and left <= 0:
        raise DeadlineExceededError(f"the call's deadline passed: {step} was not done")
