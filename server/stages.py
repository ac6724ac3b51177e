"""Where a call's time goes, stage by stage, readable wherever its work runs.

The metrics layer starts a :class:`Stopwatch` for each unary call; the servicer, the
embedding queue, the executor and the engine add the seconds of the stages they run
(``with stage("dense search"): ...``, or :func:`record` for a span measured apart), and
the call's stages are reported with it (``calor_rpc_stage_seconds``). Work that belongs
to no call has no stopwatch, and timing it costs nothing but a lookup.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

__all__ = ["RECALL_STAGES", "Stopwatch", "record", "stage", "start"]

RECALL_STAGES = (
    "validation",
    "embedding queue",
    "model",
    "embedding hand-off",
    "executor wait",
    "lexical search",
    "dense search",
    "fusion and scoring",
    "heat effects",
    "commit",
    "executor hand-off",
    "reply",
)
"""The stages a recall meets, in order (a peek skips heat effects and the commit; a
query asked lately skips the embedding queue, the model and the hand-off)."""


class Stopwatch:
    """The seconds one call spent in each stage named so far (a stage met twice adds up)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` more in stage ``name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


_current: ContextVar[Stopwatch | None] = ContextVar("calor_stopwatch", default=None)


def start() -> tuple[Stopwatch, Token[Stopwatch | None]]:
    """A new stopwatch for the current call (and the token that puts the last one back)."""
    watch = Stopwatch()
    return watch, _current.set(watch)


def record(name: str, seconds: float) -> None:
    """Count ``seconds`` in stage ``name`` of the current call, if it is timed."""
    watch = _current.get()
    if watch is not None:
        watch.add(name, seconds)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the block as stage ``name`` of the current call, if it is timed."""
    watch = _current.get()
    if watch is None:
        yield
        return
    began = time.perf_counter()
    try:
        yield
    finally:
        watch.add(name, time.perf_counter() - began)
