"""Time as the server sees it: a seam so tests control the clock instead of sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """A source of the current time, in seconds since the Unix epoch (UTC)."""

    def now(self) -> float:
        """The current time."""
        ...


class SystemClock:
    """Wall-clock time."""

    def now(self) -> float:
        """The current wall-clock time."""
        return time.time()


class ManualClock:
    """A clock that moves only when told to; for tests of decay."""

    def __init__(self, start: float) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        """The time this clock was last set or advanced to."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        with self._lock:
            self._now += seconds

    def set(self, when: float) -> None:
        """Move the clock to ``when``."""
        with self._lock:
            self._now = when
