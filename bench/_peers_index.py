"""Calor's dense index layer at a million vectors, on GENERATED clustered vectors.

Calor's API stores texts, not bare vectors, and a million texts would take the model
most of a day on this machine; so this part measures the layer recall searches
(``calor.server.recall.index.ChannelIndex.dense``) in this process, on generated
vectors: ``clusters`` Gaussian clusters around random unit centres, every point
unit-normed, the queries drawn from the same clusters. No model, no gRPC, no ranking:
the figures are the index's own search time (query embedding excluded) and its
recall@10 against an exact search over the same vectors.

The indexes under test come from factories (``dim -> index``), all measured against
one exact ground truth: ``exact`` (``ChannelIndex`` told never to go approximate) and
``server default`` (``ChannelIndex`` as the server makes it: past its
``approximate_above`` it searches an HNSW graph, which the bench builds the way the
server does off the request path, and times). Another index type is one more factory.
"""

from __future__ import annotations

import gc
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from _peers_common import Json, timed_ms
from _server import rss_kb
from throughput import summarize

DIM = 384
CLUSTERS = 1000
SPREAD = 0.04  # per-dimension noise around a centre: about 0.8 in norm at 384 dims
CHUNK = 100_000
WARMUP = 10


class DenseIndex(Protocol):
    """What the bench needs of an index: add vectors under ids, search one query."""

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None: ...

    def dense(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best (labels, similarities) for one query, best first."""
        ...

    def memory_id(self, label: int) -> str: ...

    def settle(self) -> float:
        """Finish what would be built off the request path; returns its seconds."""
        ...

    def kind(self) -> str:
        """How it searches now (``exact``, ``hnsw``, ...)."""
        ...


IndexFactory = Callable[[int], DenseIndex]
"""Makes an empty index of a dimension: what ``measure_index`` measures."""


class ChannelIndexLayer:
    """A ``ChannelIndex`` fed bare vectors: each under a minimal record (empty text, a
    fact of heat 1), so what it keeps per memory beside the vector (labels, record
    columns) is what the server keeps; searched through ``ChannelIndex.dense``."""

    def __init__(self, index: Any) -> None:
        self.index = index
        self.saved: Path | None = None  # where settle() saved the graph, as the server does

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        self.index.add(self._records(ids), vectors)

    @staticmethod
    def _records(ids: Sequence[str]) -> list[Any]:
        from calor.server.records import MemoryRecord

        return [
            MemoryRecord(
                id=memory_id,
                channel="bench",
                text="",
                memory_type="fact",
                created_at=0.0,
                updated_at=0.0,
                heat0=1.0,
                t0=0.0,
            )
            for memory_id in ids
        ]

    def dense(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        labels, sims = self.index.dense(query, k)
        return labels, sims

    def memory_id(self, label: int) -> str:
        return str(self.index.memory_id(label))

    def settle(self) -> float:
        """Build the HNSW graph the server would build in the background now (snapshot,
        build without the lock, install), if the index wants one."""
        vectors = getattr(self.index, "vectors", None)
        if vectors is None or not hasattr(vectors, "wants_graph") or not vectors.wants_graph():
            return 0.0
        from calor.server.recall.graph_files import GraphFiles, SavedGraph
        from calor.server.recall.hnsw import GraphLinks, fingerprints

        started = time.perf_counter()
        build = vectors.snapshot()
        ids, prints = self.index.memory_ids(build.labels), fingerprints(build.vectors)
        build.run()
        took = time.perf_counter() - started
        self.saved = Path(tempfile.mkdtemp(prefix="calor-bench-graph-"))
        GraphFiles(self.saved, self.index.dim).save(
            "bench", "live", SavedGraph(GraphLinks.of(build.graph), ids, prints, 0)
        )
        if not vectors.install(build):
            raise RuntimeError("the HNSW graph was built but not installed")
        return took

    def restart(self, base: np.ndarray) -> Json:
        """What a restart costs: the memories indexed again (exact), then the graph
        settle() saved read and joined to them; seconds of each, and the kind after."""
        from calor.server.recall.graph_files import GraphFiles
        from calor.server.recall.index import ChannelIndex

        if self.saved is None:
            return {}
        fresh = ChannelIndexLayer(ChannelIndex(self.index.dim))
        indexed = _build(fresh, base)
        started = time.perf_counter()
        saved = GraphFiles(self.saved, self.index.dim).load("bench", "live")
        restored = saved is not None and fresh.index.restore(saved)
        joined = time.perf_counter() - started
        shutil.rmtree(self.saved, ignore_errors=True)
        return {
            "reindex_s": round(indexed, 2),
            "graph_restore_s": round(joined, 2),
            "restored": restored,
            "kind": fresh.kind(),
        }

    def kind(self) -> str:
        return (
            "hnsw"
            if getattr(getattr(self.index, "vectors", None), "approximate", False)
            else "exact"
        )


def exact_index(dim: int) -> DenseIndex:
    """``ChannelIndex`` searching exactly at any size (FAISS flat inner product)."""
    from calor.server.recall.index import ChannelIndex

    return ChannelIndexLayer(ChannelIndex(dim, approximate_above=sys.maxsize))


def server_index(dim: int) -> DenseIndex:
    """``ChannelIndex`` with the server's defaults (approximate past its threshold)."""
    from calor.server.recall.index import ChannelIndex

    return ChannelIndexLayer(ChannelIndex(dim))


INDEXES: dict[str, IndexFactory] = {"exact": exact_index, "server default": server_index}


def clustered(
    centres: np.ndarray, count: int, rng: np.random.Generator, spread: float = SPREAD
) -> np.ndarray:
    """``count`` unit vectors, each a random centre plus Gaussian noise, float32."""
    out = np.empty((count, centres.shape[1]), dtype=np.float32)
    for start in range(0, count, CHUNK):
        end = min(start + CHUNK, count)
        rows = centres[rng.integers(0, len(centres), end - start)]
        rows += rng.standard_normal(rows.shape, dtype=np.float32) * spread
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        out[start:end] = rows
    return out


def exact_top_k(base: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """The row numbers of each query's ``k`` largest inner products, by brute force in
    chunks (no second copy of ``base``)."""
    best_sims = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_rows = np.empty((len(queries), 0), dtype=np.int64)
    for start in range(0, len(base), CHUNK):
        sims = queries @ base[start : start + CHUNK].T
        top = np.argpartition(-sims, min(k, sims.shape[1]) - 1, axis=1)[:, :k]
        best_sims = np.concatenate([best_sims, np.take_along_axis(sims, top, axis=1)], axis=1)
        best_rows = np.concatenate([best_rows, top + start], axis=1)
        keep = np.argsort(-best_sims, axis=1)[:, :k]
        best_sims = np.take_along_axis(best_sims, keep, axis=1)
        best_rows = np.take_along_axis(best_rows, keep, axis=1)
    return best_rows


def measure_index(
    factories: Mapping[str, IndexFactory] = INDEXES,
    count: int = 1_000_000,
    queries: int = 300,
    k: int = 10,
    seed: int = 13,
) -> Json:
    """Build each index of ``count`` generated vectors in turn and time ``queries``
    searches on it; recall@k of each against one exact brute-force search."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLUSTERS, DIM), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    base = clustered(centres, count, rng)
    asked = clustered(centres, queries + WARMUP, rng)
    truth = exact_top_k(base, asked[WARMUP:], k)
    measured = {}
    for name, factory in factories.items():
        print(f"  {name} index: building...", flush=True)
        measured[name] = _measure_one(factory, base, asked, truth, k)
        gc.collect()
    return {
        "generated": True,
        "what": "generated clustered vectors on the dense index layer only "
        "(no model, no gRPC, no ranking): query embedding excluded",
        "vectors": count,
        "dim": DIM,
        "clusters": CLUSTERS,
        "spread": SPREAD,
        "k": k,
        "indexes": measured,
    }


def _measure_one(
    factory: IndexFactory, base: np.ndarray, asked: np.ndarray, truth: np.ndarray, k: int
) -> Json:
    gc.collect()
    before = rss_kb()
    index = factory(DIM)
    built = _build(index, base)
    graph = index.settle()
    after = rss_kb()
    for query in asked[:WARMUP]:
        index.dense(query, k)
    found: list[list[int]] = []

    def search(i: int) -> object:
        labels, _ = index.dense(asked[WARMUP + i], k)
        found.append([int(index.memory_id(int(label))[1:]) for label in labels])
        return labels

    times = timed_ms(search, len(truth))
    recall = np.mean([len(set(f) & set(t.tolist())) / k for f, t in zip(found, truth, strict=True)])
    restart = getattr(index, "restart", None)
    return {
        "index": type(getattr(index, "index", index)).__name__,
        "kind": index.kind(),
        "add_s": round(built, 2),
        "graph_build_s": round(graph, 2),
        "index_rss_kb_per_vector": None
        if before is None or after is None
        else round((after - before) / len(base), 3),
        "search": summarize(times),
        "recall_at_k": round(float(recall), 4),
        "after_restart": restart(base) if restart is not None else {},
    }


def _build(index: DenseIndex, base: np.ndarray) -> float:
    started = time.perf_counter()
    for start in range(0, len(base), CHUNK):
        rows = base[start : start + CHUNK]
        index.add([f"v{start + i}" for i in range(len(rows))], rows)
    return time.perf_counter() - started
