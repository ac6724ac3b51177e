"""The store pipeline's last steps: records built from embedded items, written in one
atomic batch, then admitted to the channels' live views (DESIGN §4)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from calor.server.clock import Clock
from calor.server.commands import NewMemory
from calor.server.engine.changes import BulkWrite, Changes, Packed, Written, commit, write
from calor.server.engine.channel import Channel
from calor.server.engine.ingest import LINK_CHUNK, Ingested, RecordBuilder, build_records
from calor.server.engine.registry import ChannelRegistry
from calor.server.engine.results import Prepared, Stored
from calor.server.errors import NotFoundError
from calor.server.events import memory_event
from calor.server.heap import BULK_ITEMS, bulk_build
from calor.server.records import DELETED, MERGED, MemoryRecord
from calor.server.storage.store import MemoryStore
from calor.server.thermo.lifecycle import refresh_utility

__all__ = ["StagedStore", "StorePipeline"]

# A bulk store writes its vectors ahead of its records this many to a batch.
_VECTORS_AHEAD = 256
# Items a big store (``store_all``) builds and says at a time: a multiple of the chunk
# ingest links at a time, so parts find the neighbours one batch would.
_PART = 16 * LINK_CHUNK


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
        with self._locked(_channels_of(items), len(items)):
            results, written = self._write(items, vectors)
            for change in written:
                change.apply()
            return [self._as_stored(r) for r in results]

    def store_all(self, items: Sequence[NewMemory], vectors: np.ndarray) -> list[str]:
        """:meth:`store` for a big batch whose caller needs only the ids (in item order).

        ``items``, a list, is emptied as it is taken in; a big stream hands them packed
        (:class:`~calor.server.commands.PackedItems`), read a part at a time. The batch
        is built and said a part at a time into one write batch (see
        :class:`~calor.server.engine.changes.BulkWrite`), later parts linking to earlier
        ones as one batch's items do, and the views take it in a slice at a time: the
        objects of the whole batch are never alive at once, so what the views keep is
        not scattered over its heap.
        """
        with self._locked(_channels_of(items), len(items)):
            taken = items
            if isinstance(items, list):
                taken = list(items)
                items.clear()
            parts, repeats, packed = self._write_in_parts(taken, vectors)
            ids = [""] * len(taken)
            del taken
            for change in packed:
                change.apply()
        for positions, said in parts:
            for position, memory_id in zip(positions, said.split("\n"), strict=True):
                ids[position] = memory_id
        for position, first in repeats.items():
            ids[position] = ids[first]
        return ids

    def _write_in_parts(
        self, items: Sequence[NewMemory], vectors: np.ndarray
    ) -> tuple[list[tuple[Sequence[int], str]], dict[int, int], list[Packed]]:
        """Write the batch a part at a time (the caller holds the locks); each part's
        positions with their ids (one string, a line each), the items that repeat an
        earlier item's idempotency key (position → that item's), and the packed
        changes."""
        earlier, repeats, fresh = self._sort_out(items)
        parts: list[tuple[Sequence[int], str]] = [([p], r.id) for p, r in earlier.items()]
        bulk = BulkWrite(self._store)
        for name, positions in fresh.items():
            channel = self._reg.channel(name)
            now = self._clock.now()
            builder = RecordBuilder(
                channel.neighbourhood(), channel.policy, now, channel.state.interactions
            )
            change = Changes(name, channel)
            confirms: set[str] = set()
            for start in range(0, len(positions), _PART):
                chosen = positions[start : start + _PART]
                ingested = self._say_part(
                    builder, change, bulk, now, [items[p] for p in chosen], vectors[_rows(chosen)]
                )
                confirms.update(c for entry in ingested for c in entry.confirms)
                parts.append((chosen, "\n".join(entry.record.id for entry in ingested)))
            self._say_end(change, bulk, confirms, len(positions), now)
        return parts, repeats, bulk.commit()

    def _say_part(
        self,
        builder: RecordBuilder,
        change: Changes,
        bulk: BulkWrite,
        now: float,
        items: Sequence[NewMemory],
        vectors: np.ndarray,
    ) -> list[Ingested]:
        """Build the next part of a big batch in ``change``'s channel and say it into
        the write batch (its vectors written ahead); the part's new memories."""
        ingested = builder.build(items, vectors)
        self._write_vectors_ahead([(change.name, entry) for entry in ingested])
        _say_new(change, ingested, now, staged=True)
        bulk.add(change)
        # A new memory's links are made with it, to memories before it: no later part
        # links these pairs again. Remembered to the end, 100,000 memories' links (about
        # 8 each) pinned some 90 MB of heap among the parts' objects.
        change.forget_links()
        return ingested

    def _say_end(
        self, change: Changes, bulk: BulkWrite, confirms: set[str], count: int, now: float
    ) -> None:
        """A channel's last words in a big batch of ``count`` new memories: the older
        memories they confirm, one confirmation more each, and its interactions."""
        channel = change.channel
        assert channel is not None  # a store's change is always a channel's
        for record in self._confirmed(channel, confirms, now):
            change.put(record)
        interactions = channel.state.interactions + count
        change.set_state(replace(channel.state, interactions=interactions))
        bulk.add(change)

    def staged(self) -> StagedStore:
        """A big batch to store a part at a time as its parts arrive (see
        :class:`StagedStore`)."""
        return StagedStore(self)

    @contextmanager
    def _locked(self, names: Iterable[str], count: int) -> Iterator[None]:
        """The locks of the named channels, held in name order, and the bulk mode of a
        batch of ``count`` items when it is big."""
        channels = [self._reg.channel(name) for name in sorted(names)]
        for channel in channels:
            channel.lock.acquire()
        try:
            with bulk_build() if count >= BULK_ITEMS else nullcontext():
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
        earlier, repeats, fresh = self._sort_out(items)
        results: list[Stored | None] = [None] * len(items)
        for position, record in earlier.items():
            results[position] = Stored(record, False)
        prepared = {
            name: self._prepare(
                self._reg.channel(name), [items[p] for p in positions], vectors[_rows(positions)]
            )
            for name, positions in fresh.items()
        }
        if bulk:
            self._write_vectors_ahead(
                [(name, e) for name, done in prepared.items() for e in done.ingested]
            )
        _, written = write(
            self._store, [self._changes(name, done, bulk) for name, done in prepared.items()]
        )
        for name, positions in fresh.items():
            done = prepared[name]
            for position, ingested in zip(positions, done.ingested, strict=True):
                results[position] = Stored(ingested.record, True)
        for position, first in repeats.items():
            made = results[first]
            assert made is not None
            results[position] = Stored(made.record, False)
        return [r for r in results if r is not None], written

    def _sort_out(
        self,
        items: Sequence[NewMemory],
        seen: dict[tuple[str, str], int] | None = None,
        offset: int = 0,
    ) -> tuple[dict[int, MemoryRecord], dict[int, int], dict[str, array[int]]]:
        """Which items an earlier store made already (by idempotency key: position →
        that memory), which repeat the key of an earlier item of the batch (position →
        that item's), and the positions of the others, to store, by channel. Positions
        count from ``offset``; ``seen`` holds the keys of the batch's earlier parts."""
        earlier: dict[int, MemoryRecord] = {}
        repeats: dict[int, int] = {}
        # Positions packed, not as int objects: held through a big store, 100,000 of
        # them would pin the heap's pages that the store's passing objects came and went
        # from.
        fresh: dict[str, array[int]] = {}
        seen = {} if seen is None else seen
        for position, item in enumerate(items, offset):
            key = (item.channel, item.idempotency_key)
            found = self._store.idempotent_id(*key) if item.idempotency_key else None
            if found is not None:
                earlier[position] = self._earlier(item.channel, found)
            elif item.idempotency_key and key in seen:
                repeats[position] = seen[key]
            else:
                if item.idempotency_key:
                    seen[key] = position
                fresh.setdefault(item.channel, array("q")).append(position)
        return earlier, repeats, fresh

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
        confirmed = self._confirmed(channel, {c for e in ingested for c in e.confirms}, now)
        return Prepared(ingested, state, confirmed, now)

    @staticmethod
    def _confirmed(channel: Channel, confirms: set[str], now: float) -> list[MemoryRecord]:
        """The older memories new ones confirm, one confirmation more each."""
        confirmed: list[MemoryRecord] = []
        for older_id in sorted(confirms):
            older = channel.records.get(older_id)
            if older is not None:
                confirmed.append(replace(older, confirmations=older.confirmations + 1))
                refresh_utility(confirmed[-1], now)
        return confirmed

    def _changes(self, name: str, done: Prepared, staged: bool) -> Changes:
        """A channel's part of a store batch as one change."""
        change = Changes(name, self._reg.channel(name))
        _say_new(change, done.ingested, done.at, staged)
        for record in done.confirmed:
            change.put(record)
        change.set_state(done.state)
        return change

    def _write_vectors_ahead(self, entries: list[tuple[str, Ingested]]) -> None:
        """Write a bulk store's vectors ahead of its records, in batches of their own.

        The records' batch stays the one commit point: a vector whose record was never
        written is never indexed, and is dropped at the next start. What this buys is a
        shorter final write; the RocksDB binding holds the GIL while it writes and
        syncs, so that write is a pause for every other client's recall.
        """
        for start in range(0, len(entries), _VECTORS_AHEAD):
            ahead: dict[str, Changes] = {}
            for name, entry in entries[start : start + _VECTORS_AHEAD]:
                ahead.setdefault(name, Changes(name)).stage_vector(entry.record.id, entry.vector)
            commit(self._store, list(ahead.values()))


