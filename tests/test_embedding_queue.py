"""The model queue: queries never wait for ingest, which runs in bounded chunks, batches
taking turns."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np
import pytest

from calor.models.embedder import OnnxEmbedder
from calor.server.embedding import BatchEmbedding, EmbeddingQueue, IngestLane

DIM = 4
_Test = TypeVar("_Test", bound=Callable[..., Coroutine[Any, Any, None]])


def synchronously(test: _Test) -> Callable[..., None]:
    """Run an async test on a fresh event loop."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


class RecordingEmbedder:
    """A stand-in model that records each call's texts and can be held inside an ingest
    call, so the order the queue hands work to the model can be read exactly. Each text's vector
    encodes the text's number, so a caller can check it got its own rows back."""

    dim = DIM
    model_id = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self._inside = 0
        self.most_inside = 0  # the most passage calls inside the model at once
        self._count = threading.Lock()

    def _vectors(self, kind: str, texts: Sequence[str]) -> np.ndarray:
        self.calls.append((kind, list(texts)))
        if kind == "passages":
            with self._count:
                self._inside += 1
                self.most_inside = max(self.most_inside, self._inside)
            self.entered.set()
            self.gate.wait(10)
            with self._count:
                self._inside -= 1
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        out[:, 0] = [float(t.split("-")[-1]) for t in texts]
        return out

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._vectors("passages", texts)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._vectors("queries", texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self._vectors("queries", [text])[0]


def texts(prefix: str, count: int, width: int = 10) -> list[str]:
    """``count`` texts of about ``width`` characters, numbered from 0."""
    return [f"{prefix}{'x' * max(0, width - len(prefix) - 6)}-{i}" for i in range(count)]


async def held(model: RecordingEmbedder) -> None:
    """Wait until the model is inside a call that the test holds."""
    while not model.entered.is_set():
        await asyncio.sleep(0.001)


@synchronously
async def test_a_query_never_waits_behind_ingest() -> None:
    model = RecordingEmbedder()
    queue = EmbeddingQueue(model, max_batch=8)
    model.gate.clear()
    big = asyncio.ensure_future(queue.passages(texts("big", 40), IngestLane()))
    await held(model)
    # The model is busy with an ingest chunk that the test holds; the query goes through.
    vector = await asyncio.wait_for(queue.query("where-3"), 5)
    assert vector[0] == 3.0
    assert not big.done()
    model.gate.set()
    await big
    assert all(len(batch) <= 8 for kind, batch in model.calls if kind == "passages")
    await queue.close()


@synchronously
async def test_batches_take_turns_a_chunk_at_a_time() -> None:
    model = RecordingEmbedder()
    queue = EmbeddingQueue(model, max_batch=4)
    model.gate.clear()
    first = asyncio.ensure_future(queue.passages(texts("a", 20), IngestLane()))
    await held(model)
    second = asyncio.ensure_future(queue.passages(texts("b", 4), IngestLane()))
    await asyncio.sleep(0.01)
    model.gate.set()
    await asyncio.gather(first, second)
    owners = ["".join(sorted({t[0] for t in batch})) for _, batch in model.calls]
    # Two chunks of the big batch are in flight when the small one arrives; a batch
    # that has had no turn yet is served next (the third call), not after the big
    # one's 20 texts.
    assert owners[:3] == ["a", "a", "b"], owners
    assert owners[3:] == ["a"] * (len(owners) - 3)
    await queue.close()


@synchronously
async def test_each_caller_gets_its_own_rows_in_order() -> None:
    model = RecordingEmbedder()
    queue = EmbeddingQueue(model, max_batch=3)
    lanes = [IngestLane(), IngestLane(), None]
    jobs = [queue.passages(texts(f"l{n}", 10), lane) for n, lane in enumerate(lanes)]
    results = await asyncio.gather(*jobs, queue.query("q-7"))
    for vectors in results[:3]:
        assert vectors[:, 0].tolist() == list(range(10))
    assert results[3][0] == 7.0
    await queue.close()


@synchronously
async def test_ingest_keeps_its_runs_in_flight_and_answers_in_order() -> None:
    """Two ingest runs are inside the model at once (the model's threads never wait
    for the next chunk to be handed over); the rows still come back in order."""
    model = RecordingEmbedder()
    queue = EmbeddingQueue(model, max_batch=3, ingest_runs=2)
    model.gate.clear()
    job = asyncio.ensure_future(queue.passages(texts("n", 12), IngestLane()))
    while model.most_inside < 2:
        await asyncio.sleep(0.001)
    assert len([call for call in model.calls if call[0] == "passages"]) == 2
    model.gate.set()
    assert (await job)[:, 0].tolist() == list(range(12))
    assert model.most_inside == 2
    await queue.close()


@synchronously
async def test_chunks_shrink_to_the_time_budget_once_the_model_is_measured() -> None:
    model = RecordingEmbedder()
    queue = EmbeddingQueue(model, max_batch=64, chunk_seconds=1e-9)
    await queue.passages(texts("warm", 2))
    await queue.passages(texts("c", 30))
    # A budget below one text's cost still makes progress, one text per run.
    assert [len(batch) for _, batch in model.calls[1:]] == [1] * 30
    await queue.close()


@synchronously
async def test_a_batch_whose_caller_left_is_not_embedded() -> None:
    model = RecordingEmbedder()
    queue = EmbeddingQueue(model, max_batch=2, ingest_runs=2)
    model.gate.clear()
    batch = BatchEmbedding(queue, chunk=2)
    batch.add(texts("gone", 10))
    await held(model)
    batch.cancel()
    await asyncio.sleep(0.01)
    model.gate.set()
    kept = await queue.passages(texts("kept", 2))
    assert kept[:, 0].tolist() == [0.0, 1.0]
    embedded = [t for _, call in model.calls for t in call]
    # The two chunks in flight (two ingest runs, two texts each), and nothing after them.
    assert len([t for t in embedded if t.startswith("gone")]) <= 4
    await queue.close()


@pytest.fixture(scope="module")
def embedder() -> OnnxEmbedder:
    return OnnxEmbedder.load(threads=2)


@synchronously
async def test_a_stream_embedded_in_chunks_matches_the_texts_embedded_alone(
    embedder: OnnxEmbedder,
) -> None:
    queue = EmbeddingQueue(embedder, chunk_seconds=0.005)
    sentences = [f"Note {i}: the user moved to city number {i * 7} in spring." for i in range(50)]
    batch = BatchEmbedding(queue, chunk=16)
    batch.add(sentences[:30])
    batch.add(sentences[30:])
    vectors = await batch.vectors()
    alone = embedder.embed_passages(sentences)
    cosines = np.sum(vectors * alone, axis=1)
    assert vectors.shape == (50, embedder.dim)
    assert float(cosines.min()) > 0.99
    await queue.close()


@synchronously
async def test_a_repeated_query_is_answered_without_the_model() -> None:
    model = RecordingEmbedder()
    queue = EmbeddingQueue(model, query_cache=2)
    try:
        first = await queue.query("where-1")
        again = await queue.query("where-1")
        assert np.array_equal(first, again) and first[0] == 1.0
        assert model.calls == [("queries", ["where-1"])]
        await queue.query("other-2")
        await queue.query("third-3")  # the cache holds two: "where-1" goes
        await queue.query("where-1")
        assert [texts for _, texts in model.calls].count(["where-1"]) == 2
        with pytest.raises(ValueError):
            first[0] = 5.0  # shared between callers: nobody may change it
    finally:
        await queue.close()


@synchronously
async def test_a_job_runs_shortest_first_and_answers_in_the_callers_order() -> None:
    """Chunks of like length are padded little; the caller still gets its own rows."""
    model = RecordingEmbedder()
    queue = EmbeddingQueue(model, max_batch=3)
    widths = [40, 8, 25, 8, 60, 12, 33, 9, 50]
    given = [f"{'w' * width}-{i}" for i, width in enumerate(widths)]
    vectors = await queue.passages(given)
    assert vectors[:, 0].tolist() == list(range(len(given)))
    ran = [text for _, batch in model.calls for text in batch]
    assert [len(text) for text in ran] == sorted(len(text) for text in given)
    await queue.close()
