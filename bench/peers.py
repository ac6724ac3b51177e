"""Calor beside a plain vector store, in one run on the same texts: `make bench-peers`.

At each size (default 10,000 and 100,000 short memories), in order:

1. **Raw model**: the bench process embeds the texts with the server's own embedder
   (``calor.server.embedding.load_model``, the server's 2 threads); texts/s. Before
   that, each query's median time to embed alone is measured (5 runs): the figure
   subtracted from Calor's end-to-end recall times for "query embedding excluded".
2. **Calor**: a fresh ``calor serve`` (``_peers_calor.py``): ingest through one
   ``StoreStream``; one client's recalls (peek, then non-peek); 8 concurrent clients
   for a fixed time; RSS before and after ingest; disk; start-up to SERVING on the
   same data after a stop.
3. **ChromaDB**: an embedded ``PersistentClient`` in a worker subprocess
   (``_peers_chroma.py``), cosine collection, the same embedder behind its embedding
   function: ingest in batches; single queries with the text (embedding included)
   and with the precomputed vector (excluded); 8 threads; RSS; disk; start-up.

Then, unless ``--no-million``, Calor's dense index layer at 1,000,000 GENERATED
clustered vectors (``_peers_index.py``; said so in the table and the JSON).

The corpus is short memories (one or two sentences, 40-250 characters) cut from
LongMemEval turns (``corpus.build_short_corpus``); queries are LongMemEval questions,
in three disjoint sets: 50 warm-ups, 300 peek, 100 non-peek; the concurrent clients ask
8,000 further corpus sentences, stored nowhere and asked nowhere else, each once (so a
cache of query vectors cannot answer them). Results: a table, and JSON in
``bench/results/peers-<UTC stamp>.json``.

    .venv/bin/python bench/peers.py [--sizes 10000,100000] [--quick] [--no-million]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from _peers_calor import measure_calor
from _peers_chroma import measure_chroma
from _peers_common import (
    WARMUP_QUERIES,
    Json,
    Patience,
    Workload,
    cleanest,
    load_embedder,
    query_embed_ms,
)
from _peers_index import INDEXES, measure_index
from _peers_report import add_verdicts, render
from corpus import Corpus, build_short_corpus
from throughput import machine_info, write_results

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results"
CONCURRENT_POOL = 8_000  # queries for the concurrent runs: corpus texts past the stored ones


def measure_model(
    corpus: Corpus, sizes: Sequence[int], work: Workload, patience: Patience
) -> tuple[Json, Json]:
    """Each query's embedding time alone, and the raw model's texts/s at each size, in
    this process; the model is freed afterwards so it does not compete with the stores."""
    embedder = load_embedder()
    queries = [*work.peek, *work.nonpeek]

    def embed_each() -> Json:
        medians = query_embed_ms(embedder, queries, work.warmup)
        return {"ms": dict(zip(queries, medians, strict=True))}

    embedding = cleanest("query embedding times, in-process", patience, embed_each)
    raw: Json = {}
    for size in sizes:
        texts = corpus.texts[:size]
        raw[str(size)] = cleanest(
            f"raw model: embedding {size:,} texts",
            patience,
            partial(_raw_throughput, embedder, texts),
        )
    return embedding, raw  # the model goes with this frame


def _raw_throughput(embedder: Any, texts: list[str]) -> Json:
    """Texts/s of one ``embed_passages`` call over all ``texts``, after a warm-up."""
    embedder.embed_passages(texts[:64])
    started = time.perf_counter()
    embedder.embed_passages(texts)
    seconds = time.perf_counter() - started
    return {"texts": len(texts), "per_s": round(len(texts) / seconds, 1)}


def measure_size(work: Workload, embed_ms: dict[str, float], raw: Json, patience: Patience) -> Json:
    """Calor, then ChromaDB, on one size's workload."""
    size = len(work.texts)
    calor = cleanest(f"calor: {size:,} memories", patience, lambda: measure_calor(work, embed_ms))
    chroma = cleanest(f"chromadb: {size:,} memories", patience, lambda: _chroma(work))
    return {"memories": size, "raw": raw, "calor": calor, "chroma": chroma}