def _channels_of(items: Iterable[NewMemory]) -> set[str]:
    return {item.channel for item in items}


def _say_new(change: Changes, ingested: list[Ingested], at: float, staged: bool) -> None:
    """New memories into a change: each with its event and its links."""
    for entry in ingested:
        change.add(entry.record, entry.vector, staged)
        change.log(memory_event("on_store", entry.record, at, entry.record.heat0))
        for edge in entry.edges:
            change.link(edge.from_id, edge.to_id, edge.kind, edge.weight)


def _rows(positions: array[int]) -> npt.NDArray[np.int64]:
    """Packed positions as an index into the batch's rows (no copy)."""
    return np.frombuffer(positions, dtype=np.int64)


@dataclass(eq=False)
class _Staging:
    """One channel's share of a staged batch: what its parts were built against and
    what they said so far."""

    channel: Channel
    builder: RecordBuilder
    change: Changes
    now: float
    rejections: int  # how many rejections the channel held when the first part was built
    count: int = 0
    confirms: set[str] = field(default_factory=set)
    linked: set[str] = field(default_factory=set)  # memories before the batch it links to
    keys: list[str] = field(default_factory=list)  # idempotency keys of its new memories

    def still_holds(self, store: MemoryStore) -> bool:
        """Whether the parts said still stand: the channel not dropped, every memory
        they link to still there, no rejection learnt, no key of theirs taken since."""
        view = self.channel
        if view.dropped or len(view.rejections) != self.rejections:
            return False
        for memory_id in self.linked:
            record = view.records.get(memory_id)
            if record is None or record.state in (DELETED, MERGED):
                return False
        return all(store.idempotent_id(view.name, key) is None for key in self.keys)


