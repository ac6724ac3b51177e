"""HNSW graphs for large channels, built on a thread of their own, off the request path:
recall keeps searching exactly until a channel's graph is ready, and the changes made
meanwhile are caught up when it is put in place (see :mod:`calor.server.recall.vectors`).

With :class:`GraphFiles`, each built graph is saved, and a channel loaded after a restart
takes its saved graph (:meth:`GraphBuilds.restore`) instead of building it again.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from calor.server.engine.channel import Channel
from calor.server.recall.graph_files import GraphFiles, SavedGraph
from calor.server.recall.index import ChannelIndex
from calor.server.recall.vectors import ApproximateBuild, GraphLinks, fingerprints

__all__ = ["GraphBuilds"]

log = logging.getLogger(__name__)

_Job = tuple[Channel, str, ChannelIndex]  # a channel, which index ("live", "attic"), the index

# What a save needs beside the graph: node ids, vector fingerprints, the store's sequence.
_Saved = tuple[list[str], npt.NDArray[np.uint64], int]


def _indexes(channel: Channel) -> tuple[tuple[str, ChannelIndex], ...]:
    return (("live", channel.index), ("attic", channel.attic))


class GraphBuilds:
    """Builds the graphs channels ask for (:meth:`note`), one at a time, on a daemon thread
    (a build in flight never holds up the server's exit), and saves each to ``files``
    with the store's ``sequence`` at its snapshot."""

    def __init__(
        self, files: GraphFiles | None = None, sequence: Callable[[], int] = lambda: 0
    ) -> None:
        self._files = files
        self._sequence = sequence
        self._waiting: queue.Queue[_Job] = queue.Queue()
        self._queued: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.built = 0
        """How many graphs were built and put in place."""
        self.restored = 0
        """How many saved graphs were put in place."""

    def note(self, channel: Channel) -> None:
        """Queue a build for each index of the channel that wants a graph (its lock held)."""
        for kind, index in _indexes(channel):
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
            self._waiting.put((channel, kind, index))

    def restore(self, channel: Channel) -> None:
        """Put the channel's saved graphs in place, those that fit its memories (hold its
        lock; call it once its memories are indexed). The others are built as usual."""
        if self._files is None:
            return
        for kind, index in _indexes(channel):
            if not index.vectors.wants_graph():
                continue
            saved = self._files.load(channel.name, kind)
            if saved is not None and index.restore(saved):
                self.restored += 1
                log.info(
                    "channel %r: %d memories searched through its saved HNSW graph",
                    channel.name,
                    len(index),
                )

    def discard(self, channel: str) -> None:
        """Forget a dropped channel's saved graphs."""
        if self._files is not None:
            self._files.discard(channel)

    def idle(self) -> bool:
        """Whether no build is queued or running."""
        with self._lock:
            return not self._queued

    def _work(self) -> None:
        while True:
            channel, kind, index = self._waiting.get()
            try:
                self._build(channel, kind, index)
            except Exception:
                log.exception("building the HNSW graph of channel %r failed", channel.name)
            finally:
                with self._lock:
                    self._queued.discard(id(index))

    def _build(self, channel: Channel, kind: str, index: ChannelIndex) -> None:
        installed = False
        while not installed:  # again while the channel grew too much during a build
            with channel.lock:
                if channel.dropped or not index.vectors.wants_graph():
                    return
                build = index.vectors.snapshot()
                ids = index.memory_ids(build.labels)
                sequence = self._sequence()
            try:
                prints = fingerprints(build.vectors)
                build.run()
                self._save(channel, kind, build, (ids, prints, sequence))
            finally:
                with channel.lock:  # a failed build leaves exact search in place
                    installed = index.vectors.install(build)
        self.built += 1
        log.info(
            "channel %r: %d memories searched through an HNSW graph",
            channel.name,
            len(build.labels),
        )

    def _save(self, channel: Channel, kind: str, build: ApproximateBuild, saved: _Saved) -> None:
        """Save a built graph (before it is put in place: nothing else touches it yet)."""
        if self._files is None or build.graph is None or channel.dropped:
            return
        ids, prints, sequence = saved
        try:
            links = GraphLinks.of(build.graph)
            self._files.save(channel.name, kind, SavedGraph(links, ids, prints, sequence))
        except OSError as error:
            log.warning("channel %r: its HNSW graph could not be saved: %s", channel.name, error)
