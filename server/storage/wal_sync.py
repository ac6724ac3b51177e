"""Writes that answer before the disk does: their write-ahead log is fsynced soon after.

A recall's heat effects (bumps, resonance, its log) are written to RocksDB before the
recall answers, like every write, but the answer does not wait for the fsync: a
background thread syncs the log within :data:`SYNC_WITHIN` of such a write, one fsync
for all the writes of that moment. A crash of the server loses none of them (the log is
in the operating system's hands once written); a power cut, at most the last
:data:`SYNC_WITHIN` of them. Any write that does wait for the disk syncs the log up to
itself, those before it included.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["SYNC_WITHIN", "WalSyncer"]

log = logging.getLogger(__name__)

SYNC_WITHIN = 0.02
"""Seconds after a write that did not wait for the disk by which its log is synced."""


class WalSyncer:
    """Syncs a write-ahead log (``sync``) a moment after :meth:`soon` is called, on a
    thread of its own."""

    def __init__(self, sync: Callable[[], None], within: float = SYNC_WITHIN) -> None:
        self._sync = sync
        self._within = within
        self._changed = threading.Condition()
        self._asked = 0  # writes that asked for a sync
        self._synced = 0  # the first this many of them are synced
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="calor-wal-sync", daemon=True)
        self._thread.start()
        # A daemon thread stopped by the interpreter's exit inside the log's fsync aborts
        # the process ("FATAL: exception not rethrown"): a store never closed is closed
        # here first, its waiting writes synced.
        atexit.register(self.close)

    @property
    def pending(self) -> bool:
        """Whether a write waits for its sync."""
        with self._changed:
            return self._synced < self._asked

    def soon(self) -> None:
        """A write did not wait for the disk: sync the log within ``within`` seconds."""
        with self._changed:
            self._asked += 1
            self._changed.notify_all()

    def close(self) -> None:
        """Sync what waits, and stop the thread."""
        atexit.unregister(self.close)
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked > self._synced or self._closed)
                if self._asked == self._synced:
                    return  # closed, nothing waits
                closing = self._closed
            if not closing:
                time.sleep(self._within)  # the writes of this moment share one fsync
            with self._changed:
                covered = self._asked  # each of them wrote before asking
            try:
                self._sync()
            except Exception as error:  # rocksdict raises a bare Exception: "IO error: …"
                log.error("syncing the write-ahead log failed: %s", error)
            with self._changed:
                self._synced = covered
                self._changed.notify_all()
