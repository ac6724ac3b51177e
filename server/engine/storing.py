"""The store pipeline's last steps: records built from embedded items, written in one
atomic batch, then admitted to the channels' live views (DESIGN §4)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import numpy as np

from calor.server.clock import Clock
from calor.server.commands import NewMemory
from calor.server.engine.changes import Changes, Packed, Written, commit, write
from calor.server.engine.channel import Channel
from calor.server.engine.ingest import build_records
from calor.server.engine.registry import ChannelRegistry
from calor.server.engine.results import Prepared, Stored
from calor.server.errors import NotFoundError
from calor.server.events import memory_event
from calor.server.heap import BULK_ITEMS, bulk_build
from calor.server.records import MemoryRecord
from calor.server.storage.store import MemoryStore
from calor.server.thermo.lifecycle import refresh_utility

__all__ = ["StorePipeline"]

# A bulk store writes its vectors ahead of its records this many to a batch.
_VECTORS_AHEAD = 256


class StorePipeline:
    """Stores embedded items in their channels, each call one atomic batch."""

    def __init__(self, registry: ChannelRegistry, store: MemoryStore, clock: Clock) -> None:
        self._reg = registry
        self._store = store
        self._clock = clock

    def store(self, items: Sequence[NewMemory], vectors: np.ndarray) -> list[Stored]:
        """Store memories (with their embeddings, one row each) in one atomic batch.

        A batch of ``BULK_ITEMS`` or more is built as a bulk: no cycle-collector pass
        meanwhile, and its vectors written ahead of its records (see
        :meth:`_write_vectors_ahead`).
        """
        with self._locked(items):
            results, written = self._write(items, vectors)
            for change in written:
                change.apply()
            return [self._as_stored(r) for r in results]

    def store_all(self, items: list[NewMemory], vectors: np.ndarray) -> list[str]:
        """:meth:`store` for a big batch whose caller needs only the ids (in item order):
        ``items`` is emptied as it is taken in, and the channels' views take the stored
        memories in a slice at a time (see :class:`~calor.server.engine.changes.Packed`),
        so that what they keep is not scattered over the batch's heap."""
        with self._locked(items):
            ids, packed = self._write_packed(items, vectors)
            for change in packed:
                change.apply()
        return ids.split("\n") if ids else []

    def _write_packed(
        self, items: list[NewMemory], vectors: np.ndarray
    ) -> tuple[str, list[Packed]]:
        """The batch written; its ids (one string, a line each) and its changes packed.
        Every other object the batch made is gone when this returns."""
        taken = list(items)
        items.clear()
        results, written = self._write(taken, vectors)
        del taken
        ids = "\n".join(stored.record.id for stored in results)
        del results
        return ids, [change.packed() for change in written]

    @contextmanager
    def _locked(self, items: Sequence[NewMemory]) -> Iterator[None]:
        """The locks of the channels the items name, held in name order, and the bulk
        mode of a big batch."""
        names = sorted({item.channel for item in items})
        channels = [self._reg.channel(name) for name in names]
        for channel in channels:
            channel.lock.acquire()
        try:
            with bulk_build() if len(items) >= BULK_ITEMS else nullcontext():
                yield
        finally:
            for channel in reversed(channels):
                channel.lock.release()

    def _write(
        self, items: Sequence[NewMemory], vectors: np.ndarray
    ) -> tuple[list[Stored], list[Written]]:
        """Write the batch (the caller holds the locks); each item's outcome, its memory
        as written, and the changes the views have yet to take in."""
        bulk = len(items) >= BULK_ITEMS
        results: list[Stored | None] = [None] * len(items)
        fresh: dict[str, list[int]] = {}
        seen: dict[tuple[str, str], int] = {}
        for position, item in enumerate(items):
            key = (item.channel, item.idempotency_key)
            earlier = self._store.idempotent_id(*key) if item.idempotency_key else None
            if earlier is not None:
                results[position] = Stored(self._earlier(item.channel, earlier), False)
            elif item.idempotency_key and key in seen:
                continue  # resolved below, once the first of the batch has its id
            else:
                if item.idempotency_key:
                    seen[key] = position
                fresh.setdefault(item.channel, []).append(position)
        prepared = {
            name: self._prepare(
                self._reg.channel(name), [items[p] for p in positions], vectors[positions]
            )
            for name, positions in fresh.items()
        }
        if bulk:
            self._write_vectors_ahead(prepared)
        _, written = write(
            self._store, [self._changes(name, done, bulk) for name, done in prepared.items()]
        )
        for name, positions in fresh.items():
            done = prepared[name]
            for position, ingested in zip(positions, done.ingested, strict=True):
                results[position] = Stored(ingested.record, True)
        for position, item in enumerate(items):
            if results[position] is None:
                first = results[seen[(item.channel, item.idempotency_key)]]
                assert first is not None
                results[position] = Stored(first.record, False)
        return [r for r in results if r is not None], written

    def derived(
        self, channel: Channel, items: Sequence[NewMemory], vectors: np.ndarray
    ) -> tuple[list[MemoryRecord], Changes]:
        """The change that stores memories a dream derives in ``channel``, not committed:
        the caller holds the channel's lock, adds its own operations to the change, and
        commits it, so the new memories and what they do to others land in one batch."""
        done = self._prepare(channel, list(items), vectors)
        return [entry.record for entry in done.ingested], self._changes(channel.name, done, False)

    def _as_stored(self, stored: Stored) -> Stored:
        """A store's outcome with its memory as it stands now."""
        now = self._reg.channel(stored.record.channel).current(stored.record)
        return Stored(now.record, stored.created, now.heat)

    def _earlier(self, channel: str, memory_id: str) -> MemoryRecord:
        """The memory an earlier store with the same idempotency key made."""
        record = self._reg.channel(channel).records.get(memory_id)
        if record is None:
            raise NotFoundError(f"no memory {memory_id} in channel {channel!r}")
        return record

    def _prepare(self, channel: Channel, items: list[NewMemory], vectors: np.ndarray) -> Prepared:
        policy = channel.policy
        now = self._clock.now()
        ingested = build_records(
            items, vectors, channel.neighbourhood(), policy, now, channel.state.interactions
        )
        state = replace(channel.state, interactions=channel.state.interactions + len(items))
        confirmed: list[MemoryRecord] = []
        for older_id in sorted({c for entry in ingested for c in entry.confirms}):
            older = channel.records.get(older_id)
            if older is not None:
                confirmed.append(replace(older, confirmations=older.confirmations + 1))
                refresh_utility(confirmed[-1], now)
        return Prepared(ingested, state, confirmed, now)

    def _changes(self, name: str, done: Prepared, staged: bool) -> Changes:
        """A channel's part of a store batch as one change."""
        change = Changes(name, self._reg.channel(name))
        for entry in done.ingested:
            change.add(entry.record, entry.vector, staged)
            change.log(memory_event("on_store", entry.record, done.at, entry.record.heat0))
            for edge in entry.edges:
                change.link(edge.from_id, edge.to_id, edge.kind, edge.weight)
        for record in done.confirmed:
            change.put(record)
        change.set_state(done.state)
        return change

    def _write_vectors_ahead(self, prepared: dict[str, Prepared]) -> None:
        """Write a bulk store's vectors ahead of its records, in batches of their own.

        The records' batch stays the one commit point: a vector whose record was never
        written is never indexed, and is dropped at the next start. What this buys is a
        shorter final write; the RocksDB binding holds the GIL while it writes and
        syncs, so that write is a pause for every other client's recall.
        """
        entries = [(name, e) for name, done in prepared.items() for e in done.ingested]
        for start in range(0, len(entries), _VECTORS_AHEAD):
            ahead: dict[str, Changes] = {}
            for name, entry in entries[start : start + _VECTORS_AHEAD]:
                ahead.setdefault(name, Changes(name)).stage_vector(entry.record.id, entry.vector)
            commit(self._store, list(ahead.values()))
