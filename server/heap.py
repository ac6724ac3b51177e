"""Keeps the cycle collector's full passes off other clients' latency, and gives freed
memory back to the operating system after big builds.

A full pass of Python's cycle collector walks every tracked object while holding the
GIL: with a few thousand memories in the heap it takes 50 to 150 ms, and a big batch
being built triggers several, each one stalling every recall in the server. Memories,
their edges and their index entries hold no reference cycles (reference counting frees
them when they go), so the objects that make up the loaded channels are moved out of
the collector's view (:func:`gc.freeze`) once they are built, and no pass runs while a
batch is being built.

glibc's allocator keeps freed pages for reuse: after a channel's records are decoded
at load, or an HNSW graph built from a snapshot of its vectors, the process would keep
hundreds of megabytes it no longer uses (measured at 100,000 memories: 445 MB resident
beyond the model, 236 MB once trimmed). :func:`release` hands them back.

glibc also gives threads arenas of their own (up to eight per core): memory one thread
frees stays in its arena, for that arena's next allocations only. After one
``StoreStream`` of 40,000 short memories, once indexed, the server held 4.2 KB per
memory with the default and 3.3 KB with two arenas, at the same ingest rate (111 texts/s
both; 2.4 and 2.5 KB after a restart). :func:`limit_arenas` keeps a server process to
:data:`ARENAS`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

__all__ = ["ARENAS", "BULK_ITEMS", "bulk_build", "limit_arenas", "release", "settle"]

ARENAS = 2
"""glibc malloc arenas a server process keeps (unless ``MALLOC_ARENA_MAX`` says)."""
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)

BULK_ITEMS = 256
"""A store of at least this many items is built as a bulk (see :func:`bulk_build`)."""

_lock = threading.Lock()
_builds = 0
_was_enabled = True


def _libc(name: str, argtypes: list[Any]) -> Callable[..., int] | None:
    """A function of glibc's (int result), or None where the C library has none."""
    library = ctypes.util.find_library("c")
    try:
        function = getattr(ctypes.CDLL(library), name) if library else None
    except (OSError, AttributeError):
        return None
    if function is not None:
        function.argtypes, function.restype = argtypes, ctypes.c_int
    return cast("Callable[..., int] | None", function)


_trim = _libc("malloc_trim", [ctypes.c_size_t])


def limit_arenas() -> bool:
    """Keep glibc's allocator to :data:`ARENAS` arenas from now on (call it before the
    process starts threads), unless ``MALLOC_ARENA_MAX`` is set; whether it did."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = _libc("mallopt", [ctypes.c_int, ctypes.c_int])
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, ARENAS))


def release() -> None:
    """Give the heap memory freed so far back to the operating system (glibc; nothing
    elsewhere). Other threads run meanwhile: the call lets go of the GIL."""
    if _trim is not None:
        _trim(0)


def settle() -> None:
    """Move every object alive now out of the cycle collector's view; call it when a
    long-lived structure (the channels at start, a big batch) has just been built."""
    gc.freeze()


@contextmanager
def bulk_build() -> Iterator[None]:
    """No collector pass while the block builds a big batch; what it built is settled,
    and what it freed released, when the last concurrent bulk build ends."""
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
                release()
                if _was_enabled:
                    gc.enable()
