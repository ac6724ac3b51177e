"""The background purge: soon after a forget or a dropped channel, RocksDB is made to drop
the bytes it left on disk (see :meth:`MemoryStore.purge`).

A purge flushes the memtable and compacts the touched key ranges, which costs far more
than the forget itself, so it does not run in the forget's call: the first forget after
a quiet spell asks for one ``delay`` seconds later, and every forget until then rides
along. What an operator can rely on: a forgotten text is gone from every file under the
data dir ``delay`` seconds plus one compaction after its forget was acknowledged, or,
if the server stopped first, as long after it next starts (what is pending is recorded
in the store).

    purger = Purger(store, delay=1.0)
    purger.start()
    ...
    purger.close()  # before the store closes
"""

from __future__ import annotations

import logging
import threading
import time

from calor.server.errors import UnavailableError
from calor.server.storage.store import MemoryStore

__all__ = ["Purger"]

log = logging.getLogger("calor.purge")


class Purger:
    """Runs the store's pending purge on a thread of its own, ``delay`` seconds after it is
    asked for."""

    def __init__(self, store: MemoryStore, delay: float) -> None:
        if delay < 0:
            raise ValueError(f"delay must not be negative, got {delay}")
        self._store = store
        self._delay = delay
        self._due: float | None = None  # monotonic moment of the next purge
        self._stopping = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="calor-purge", daemon=True)

    def start(self) -> None:
        """Listen for commits that leave bytes behind, and purge what is pending already."""
        self._store.on_purge(self.request)
        self._thread.start()
        if self._store.purge_pending:
            self.request()

    def request(self) -> None:
        """Ask for a purge ``delay`` seconds from now (or at the one already asked for)."""
        with self._wake:
            if self._due is None:
                self._due = time.monotonic() + self._delay
                self._wake.notify()

    def close(self) -> None:
        """Stop the thread (a purge under way finishes first); what is pending stays
        recorded in the store, for the next start."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and (self._due is None or self._due > time.monotonic()):
                    timeout = None if self._due is None else self._due - time.monotonic()
                    self._wake.wait(timeout)
                if self._stopping:
                    return
                self._due = None
            try:
                self._store.purge()
            except UnavailableError:
                return  # the store closed under us: it purges at its next open
            except Exception:  # kept pending: the next forget or the next open retries it
                log.exception("purging forgotten data failed")
