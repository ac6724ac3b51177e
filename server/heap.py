"""Keeps the cycle collector's full passes off other clients' latency.

A full pass of Python's cycle collector walks every tracked object while holding the
GIL: with a few thousand memories in the heap it takes 50 to 150 ms, and a big batch
being built triggers several, each one stalling every recall in the server. Memories,
their edges and their index entries hold no reference cycles (reference counting frees
them when they go), so the objects that make up the loaded channels are moved out of
the collector's view (:func:`gc.freeze`) once they are built, and no pass runs while a
batch is being built.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["BULK_ITEMS", "bulk_build", "settle"]

BULK_ITEMS = 256
"""A store of at least this many items is built as a bulk (see :func:`bulk_build`)."""

_lock = threading.Lock()
_builds = 0
_was_enabled = True


def settle() -> None:
    """Move every object alive now out of the cycle collector's view; call it when a
    long-lived structure (the channels at start, a big batch) has just been built."""
    gc.freeze()


@contextmanager
def bulk_build() -> Iterator[None]:
    """No collector pass while the block builds a big batch; what it built is settled
    when the last concurrent bulk build ends."""
    global _builds, _was_enabled
    with _lock:
        if _builds == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _builds += 1
    try:
        yield
    finally:
        with _lock:
            _builds -= 1
            if _builds == 0:
                settle()
                if _was_enabled:
                    gc.enable()
