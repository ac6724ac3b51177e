"""A small progress bar for long CLI work, drawn on stderr only when a person is watching."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TextIO, TypeVar

from calor.client.errors import CalorClientError

__all__ = ["Progress", "following", "polled"]

_POLL_SECONDS = 0.2  # how often a bar asks how far the server has come
_Answer = TypeVar("_Answer")


class Progress:
    """Counts work done and redraws one status line, at most about ten times a second.

    The line shows the count (against the total when it is known, with a bar and the time
    left), and the rate. Nothing is written unless the stream is a terminal or ``force`` is
    set, so piped and scripted runs stay clean.

    Example::

        with Progress(total=len(notes), label="import") as progress:
            for note in notes:
                send(note)
                progress.update()

    Args:
        total: How many items the work has, if known; :meth:`set_total` can tell it later.
        label: A word or two in front of the line.
        stream: Where to draw; standard error by default.
        force: Draw even when ``stream`` is not a terminal.
        interval: The least time, in seconds, between two redraws.
        width: The bar's width in characters.
        clock: Seconds from a monotonic clock; tests pass a fake one.
        steps: The count is of steps of unequal length: the time taken is shown, not a
            rate or the time left.
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        label: str = "",
        stream: TextIO | None = None,
        force: bool = False,
        interval: float = 0.1,
        width: int = 24,
        clock: Callable[[], float] = time.monotonic,
        steps: bool = False,
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._force = force
        self._interval = interval
        self._width = width
        self._clock = clock
        self._steps = steps
        self.label = label
        self.total = total
        self.count = 0
        self._enabled = False
        self._start = 0.0
        self._last_draw = float("-inf")
        self._drawn = 0
        self.phase = ""
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether the bar is drawing (inside the ``with`` block, on a terminal or forced)."""
        return self._enabled

    def __enter__(self) -> Progress:
        self._enabled = self._force or _is_terminal(self._stream)
        self._start = self._clock()
        if self._enabled:
            self._draw(self._start)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def set_total(self, total: int | None) -> None:
        """Tell the bar how many items there are once that is known."""
        self.total = total

    def show(self, count: int, total: int | None, phase: str = "") -> None:
        """Show counts another party keeps (a server's): ``count`` of ``total`` done,
        in ``phase``; safe from another thread than the one that entered the bar."""
        with self._lock:
            self.count, self.total = count, total or None
            self.phase = phase
            if self._enabled:
                self._draw(self._clock())

    def update(self, n: int = 1) -> None:
        """Count ``n`` more items done; redraws when the last redraw is old enough."""
        self.count += n
        if not self._enabled:
            return
        now = self._clock()
        if now - self._last_draw >= self._interval or self.count == self.total:
            self._draw(now)

    def close(self) -> None:
        """Draw the final state and end the line; later calls do nothing."""
        with self._lock:
            if not self._enabled:
                return
            self._draw(self._clock())
            self._stream.write("\n")
            self._stream.flush()
            self._enabled = False

    def line(self, now: float) -> str:
        """The status line as it reads at ``now`` (no carriage return)."""
        elapsed = now - self._start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.label} ({self.phase})" if self.phase else self.label] if self.label else []
        if self.total is None:
            parts.append(f"{self.count:,}")
        else:
            done = min(1.0, self.count / self.total) if self.total > 0 else 1.0
            filled = round(done * self._width)
            parts.append("[" + "#" * filled + "." * (self._width - filled) + "]")
            parts.append(f"{self.count:,}/{self.total:,}")
            parts.append(f"{done:4.0%}")
        if self._steps:
            parts.append(_clock_time(elapsed))
            return "  ".join(parts)
        parts.append(f"{rate:,.1f}/s" if rate < 100 else f"{rate:,.0f}/s")
        if self.total is not None and 0 < self.count < self.total and rate > 0:
            parts.append("eta " + _clock_time((self.total - self.count) / rate))
        return "  ".join(parts)

    def _draw(self, now: float) -> None:
        text = self.line(now)
        # Pad with spaces to wipe what a longer previous line left behind.
        self._stream.write("\r" + text + " " * max(0, self._drawn - len(text)))
        self._stream.flush()
        self._drawn = len(text)
        self._last_draw = now


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:  # a closed stream
        return False


def _clock_time(seconds: float) -> str:
    """``75`` → ``1:15``; ``3725`` → ``1:02:05``."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def polled(
    ask: Callable[[], _Answer], pick: Callable[[_Answer], tuple[int, int, str]]
) -> Callable[[], tuple[int, int, str] | None]:
    """What a server says of its work, for :func:`following`: ``ask``'s answer as
    ``pick`` reads it (count, total, phase), or None while the server cannot tell (the
    work not begun yet, or a server that does not report it)."""

    def read() -> tuple[int, int, str] | None:
        try:
            return pick(ask())
        except CalorClientError:
            return None

    return read


@contextmanager
def following(bar: Progress, read: Callable[[], tuple[int, int, str] | None]) -> Iterator[None]:
    """While the block runs, show on ``bar`` what ``read`` says of work another party
    does (count, total and phase; None while it cannot tell), polled a few times a
    second on a thread of its own; nothing when the bar is not drawn."""
    if not bar.enabled:
        yield
        return
    stop = threading.Event()

    def follow() -> None:
        while not stop.wait(_POLL_SECONDS):
            shown = read()
            if shown is not None:
                bar.show(*shown)

    poller = threading.Thread(target=follow, name="calor-progress", daemon=True)
    poller.start()
    try:
        yield
    finally:
        stop.set()
        poller.join()
