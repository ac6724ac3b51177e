"""What falls due by itself, on time: a memory turning COLD (an ``on_decay`` event), moving
to cold storage or becoming a ghost, and the consolidation sweep a channel owes once
enough memories turned cold (DESIGN §3).

Each channel keeps a heap of the moments its memories change state
(:attr:`~calor.server.engine.channel.Channel.schedule`, solved from the heat formula).
:class:`DueChannels` keeps, across channels, the earliest of those moments per channel,
so the :class:`DueTimer` thread sleeps until the next one and wakes only the channels
whose moment came, never scanning memories or channels.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
from collections.abc import Callable

from calor.server.clock import Clock

__all__ = ["DueChannels", "DueTimer"]

log = logging.getLogger("calor.server")

# Longest sleep between looks at the clock: a clock a test moves by hand is seen within
# this, and a real one is never more than this late.
_MAX_SLEEP = 1.0


class DueChannels:
    """The next moment something falls due in each channel, earliest first (entries a
    channel has moved past are dropped as they come up)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.changed = threading.Event()
        """Set when a moment earlier than all others was noted (the timer sleeps anew)."""

    def note(self, moment: float, channel: str) -> None:
        """Something falls due in ``channel`` at ``moment``."""
        if not math.isfinite(moment):
            return
        with self._lock:
            earliest = not self._heap or moment < self._heap[0][0]
            heapq.heappush(self._heap, (moment, channel))
        if earliest:
            self.changed.set()

    def next_moment(self) -> float | None:
        """The earliest moment noted, if any."""
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def take_due(self, now: float) -> list[str]:
        """The channels with something due by ``now`` (each once), taken off the heap."""
        due: dict[str, None] = {}
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                due[heapq.heappop(self._heap)[1]] = None
        return list(due)


class DueTimer:
    """A thread that runs ``settle`` (which settles what is due and notes what comes next)
    at each moment :class:`DueChannels` names."""

    def __init__(self, due: DueChannels, clock: Clock, settle: Callable[[], None]) -> None:
        self._due = due
        self._clock = clock
        self._settle = settle
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calor-due", daemon=True)

    def start(self) -> None:
        """Begin watching the clock."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the settle in progress, if any, finishes first)."""
        self._stopping.set()
        self._due.changed.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._due.changed.clear()
            upcoming = self._due.next_moment()
            if upcoming is not None and upcoming <= self._clock.now():
                try:
                    self._settle()
                except Exception:  # never let one bad channel stop the clock
                    log.exception("settling what fell due failed")
                    self._stopping.wait(_MAX_SLEEP)
                continue
            wait = _MAX_SLEEP if upcoming is None else upcoming - self._clock.now()
            self._due.changed.wait(min(max(wait, 0.0), _MAX_SLEEP))