def _chroma(work: Workload) -> Json:
    workdir = Path(tempfile.mkdtemp(prefix="calor-peers-chroma-"))
    try:
        return measure_chroma(work, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace) -> Json:
    """Every measurement, as one report."""
    began = time.perf_counter()
    report: Json = {
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "settings": {
            "sizes": args.sizes,
            "peek_queries": args.queries,
            "nonpeek_queries": args.nonpeek,
            "clients": args.clients,
            "client_seconds": args.seconds,
            "index_vectors": args.index_vectors if args.million else None,
            "quiet_wait_s": args.quiet_wait,
            "retries": args.retries,
        },
        "sizes": [],
        "index": None,
    }
    if args.sizes:
        report |= _stores(args)
    if args.million:
        report["index"] = cleanest(
            f"index layer: {args.index_vectors:,} generated vectors",
            _patience(args),
            lambda: measure_index(INDEXES, args.index_vectors, args.queries),
        )
    report["total_s"] = round(time.perf_counter() - began, 1)
    add_verdicts(report)
    return report


def _stores(args: argparse.Namespace) -> Json:
    wanted, largest = WARMUP_QUERIES + args.queries + args.nonpeek, max(args.sizes)
    corpus = build_short_corpus(largest + CONCURRENT_POOL, wanted)
    pool = corpus.texts[largest:]
    stored = Corpus(
        corpus.texts[:largest], corpus.queries, _without_last(corpus.sources, len(pool))
    )
    described = stored.describe()
    print(f"corpus: {described}", flush=True)
    full = Workload.split(
        stored.texts, corpus.queries, pool, args.queries, args.nonpeek, args.clients, args.seconds
    )
    embedding, raw = measure_model(corpus, args.sizes, full, _patience(args))
    embed_ms: dict[str, float] = embedding.pop("ms")
    gc.collect()
    sizes = []
    for size in args.sizes:
        work = replace(full, texts=stored.texts[:size])
        sizes.append(measure_size(work, embed_ms, raw[str(size)], _patience(args)))
    return {
        "corpus": described
        | {"generated_fallback": "generated" in corpus.sources, "concurrent_pool": len(pool)},
        "query_embedding": _embedding_summary(embed_ms) | embedding,
        "sizes": sizes,
    }


def _without_last(sources: dict[str, int], count: int) -> dict[str, int]:
    """Source counts less the last ``count`` texts (taken from the last sources)."""
    kept = dict(sources)
    for name in reversed(list(kept)):
        taken = min(count, kept[name])
        kept[name] -= taken
        count -= taken
    return {name: n for name, n in kept.items() if n}


def _embedding_summary(embed_ms: dict[str, float]) -> Json:
    values = sorted(embed_ms.values())
    return {
        "how": "each query embedded alone in the bench process, the server's embedder "
        "and threads, median of 5 runs; subtracted per query from Calor's end-to-end "
        "time for the 'excluded' figures",
        "queries": len(values),
        "p50_ms": round(values[len(values) // 2], 2),
        "max_ms": round(values[-1], 2),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=[10_000, 100_000],
        help="memories per run, comma-separated (default 10000,100000; 0: none)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2,000 memories, 5 s concurrent runs, the index layer at 100,000 vectors",
    )
    parser.add_argument(
        "--million",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the index layer at 1M generated vectors (default on)",
    )
    parser.add_argument(
        "--index-vectors",
        type=int,
        default=1_000_000,
        help="generated vectors for the index-layer part (default 1,000,000)",
    )
    parser.add_argument("--queries", type=int, default=300, help="peek queries timed")
    parser.add_argument("--nonpeek", type=int, default=100, help="non-peek queries timed")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=20.0, help="concurrent run length")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each phase, wait up to this long for other processes to leave the CPU "
        "idle (on a shared machine; default 0: do not wait)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="run a phase again, up to N times, while other processes took more than a "
        "fifth of a core during it; the least disturbed run is kept (default 0)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.seconds, args.index_vectors = [2_000], 5.0, 100_000
    if any(size < 64 for size in args.sizes):
        parser.error("each size must be at least 64 memories")
    return args


def _patience(args: argparse.Namespace) -> Patience:
    return Patience(quiet_wait=args.quiet_wait, retries=args.retries)


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip() and int(part) > 0]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print()
    print(render(report))
    path = write_results(report, args.out, name="peers")
    print(f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
