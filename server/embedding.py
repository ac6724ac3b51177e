"""The model off the event loop: one inference thread, concurrent requests coalesced into batches.

A lone request runs at once (no waiting to fill a batch); requests that arrive while
the model is busy are embedded together in the next run, which is where batching pays.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from calor.models.embedder import Embedder

__all__ = ["EmbeddingQueue"]


@dataclass
class _Job:
    texts: list[str]
    query: bool
    future: asyncio.Future[np.ndarray] = field(repr=False)


class EmbeddingQueue:
    """Embeds passages and queries for many callers on one dedicated thread."""

    def __init__(self, embedder: Embedder, max_batch: int = 64) -> None:
        self.embedder = embedder
        self._max_batch = max_batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="calor-model")
        self._jobs: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task[None] | None = None

    async def passages(self, texts: list[str]) -> np.ndarray:
        """Unit vectors for stored texts, one row each."""
        return await self._submit(texts, query=False)

    async def query(self, text: str) -> np.ndarray:
        """The unit vector of a search query (with the model's query prefix)."""
        vectors = await self._submit([text], query=True)
        return np.asarray(vectors[0], dtype=np.float32)

    async def _submit(self, texts: list[str], query: bool) -> np.ndarray:
        if not texts:
            return np.empty((0, self.embedder.dim), dtype=np.float32)
        if self._jobs is None:
            self._jobs = asyncio.Queue()
            self._worker = asyncio.create_task(self._work(self._jobs), name="calor-embed")
        job = _Job(texts, query, asyncio.get_running_loop().create_future())
        self._jobs.put_nowait(job)
        return await job.future

    async def _work(self, jobs: asyncio.Queue[_Job]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await jobs.get()]
            size = len(batch[0].texts)
            while not jobs.empty() and size < self._max_batch:
                batch.append(jobs.get_nowait())
                size += len(batch[-1].texts)
            # Queries first: a recall never waits behind the ingest texts coalesced with it.
            for query in (True, False):
                group = [job for job in batch if job.query is query]
                if group:
                    await self._run(loop, group, query)

    async def _run(self, loop: asyncio.AbstractEventLoop, group: list[_Job], query: bool) -> None:
        texts = [text for job in group for text in job.texts]
        embed = self.embedder.embed_queries if query else self.embedder.embed_passages
        try:
            vectors = await loop.run_in_executor(self._executor, embed, texts)
        except Exception as exc:  # handed to every waiting caller, not swallowed
            for job in group:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        start = 0
        for job in group:
            end = start + len(job.texts)
            if not job.future.done():
                job.future.set_result(vectors[start:end])
            start = end

    async def close(self) -> None:
        """Stop the worker and the inference thread."""
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=True)
