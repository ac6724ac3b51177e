"""The offline consistency check of a store (``calor check``): what each key family says
about the others, and the repairs.

A memory that is not forgotten (ACTIVE, COLD, ARCHIVED, GHOST or MERGED) has its
embedding: the engine keeps it through every state change, because a ghost that is
warmed again or a merge that is undone goes back into an index with it. A forgotten
memory (DELETED) has none. Every embedding belongs to a memory record; every edge and
every open conflict names two memories of its channel that exist and are not
forgotten; a heat kept beside a record (resonance's) has a record that is not
forgotten; every idempotency key names a memory that exists (a tombstone counts: a
store with that key returns it). The event log is numbered without holes from its
oldest retained event to its newest, and each event carries its own key's number.

Repairs are written as one atomic batch of change lists (:meth:`MemoryStore.write`) after the
whole store was read: a missing embedding is embedded again from the memory's text
(when an embedder is given), a stray one, edge, conflict, heat or idempotency key is
dropped, a misnumbered event takes its key's number, and a hole in the log is filled
with ``notify`` placeholder events (channel "", message :data:`PLACEHOLDER_MESSAGE`)
that subscribers replaying the log will see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from calor.server.errors import FailedPreconditionError, StoreInUseError
from calor.server.events import EventRecord
from calor.server.records import DELETED, MemoryRecord
from calor.server.storage.keys import split
from calor.server.storage.ops import (
    ChangeList,
    DeleteKey,
    DropVector,
    Operation,
    PutKey,
    PutMemory,
    SettleConflict,
    Unlink,
)
from calor.server.storage.store import Keys, MemoryStore

__all__ = [
    "KINDS",
    "PLACEHOLDER_MESSAGE",
    "Checker",
    "Embed",
    "Problem",
    "Tally",
    "check",
    "open_offline",
]

Embed = Callable[[Sequence[str]], np.ndarray]
"""Texts to unit-length float32 embeddings, one row each (the store's own model)."""

PLACEHOLDER_MESSAGE = "lost event: restored as a placeholder by calor check"

MISSING_VECTOR = "missing_vector"
BAD_VECTOR = "bad_vector"
DELETED_VECTOR = "deleted_vector"
ORPHAN_VECTOR = "orphan_vector"
DANGLING_EDGE = "dangling_edge"
DANGLING_CONFLICT = "dangling_conflict"
DANGLING_IDEMPOTENCY_KEY = "dangling_idempotency_key"
STRAY_HEAT = "stray_heat"
MISNUMBERED_EVENT = "misnumbered_event"
UNREADABLE_EVENT = "unreadable_event"
EVENT_GAP = "event_gap"
KINDS = (
    MISSING_VECTOR,
    BAD_VECTOR,
    DELETED_VECTOR,
    ORPHAN_VECTOR,
    DANGLING_EDGE,
    DANGLING_CONFLICT,
    DANGLING_IDEMPOTENCY_KEY,
    STRAY_HEAT,
    MISNUMBERED_EVENT,
    UNREADABLE_EVENT,
    EVENT_GAP,
)
"""Every kind of problem the check reports, by its stable name."""

# A hole in the log wider than this is reported but not filled: that many placeholders
# would be a corruption of their own (a key numbered far past the rest, most likely).
_MAX_FILL = 100_000

_MemoryKey = tuple[str, str]  # (channel, memory id)


@dataclass(frozen=True)
class Problem:
    """One inconsistency: its kind (one of :data:`KINDS`), its channel ("" for the
    event log), what is wrong, naming the ids and keys, and whether it was repaired."""

    kind: str
    channel: str
    detail: str
    fixed: bool = False

    def __str__(self) -> str:
        where = f" {self.channel}" if self.channel else ""
        return f"{self.kind}{where}: {self.detail}" + (" (fixed)" if self.fixed else "")


@dataclass
class Tally:
    """How much a check read, key family by key family."""

    memories: int = 0
    vectors: int = 0
    edges: int = 0
    conflicts: int = 0
    idempotency_keys: int = 0
    events: int = 0


@dataclass
class _Finding:
    """A problem and its repair: operations, or a memory to embed again."""

    problem: Problem
    ops: list[Operation] = field(default_factory=list)
    reembed: _MemoryKey | None = None


class Checker:
    """One consistency check of a store, reading each key family once.

    ``tally`` says how much was read once :meth:`run` returns.
    """

    def __init__(self, store: MemoryStore, embed: Embed | None = None) -> None:
        self._store = store
        self._embed = embed
        self.tally = Tally()
        self._states: dict[_MemoryKey, str] = {}
        self._found: list[_Finding] = []

    STEPS = ("memories", "vectors", "edges", "conflicts", "idempotency keys", "heats", "log")
    """What a check reads, in order (a fix then repairs: ``"repairing"``)."""

    def run(
        self, fix: bool = False, on_step: Callable[[str], None] = lambda step: None
    ) -> list[Problem]:
        """The problems found, in key-family order; with ``fix``, every one that can be
        repaired is, in one atomic commit, and reported as fixed. ``on_step`` hears the
        name of each step (:attr:`STEPS`, then ``"repairing"``) as it begins."""
        self._found = []
        self.tally = Tally()
        steps = (
            self._read_memories,
            self._check_vectors,
            self._check_edges,
            self._check_conflicts,
            self._check_idempotency_keys,
            self._check_heats,
            self._check_log,
        )
        for name, step in zip(self.STEPS, steps, strict=True):
            on_step(name)
            step()
        if fix:
            on_step("repairing")
            self._repair()
        return [finding.problem for finding in self._found]

    # --- reading -------------------------------------------------------------------

    def _report(
        self,
        kind: str,
        channel: str,
        detail: str,
        ops: Sequence[Operation] = (),
        reembed: _MemoryKey | None = None,
    ) -> None:
        self._found.append(_Finding(Problem(kind, channel, detail), list(ops), reembed))

    def _read_memories(self) -> None:
        self._states = {}
        for record in self._store.records():
            self._states[(record.channel, record.id)] = record.state
        self.tally.memories = len(self._states)

    def _missing(self, channel: str, memory_id: str) -> str | None:
        """Why a memory cannot be named by an edge or conflict, or None if it can be."""
        state = self._states.get((channel, memory_id))
        if state is None:
            return f"memory {memory_id} does not exist"
        return f"memory {memory_id} is forgotten" if state == DELETED else None

    def _check_vectors(self) -> None:
        """Every embedding against its record, then the records left without one."""
        unseen = {key for key, state in self._states.items() if state != DELETED}
        for channel, memory_id, vector in self._store.vectors():
            self.tally.vectors += 1
            state = self._states.get((channel, memory_id))
            if state is None:
                detail = f"embedding of {memory_id} belongs to no memory record"
                self._report(ORPHAN_VECTOR, channel, detail, [DropVector(memory_id)])
            elif state == DELETED:
                detail = f"memory {memory_id} is forgotten but keeps its embedding"
                self._report(DELETED_VECTOR, channel, detail, [DropVector(memory_id)])
            else:
                unseen.discard((channel, memory_id))
                if vector.shape[0] != self._store.dim:
                    detail = (
                        f"embedding of memory {memory_id} has {vector.shape[0]} values, "
                        f"the store's have {self._store.dim}"
                    )
                    self._report(BAD_VECTOR, channel, detail, reembed=(channel, memory_id))
        for channel, memory_id in sorted(unseen):
            state = self._states[(channel, memory_id)]
            detail = f"memory {memory_id} ({state}) has no embedding"
            self._report(MISSING_VECTOR, channel, detail, reembed=(channel, memory_id))

    def _check_edges(self) -> None:
        for channel, a, b, kind, _ in self._store.edges():
            self.tally.edges += 1
            why = self._missing(channel, a) or self._missing(channel, b)
            if why is not None:
                detail = f"{kind} edge between {a} and {b}: {why}"
                self._report(DANGLING_EDGE, channel, detail, [Unlink(a, b, kind)])

    def _check_conflicts(self) -> None:
        for channel, a, b, _ in self._store.conflicts():
            self.tally.conflicts += 1
            why = self._missing(channel, a) or self._missing(channel, b)
            if why is not None:
                detail = f"open conflict between {a} and {b}: {why}"
                self._report(DANGLING_CONFLICT, channel, detail, [SettleConflict(a, b)])

    def _check_idempotency_keys(self) -> None:
        for channel, key, memory_id in self._store.idempotency_keys():
            self.tally.idempotency_keys += 1
            if (channel, memory_id) not in self._states:
                detail = f"idempotency key {key!r} names memory {memory_id}, which does not exist"
                ops = [DeleteKey(Keys.idempotency(channel, key))]
                self._report(DANGLING_IDEMPOTENCY_KEY, channel, detail, ops)

    def _check_heats(self) -> None:
        for key, _ in self._store.heats():
            channel, memory_id = split(key)
            why = self._missing(channel, memory_id)
            if why is not None:
                detail = f"heat kept for memory {memory_id}: {why}"
                self._report(STRAY_HEAT, channel, detail, [DeleteKey(key)])

    def _check_log(self) -> None:
        """The log's numbering: each event under its own number, no holes."""
        previous: EventRecord | None = None
        for seq, data in self._store.logged():
            self.tally.events += 1
            if previous is not None and seq > previous.seq + 1:
                self._report_gap(previous, seq)
            event = _parse_event(data)
            if event is None:
                event = _placeholder(seq, previous)
                detail = f"event {seq} cannot be read; a placeholder takes its place"
                self._report(UNREADABLE_EVENT, "", detail, [_put_event(event)])
            elif event.seq != seq:
                detail = f"event under key {seq} carries sequence number {event.seq}"
                event = event.with_seq(seq)
                self._report(MISNUMBERED_EVENT, event.channel, detail, [_put_event(event)])
            previous = event

    def _report_gap(self, before: EventRecord, seq: int) -> None:
        first, last = before.seq + 1, seq - 1
        span = f"event {first}" if first == last else f"events {first}..{last}"
        detail = f"{span} missing between events {before.seq} and {seq}"
        ops: list[Operation] = []
        if last - first < _MAX_FILL:
            ops = [_put_event(_placeholder(n, before)) for n in range(first, last + 1)]
        else:
            detail += f" (more than {_MAX_FILL}: not filled)"
        self._report(EVENT_GAP, "", detail, ops)

    # --- repairing -----------------------------------------------------------------

    def _repair(self) -> None:
        """Commit every repair there is as one change; mark those problems fixed."""
        vectors = self._embed_again()
        changes: dict[str, ChangeList] = {}
        for n, finding in enumerate(self._found):
            ops = list(finding.ops)
            if finding.reembed is not None and finding.reembed in vectors:
                record, vector = vectors[finding.reembed]
                ops.append(PutMemory(record, vector))
            if not ops:
                continue
            channel = finding.problem.channel
            changes.setdefault(channel, ChangeList(channel)).ops.extend(ops)
            self._found[n] = replace(finding, problem=replace(finding.problem, fixed=True))
        if changes:  # offline: no live view to apply them to
            self._store.write(list(changes.values()))

    def _embed_again(self) -> dict[_MemoryKey, tuple[MemoryRecord, np.ndarray]]:
        """The records that need a new embedding, with it (none without an embedder)."""
        wanted = [f.reembed for f in self._found if f.reembed is not None]
        if self._embed is None or not wanted:
            return {}
        records = [record for key in wanted if (record := self._record(key)) is not None]
        if not records:
            return {}
        rows = self._embed([record.text for record in records])
        return {(r.channel, r.id): (r, rows[n]) for n, r in enumerate(records)}

    def _record(self, key: _MemoryKey) -> MemoryRecord | None:
        return self._store.record(*key)


def check(store: MemoryStore, fix: bool = False, embed: Embed | None = None) -> list[Problem]:
    """The inconsistencies of ``store`` (see the module's rules); with ``fix``, the
    repairable ones repaired in one commit. A missing embedding is repairable only
    with ``embed``, the store's own model."""
    return Checker(store, embed).run(fix)


def open_offline(path: Path, *, model_id: str, dim: int) -> MemoryStore:
    """Open the store in the data folder ``path`` for a check, no server running.

    Raises:
        FailedPreconditionError: there is no store in ``path``, or a running server
            holds it (RocksDB's lock).
        StoreMismatchError: the store was made by another model or a newer Calor.
    """
    if not (path / "rocksdb").is_dir():
        raise FailedPreconditionError(f"no Calor store in {path}")
    try:
        return MemoryStore.open(path, model_id=model_id, dim=dim)
    except StoreInUseError as err:
        raise StoreInUseError(
            f"{err.message}; calor check works on a store no server holds"
        ) from None


def _parse_event(data: bytes) -> EventRecord | None:
    try:
        return EventRecord.from_json(data)
    except (ValueError, TypeError):
        return None


def _placeholder(seq: int, before: EventRecord | None) -> EventRecord:
    """The event that stands in for a lost one: a ``notify`` of no channel, at the time
    of the event before it."""
    at = before.at if before is not None else 0.0
    return EventRecord(kind="notify", channel="", at=at, message=PLACEHOLDER_MESSAGE, seq=seq)


def _put_event(event: EventRecord) -> PutKey:
    return PutKey(Keys.event(event.seq), event.to_json())
