"""Vectors by heat tier: how much of exact float32 search tiered search finds, and what
each memory's vector costs, for several mixes of hot, warm and cold memories.

N short memories (the peers bench's corpus) and Q queries are embedded once with the
server's model (cached under ``bench/.cache/``), held in a channel's
:class:`~calor.server.recall.tiers.TieredVectors` with a given share in each tier
(their precisions are ``TIERS``'), and searched exactly
and through HNSW graphs, a 4-bit tier's best hits scored again from the whole vectors
(as recall does from RocksDB; once more without, to show what that adds). recall@10 is
against exact float32 search over the same vectors. Prints a table and writes JSON::

    .venv/bin/python bench/tiers.py --memories 20000 --queries 300
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import build_short_corpus  # noqa: E402
from throughput import cpu_flags, cpu_model  # noqa: E402

from calor.models.embedder import OnnxEmbedder  # noqa: E402
from calor.server.recall.tiers import TIERS, TieredVectors  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / "bench" / ".cache"
# (name, share hot, warm, cold): all fresh; a channel of episodic memories stored evenly
# over ten days (hot the first day, cold after three and a third); even; all cold.
MIXES = (
    ("all hot", 1.0, 0.0, 0.0),
    ("episodic over 10 days", 0.10, 0.23, 0.67),
    ("a third each", 1 / 3, 1 / 3, 1 / 3),
    ("all cold", 0.0, 0.0, 1.0),
)


def embedded(memories: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """The corpus's vectors and the queries', from the cache or the model."""
    path = CACHE / f"tiers-{memories}-{queries}.npz"
    if path.exists():
        with np.load(path) as saved:
            return saved["texts"], saved["queries"]
    corpus = build_short_corpus(memories, queries)
    model = OnnxEmbedder.load()
    texts, asked = model.embed_passages(corpus.texts), model.embed_queries(corpus.queries)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, texts=texts, queries=asked)
    return texts, asked


def measure(
    vectors: np.ndarray,
    queries: np.ndarray,
    shares: tuple[float, float, float],
    graphs: bool,
    rescore: bool = True,
) -> dict[str, float]:
    """recall@10 against exact float32, search time and vector bytes per memory."""
    count = vectors.shape[0]
    rng = np.random.default_rng(7)
    tiers = rng.choice(len(TIERS), size=count, p=np.array(shares) / sum(shares)).astype(np.int8)

    def whole(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return vectors[labels], np.ones(labels.shape[0], dtype=bool)

    held = TieredVectors(
        vectors.shape[1],
        approximate_above=1_000 if graphs else count + 1,
        whole=whole if rescore else None,
    )
    held.add(np.arange(count, dtype=np.int64), vectors, tiers)
    for _, index in held.held():
        if index.wants_graph():
            build = index.snapshot()
            build.run()
            index.install(build)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    took = []
    found = np.empty((queries.shape[0], 10), dtype=np.int64)
    for row, query in enumerate(queries):
        started = time.perf_counter()
        _, labels = held.search(query.reshape(1, -1), 10)
        took.append(time.perf_counter() - started)
        found[row] = labels[0]
    recall = np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact, strict=True)])
    code_bytes = sum(index.code_size * index.live for _, index in held.held())
    return {
        "recall_at_10": round(float(recall), 4),
        "search_ms_p50": round(1000 * float(np.median(took)), 3),
        "vector_bytes_per_memory": round(code_bytes / count, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "tiers.json")
    args = parser.parse_args()
    vectors, queries = embedded(args.memories, args.queries)
    flags = " ".join(name for name, present in cpu_flags().items() if present)
    print(f"{args.memories:,} memories, {args.queries} queries; CPU {cpu_model()} ({flags})")
    print(f"  {'mix':<24} {'search':<22} {'recall@10':>9} {'p50 ms':>7} {'vector B/memory':>16}")
    rows = []
    runs = [(name, (h, w, c), graphs, True) for name, h, w, c in MIXES for graphs in (False, True)]
    coldest, *cold_shares = MIXES[-1]
    runs += [(coldest, tuple(cold_shares), graphs, False) for graphs in (False, True)]
    for name, shares, graphs, rescore in runs:
        figures = measure(vectors, queries, shares, graphs, rescore)
        how = ("graphs" if graphs else "exact") + ("" if rescore else ", not re-scored")
        rows.append({"mix": name, "search": how, **figures})
        print(
            f"  {name:<24} {how:<22} {figures['recall_at_10']:>9.3f} "
            f"{figures['search_ms_p50']:>7.3f} {figures['vector_bytes_per_memory']:>16.1f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"memories": args.memories, "cpu": cpu_model(), "cpu_flags": cpu_flags(), "rows": rows}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
