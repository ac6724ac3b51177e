"""The model off the event loop: queries on their own thread, ingest in fair chunks.

Queries have their own lane, a model thread of their own: a recall never waits behind
ingest work, and the queries waiting when that thread comes free are embedded together.
Ingest texts run in chunks that take about ``chunk_seconds`` on this machine (measured
as the model runs), ``ingest_runs`` chunks in flight at once, so the model's threads
never wait for the next chunk to be handed over. Each ingest batch (a ``StoreStream``, an
``Import``, one ``Store``) is a lane of its own, and lanes take turns a chunk at a
time, so one client's 20,000 items cannot hold back another client's ten, and a
client that goes away stops costing model time after the chunk in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from calor.models.embedder import Embedder, ModelError, OnnxEmbedder
from calor.server import stages
from calor.server.errors import ModelUnavailableError

__all__ = ["BatchEmbedding", "EmbeddingQueue", "IngestLane"]

# Until the model has run once, a chunk is this many characters (a few long turns).
_FIRST_CHUNK_CHARS = 1_500
# How much each measured run moves the estimate of seconds per character.
_SMOOTHING = 0.3
# How many recent queries' vectors are kept (384 float32 each: 1.5 KB).
QUERY_CACHE = 1_024


def _timed(embed: Callable[[list[str]], np.ndarray], texts: list[str]) -> tuple[np.ndarray, float]:
    """The model's vectors for ``texts`` and the seconds it took (on the model's thread)."""
    began = time.perf_counter()
    vectors = embed(texts)
    return vectors, time.perf_counter() - began


@dataclass(eq=False)
class _Job:
    """Texts one caller waits for; filled a slice at a time.

    The texts are held shortest first (``rows`` says where each was in the caller's
    list), so the slices of a long job are of like length: a model batch is padded to
    its longest text, and mixed lengths cost a fifth of ingest throughput.
    """

    texts: list[str]
    future: asyncio.Future[np.ndarray] = field(repr=False)
    rows: list[int] = field(default_factory=list, repr=False)
    vectors: np.ndarray | None = None
    next: int = 0  # the first text not yet handed to the model
    remaining: int = 0  # texts whose vectors have not come back yet
    # When it was queued, when the model began its (last) run, how long the model ran,
    # and when its vectors were handed over (time.perf_counter): where a query waited.
    queued_at: float = field(default_factory=time.perf_counter, repr=False)
    began_at: float = 0.0
    model_seconds: float = 0.0
    delivered_at: float = 0.0

    def __post_init__(self) -> None:
        self.rows = sorted(range(len(self.texts)), key=lambda row: len(self.texts[row]))
        self.texts = [self.texts[row] for row in self.rows]
        self.remaining = len(self.texts)

    @property
    def abandoned(self) -> bool:
        """Whether nobody waits for this job any more (the caller went away)."""
        return self.future.done()


@dataclass(eq=False)
class _Slice:
    """Texts ``start:end`` of a job, run together in one model call."""

    job: _Job
    start: int
    end: int


class IngestLane:
    """A name for one batch's ingest work: its chunks queue behind each other, and
    take turns with other lanes' chunks."""

    _ids = itertools.count()

    def __init__(self) -> None:
        self.key: Hashable = next(self._ids)