class StagedStore:
    """A big batch stored as it arrives (a ``StoreStream``): each part, once embedded,
    is built and said into one write batch under its channels' locks, which are let go
    between parts so recalls and other writes go on meanwhile; :meth:`finish` writes
    the whole batch at once, all or nothing, as :meth:`StorePipeline.store_all` does.

    Parts are built against the views as they stand when each arrives, as if stored one
    by one. If the views changed meanwhile in a way the parts cannot stand (a memory
    they link to forgotten or merged away, a rejection learnt, an idempotency key of
    theirs taken, the channel dropped), :meth:`finish` stores the batch afresh instead.
    """

    def __init__(self, pipeline: StorePipeline) -> None:
        self._pipeline = pipeline
        self._bulk = BulkWrite(pipeline._store)
        self._channels: dict[str, _Staging] = {}
        self._parts: list[tuple[str, Sequence[int], str]] = []  # channel, positions, ids
        self._earlier: dict[int, MemoryRecord] = {}
        self._repeats: dict[int, int] = {}
        self._seen: dict[tuple[str, str], int] = {}
        self._count = 0
        self._stale = False

    def __len__(self) -> int:
        """How many items the parts so far held."""
        return self._count

    def add(self, items: Sequence[NewMemory], vectors: np.ndarray) -> None:
        """Build and say the next items of the batch (with their embeddings, one row
        each), in the batch's order, a part at a time."""
        for start in range(0, len(items), _PART):
            self._add_part(items[start : start + _PART], vectors[start : start + _PART])

    def _add_part(self, items: Sequence[NewMemory], vectors: np.ndarray) -> None:
        offset = self._count
        self._count += len(items)
        if self._stale:
            return  # nothing more is built: finish stores the batch afresh
        earlier, repeats, fresh = self._pipeline._sort_out(items, self._seen, offset)
        self._earlier.update(earlier)
        self._repeats.update(repeats)
        with self._pipeline._locked(fresh, len(items)):
            for name, positions in fresh.items():
                staging = self._staging(name)
                if (
                    staging.channel.dropped
                    or self._pipeline._reg.channel(name) is not staging.channel
                ):
                    self._stale = True
                    return
                local = array("q", (p - offset for p in positions))
                chosen = [items[p] for p in local]
                ingested = self._pipeline._say_part(
                    staging.builder,
                    staging.change,
                    self._bulk,
                    staging.now,
                    chosen,
                    vectors[_rows(local)],
                )
                self._note(staging, ingested, chosen)
                said = "\n".join(entry.record.id for entry in ingested)
                self._parts.append((name, positions, said))

    def _staging(self, name: str) -> _Staging:
        staging = self._channels.get(name)
        if staging is None:
            channel = self._pipeline._reg.channel(name)
            now = self._pipeline._clock.now()
            builder = RecordBuilder(
                channel.neighbourhood(), channel.policy, now, channel.state.interactions
            )
            staging = _Staging(
                channel, builder, Changes(name, channel), now, len(channel.rejections)
            )
            self._channels[name] = staging
        return staging

    @staticmethod
    def _note(staging: _Staging, ingested: list[Ingested], items: list[NewMemory]) -> None:
        """What finish checks and completes: the older memories the part confirms and
        links to, and its idempotency keys."""
        records = staging.channel.records
        staging.count += len(ingested)
        for entry, item in zip(ingested, items, strict=True):
            staging.confirms.update(entry.confirms)
            for edge in entry.edges:
                for end in (edge.from_id, edge.to_id):
                    if end in records:
                        staging.linked.add(end)
            if item.idempotency_key:
                staging.keys.append(item.idempotency_key)

    def finish(self, items: Sequence[NewMemory], vectors: np.ndarray) -> list[str]:
        """Write the batch in one atomic batch; each item's memory id, in item order.

        ``items`` and ``vectors`` are the whole batch again (the parts given to
        :meth:`add`, in order): stored afresh by :meth:`StorePipeline.store_all` (which
        empties a list) if the parts no longer stand.
        """
        if len(items) != self._count:
            raise ValueError(f"finish: {len(items)} items, but the parts held {self._count}")
        # Taken in as a bulk (no collector pass meanwhile; what it let go handed back).
        with self._pipeline._locked(self._channels, self._count):
            store = self._pipeline._store
            if not self._stale and all(s.still_holds(store) for s in self._channels.values()):
                for staging in self._channels.values():
                    self._pipeline._say_end(
                        staging.change, self._bulk, staging.confirms, staging.count, staging.now
                    )
                packed = self._bulk.commit()
                for change in packed:
                    change.apply()
                del packed
                ids = self._ids()
                self._let_go()
                return ids
        self.discard()
        return self._pipeline.store_all(items, vectors)

    def _ids(self) -> list[str]:
        ids = [""] * self._count
        for _, positions, said in self._parts:
            for position, memory_id in zip(positions, said.split("\n"), strict=True):
                ids[position] = memory_id
        for position, record in self._earlier.items():
            ids[position] = record.id
        for position, first in self._repeats.items():
            ids[position] = ids[first]
        return ids

    def discard(self) -> None:
        """Write nothing of the batch; the embeddings written ahead of its records are
        dropped (a restart would drop them too)."""
        for name, _, said in self._parts:
            ids = said.split("\n")
            for start in range(0, len(ids), _VECTORS_AHEAD):
                dropped = Changes(name)
                for memory_id in ids[start : start + _VECTORS_AHEAD]:
                    dropped.drop_vector(memory_id)
                commit(self._pipeline._store, [dropped])
        self._let_go()

    def _let_go(self) -> None:
        """Hold nothing more of the batch: its write batch, the views' packed changes,
        the builders' scratch indexes (tens of MB at 10,000 items, kept for as long as
        whoever holds this store, if not let go)."""
        self._bulk = BulkWrite(self._pipeline._store)
        self._channels = {}
        self._parts = []
        self._earlier, self._repeats, self._seen = {}, {}, {}
        self._stale = True
