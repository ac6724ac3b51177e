"""How far each long write has come: a StoreStream or Import that names a progress token
counts its items received, embedded and stored here, a Dream its steps, and ``Progress``
reads the counts.

The counts live in memory only (a call that dies with the server has no progress to
show) and are kept a few minutes after the call ends, so a poller sees how it ended.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from calor.server.errors import InvalidArgumentError, NotFoundError

__all__ = ["ProgressBoard", "WriteProgress", "progress_token"]

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_KEEP_SECONDS = 300.0  # how long a finished call's counts stay readable
_MOST = 10_000  # calls counted at once at most; the oldest go first


def progress_token(value: str) -> str:
    """A progress token as a request names it ("" for none); INVALID_ARGUMENT otherwise."""
    if value and not _TOKEN.match(value):
        raise InvalidArgumentError(
            f"progress_token: {value[:40]!r} is not 1-64 letters, digits, '_' or '-'"
        )
    return value


@dataclass
class WriteProgress:
    """One call's counts; the call's own coroutine updates them (one event loop)."""

    received: int = 0
    embedded: int = 0
    stored: int = 0
    total: int = 0
    phase: str = "receiving"
    step: int = 0
    steps: int = 0
    ended_at: float | None = None

    def end(self, phase: str, now: float | None = None) -> None:
        """The call is over: ``done`` or ``failed``."""
        self.phase, self.ended_at = phase, time.monotonic() if now is None else now

    def begin(self, step: str) -> None:
        """A dream begins its next step, ``step`` (from the dream's worker thread: each
        field is set whole, and a reader sees one step or the next)."""
        self.step, self.phase = self.step + 1, step

    def embedded_more(self, count: int) -> None:
        """The model has embedded ``count`` more of the call's items."""
        self.embedded += count


class ProgressBoard:
    """The progress of the write calls that named a token, by (channel, token)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._calls: OrderedDict[tuple[str, str], WriteProgress] = OrderedDict()

    def track(self, channel: str, token: str, progress: WriteProgress) -> None:
        """Make a call's counts readable under its token (replacing an older call's of
        the same token); a call without a token is counted where no one reads it."""
        if token:
            self._forget_old()
            self._calls[(channel, token)] = progress
            self._calls.move_to_end((channel, token))

    def read(self, channel: str, token: str) -> WriteProgress:
        """A call's counts; NOT_FOUND for a token no recent call of the channel named."""
        progress = self._calls.get((channel, token))
        if progress is None:
            raise NotFoundError(f"no write of channel {channel!r} has progress_token {token!r}")
        return progress

    def _forget_old(self) -> None:
        now = self._clock()
        for key, progress in list(self._calls.items()):
            if progress.ended_at is not None and now - progress.ended_at > _KEEP_SECONDS:
                del self._calls[key]
        while len(self._calls) >= _MOST:
            self._calls.popitem(last=False)