class EmbeddingQueue:
    """Embeds queries and passages for many callers, each kind on model threads of its own."""

    def __init__(
        self,
        embedder: Embedder,
        max_batch: int = 64,
        chunk_seconds: float = 0.15,
        query_cache: int = QUERY_CACHE,
        ingest_runs: int = 2,
    ) -> None:
        self.embedder = embedder
        self._ingest_runs = ingest_runs
        self._cached: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = query_cache
        self._max_batch = max_batch
        self._chunk_seconds = chunk_seconds
        self._seconds_per_char: float | None = None
        self._query_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="calor-query")
        self._ingest_thread = ThreadPoolExecutor(ingest_runs, thread_name_prefix="calor-model")
        self._queries: deque[_Job] = deque()
        self._lanes: OrderedDict[Hashable, deque[_Job]] = OrderedDict()
        self._query_ready: asyncio.Event | None = None
        self._ingest_ready: asyncio.Event | None = None
        self._workers: list[asyncio.Task[None]] = []
        self.embedded: Callable[[str, int, float], None] = lambda kind, texts, seconds: None
        """Told of every model run: its kind (query or passage), texts and seconds."""

    async def passages(self, texts: list[str], lane: IngestLane | None = None) -> np.ndarray:
        """Unit vectors for stored texts, one row each, in the order given.

        Args:
            texts: The texts, embedded as given (shortest first: see ``_Job``).
            lane: The batch these texts belong to; calls of one lane are embedded in
                the order made and take turns with other lanes. None: a lane of their own.
        """
        if not texts:
            return self._empty()
        self._start()
        job = _Job(list(texts), asyncio.get_running_loop().create_future())
        key = lane.key if lane is not None else IngestLane().key
        if key not in self._lanes:  # a lane that has had no turn yet is served next
            self._lanes[key] = deque()
            self._lanes.move_to_end(key, last=False)
        self._lanes[key].append(job)
        assert self._ingest_ready is not None
        self._ingest_ready.set()
        return await job.future

    async def query(self, text: str) -> np.ndarray:
        """The unit vector of a search query (with the model's query prefix); the same
        array for a query asked again lately (callers never write to it)."""
        vector = self._cached.get(text)
        if vector is not None:
            self._cached.move_to_end(text)
            return vector
        self._start()
        job = _Job([text], asyncio.get_running_loop().create_future())
        self._queries.append(job)
        assert self._query_ready is not None
        self._query_ready.set()
        vectors = await job.future
        stages.record("embedding queue", job.began_at - job.queued_at)
        stages.record("model", job.model_seconds)
        ran = job.delivered_at - job.began_at - job.model_seconds
        stages.record("embedding hand-off", ran + time.perf_counter() - job.delivered_at)
        vector = np.asarray(vectors[0], dtype=np.float32)
        vector.flags.writeable = False
        if self._cache_size > 0:
            self._cached[text] = vector
            if len(self._cached) > self._cache_size:
                self._cached.popitem(last=False)
        return vector

    def _empty(self) -> np.ndarray:
        return np.empty((0, self.embedder.dim), dtype=np.float32)

    def _start(self) -> None:
        if self._workers:
            return
        self._query_ready, self._ingest_ready = asyncio.Event(), asyncio.Event()
        self._workers = [
            asyncio.create_task(
                self._work(self._query_ready, self._take_queries, self._query_thread, True),
                name="calor-embed-queries",
            ),
            *(
                asyncio.create_task(
                    self._work(self._ingest_ready, self._take_chunk, self._ingest_thread, False),
                    name="calor-embed-ingest",
                )
                for _ in range(self._ingest_runs)
            ),
        ]

    async def _work(
        self,
        ready: asyncio.Event,
        take: Callable[[], list[_Slice]],
        thread: ThreadPoolExecutor,
        query: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await ready.wait()
            chunk = take()
            if chunk:
                await self._run(loop, thread, chunk, query)
            else:
                ready.clear()

    def _take_queries(self) -> list[_Slice]:
        """Every waiting query, up to a model batch."""
        taken: list[_Slice] = []
        while self._queries and len(taken) < self._max_batch:
            job = self._queries.popleft()
            if not job.abandoned:
                taken.append(_Slice(job, 0, len(job.texts)))
        return taken

    def _budget_chars(self) -> int:
        if self._seconds_per_char is None:
            return _FIRST_CHUNK_CHARS
        return max(1, int(self._chunk_seconds / self._seconds_per_char))

    def _take_chunk(self) -> list[_Slice]:
        """The next chunk of ingest texts: from the lane whose turn it is, topped up from
        the lanes after it when that lane has less than a chunk waiting."""
        budget, count = self._budget_chars(), 0
        taken: list[_Slice] = []
        for key in list(self._lanes):
            jobs = self._lanes[key]
            served = False
            while jobs and count < self._max_batch:
                job = jobs[0]
                if job.abandoned:
                    jobs.popleft()
                    continue
                end = job.next
                while end < len(job.texts) and count < self._max_batch:
                    size = len(job.texts[end])
                    if count and size > budget:
                        break  # the chunk is full; a first text always fits
                    budget -= size
                    count += 1
                    end += 1
                if end == job.next:
                    break
                taken.append(_Slice(job, job.next, end))
                served, job.next = True, end
                if end < len(job.texts):
                    break
                jobs.popleft()
            if not jobs:
                del self._lanes[key]
            elif served:
                self._lanes.move_to_end(key)  # its turn is over: behind the others
            if count >= self._max_batch or budget <= 0:
                break
        return taken

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        thread: ThreadPoolExecutor,
        chunk: list[_Slice],
        query: bool,
    ) -> None:
        texts = [text for piece in chunk for text in piece.job.texts[piece.start : piece.end]]
        embed = self.embedder.embed_queries if query else self.embedder.embed_passages
        started = time.perf_counter()
        try:
            vectors, model_seconds = await loop.run_in_executor(thread, _timed, embed, texts)
        except Exception as exc:  # handed to every waiting caller, not swallowed
            for piece in chunk:
                if not piece.job.abandoned:
                    piece.job.future.set_exception(exc)
            return
        done = time.perf_counter()
        seconds = done - started
        for piece in chunk:
            piece.job.began_at, piece.job.model_seconds = started, model_seconds
            piece.job.delivered_at = done
        self.embedded("query" if query else "passage", len(texts), seconds)
        if not query:
            self._measured(seconds, sum(len(t) for t in texts))
        offset = 0
        for piece in chunk:
            size = piece.end - piece.start
            _deliver(piece, vectors[offset : offset + size])
            offset += size

    def _measured(self, seconds: float, chars: int) -> None:
        """Fold one ingest run's speed into the estimate that sizes chunks."""
        rate = seconds / max(chars, 1)
        previous = self._seconds_per_char
        self._seconds_per_char = (
            rate if previous is None else previous + _SMOOTHING * (rate - previous)
        )

    async def close(self) -> None:
        """Stop the workers and the inference threads."""
        for worker in self._workers:
            worker.cancel()
            try:
                await worker
            except asyncio.CancelledError:
                pass
        self._query_thread.shutdown(wait=True)
        self._ingest_thread.shutdown(wait=True)


