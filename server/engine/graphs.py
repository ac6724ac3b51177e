"""HNSW graphs for large channels, built on a thread of their own, off the request path:
recall keeps searching exactly until a channel's graph is ready, and the changes made
meanwhile are caught up when it is put in place (see :mod:`calor.server.recall.vectors`)."""

from __future__ import annotations

import logging
import queue
import threading

from calor.server.engine.channel import Channel
from calor.server.recall.index import ChannelIndex

__all__ = ["GraphBuilds"]

log = logging.getLogger(__name__)


class GraphBuilds:
    """Builds the graphs channels ask for (:meth:`note`), one at a time, on a daemon thread
    (a build in flight never holds up the server's exit)."""

    def __init__(self) -> None:
        self._waiting: queue.Queue[tuple[Channel, ChannelIndex]] = queue.Queue()
        self._queued: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.built = 0
        """How many graphs were put in place."""

    def note(self, channel: Channel) -> None:
        """Queue a build for each index of the channel that wants a graph (its lock held)."""
        for index in (channel.index, channel.attic):
            if not index.vectors.wants_graph():
                continue
            with self._lock:
                if id(index) in self._queued:
                    continue
                self._queued.add(id(index))
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._work, name="calor-graph", daemon=True
                    )
                    self._thread.start()
            self._waiting.put((channel, index))

    def idle(self) -> bool:
        """Whether no build is queued or running."""
        with self._lock:
            return not self._queued

    def _work(self) -> None:
        while True:
            channel, index = self._waiting.get()
            try:
                self._build(channel, index)
            except Exception:
                log.exception("building the HNSW graph of channel %r failed", channel.name)
            finally:
                with self._lock:
                    self._queued.discard(id(index))

    def _build(self, channel: Channel, index: ChannelIndex) -> None:
        installed = False
        while not installed:  # again while the channel grew too much during a build
            with channel.lock:
                if channel.dropped or not index.vectors.wants_graph():
                    return
                build = index.vectors.snapshot()
            try:
                build.run()
            finally:
                with channel.lock:  # a failed build leaves exact search in place
                    installed = index.vectors.install(build)
        self.built += 1
        log.info(
            "channel %r: %d memories searched through an HNSW graph",
            channel.name,
            len(build.labels),
        )
