"""The one write path: a change to a channel is said here, written as one RocksDB batch,
and only then applied to the channel's in-memory view.

    with changing(store, channel) as change:
        change.put(record)
        change.log(event)

On leaving the block without an error the operations (a :class:`~calor.server.storage.ops.
ChangeList`) are committed by :meth:`MemoryStore.write`; once that returns, the view
applies the same list (:meth:`Channel.apply`). If the commit fails, the view is as it
was. What a forgotten memory leaves behind (its edges, its conflicts, what its tombstone
keeps) and how an edge's weight is kept are decided here, once. A view whose channel was
dropped takes no more changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from calor.server import deadline
from calor.server.engine.channel import Channel, conflict_pair
from calor.server.engine.curator import SUMMARY_TAG, quotes_sentence_of
from calor.server.engine.evaluate import FINDING_TAG
from calor.server.errors import UnavailableError
from calor.server.events import EventRecord
from calor.server.records import DELETED, MemoryRecord
from calor.server.storage.batch import PendingBatch, put_ops
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
)
from calor.server.storage.store import MemoryStore
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.graph import Edge
from calor.server.thermo.policy import ChannelPolicy

__all__ = [
    "Bookkeeping",
    "BulkWrite",
    "Changes",
    "Packed",
    "Written",
    "changing",
    "commit",
    "forgotten_with",
    "write",
]

# A finding quotes a memory's text flattened to one line, whole or cut with "…"; this
# much of its start, after the opening quote mark, says a finding quotes it.
_QUOTE_START = 200
# New memories a packed change gives its view at a time (see :class:`Packed`).
_APPLY_SLICE = 256
# Another component's writes (a trigger's cursor and counters) that join a change's batch.
Bookkeeping = Sequence[PutKey | DeleteKey | DeleteRange | Quote]


class Changes:
    """The operations of one change to one channel, said in order.

    ``channel`` is the live view the change applies to once durable; None for a
    channel that has no view (bookkeeping, events of a channel never written to).
    The caller holds the channel's lock from the first operation to the commit.
    """

    def __init__(self, name: str, channel: Channel | None = None) -> None:
        self.name = name
        self.channel = channel
        self.ops: list[Operation] = []
        self._links: dict[tuple[str, str, str], float] = {}

    def __bool__(self) -> bool:
        return bool(self.ops)

    def as_list(self) -> ChangeList:
        """The change as a plain list of operations."""
        return ChangeList(self.name, list(self.ops))

    # --- memories ------------------------------------------------------------------

    def add(self, record: MemoryRecord, vector: np.ndarray, staged: bool = False) -> None:
        """A new memory, with its embedding (``staged``: written ahead already)."""
        self.ops.append(AddMemory(record, vector, staged))

    def put(self, record: MemoryRecord, vector: np.ndarray | None = None) -> None:
        """A changed memory; ``vector`` when its text (and so its embedding) changed."""
        self.ops.append(PutMemory(record, vector))

    def set_heats(self, heats: Mapping[str, float], at: float, interactions: int) -> None:
        """Memories whose heat alone rose, materialised at ``at`` (see :class:`SetHeat`)."""
        if heats:
            self.ops.append(SetHeat(tuple(heats), tuple(heats.values()), at, interactions))

    def forget(self, record: MemoryRecord, now: float) -> MemoryRecord:
        """Make a memory a tombstone: no text, no embedding, no edges, no conflicts.

        The tombstone keeps what says the memory was there (id, type, times, counts, its
        idempotency key, so a late retry of its store does not bring it back) and nothing
        taken from or said about its text: no entities, tags, provenance or session.
        """
        tombstone = replace(
            record,
            state=DELETED,
            text="",
            updated_at=now,
            entities=[],
            tags={},
            provenance={},
            session="",
            valence=0.0,
        )
        if self.channel is not None:
            for edge in self.channel.graph.edges(record.id):
                self.unlink(edge)
            for a, b in self.channel.conflicts_of(record.id):
                self.settle(a, b)
        self.ops.append(Forget(tombstone))
        return tombstone

    def stage_vector(self, memory_id: str, vector: np.ndarray) -> None:
        """Write an embedding ahead of its record (a bulk store's first part)."""
        self.ops.append(StageVector(memory_id, vector))

    def drop_vector(self, memory_id: str) -> None:
        """Drop an embedding whose record was never written."""
        self.ops.append(DropVector(memory_id))

    # --- the graph -----------------------------------------------------------------

    def link(self, a: str, b: str, kind: str, weight: float) -> Edge:
        """Link two memories; a link that exists already keeps the larger weight."""
        low, high = conflict_pair(a, b)
        held = self._links.get((low, high, kind))
        if held is None and self.channel is not None:
            held = self.channel.graph.weight(low, high, kind)
        weight = weight if held is None else max(weight, held)
        self._links[(low, high, kind)] = weight
        self.ops.append(Link(a, b, kind, weight))
        return Edge(a, b, kind, weight)

    def forget_links(self) -> None:
        """Stop remembering the links said so far, for a caller that links none of those
        pairs again in this change (so no later link has to keep a larger weight)."""
        self._links = {}

    def unlink(self, edge: Edge) -> None:
        """Drop an edge."""
        low, high = conflict_pair(edge.from_id, edge.to_id)
        self._links.pop((low, high, edge.kind), None)
        self.ops.append(Unlink(edge.from_id, edge.to_id, edge.kind))

    # --- conflicts -----------------------------------------------------------------

    def open_conflict(self, a: str, b: str, reason: str) -> None:
        """Record that two memories contradict each other."""
        self.ops.append(OpenConflict(*conflict_pair(a, b), reason))

    def settle(self, a: str, b: str) -> None:
        """Close the conflict between two memories."""
        self.ops.append(SettleConflict(*conflict_pair(a, b)))

    def settle_all(self, memory_id: str) -> None:
        """Close every open conflict a memory is part of."""
        if self.channel is not None:
            for a, b in self.channel.conflicts_of(memory_id):
                self.settle(a, b)

    # --- the channel ---------------------------------------------------------------

    def set_state(self, state: ChannelState) -> None:
        """The channel's own state from now on."""
        self.ops.append(SetState(state))

    def set_policy(self, policy: ChannelPolicy) -> None:
        """The channel's settings from now on."""
        self.ops.append(SetPolicy(policy))

    def log(self, *events: EventRecord) -> None:
        """Log events with this change."""
        self.ops.extend(Log(event) for event in events)

    def keep(self, bookkeeping: Bookkeeping) -> None:
        """Write another component's bookkeeping in this change's batch."""
        self.ops.extend(bookkeeping)

    def drop_channel(self) -> None:
        """Remove the whole channel: every key it owns (its triggers are bookkeeping the
        caller adds with :meth:`keep`)."""
        self.ops.append(DropChannel())


def commit(
    store: MemoryStore, changes: Sequence[Changes], *, synced: bool = True
) -> list[EventRecord]:
    """Write changes as one atomic batch, then apply each to its channel's view (unless
    ``synced``, without waiting for the disk: see ``MemoryStore.write_batch``).

    Returns the logged events, numbered. A changed memory that enters an index which
    holds no embedding of it (a ghost coming back) brings its stored embedding along.
    Nothing is written once the deadline of the call doing the work has passed
    (:mod:`calor.server.deadline`; DeadlineExceededError).
    """
    events, unapplied = write(store, changes, synced=synced)
    for change in unapplied:
        change.apply()
    return events


def write(
    store: MemoryStore, changes: Sequence[Changes], *, synced: bool = True
) -> tuple[list[EventRecord], list[Written]]:
    """The first half of :func:`commit`: write changes as one atomic batch; returns the
    logged events, numbered, and each change as its view still has to take it in (the
    caller holds the channels' locks until every one is applied)."""
    changes = [change for change in changes if change]
    if not changes:
        return [], []
    held = store.open_batch()
    written = [_said(store, held, change) for change in changes]
    deadline.check("the commit")  # a call whose deadline passed commits nothing
    return store.write_batch(held, synced=synced), written


class BulkWrite:
    """One atomic batch said a part at a time (a big store): each part of a change goes
    into the write batch, and is packed for its view, as it is said (see
    :class:`Packed`), so the objects of the whole batch are never alive at once.
    The caller holds the channels' locks from the first part until every packed change
    is applied."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._held = store.open_batch()
        self._packed: list[Packed] = []

    def add(self, change: Changes) -> None:
        """The change's operations so far go into the batch (and leave the change, which
        keeps what it knows of its links for the parts to come)."""
        if change:
            self._packed.append(_said(self._store, self._held, change).packed())
            change.ops = []

    def commit(self) -> list[Packed]:
        """Write the batch; what the views have yet to take in, in order."""
        if not self._packed:
            return []  # nothing was said: nothing to write
        deadline.check("the commit")  # a call whose deadline passed commits nothing
        for packed in self._packed:
            packed.check_view()
        self._store.write_batch(self._held)
        return self._packed


def _said(store: MemoryStore, held: PendingBatch, change: Changes) -> Written:
    """Put a change into a write batch being made: it as its view will take it in."""
    view = change.channel
    if view is not None:
        _check_view(view)
        for n, op in enumerate(change.ops):
            if isinstance(op, PutMemory) and op.vector is None and view.needs_vector(op.record):
                change.ops[n] = PutMemory(op.record, store.get_vector(change.name, op.record.id))
    replaced = _replaced(change)
    listed = change.as_list()
    put_ops(held, listed)
    return Written(view, listed, replaced)


def _check_view(view: Channel | None) -> None:
    if view is not None and view.dropped:
        raise UnavailableError(f"channel {view.name!r} was dropped while this call ran; try again")


class Written:
    """A change that is durable and that its view (if any) has yet to take in."""

    def __init__(
        self, view: Channel | None, change: ChangeList, replaced: Mapping[str, MemoryRecord]
    ) -> None:
        self.view = view
        self.change = change
        self.replaced = replaced

    def apply(self) -> None:
        """Let the view take the change in."""
        if self.view is not None:
            self.view.apply(self.change, self.replaced)

    def packed(self) -> Packed:
        """The change held compactly until it is applied (see :class:`Packed`)."""
        return Packed(self)


class Packed:
    """A written change of many new memories, held compactly until its view takes it in:
    their records as JSON and their vectors and links in one buffer per slice, the rest
    of the change as it was.

    A bulk of many thousands of memories whose objects were all alive while the view
    takes them in would leave what the view keeps (ids, index entries, links) scattered
    over the whole bulk's heap, which Python cannot give back once the bulk's objects
    are gone (measured in-process: 4.2 KB a memory after one store of 10,000; 1.5 with
    its parts packed and applied a slice at a time). Applied a slice at a time from
    this form, each slice's objects are made and dropped before the next. Events are
    left out: the write logged them.
    """

    def __init__(self, written: Written) -> None:
        self._view = written.view
        self._name = written.change.channel
        self._replaced = written.replaced
        self._first: list[Operation] = []  # the channel's state: taken before any memory
        self._last: list[Operation] = []  # other changes, after the new memories
        self._slices: list[tuple[bytes, np.ndarray, bytes]] = []
        records: list[bytes] = []
        vectors: list[np.ndarray] = []
        links: list[tuple[str, str, str, float]] = []
        for op in written.change.ops:
            if isinstance(op, AddMemory):
                if len(records) == _APPLY_SLICE:
                    self._pack(records, vectors, links)
                    records, vectors, links = [], [], []
                records.append(op.record.to_json())
                vectors.append(op.vector)
            elif isinstance(op, Link):
                links.append((op.a, op.b, op.kind, op.weight))
            elif isinstance(op, SetState):
                self._first.append(op)
            elif not isinstance(op, Log):
                self._last.append(op)
        if records or links:
            self._pack(records, vectors, links)

    def _pack(
        self,
        records: list[bytes],
        vectors: list[np.ndarray],
        links: list[tuple[str, str, str, float]],
    ) -> None:
        # Compact JSON escapes every newline inside a string: a bare one only separates.
        # Half precision: what the index keeps of them (the store has them whole already).
        stacked = np.stack(vectors).astype(np.float16) if vectors else np.empty((0, 0))
        self._slices.append((b"\n".join(records), stacked, json.dumps(links).encode()))

    def check_view(self) -> None:
        """UNAVAILABLE if the view was dropped meanwhile."""
        _check_view(self._view)

    def apply(self) -> None:
        """Let the view take the change in, a slice at a time (the caller holds its lock
        throughout: no reader sees a part of it)."""
        view = self._view
        if view is None:
            return
        if self._first:
            view.apply(ChangeList(self._name, self._first))
        while self._slices:
            records, vectors, links = self._slices.pop(0)
            ops: list[Operation] = [
                AddMemory(MemoryRecord.from_json(line), vector, staged=True)
                for line, vector in zip(
                    records.split(b"\n") if records else (), vectors, strict=True
                )
            ]
            ops.extend(Link(a, b, kind, weight) for a, b, kind, weight in json.loads(links))
            view.apply(ChangeList(self._name, ops))
        if self._last:
            view.apply(ChangeList(self._name, self._last), self._replaced)


def _replaced(change: Changes) -> dict[str, MemoryRecord]:
    """The records a change puts or forgets, as its view holds them before it is written."""
    view = change.channel
    found: dict[str, MemoryRecord] = {}
    if view is None:
        return found
    for op in change.ops:
        if isinstance(op, PutMemory | Forget) and op.record.id not in found:
            before = view.records.get(op.record.id)
            if before is not None:
                found[op.record.id] = before
    return found


@contextmanager
def changing(
    store: MemoryStore, channel: Channel | None, name: str = "", *, synced: bool = True
) -> Iterator[Changes]:
    """Say one change to a channel in the block; it is committed when the block ends
    without an error (nothing is written if nothing was said; see :func:`commit`)."""
    change = Changes(channel.name if channel is not None else name, channel)
    yield change
    if change:
        commit(store, [change], synced=synced)


def forgotten_with(channel: Channel, memory_ids: Iterable[str]) -> list[MemoryRecord]:
    """The memories a forget of ``memory_ids`` takes: those named that are not forgotten
    yet, the memories merged into them (and into those), the episode summaries that
    quote a sentence of any of them, and the Evaluate findings that name or quote any of
    them (a finding is a note about a text, quoting it)."""
    gone: dict[str, MemoryRecord] = {}
    todo = list(dict.fromkeys(memory_ids))
    while todo:
        record = channel.records.get(todo.pop(0))
        if record is None or record.state == DELETED or record.id in gone:
            continue
        gone[record.id] = record
        todo.extend(record.merged_from)
    if not gone:
        return []
    for record in list(gone.values()):  # an episode's summary quotes its sources
        for edge in channel.graph.edges(record.id):
            summary = channel.records.get(edge.to_id) if edge.kind == "summary" else None
            if (
                summary is not None
                and SUMMARY_TAG in summary.tags
                and summary.state != DELETED
                and summary.id not in gone
                and quotes_sentence_of(summary, record.text)
            ):
                gone[summary.id] = summary
    quotes = [_quote_start(r.text) for r in gone.values() if r.text.strip()]
    for record in channel.records.values():
        if record.id in gone or record.state == DELETED or FINDING_TAG not in record.tags:
            continue
        named = record.provenance.get("issue_memory_id", "") in gone
        if named or any(quote in record.text for quote in quotes):
            gone[record.id] = record
    return list(gone.values())


def _quote_start(text: str) -> str:
    """How a finding that quotes ``text`` shows its start: after an opening quote mark,
    flattened to one line; a short text whole, between quote marks."""
    flat = " ".join(text.split())
    return f'"{flat}"' if len(flat) < _QUOTE_START else f'"{flat[:_QUOTE_START]}'
