"""The memory engine: stores, recalls and tends memories, one lock per channel.

Every method is synchronous and may block (RocksDB, FAISS); the servicers run them
off the event loop. Writes go to RocksDB first, in one atomic batch, and only then
to the in-memory indexes, so what a reader sees has always been made durable.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from calor.models.text import classify_type
from calor.server.clock import Clock
from calor.server.commands import ListQuery, NewMemory, RecallQuery, UpdateChange
from calor.server.errors import InvalidArgumentError, NotFoundError
from calor.server.heat import SOURCE_TRUST
from calor.server.ids import new_id
from calor.server.index import ChannelIndex
from calor.server.lifecycle import (
    apply_boost,
    apply_keystone,
    apply_recall,
    current_heat,
    current_state,
)
from calor.server.policy import ChannelPolicy
from calor.server.recall import Hit, rank_channel, recall_window
from calor.server.records import ACTIVE, COLD, DELETED, MemoryRecord
from calor.server.store import MemoryStore
from calor.server.temporal import TimeWindow

__all__ = ["ChannelStatus", "MemoryEngine", "RecallResult", "Stored"]

_INDEXED = frozenset({ACTIVE, COLD})
# A change applied to a copy of a record: (record, policy, now).
_Edit = Callable[[MemoryRecord, ChannelPolicy, float], None]


@dataclass
class _Channel:
    """The live view of one channel: its records, its indexes, and the lock over both."""

    name: str
    index: ChannelIndex
    records: dict[str, MemoryRecord] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


@dataclass(frozen=True)
class Stored:
    """The outcome of one store: the memory, and whether this call created it."""

    record: MemoryRecord
    created: bool


@dataclass(frozen=True)
class RecallResult:
    """Ranked hits and the time window the query named, if any."""

    hits: list[Hit]
    window: TimeWindow | None


@dataclass(frozen=True)
class ChannelStatus:
    """Counts of a channel's memories by state and by type."""

    total: int
    by_state: dict[str, int]
    by_type: dict[str, int]


