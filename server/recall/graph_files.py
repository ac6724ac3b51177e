"""The HNSW graphs of large channels, saved beside RocksDB so a restart joins them to the
stored vectors instead of building them again (minutes at a million memories).

A file holds one index's graph links (:class:`GraphLinks`: no vectors, no text), the
memory id of each node, a fingerprint of each node's vector and the RocksDB sequence of
the snapshot the graph was built from. Nothing in it is needed: RocksDB stays the truth,
a file is checked against the channel's vectors when it is used (see
``VectorIndex.adopt``), and one that is missing, unreadable or out of date is passed over
and the graph built again. Forgetting leaves nothing behind here: a file holds ids and
fingerprints, never what a memory said, and a dropped channel's files are deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from calor.server.recall.hnsw import GraphLinks

__all__ = ["GraphFiles", "SavedGraph"]

log = logging.getLogger(__name__)

# 2: vectors 8-bit quantised (the ranges saved with the links); 3: the precision named
_FORMAT = 3


@dataclass
class SavedGraph:
    """One index's graph as saved: its links, and per node the memory id and vector
    fingerprint, as of RocksDB sequence ``sequence``."""

    links: GraphLinks
    ids: list[str]
    prints: npt.NDArray[np.uint64]
    sequence: int


class GraphFiles:
    """The saved graphs of one data directory, one file per channel index."""

    def __init__(self, directory: Path, dim: int) -> None:
        self.directory = directory
        self.dim = dim

    def save(self, channel: str, kind: str, graph: SavedGraph) -> None:
        """Write a graph atomically (a crash leaves the old file or the new one)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(channel, kind)
        meta = {
            "format": _FORMAT,
            "dim": self.dim,
            "channel": channel,
            "kind": kind,
            "sequence": graph.sequence,
            "entry_point": graph.links.entry_point,
            "max_level": graph.links.max_level,
            "precision": graph.links.precision,
        }
        partial = path.with_suffix(".partial")
        with partial.open("wb") as out:
            arrays: dict[str, Any] = {
                "meta": np.array(json.dumps(meta)),
                "ids": np.array(graph.ids, dtype=str),
                "prints": graph.prints,
            }
            arrays.update({f"links_{name}": array for name, array in graph.links.arrays.items()})
            np.savez(out, **arrays)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
        _sync_directory(self.directory)

    def load(self, channel: str, kind: str) -> SavedGraph | None:
        """The graph saved for a channel's index; None if there is none or it cannot be
        read (the graph is then built again)."""
        path = self._path(channel, kind)
        if not path.exists():
            return None
        try:
            with path.open("rb") as raw, np.load(raw, allow_pickle=False) as saved:
                meta = json.loads(str(saved["meta"]))
                if (meta["format"], meta["dim"], meta["channel"]) != (_FORMAT, self.dim, channel):
                    return None
                arrays = {
                    name.removeprefix("links_"): saved[name]
                    for name in saved.files
                    if name.startswith("links_")
                }
                links = GraphLinks(
                    arrays, int(meta["entry_point"]), int(meta["max_level"]), meta["precision"]
                )
                ids = saved["ids"].tolist()
                prints = saved["prints"].astype(np.uint64)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
            log.warning("passing over the saved graph %s: %s", path, error)
            return None
        if not len(ids) == prints.shape[0] == links.size:
            return None
        return SavedGraph(links, ids, prints, int(meta["sequence"]))

    def discard(self, channel: str) -> None:
        """Delete a channel's saved graphs (it was dropped)."""
        for path in self.directory.glob(f"{_stem(channel)}-*"):
            path.unlink(missing_ok=True)

    def _path(self, channel: str, kind: str) -> Path:
        return self.directory / f"{_stem(channel)}-{kind}.npz"


def _stem(channel: str) -> str:
    """A file name for any channel name (names hold any character)."""
    return hashlib.sha256(channel.encode()).hexdigest()[:32]


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
