"""What a loaded memory costs the engine in memory, and how long a channel takes to load.

One channel of N short memories (the peers bench's corpus, embedded by the server's
model once and cached in ``bench/.cache/``) is written through
``MemoryEngine.store_all`` into a RocksDB store, in one batch as a ``StoreStream`` is
(or ``--batch`` at a time), and the writing process's resident memory is read once the
channel is indexed. Then a new process opens the store, loads the channel (its HNSW
graph restored or built, as the server does) and reports its resident memory beyond
what it held with the model loaded and the store open: per memory, as loaded, and
after 200 non-peek recalls. In-process, no gRPC: the engine's own footprint.

```
.venv/bin/python bench/footprint.py [--memories 100000] [--batch N] [--out DIR]
```
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from corpus import build_short_corpus
from throughput import machine_info, write_results

from calor.server.clock import SystemClock
from calor.server.commands import NewMemory, RecallQuery
from calor.server.embedding import load_model
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.storage.store import MemoryStore
from calor.server.thermo.policy import ChannelPolicy

CHANNEL = "footprint"
CACHE = Path(__file__).parent / ".cache"
RECALLS = 200


def resident_kb() -> int:
    """This process's resident anonymous memory (heap, not mapped files)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def write_channel(data: Path, memories: int, batch: int) -> tuple[list[str], float]:
    """The channel written to ``data``; returns the queries to recall with and the
    writing process's resident KB per memory once the ingest (and its graph) is done."""
    corpus = build_short_corpus(memories, RECALLS)
    model = load_model()
    cached = CACHE / f"footprint-{memories}.npy"
    if cached.exists():
        vectors = np.load(cached)
    else:
        vectors = np.concatenate(
            [model.embed_passages(corpus.texts[i : i + 256]) for i in range(0, memories, 256)]
        )
        cached.parent.mkdir(parents=True, exist_ok=True)
        np.save(cached, vectors)
    store = MemoryStore.open(data, model_id=model.model_id, dim=model.dim, sync=False)
    engine = MemoryEngine.open(store, SystemClock(), ChannelPolicy())
    before = resident_kb()
    batch = batch or memories
    for start in range(0, memories, batch):
        items = [NewMemory(channel=CHANNEL, text=t) for t in corpus.texts[start : start + batch]]
        engine.store_all(items, vectors[start : start + batch])
    graphs = engine.channels.graphs
    while not graphs.idle():  # the graph built and saved, as a server would have it
        time.sleep(0.5)
    ingested = (resident_kb() - before) / memories
    store.close()
    return list(corpus.queries), ingested


def measure(data: Path, memories: int, queries: list[str]) -> dict[str, Any]:
    """Run in a fresh process: load the channel, recall, report (see the module doc)."""
    model = load_model()
    vectors = [model.embed_query(q) for q in queries]
    store = MemoryStore.open(data, model_id=model.model_id, dim=model.dim)
    before = resident_kb()
    started = time.perf_counter()
    engine = MemoryEngine.open(store, SystemClock(), ChannelPolicy())
    view = engine.channels.find(CHANNEL)
    load_s = time.perf_counter() - started
    assert view is not None
    while not engine.channels.graphs.idle():
        time.sleep(0.5)
    loaded = resident_kb()
    for query, vector in zip(queries, vectors, strict=True):
        engine.recall(RecallQuery(channel=CHANNEL, query=query, peek=False), vector)
    recalled = resident_kb()
    return {
        "memories": memories,
        "load_s": round(load_s, 2),
        "approximate": view.index.vectors.approximate,
        "graph_restored": engine.channels.graphs.restored,
        "graph_built": engine.channels.graphs.built,
        "kb_per_memory_loaded": round((loaded - before) / memories, 2),
        "kb_per_memory_after_recalls": round((recalled - before) / memories, 2),
        "non_peek_recalls": len(queries),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument(
        "--batch", type=int, default=0, help="memories per store (default: all in one)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.measure is not None:
        queries = json.loads((args.measure / "queries.json").read_text())
        print(json.dumps(measure(args.measure, args.memories, queries)))
        return 0
    with tempfile.TemporaryDirectory(prefix="calor-footprint-") as folder:
        data = Path(folder)
        queries, ingested = write_channel(data, args.memories, args.batch)
        (data / "queries.json").write_text(json.dumps(queries))
        child = [sys.executable, __file__, "--memories", str(args.memories), "--measure", folder]
        result = json.loads(subprocess.run(child, check=True, capture_output=True).stdout)
        result["kb_per_memory_after_ingest"] = round(ingested, 2)
        result["batch"] = args.batch or args.memories
    machine = machine_info()
    print(f"Footprint of one loaded channel ({machine['cpu']}, commit {machine['git_commit']})")
    print(f"  memories                          {result['memories']:>10,}")
    print(f"  load s (first use after start)    {result['load_s']:>10.2f}")
    print(f"  searched through a graph          {result['approximate']!s:>10}")
    graphs = f"{result['graph_restored']} / {result['graph_built']}"
    print(f"  graphs restored / built at load   {graphs:>10}")
    print(f"  KB per memory, after ingest       {result['kb_per_memory_after_ingest']:>10.2f}")
    print(f"  KB per memory, loaded             {result['kb_per_memory_loaded']:>10.2f}")
    after = result["kb_per_memory_after_recalls"]
    print(f"  KB per memory, after {RECALLS} non-peek recalls {after:>6.2f}")
    report = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine}
    path = write_results({**report, **result}, args.out, "footprint")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