class MemoryEngine:
    """Every channel's memories, backed by a :class:`MemoryStore`."""

    def __init__(self, store: MemoryStore, clock: Clock, policy: ChannelPolicy) -> None:
        self._store = store
        self._clock = clock
        self._policy = policy
        self._channels: dict[str, _Channel] = {}
        self._policies: dict[str, ChannelPolicy] = {}
        self._channels_lock = threading.Lock()

    @classmethod
    def open(cls, store: MemoryStore, clock: Clock, policy: ChannelPolicy) -> MemoryEngine:
        """An engine whose indexes are rebuilt from everything ``store`` holds."""
        engine = cls(store, clock, policy)
        engine._rebuild()
        return engine

    def _rebuild(self) -> None:
        for name, data in self._store.policies():
            self._policies[name] = ChannelPolicy.from_json(data)
        for record in self._store.records():
            self._channel(record.channel).records[record.id] = record
        pending: dict[str, tuple[list[tuple[str, str]], list[np.ndarray]]] = {}
        for channel, memory_id, vector in self._store.vectors():
            live = self._channels.get(channel)
            known = live.records.get(memory_id) if live is not None else None
            if known is None or known.state not in _INDEXED:
                continue
            items, vectors = pending.setdefault(channel, ([], []))
            items.append((memory_id, known.text))
            vectors.append(vector)
        for channel, (items, vectors) in pending.items():
            self._channels[channel].index.add(items, np.stack(vectors))

    def _channel(self, name: str) -> _Channel:
        with self._channels_lock:
            channel = self._channels.get(name)
            if channel is None:
                channel = _Channel(name, ChannelIndex(self._store.dim))
                self._channels[name] = channel
            return channel

    def policy(self, channel: str) -> ChannelPolicy:
        """The policy in force in a channel."""
        return self._policies.get(channel, self._policy)

    def set_policy(self, channel: str, policy: ChannelPolicy) -> ChannelPolicy:
        """Make ``policy`` the channel's own from now on (durably); every read uses it."""
        with self._channel(channel).lock:
            with self._store.batch() as batch:
                batch.put_policy(channel, policy.to_json())
            self._policies[channel] = policy
        return policy

    # --- store -----------------------------------------------------------------

    def find_idempotent(self, channel: str, key: str) -> MemoryRecord | None:
        """The memory an earlier store with this idempotency key made, if any."""
        if not key:
            return None
        memory_id = self._store.idempotent_id(channel, key)
        if memory_id is None:
            return None
        return self._get(self._channel(channel), memory_id)

    def store(self, items: Sequence[NewMemory], vectors: np.ndarray) -> list[Stored]:
        """Store memories (with their embeddings, one row each) in one atomic batch."""
        names = sorted({item.channel for item in items})
        channels = [self._channel(name) for name in names]
        for channel in channels:
            channel.lock.acquire()
        try:
            return self._store_locked(items, vectors)
        finally:
            for channel in reversed(channels):
                channel.lock.release()

    def _store_locked(self, items: Sequence[NewMemory], vectors: np.ndarray) -> list[Stored]:
        now = self._clock.now()
        results: list[Stored] = []
        fresh: list[tuple[MemoryRecord, np.ndarray]] = []
        seen_keys: dict[tuple[str, str], MemoryRecord] = {}
        with self._store.batch() as batch:
            for item, vector in zip(items, vectors, strict=True):
                key = (item.channel, item.idempotency_key)
                earlier = seen_keys.get(key) or self.find_idempotent(*key)
                if earlier is not None:
                    results.append(Stored(earlier, created=False))
                    continue
                record = self._new_record(item, now)
                batch.put_record(record)
                batch.put_vector(record.channel, record.id, vector)
                if item.idempotency_key:
                    batch.put_idempotency(record.channel, item.idempotency_key, record.id)
                    seen_keys[key] = record
                fresh.append((record, vector))
                results.append(Stored(record, created=True))
        by_channel: dict[str, list[tuple[MemoryRecord, np.ndarray]]] = {}
        for record, vector in fresh:
            by_channel.setdefault(record.channel, []).append((record, vector))
        for name, entries in by_channel.items():
            channel = self._channels[name]
            for record, _ in entries:
                channel.records[record.id] = record
            channel.index.add(
                [(r.id, r.text) for r, _ in entries], np.stack([v for _, v in entries])
            )
        return [Stored(replace(r.record), r.created) for r in results]

    def _new_record(self, item: NewMemory, now: float) -> MemoryRecord:
        policy = self.policy(item.channel)
        created = item.created_at if item.created_at is not None else now
        importance = item.importance
        if importance is None:
            importance = policy.default_importance * SOURCE_TRUST[item.source]
        return MemoryRecord(
            id=new_id(),
            channel=item.channel,
            text=item.text,
            memory_type=item.memory_type or classify_type(item.text),
            created_at=created,
            updated_at=now,
            heat0=1.0,
            t0=created,
            importance=importance,
            utility=importance,
            keystone=item.keystone,
            tags=dict(item.tags),
            source=item.source,
            confidence=item.confidence,
            provenance=dict(item.provenance),
            idempotency_key=item.idempotency_key,
        )

    # --- recall ----------------------------------------------------------------

    def recall(self, query: RecallQuery, query_vector: np.ndarray) -> RecallResult:
        """Rank the memories of the caller's channel (and any it names) for a query.

        Unless ``peek``, the returned memories of the caller's own channel are
        recalled: heat bumped, stability multiplied, count raised, made durable.
        """
        now = self._clock.now()
        window = recall_window(query, now)
        hits: list[Hit] = []
        for name in (query.channel, *query.channels):
            channel = self._channels.get(name)
            if channel is None:
                continue
            with channel.lock:
                found = rank_channel(
                    channel.index,
                    channel.records,
                    self.policy(name),
                    query,
                    query_vector,
                    window,
                    now,
                    own=name == query.channel,
                )
                hits.extend(replace(h, record=replace(h.record)) for h in found)
        hits.sort(key=lambda h: (-h.score, h.record.id))
        hits = hits[: query.limit]
        if not query.peek:
            self._recalled(query.channel, [h for h in hits if h.record.channel == query.channel])
        return RecallResult(hits, window)

    def _recalled(self, name: str, hits: list[Hit]) -> None:
        if not hits:
            return
        channel = self._channels[name]
        policy = self.policy(name)
        with channel.lock:
            now = self._clock.now()
            updated: list[MemoryRecord] = []
            for hit in hits:
                live = channel.records.get(hit.record.id)
                if live is None:
                    continue
                changed = replace(live)
                apply_recall(changed, policy, now)
                updated.append(changed)
            with self._store.batch() as batch:
                for record in updated:
                    batch.put_record(record)
            for record in updated:
                channel.records[record.id] = record
        by_id = {r.id: r for r in updated}
        for hit in hits:
            if hit.record.id in by_id:
                hit.record = replace(by_id[hit.record.id])

    # --- reads -----------------------------------------------------------------

    def _get(self, channel: _Channel, memory_id: str) -> MemoryRecord:
        record = channel.records.get(memory_id) or self._store.get(channel.name, memory_id)
        if record is None:
            raise NotFoundError(f"no memory {memory_id} in channel {channel.name!r}")
        return record

    def _existing(self, channel: str, memory_id: str) -> _Channel:
        live = self._channels.get(channel)
        if live is None:
            raise NotFoundError(f"no memory {memory_id} in channel {channel!r}")
        return live

    def inspect(self, channel: str, memory_id: str) -> MemoryRecord:
        """One memory of a channel (tombstones included)."""
        live = self._existing(channel, memory_id)
        with live.lock:
            return replace(self._get(live, memory_id))

    def heat(self, record: MemoryRecord) -> float:
        """A memory's heat now."""
        return current_heat(record, self.policy(record.channel), self._clock.now())

    def state(self, record: MemoryRecord) -> str:
        """A memory's state now."""
        return current_state(record, self.policy(record.channel), self._clock.now())

    def list_page(self, query: ListQuery) -> tuple[list[MemoryRecord], str]:
        """A page of memories in id order, and the id to resume after ('' at the end)."""
        channel = self._channels.get(query.channel)
        if channel is None:
            return [], ""
        policy = self.policy(query.channel)
        now = self._clock.now()
        page: list[MemoryRecord] = []
        with channel.lock:
            for memory_id in sorted(channel.records):
                if memory_id <= query.after_id:
                    continue
                record = channel.records[memory_id]
                if not self._listed(record, current_state(record, policy, now), query):
                    continue
                if len(page) == query.page_size:
                    return page, page[-1].id
                page.append(replace(record))
        return page, ""

    @staticmethod
    def _listed(record: MemoryRecord, state: str, query: ListQuery) -> bool:
        if query.states:
            if state not in query.states:
                return False
        elif state == DELETED:
            return False
        if query.memory_types and record.memory_type not in query.memory_types:
            return False
        if query.time_from is not None and record.created_at < query.time_from:
            return False
        if query.time_to is not None and record.created_at > query.time_to:
            return False
        return all(record.tags.get(key) == value for key, value in query.tags)

    def status(self, channel: str) -> ChannelStatus:
        """How many memories a channel holds, by state and by type."""
        live = self._channels.get(channel)
        if live is None:
            return ChannelStatus(0, {}, {})
        policy = self.policy(channel)
        now = self._clock.now()
        with live.lock:
            states = Counter(current_state(r, policy, now) for r in live.records.values())
            types = Counter(r.memory_type for r in live.records.values() if r.state != DELETED)
        total = sum(count for state, count in states.items() if state != DELETED)
        return ChannelStatus(total, dict(states), dict(types))

    # --- changes ---------------------------------------------------------------

    def _change(self, channel: str, memory_id: str, edit: _Edit) -> MemoryRecord:
        live = self._existing(channel, memory_id)
        with live.lock:
            current = self._get(live, memory_id)
            if current.state == DELETED:
                raise NotFoundError(f"memory {memory_id} was forgotten")
            changed = replace(current)
            edit(changed, self.policy(channel), self._clock.now())
            with self._store.batch() as batch:
                batch.put_record(changed)
            live.records[memory_id] = changed
            return replace(changed)

    def keystone(self, channel: str, memory_id: str, on: bool) -> MemoryRecord:
        """Pin (keystone) or unpin a memory."""
        return self._change(channel, memory_id, lambda r, p, now: apply_keystone(r, p, now, on))

    def boost(self, channel: str, memory_id: str, delta: float) -> MemoryRecord:
        """Add heat to a memory; 0 means the channel's ``boost_delta``."""
        return self._change(
            channel,
            memory_id,
            lambda r, p, now: apply_boost(r, p, now, delta or p.boost_delta),
        )

    def update(self, change: UpdateChange, vector: np.ndarray | None) -> MemoryRecord:
        """Correct a memory; a new text comes with its new embedding."""
        live = self._existing(change.channel, change.memory_id)
        with live.lock:
            current = self._get(live, change.memory_id)
            if current.state == DELETED:
                raise NotFoundError(f"memory {change.memory_id} was forgotten")
            older = None
            if change.supersedes:
                if change.supersedes == change.memory_id:
                    raise InvalidArgumentError("supersedes: a memory cannot supersede itself")
                older = replace(self._get(live, change.supersedes))
                older.tags = {**older.tags, "deprecated": "true", "superseded_by": current.id}
                older.updated_at = self._clock.now()
            changed = replace(current, updated_at=self._clock.now())
            if change.text is not None:
                changed.text = change.text
            if change.memory_type is not None:
                changed.memory_type = change.memory_type
            if change.tags is not None:
                changed.tags = dict(change.tags)
            if change.importance is not None:
                changed.importance = change.importance
            with self._store.batch() as batch:
                batch.put_record(changed)
                if vector is not None:
                    batch.put_vector(changed.channel, changed.id, vector)
                if older is not None:
                    batch.put_record(older)
            live.records[changed.id] = changed
            if older is not None:
                live.records[older.id] = older
            if vector is not None and changed.id in live.index:
                live.index.add([(changed.id, changed.text)], vector.reshape(1, -1))
            return replace(changed)

    def forget(self, channel: str, memory_ids: Iterable[str]) -> int:
        """Forget memories: each becomes a tombstone without text or embedding."""
        live = self._channels.get(channel)
        if live is None:
            return 0
        with live.lock:
            now = self._clock.now()
            gone: list[MemoryRecord] = []
            for memory_id in dict.fromkeys(memory_ids):
                record = live.records.get(memory_id)
                if record is None or record.state == DELETED:
                    continue
                gone.append(replace(record, state=DELETED, text="", updated_at=now))
            with self._store.batch() as batch:
                for record in gone:
                    batch.put_record(record)
                    batch.delete_vector(channel, record.id)
            for record in gone:
                live.records[record.id] = record
                live.index.remove(record.id)
            return len(gone)

    def matching(self, channel: str, query: ListQuery) -> list[str]:
        """The ids of every memory a filter matches (for forget by filter)."""
        ids: list[str] = []
        page_query = replace(query, page_size=1000)
        while True:
            page, after = self.list_page(page_query)
            ids.extend(r.id for r in page)
            if not after:
                return ids
            page_query = replace(page_query, after_id=after)
