"""What the servicers share: the engine, the model queue, the executor, and readiness."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from calor.server import deadline, stages
from calor.server.api.validation import Validator
from calor.server.clock import Clock
from calor.server.config import ServerConfig
from calor.server.embedding import EmbeddingQueue
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.errors import UnavailableError

__all__ = ["Runtime"]

_T = TypeVar("_T")


class Runtime:
    """The parts a running server is made of, ready once the model and indexes are loaded."""

    def __init__(
        self, config: ServerConfig, clock: Clock, executor: ThreadPoolExecutor | None = None
    ) -> None:
        self.config = config
        self.clock = clock
        self.validator = Validator(config.limits, clock)
        self.executor = executor or ThreadPoolExecutor(
            max_workers=config.workers, thread_name_prefix="calor-store"
        )
        """Where store and index work runs: this runtime's, or one shared with others."""
        self.inflight = 0
        self._engine: MemoryEngine | None = None
        self._embeddings: EmbeddingQueue | None = None

    def attach(self, engine: MemoryEngine, embeddings: EmbeddingQueue) -> None:
        """Make the loaded engine and model available; the server is ready from now."""
        self._engine = engine
        self._embeddings = embeddings

    @property
    def ready(self) -> bool:
        """Whether the model and the indexes are loaded."""
        return self._engine is not None

    @property
    def engine(self) -> MemoryEngine:
        """The memory engine; UNAVAILABLE while the server is still starting."""
        if self._engine is None:
            raise UnavailableError("the server is starting: the model and indexes are loading")
        return self._engine

    @property
    def embeddings(self) -> EmbeddingQueue:
        """The model queue; UNAVAILABLE while the server is still starting."""
        if self._embeddings is None:
            raise UnavailableError("the server is starting: the model and indexes are loading")
        return self._embeddings

    async def run(self, function: Callable[..., _T], *args: object) -> _T:
        """Run blocking store or index work on the executor; ``inflight`` counts it.

        The work runs in the calling context (the call's deadline and key go along), and
        not at all once the call's deadline has passed, whether before it is queued or
        while it waits for a thread; its commits check the deadline again.

        Raises:
            DeadlineExceededError: The call's deadline passed before the work began.
        """
        deadline.check("the store and index work")
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        self.inflight += 1
        queued = time.perf_counter()
        try:
            result, ended = await loop.run_in_executor(
                self.executor, context.run, _begin, function, args, queued
            )
        finally:
            self.inflight -= 1
        stages.record("executor hand-off", time.perf_counter() - ended)
        return result


def _begin(function: Callable[..., _T], args: Sequence[object], queued: float) -> tuple[_T, float]:
    """Run queued work, unless its call's deadline passed while it waited for a thread;
    with the moment it ended."""
    stages.record("executor wait", time.perf_counter() - queued)
    deadline.check("the store and index work")
    return function(*args), time.perf_counter()
