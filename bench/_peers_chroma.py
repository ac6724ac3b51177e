"""ChromaDB's side of the peers bench, run in a subprocess of its own.

ChromaDB's ``PersistentClient`` is embedded: it lives in the application's process. The
bench runs it in a worker subprocess (this file) so that its resident memory is
measured alone, as the Calor server's is, and not mixed with the bench's own. The
worker loads the same embedder as the Calor server (``calor.server.embedding``) and
gives it to ChromaDB through an ``EmbeddingFunction``, so both stores get the same ONNX
vectors and the comparison is between stores, not models.

    python bench/_peers_chroma.py run WORKLOAD.json DATA_DIR RESULT.json
    python bench/_peers_chroma.py startup WORKLOAD.json DATA_DIR RESULT.json

``run`` creates a cosine collection in DATA_DIR, adds the texts in batches (ChromaDB
calls the embedding function), and times single queries with the query text (embedding
included) and with the query's precomputed vector (excluded), then the same with N
threads for a fixed time. ``startup`` opens the persisted collection in a new process
and answers one query. Both write their figures to RESULT.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
from _peers_common import Json, Workload, run_clients, timed_ms
from _server import rss_kb
from throughput import summarize

from calor.server.metrics import data_bytes

COLLECTION = "bench-memories"
BATCH = 1000
LIMIT = 10
INCLUDE = ["documents", "distances"]  # what a recall needs back: texts and scores
RESULT_TIMEOUT_S = 7200.0


# --- the bench process's side ---------------------------------------------------------


def measure_chroma(work: Workload, workdir: Path) -> Json:
    """Run the worker on ``work`` in ``workdir`` (a fresh data dir), then again to time
    start-up on the data it left; the figures of both, and the data dir's size."""
    workdir.mkdir(parents=True, exist_ok=True)
    workload, data = workdir / "workload.json", workdir / "chroma"
    work.save(workload)
    result = _worker("run", workload, data, workdir / "run.json")
    disk = data_bytes(data)
    result["disk_bytes"] = disk
    result["disk_kb_per_memory"] = round(disk / 1024 / len(work.texts), 3)
    started = time.perf_counter()
    startup = _worker("startup", workload, data, workdir / "startup.json")
    startup["process_to_first_answer_s"] = round(time.perf_counter() - started, 2)
    result["startup"] = startup
    return result


def _worker(mode: str, workload: Path, data: Path, out: Path) -> Json:
    command = [sys.executable, str(Path(__file__)), mode, str(workload), str(data), str(out)]
    subprocess.run(command, check=True, timeout=RESULT_TIMEOUT_S)
    result: Json = json.loads(out.read_text())
    return result


# --- the worker -----------------------------------------------------------------------


def embedding_function(embedder: Any = None) -> Any:
    """A ChromaDB ``EmbeddingFunction`` over Calor's embedder: passages as the server
    embeds stored texts, queries with the model's query prefix as the server embeds a
    recall's query. Loads the model on first use when none is given."""
    from _peers_common import load_embedder
    from chromadb.api.types import Documents, EmbeddingFunction, Embeddings

    class CalorEmbedding(EmbeddingFunction[Documents]):
        def __init__(self, model: Any = None) -> None:
            self._model = model

        @property
        def model(self) -> Any:
            if self._model is None:
                self._model = load_embedder()
            return self._model

        def __call__(self, input: Documents) -> Embeddings:
            return list(self.model.embed_passages(list(input)))

        def embed_query(self, input: Documents) -> Embeddings:
            return list(self.model.embed_queries(list(input)))

        @staticmethod
        def name() -> str:
            return "calor-bge-small-int8"

        def get_config(self) -> dict[str, Any]:
            return {}

        @staticmethod
        def build_from_config(config: dict[str, Any]) -> CalorEmbedding:
            return CalorEmbedding()

        def default_space(self) -> Any:
            return "cosine"

    return CalorEmbedding(embedder)


def _client(data: Path) -> Any:
    import chromadb
    from chromadb.config import Settings

    return chromadb.PersistentClient(path=str(data), settings=Settings(anonymized_telemetry=False))


