"""FAISS HNSW graphs over vectors held at a precision: made empty, their links taken out
(:class:`GraphLinks`, to save) and joined back to the vectors, and each vector's
fingerprint (so a saved graph can tell which of its vectors changed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import faiss
import numpy as np
import numpy.typing as npt

__all__ = ["PRECISIONS", "GraphLinks", "fingerprints", "new_graph", "quantiser"]

_F16 = npt.NDArray[np.float16]
_F32 = npt.NDArray[np.float32]
_I64 = npt.NDArray[np.int64]
_U64 = npt.NDArray[np.uint64]

PRECISIONS: dict[str, Any] = {
    "half": faiss.ScalarQuantizer.QT_fp16,
    "int8": faiss.ScalarQuantizer.QT_8bit,
    "int4": faiss.ScalarQuantizer.QT_4bit,
}
"""How an index may hold its vectors, by name: FAISS's scalar quantiser types."""

_LINKS = 32  # HNSW M: neighbours per node
_BUILD_BREADTH = 80  # efConstruction
# The parts of a FAISS HNSW graph that hold its links (the vectors are stored apart).
_LINK_ARRAYS = ("assign_probas", "cum_nneighbor_per_level", "levels", "offsets", "neighbors")
_RANGES = "quantiser_ranges"  # saved beside the links: how vectors are encoded in bits

_FINGERPRINT_ROWS = 8_192  # rows hashed at a time (bounds the scratch memory)
_FINGERPRINT_WEIGHTS = np.random.default_rng(0x6361_6C6F_72).integers(
    1, 2**63, size=4_096, dtype=np.uint64
) | np.uint64(1)


def fingerprints(vectors: _F32 | _F16) -> _U64:
    """A 64-bit hash of each row's bits at half precision, as exact search holds them:
    equal rows, equal prints (so a saved graph can tell which of its vectors changed
    without keeping them)."""
    words = np.ascontiguousarray(vectors, dtype=np.float16).view(np.uint16)
    weights = _FINGERPRINT_WEIGHTS[: words.shape[1]]
    out = np.empty(words.shape[0], dtype=np.uint64)
    for start in range(0, words.shape[0], _FINGERPRINT_ROWS):
        chunk = words[start : start + _FINGERPRINT_ROWS].astype(np.uint64)
        out[start : start + chunk.shape[0]] = (chunk * weights).sum(axis=1)  # wraps mod 2^64
    return out


@dataclass
class GraphLinks:
    """An HNSW graph without its vectors: which node links to which, at which level.

    ``arrays`` are FAISS's own (levels, offsets, neighbours, ...) and the quantiser's
    ranges; node ``i`` is the ``i``-th vector the graph was built from, held at
    ``precision``.
    """

    arrays: dict[str, np.ndarray]
    entry_point: int
    max_level: int
    precision: str = "half"

    @property
    def size(self) -> int:
        """How many nodes the graph has."""
        return int(self.arrays["levels"].shape[0])

    @classmethod
    def of(cls, graph: faiss.IndexIDMap2) -> GraphLinks:
        """The links of a built graph (copied out), with its quantiser's ranges."""
        index = cast(faiss.IndexHNSWSQ, faiss.downcast_index(graph.index))
        arrays = {name: faiss.vector_to_array(getattr(index.hnsw, name)) for name in _LINK_ARRAYS}
        encoding = quantiser(index)
        arrays[_RANGES] = faiss.vector_to_array(encoding.trained)
        precision = next(name for name, kind in PRECISIONS.items() if kind == encoding.qtype)
        return cls(arrays, int(index.hnsw.entry_point), int(index.hnsw.max_level), precision)

    def join(self, vectors: _F32, labels: _I64) -> faiss.IndexIDMap2:
        """The searchable graph of these links with node ``i``'s vector and label in row
        ``i``."""
        index = new_graph(vectors.shape[1], self.precision, self.arrays[_RANGES])
        graph = faiss.IndexIDMap2(index)
        for name in _LINK_ARRAYS:
            target = getattr(index.hnsw, name)
            target.clear()
            faiss.copy_array_to_vector(self.arrays[name], target)
        index.hnsw.entry_point, index.hnsw.max_level = self.entry_point, self.max_level
        faiss.downcast_index(index.storage).add(np.ascontiguousarray(vectors, dtype=np.float32))
        index.ntotal = graph.ntotal = self.size
        faiss.copy_array_to_vector(labels, graph.id_map)
        graph.construct_rev_map()
        return graph


def new_graph(dim: int, precision: str, ranges: np.ndarray | None) -> faiss.IndexHNSWSQ:
    """An empty HNSW graph over vectors held at ``precision``; a quantised one encodes
    with the trained ``ranges`` it is given."""
    index = faiss.IndexHNSWSQ(dim, PRECISIONS[precision], _LINKS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = _BUILD_BREADTH
    if precision != "half":
        if ranges is None or ranges.size == 0:
            raise ValueError(f"a {precision} graph needs its quantiser's ranges")
        storage = faiss.downcast_index(index.storage)
        faiss.copy_array_to_vector(np.asarray(ranges, dtype=np.float32), quantiser(index).trained)
        storage.is_trained = index.is_trained = True
    return index


def quantiser(index: faiss.Index) -> faiss.ScalarQuantizer:
    """The scalar quantiser of an index's vectors: an exact index's own, a graph's
    storage's."""
    inner: Any = faiss.downcast_index(
        index.index if isinstance(index, faiss.IndexIDMap2) else index
    )
    if isinstance(inner, faiss.IndexHNSW):
        inner = faiss.downcast_index(inner.storage)
    return cast(faiss.ScalarQuantizer, inner.sq)
