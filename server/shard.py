"""One store and what runs on it: the memory engine, the triggers, the due timer, the
purger, and the servicers that answer for it.

The embedded server has one shard, its data directory; a cluster node has one per
shard of the cluster it owns (cluster mode). A shard is built in two steps: its
servicers exist from the start (answering UNAVAILABLE while it loads), and
:meth:`Shard.serve` loads its engine over an open store.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from calor.server.api.memory_service import MemoryServicer
from calor.server.api.observe import counts_reader
from calor.server.api.runtime import Runtime
from calor.server.api.settings_service import SettingsServicer
from calor.server.clock import Clock
from calor.server.embedding import EmbeddingQueue
from calor.server.engine.due import DueTimer
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.heap import settle
from calor.server.metrics import Metrics, ServerCounts
from calor.server.storage.purge import Purger
from calor.server.storage.store import MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from calor.triggers.engine import TriggerEngine
from calor.triggers.trigger_service import TriggerServicer
from calor.triggers.webhook import WebhookPolicy

__all__ = ["Shard"]

log = logging.getLogger("calor.server")

# A dream waits this long at most for the model to embed an episode's sentences.
_DREAM_EMBED_SECONDS = 300.0


class Shard:
    """A store, the engine and triggers over it, and its three servicers.

    ``counts`` is what ``ServerStatus`` reports (the whole server's, not this shard's).
    """

    def __init__(
        self,
        runtime: Runtime,
        webhooks: WebhookPolicy,
        counts: Callable[[], ServerCounts] | None = None,
    ) -> None:
        self.runtime = runtime
        self.memory_api = MemoryServicer(runtime)
        self.trigger_api = TriggerServicer(runtime, webhooks)
        self.settings_api = SettingsServicer(runtime, counts)
        self.store: MemoryStore | None = None
        self.triggers: TriggerEngine | None = None
        self._webhooks = webhooks
        self._engine: MemoryEngine | None = None
        self._purger: Purger | None = None
        self._due: DueTimer | None = None
        self._warming: threading.Thread | None = None
        self._stop_warming = threading.Event()
        self._counts: Callable[[], ServerCounts] | None = None

    @staticmethod
    def open_store(directory: Path, model_id: str, dim: int, sync: bool) -> MemoryStore:
        """Open (or make) the RocksDB store in ``directory`` for the loaded model
        (blocking)."""
        return MemoryStore.open(directory, model_id=model_id, dim=dim, sync=sync)

    async def serve(
        self,
        store: MemoryStore,
        embeddings: EmbeddingQueue,
        clock: Clock,
        metrics: Metrics,
        busy: Callable[[], bool],
        directory: Path,
    ) -> None:
        """Load the engine and the triggers over ``store`` (kept in ``directory``) and
        answer calls from now on; the channels no call asked for yet load in the
        background (``busy``: whether calls are being served, which that loading gives
        way to)."""
        config, loop = self.runtime.config, asyncio.get_running_loop()
        self.store = store
        self._purger = Purger(store, config.purge_delay_seconds)
        self._purger.start()  # forgotten bytes leave the disk soon after each forget
        engine = await loop.run_in_executor(
            None,
            MemoryEngine.open,
            store,
            clock,
            ChannelPolicy(),
            config.approximate_above,
            config.memory_budget_mb * 1024 * 1024,
        )
        engine.background = self.runtime.executor.submit
        engine.use_model(partial(_embed_from_thread, embeddings, loop))
        settle()  # the channels just loaded live until forgotten: out of the collector's view
        triggers = TriggerEngine(
            store,
            engine,
            clock,
            self.runtime.run,
            self._webhooks,
            retention_events=config.event_retention,
            retention_seconds=config.event_retention_seconds,
            queue_size=config.subscriber_queue,
            max_chain_depth=config.max_chain_depth,
        )
        await triggers.start()
        self.triggers = triggers
        self.trigger_api.attach(triggers)
        self._due = DueTimer(engine.channels.due, clock, engine.settle_due)
        self._due.start()  # state changes, on_decay events and sweeps happen on time
        engine.dreamt = lambda report, cold_only: metrics.dreamt(
            cold_only, report.duration_ms / 1000
        )
        self._counts = counts_reader(engine, lambda: store.last_seq, triggers.hub, config.data_dir)
        self._engine = engine
        self.runtime.attach(engine, embeddings)
        self._warming = threading.Thread(
            target=self._warm_up, args=(engine, busy), name="calor-warm", daemon=True
        )
        self._warming.start()

    def counts(self) -> ServerCounts | None:
        """What this shard holds now (blocking), or None while it loads."""
        return self._counts() if self._counts is not None else None

    def _warm_up(self, engine: MemoryEngine, busy: Callable[[], bool]) -> None:
        """Load the channels no call has asked for yet, after SERVING: a call for one
        loads it at once; this makes decay and its events happen on time everywhere."""
        waiting = engine.channels.unloaded()
        try:
            engine.channels.load_all(self._stop_warming, busy=busy)
        except Exception:
            if not self._stop_warming.is_set():
                log.exception("loading the channels in the background failed")
            return
        if waiting and not self._stop_warming.is_set():
            settle()  # the channels just loaded live until forgotten
            log.info("all %d stored channels loaded", waiting)

    async def stop_serving(self) -> None:
        """End subscriptions (with a status naming their resume point) and stop the
        background work: loading channels, the due timer."""
        loop = asyncio.get_running_loop()
        if self.triggers is not None:
            await self.triggers.stop()
        self._stop_warming.set()
        if self._warming is not None:
            await loop.run_in_executor(None, self._warming.join)
        if self._due is not None:
            await loop.run_in_executor(None, self._due.stop)

    def close(self) -> None:
        """Close the store, once no call uses it; what the purger has pending is purged
        at the next start."""
        if self._purger is not None:
            self._purger.close()
        if self.store is not None:
            self.store.close()


def _embed_from_thread(
    embeddings: EmbeddingQueue, loop: asyncio.AbstractEventLoop, texts: list[str]
) -> np.ndarray:
    """Passages embedded by the model's queue on ``loop``, for a dream on a worker thread
    (a server stopping meanwhile gives up after a while instead of holding the thread)."""
    done = asyncio.run_coroutine_threadsafe(embeddings.passages(texts), loop)
    return done.result(timeout=_DREAM_EMBED_SECONDS)