def run(work: Workload, data: Path) -> Json:
    """Ingest, then single and concurrent queries, in this process."""
    from _peers_common import load_embedder

    embedder = load_embedder()
    function = embedding_function(embedder)
    function(work.texts[:64])  # warms the model as the Calor server's warm-up store does
    collection = _client(data).create_collection(
        COLLECTION, embedding_function=function, configuration={"hnsw": {"space": "cosine"}}
    )
    before = rss_kb()
    seconds = _ingest(collection, work.texts)
    after = rss_kb()
    result: Json = {
        "ingest": {
            "memories": len(work.texts),
            "seconds": round(seconds, 3),
            "per_s": round(len(work.texts) / seconds, 1),
            "batch": BATCH,
        },
        "rss_before_kb": before,
        "rss_after_kb": after,
        "rss_kb_per_memory": None
        if not before or not after
        else round((after - before) / len(work.texts), 3),
        "hnsw": dict(collection.configuration.get("hnsw") or {}),
    }
    return result | _queries(collection, work, embedder, data)


def _ingest(collection: Any, texts: Sequence[str]) -> float:
    started = time.perf_counter()
    for start in range(0, len(texts), BATCH):
        batch = list(texts[start : start + BATCH])
        ids = [str(i) for i in range(start, start + len(batch))]
        collection.add(ids=ids, documents=batch)
    return time.perf_counter() - started


def _queries(collection: Any, work: Workload, embedder: Any, data: Path) -> Json:
    vectors = embedder.embed_queries(work.peek)
    np.save(_vectors_file(data), vectors)  # for the start-up run's first query

    def by_text(text: str) -> Any:
        return collection.query(query_texts=[text], n_results=LIMIT, include=INCLUDE)

    def by_vector(vector: np.ndarray) -> Any:
        return collection.query(query_embeddings=[vector], n_results=LIMIT, include=INCLUDE)

    for text in work.warmup:
        by_text(text)
    result: Json = {
        "query": summarize(timed_ms(lambda i: by_text(work.peek[i]), len(work.peek))),
        "query_excl": summarize(timed_ms(lambda i: by_vector(vectors[i]), len(vectors))),
    }

    def texts(number: int) -> Any:  # the concurrent pool, as Calor's clients get it
        return nullcontext(lambda i: by_text(work.concurrent_query(number, i)))

    def peek_vectors(number: int) -> Any:  # the peek queries' vectors, in turn
        return nullcontext(lambda i: by_vector(vectors[(number + work.clients * i) % len(vectors)]))

    result["clients"] = run_clients(texts, work.clients, work.seconds)
    result["clients"]["repeated_queries"] = work.repeats(result["clients"]["calls"])
    result["clients_excl"] = run_clients(peek_vectors, work.clients, work.seconds)
    result["hits_per_query"] = float(np.mean([len(by_text(q)["ids"][0]) for q in work.peek[:5]]))
    result["rss_end_kb"] = rss_kb()
    return result


def startup(work: Workload, data: Path) -> Json:
    """Open the persisted collection in this new process and answer one query with its
    precomputed vector, then one with its text (the model loaded on that first use)."""
    started = time.perf_counter()
    import chromadb  # noqa: F401  (timed: part of what a new process pays)

    imported = time.perf_counter()
    function = embedding_function()
    collection = _client(data).get_collection(COLLECTION, embedding_function=function)
    opened = time.perf_counter()
    vector = np.load(_vectors_file(data))[0]  # the store's first answer, no model involved
    collection.query(query_embeddings=[vector], n_results=LIMIT, include=INCLUDE)
    answered = time.perf_counter()
    collection.query(query_texts=[work.peek[0]], n_results=LIMIT, include=INCLUDE)
    with_model = time.perf_counter()
    return {
        "import_s": round(imported - started, 3),
        "open_s": round(opened - imported, 3),
        "first_query_ms": round((answered - opened) * 1000, 2),
        "open_and_first_query_s": round(answered - imported, 3),
        "first_text_query_with_model_load_s": round(with_model - answered, 3),
        "rss_kb": rss_kb(),
        "count": collection.count(),
    }


def _vectors_file(data: Path) -> Path:
    return data.parent / "query-vectors.npy"


def main(argv: Sequence[str]) -> int:
    mode, workload, data, out = argv
    work = Workload.load(Path(workload))
    result = run(work, Path(data)) if mode == "run" else startup(work, Path(data))
    Path(out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
