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

from calor.server.engine.channel import Channel
from calor.server.heap import release
from calor.server.recall.graph_files import GraphFiles, SavedGraph
from calor.server.recall.hnsw import GraphLinks
from calor.server.recall.index import ChannelIndex
from calor.server.recall.tiers import TIERS
from calor.server.recall.vectors import VectorIndex

__all__ = ["GraphBuilds"]

log = logging.getLogger(__name__)

# What to do ("build" or "save"), for which channel and which tier of which of its
# indexes (named as its file is: "live-hot", "attic-cold", ...), the index and the
# tier's code and vectors.
_Job = tuple[str, Channel, str, ChannelIndex, int, VectorIndex]


def _tiers(channel: Channel) -> list[tuple[str, ChannelIndex, int, VectorIndex]]:
    """Every tier of the channel's live index and attic: (name, index, code, vectors)."""
    return [
        (f"{kind}-{TIERS[code][0]}", index, code, vectors)
        for kind, index in (("live", channel.index), ("attic", channel.attic))
        for code, vectors in index.vectors.held()
    ]


class GraphBuilds:
    """Builds the graphs channels ask for (:meth:`note`), one at a time, on a daemon thread
    (a build in flight never holds up the server's exit), and saves each to ``files``
    with the store's ``sequence`` at its snapshot: when built, and again whenever it has
    grown enough that a restart would have much to catch up."""

    def __init__(
        self, files: GraphFiles | None = None, sequence: Callable[[], int] = lambda: 0
    ) -> None:
        self._files = files
        self._sequence = sequence
        self._waiting: queue.Queue[_Job] = queue.Queue()
        self._queued: set[tuple[int, str]] = set()  # (index, action) queued or running
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.built = 0
        """How many graphs were built and put in place."""
        self.restored = 0
        """How many saved graphs were put in place."""

    def note(self, channel: Channel) -> None:
        """Queue a build for each index of the channel that wants a graph, a save for each
        whose graph grew since it was saved (hold the channel's lock)."""
        for kind, index, code, vectors in _tiers(channel):
            if vectors.wants_graph():
                action = "build"
            elif self._files is not None and vectors.wants_save():
                action = "save"
            else:
                continue
            with self._lock:
                if (id(vectors), action) in self._queued:
                    continue
                self._queued.add((id(vectors), action))
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._work, name="calor-graph", daemon=True
                    )
                    self._thread.start()
            self._waiting.put((action, channel, kind, index, code, vectors))

    def restore(self, channel: Channel) -> None:
        """Put the channel's saved graphs in place, those that fit its memories (hold its
        lock; call it once its memories are indexed). The others are built as usual."""
        if self._files is None:
            return
        for kind, index, code, vectors in _tiers(channel):
            if not vectors.wants_graph():
                continue
            saved = self._files.load(channel.name, kind)
            if saved is not None and index.restore(saved, code):
                self.restored += 1
                release()  # the exact index the graph replaced
                log.info(
                    "channel %r: %d memories (%s) searched through a saved HNSW graph",
                    channel.name,
                    vectors.live,
                    kind,
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
            action, channel, kind, index, code, vectors = self._waiting.get()
            try:
                if action == "build":
                    self._build(channel, kind, index, code, vectors)
                else:
                    self._save_grown(channel, kind, index, code, vectors)
            except Exception:
                log.exception("the HNSW graph of channel %r: %s failed", channel.name, action)
            finally:
                with self._lock:
                    self._queued.discard((id(vectors), action))

    def _build(
        self, channel: Channel, kind: str, index: ChannelIndex, code: int, vectors: VectorIndex
    ) -> None:
        installed = False
        while not installed:  # again while the channel grew too much during a build
            with channel.lock:
                if channel.dropped or not vectors.wants_graph():
                    return
                build = vectors.snapshot()
                ids = index.tier_ids(code, build.labels)
                sequence = self._sequence()
            try:
                build.run()
                if build.graph is not None and build.prints is not None and not channel.dropped:
                    links = GraphLinks.of(build.graph)  # not in place yet: nothing else uses it
                    self._save(channel.name, kind, SavedGraph(links, ids, build.prints, sequence))
            finally:
                with channel.lock:  # a failed build leaves exact search in place
                    installed = vectors.install(build)
        self.built += 1
        release()  # the snapshot's vectors, and the exact index the graph replaced
        log.info(
            "channel %r: %d memories (%s) searched through an HNSW graph",
            channel.name,
            len(build.labels),
            kind,
        )
        self._save_grown(channel, kind, index, code, vectors)  # if much was caught up

    def _save_grown(
        self, channel: Channel, kind: str, index: ChannelIndex, code: int, vectors: VectorIndex
    ) -> None:
        """Save a graph in place again: its links copied under the lock, written after."""
        with channel.lock:
            if channel.dropped or not vectors.wants_save():
                return
            links, rows, prints = vectors.saving()
            ids = index.tier_ids(code, rows)
            sequence = self._sequence()
        self._save(channel.name, kind, SavedGraph(links, ids, prints, sequence))
        del links, rows, prints, ids
        release()  # the copies just written

    def _save(self, channel: str, kind: str, graph: SavedGraph) -> None:
        if self._files is None:
            return
        try:
            self._files.save(channel, kind, graph)
        except OSError as error:
            log.warning("channel %r: its HNSW graph could not be saved: %s", channel, error)
