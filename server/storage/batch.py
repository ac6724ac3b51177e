"""How a change list becomes keys of one RocksDB write batch, and what the commit of
that batch must still see to (see ``MemoryStore.write``)."""

from __future__ import annotations

import rocksdict

from calor.server.events import EventRecord
from calor.server.storage.heats import heat_bytes
from calor.server.storage.keys import SEP, Keys
from calor.server.storage.logged import Batch
from calor.server.storage.ops import (
    AddMemory,
    ChangeList,
    DeleteKey,
    DeleteRange,
    DropChannel,
    DropVector,
    Forget,
    Link,
    Log,
    OpenConflict,
    Operation,
    PutKey,
    PutMemory,
    Quote,
    SetHeat,
    SetPolicy,
    SetState,
    SettleConflict,
    StageVector,
    Unlink,
    vector_bytes,
)

__all__ = ["PendingBatch", "put_ops"]


class PendingBatch:
    """One write batch being made, and what its commit must still see to (under the
    commit lock): events to number, quotes to index, traces of forgotten memories and
    dropped channels to scrub, and the key ranges whose old bytes must leave the disk."""

    def __init__(self, batch: Batch, raw: rocksdict.WriteBatch) -> None:
        self.batch = batch  # opened by the store, the one module that opens batches
        self.raw = raw  # what RocksDB writes: ``batch`` itself, or what it logs into
        self.events: list[EventRecord] = []
        self.quotes: list[Quote] = []
        self.added: set[tuple[str, str]] = set()
        self.forgotten: set[tuple[str, str]] = set()
        self.dropped: set[str] = set()
        self.erased: list[tuple[bytes, bytes]] = []

    def erase(self, key: bytes) -> None:
        """Note that the old value of ``key`` must leave the disk."""
        self.erased.append((key, key + SEP))

    def gone(self, channel: str, memory_id: str) -> bool:
        """Whether this batch forgets the memory (or drops its channel)."""
        return (channel, memory_id) in self.forgotten or channel in self.dropped


def put_ops(held: PendingBatch, change: ChangeList) -> None:
    """Add one change list's keys to the batch; its events, quotes, forgets and drops are
    noted for the commit to finish."""
    name = change.channel
    forgets = any(isinstance(op, Forget) for op in change.ops)
    for op in change.ops:
        if isinstance(op, Log):
            held.events.append(op.event)
        elif isinstance(op, Quote):
            held.quotes.append(op)
        elif isinstance(op, DropChannel):
            held.dropped.add(name)
            for start, end in Keys.channel_ranges(name):
                held.batch.delete_range(start, end)
                held.erased.append((start, end))
        elif isinstance(op, DeleteRange):
            held.batch.delete_range(op.start, op.end)
            held.erased.append((op.start, op.end))
        elif isinstance(op, AddMemory | PutMemory | SetHeat | Forget | StageVector | DropVector):
            _put_memory_op(held.batch, name, op)
            if isinstance(op, AddMemory):
                held.added.add((name, op.record.id))
            elif isinstance(op, Forget):
                held.forgotten.add((name, op.record.id))
                held.erase(Keys.memory(name, op.record.id))
                held.erase(Keys.vector(name, op.record.id))
        else:
            _put_channel_op(held.batch, name, op)
            if forgets and isinstance(op, SettleConflict):  # its reason may quote numbers
                held.erase(Keys.conflict(name, op.a, op.b))


def _put_memory_op(
    batch: Batch,
    name: str,
    op: AddMemory | PutMemory | SetHeat | Forget | StageVector | DropVector,
) -> None:
    match op:
        case AddMemory(record, vector, staged):
            batch.put(Keys.memory(name, record.id), record.to_json())
            if not staged:
                batch.put(Keys.vector(name, record.id), vector_bytes(vector))
            if record.idempotency_key:
                batch.put(Keys.idempotency(name, record.idempotency_key), record.id.encode())
        case PutMemory(record, vector):
            batch.put(Keys.memory(name, record.id), record.to_json())
            batch.delete(Keys.heat(name, record.id))  # the record carries it now
            if vector is not None:
                batch.put(Keys.vector(name, record.id), vector_bytes(vector))
        case SetHeat(memory_ids, heats, at, interactions):
            for memory_id, heat0 in zip(memory_ids, heats, strict=True):
                batch.put(Keys.heat(name, memory_id), heat_bytes(heat0, at, interactions))
        case Forget(record):
            batch.put(Keys.memory(name, record.id), record.to_json())
            batch.delete(Keys.heat(name, record.id))
            batch.delete(Keys.vector(name, record.id))
        case StageVector(memory_id, vector):
            batch.put(Keys.vector(name, memory_id), vector_bytes(vector))
        case DropVector(memory_id):
            batch.delete(Keys.vector(name, memory_id))


def _put_channel_op(batch: Batch, name: str, op: Operation) -> None:
    match op:
        case Link(a, b, kind, weight):
            batch.put(Keys.edge(name, a, b, kind), repr(float(weight)).encode())
        case Unlink(a, b, kind):
            batch.delete(Keys.edge(name, a, b, kind))
        case OpenConflict(a, b, reason):
            batch.put(Keys.conflict(name, a, b), reason.encode())
        case SettleConflict(a, b):
            batch.delete(Keys.conflict(name, a, b))
        case SetState(state):
            batch.put(Keys.channel_state(name), state.to_json())
        case SetPolicy(policy):
            batch.put(Keys.policy(name), policy.to_json())
        case PutKey(key, value):
            batch.put(key, value)
        case DeleteKey(key):
            batch.delete(key)
