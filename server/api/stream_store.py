"""A ``StoreStream`` stored while it streams: its chunks, once read and embedded, are
built into the batch a part at a time on a store thread while the model embeds the next
ones, so what is left when the last item arrives is the model's last chunk and the
commit (see :class:`~calor.server.engine.storing.StagedStore`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from calor.server.commands import PackedItems
from calor.server.engine.storing import StagedStore

__all__ = ["STAGED_PART", "StreamStore"]

Run = Callable[..., Awaitable[Any]]

STAGED_PART = 1_024
"""Items handed to the staged batch at a time (a store's part)."""

# Abandoned streams whose staged parts are still being dropped (kept from the collector).
_dropping: set[asyncio.Task[None]] = set()


class StreamStore:
    """Feeds one stream's chunks to a :class:`StagedStore` in order, as each is read
    (type, entities, valence, packed) and embedded; :meth:`finish` stores the rest and
    writes the batch."""

    def __init__(self, run: Run, staged: StagedStore, store_all: Callable[..., list[str]]) -> None:
        """``run`` runs blocking work on a store thread; ``store_all`` stores a batch
        whole (what a stream too short to stage, or one finished, comes to)."""
        self._run = run
        self._staged = staged
        self._store_all = store_all
        self._chunks: asyncio.Queue[tuple[Awaitable[bytes], Awaitable[np.ndarray], int] | None]
        self._chunks = asyncio.Queue()
        self._feeding = asyncio.ensure_future(self._feed())

    def chunk(
        self, reading: Awaitable[bytes], embedding: Awaitable[np.ndarray], count: int
    ) -> None:
        """The next ``count`` items of the stream: their reading, packed, and their
        vectors, both on their way."""
        self._chunks.put_nowait((reading, embedding, count))

    async def _feed(self) -> None:
        part, rows = PackedItems(), []
        while (chunk := await self._chunks.get()) is not None:
            reading, embedding, count = chunk
            part.add(await reading, count)
            rows.append(await embedding)
            if len(part) >= STAGED_PART:
                await self._run(self._staged.add, part, np.concatenate(rows))
                part, rows = PackedItems(), []

    async def finish(self, items: PackedItems, vectors: np.ndarray) -> list[str]:
        """Store the whole stream (``items`` and their ``vectors``, all of them, in
        order) in one atomic batch; its ids in item order."""
        self._chunks.put_nowait(None)
        await self._feeding
        staged = self._staged
        if not len(staged):
            return await self._run(self._store_all, items, vectors)  # type: ignore[no-any-return]
        done = len(staged)
        if done < len(items):
            await self._run(staged.add, items[done:], vectors[done:])
        return await self._run(staged.finish, items, vectors)  # type: ignore[no-any-return]

    def abandon(self) -> None:
        """Store nothing: stop feeding, and drop what was staged once the part being
        built (if any) is done."""
        self._chunks.put_nowait(None)
        task = asyncio.ensure_future(self._drop())
        _dropping.add(task)
        task.add_done_callback(_dropping.discard)

    async def _drop(self) -> None:
        try:
            await self._feeding
        except BaseException:  # noqa: BLE001 - the stream failed already; its parts go
            pass
        loop = asyncio.get_running_loop()
        # Not through ``run``: the call's deadline may have passed, and this writes only
        # to take back what the stream wrote ahead.
        await loop.run_in_executor(None, self._staged.discard)