def _deliver(piece: _Slice, vectors: np.ndarray) -> None:
    """Put a slice's vectors in place; answer the caller once the whole job is done."""
    job = piece.job
    if job.abandoned:
        return
    if job.vectors is None:
        job.vectors = np.empty((len(job.texts), vectors.shape[1]), dtype=np.float32)
    job.vectors[job.rows[piece.start : piece.end]] = vectors
    job.remaining -= piece.end - piece.start
    if job.remaining == 0:
        job.future.set_result(job.vectors)


class BatchEmbedding:
    """The vectors of one batch whose texts arrive over time (a stream, an import):
    each full chunk of ``chunk`` texts goes to the model as soon as it is complete,
    in one lane, so embedding overlaps receiving; ``embedded`` hears how many texts
    each finished chunk held."""

    def __init__(
        self, queue: EmbeddingQueue, chunk: int, embedded: Callable[[int], None] | None = None
    ) -> None:
        self._queue = queue
        self._chunk = chunk
        self._lane = IngestLane()
        self._waiting: list[str] = []
        self._pending: list[asyncio.Future[np.ndarray]] = []
        self._embedded = embedded

    def add(self, texts: list[str]) -> None:
        """Queue texts; they are embedded in the order added."""
        self._waiting.extend(texts)
        while len(self._waiting) >= self._chunk:
            self._send(self._waiting[: self._chunk])
            del self._waiting[: self._chunk]

    @property
    def sent(self) -> Sequence[asyncio.Future[np.ndarray]]:
        """The vectors of each chunk sent to the model so far, in order (a full chunk
        is sent as soon as its last text is added)."""
        return self._pending

    def _send(self, texts: list[str]) -> None:
        part = asyncio.ensure_future(self._queue.passages(texts, self._lane))
        if self._embedded is not None:
            part.add_done_callback(partial(_count_embedded, self._embedded, len(texts)))
        self._pending.append(part)

    async def vectors(self) -> np.ndarray:
        """Every text's vector, one row each in the order added."""
        if self._waiting:
            self._send(self._waiting)
            self._waiting = []
        parts = [await part for part in self._pending]
        if not parts:
            return np.empty((0, self._queue.embedder.dim), dtype=np.float32)
        return np.concatenate(parts)

    def cancel(self) -> None:
        """Drop what has not been embedded yet (the caller went away or failed)."""
        for part in self._pending:
            part.cancel()


def _count_embedded(told: Callable[[int], None], count: int, part: asyncio.Future[Any]) -> None:
    """Tell ``told`` of a chunk the model embedded (not of one cancelled or failed)."""
    if not part.cancelled() and part.exception() is None:
        told(count)


def load_model(model_dir: Path | None = None, threads: int = 2) -> OnnxEmbedder:
    """The embedding model from its local files (nothing is downloaded).

    Raises:
        ModelUnavailableError: The files are missing, corrupt or unusable.
    """
    try:
        return OnnxEmbedder.load(model_dir, threads=threads)
    except ModelError as error:
        raise ModelUnavailableError(str(error)) from error
