"""Changes to memories that already exist (a pin, a boost, tags, a correction, a link,
a deprecation, forgetting), each written in one atomic batch and then applied to the
channel's live view (:mod:`calor.server.engine.changes`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import numpy as np

from calor.server.clock import Clock
from calor.server.commands import UpdateChange
from calor.server.engine.changes import Bookkeeping, changing, forgotten_with
from calor.server.engine.channel import Channel
from calor.server.engine.dream import keep_apart
from calor.server.engine.registry import ChannelRegistry
from calor.server.engine.rejections import rejection
from calor.server.engine.results import Current
from calor.server.engine.settling import mark_superseded, settle_conflicts
from calor.server.errors import InvalidArgumentError, NotFoundError
from calor.server.events import Cause, memory_event
from calor.server.records import DELETED, MERGED, MemoryRecord
from calor.server.storage.store import MemoryStore
from calor.server.thermo.graph import Edge
from calor.server.thermo.lifecycle import (
    Clocks,
    apply_boost,
    apply_keystone,
    current_heat,
    evolve,
    refresh_utility,
)
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["MemoryEdits", "record_of"]

# A change applied to a copy of a record: (record, policy, clocks).
_Edit = Callable[[MemoryRecord, ChannelPolicy, Clocks], None]


def record_of(channel: Channel, memory_id: str) -> MemoryRecord:
    """The record ``channel`` holds for ``memory_id`` (a tombstone too); NOT_FOUND if none."""
    record = channel.records.get(memory_id)
    if record is None:
        raise NotFoundError(f"no memory {memory_id} in channel {channel.name!r}")
    return record


class MemoryEdits:
    """Every channel's changes to existing memories (the engine's ``edits``)."""

    def __init__(self, store: MemoryStore, clock: Clock, channels: ChannelRegistry) -> None:
        self._store = store
        self._clock = clock
        self._channels = channels

    def _change(
        self,
        channel: str,
        memory_ids: Sequence[str],
        edit: _Edit,
        event: str = "",
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> list[Current]:
        """Apply ``edit`` to each memory (one channel), in one batch with ``extra``."""
        if not memory_ids:
            with changing(self._store, None) as change:
                change.keep(extra)
            return []
        live = self._channels.existing(channel, memory_ids[0])
        with live.lock:
            policy, clocks = live.policy, live.clocks()
            changes: list[MemoryRecord] = []
            for memory_id in dict.fromkeys(memory_ids):
                current = record_of(live, memory_id)
                if current.state == DELETED:
                    raise NotFoundError(f"memory {memory_id} was forgotten")
                changed = evolve(replace(current), policy, clocks)
                edit(changed, policy, clocks)
                refresh_utility(changed, clocks.now)
                changes.append(changed)
            with changing(self._store, live) as change:
                for changed in changes:
                    change.put(changed)
                    if event:
                        heat = current_heat(changed, policy, clocks)
                        change.log(memory_event(event, changed, clocks.now, heat, cause=cause))
                change.keep(extra)
            return [live.current(changed, clocks) for changed in changes]

    # A trigger's action passes ``cause`` and, as ``extra``, its cursor and bookkeeping
    # writes: they join the action's own batch, so after a crash the action is either
    # done and accounted for or not done at all.

    def keystone(
        self,
        channel: str,
        memory_id: str,
        on: bool,
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> Current:
        """Pin (keystone) or unpin a memory; a trigger's pin is logged as a ``pin`` event."""
        [changed] = self._change(
            channel,
            [memory_id],
            lambda r, p, c: apply_keystone(r, p, c, on),
            "pin" if cause is not None else "",
            cause,
            extra,
        )
        return changed

    def boost(
        self,
        channel: str,
        memory_id: str,
        delta: float,
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> Current:
        """Add heat to a memory; 0 means the channel's ``boost_delta``."""
        [changed] = self.boost_all(channel, [memory_id], delta, cause, extra)
        return changed

    def boost_all(
        self,
        channel: str,
        memory_ids: Sequence[str],
        delta: float,
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> list[Current]:
        """Add heat to several memories of a channel in one batch (a trigger's boost of
        a memory's neighbours); none is boosted if one cannot be."""
        return self._change(
            channel,
            memory_ids,
            lambda r, p, c: apply_boost(r, p, c, delta or p.boost_delta),
            "on_boost",
            cause,
            extra,
        )

    def tag(
        self,
        channel: str,
        memory_id: str,
        tags: dict[str, str],
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> Current:
        """Add tags to a memory (a trigger's ``tag`` action)."""

        def add(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> None:
            record.tags = {**record.tags, **tags}

        kind = "tag" if cause is not None else ""
        [changed] = self._change(channel, [memory_id], add, kind, cause, extra)
        return changed

    def deprecate(
        self,
        channel: str,
        memory_id: str,
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> Current:
        """Deprecate a memory (a trigger's ``deprecate`` action): settled history, see
        :mod:`calor.server.engine.settling`."""
        live = self._channels.existing(channel, memory_id)
        with live.lock:
            policy, clocks = live.policy, live.clocks()
            record = evolve(replace(record_of(live, memory_id)), policy, clocks)
            if record.state == DELETED:
                raise NotFoundError(f"memory {memory_id} was forgotten")
            mark_superseded(record, None, policy, clocks)
            refresh_utility(record, clocks.now)
            with changing(self._store, live) as change:
                settle_conflicts(change, live, record, (), policy, clocks)
                change.put(record)
                heat = current_heat(record, policy, clocks)
                change.log(memory_event("deprecate", record, clocks.now, heat, cause=cause))
                change.keep(extra)
            return live.current(record, clocks)

    def connect(self, channel: str, from_id: str, to_id: str, weight: float) -> Edge:
        """Link two memories of a channel by hand (a ``manual`` edge)."""
        if from_id == to_id:
            raise InvalidArgumentError("to_id: a memory cannot be linked to itself")
        live = self._channels.existing(channel, from_id)
        with live.lock:
            for memory_id in (from_id, to_id):
                if record_of(live, memory_id).state == DELETED:
                    raise NotFoundError(f"memory {memory_id} was forgotten")
            with changing(self._store, live) as change:
                edge = change.link(from_id, to_id, "manual", weight)
            return edge

    def update(self, change: UpdateChange, vector: np.ndarray | None) -> Current:
        """Correct a memory; a new text comes with its new embedding."""
        live = self._channels.existing(change.channel, change.memory_id)
        with live.lock:
            policy, clocks = live.policy, live.clocks()
            current = record_of(live, change.memory_id)
            if current.state == DELETED:
                raise NotFoundError(f"memory {change.memory_id} was forgotten")
            older = None
            if change.supersedes:
                if change.supersedes == change.memory_id:
                    raise InvalidArgumentError("supersedes: a memory cannot supersede itself")
                older = evolve(replace(record_of(live, change.supersedes)), policy, clocks)
                if older.state == DELETED:
                    raise NotFoundError(f"supersedes: memory {older.id} was forgotten")
            changed = evolve(replace(current, updated_at=clocks.now), policy, clocks)
            change.apply(changed, clocks.now, live.knows_entity)
            if older is not None:
                mark_superseded(older, changed, policy, clocks)
            survivor = None
            if change.clear_merge and current.state == MERGED:
                survivor = replace(record_of(live, current.merged_into))
                survivor.merged_from = [i for i in survivor.merged_from if i != current.id]
                survivor.updated_at = clocks.now
                keep_apart(changed, survivor)
            refresh_utility(changed, clocks.now)
            with changing(self._store, live) as writing:
                if older is not None:
                    settle_conflicts(writing, live, older, [changed], policy, clocks)
                    writing.put(older)
                    writing.link(changed.id, older.id, "supersedes", 1.0)
                if survivor is not None:
                    writing.put(survivor)
                writing.put(changed, vector)
                if change.text is not None:  # a corrected text settles its conflicts
                    writing.settle_all(changed.id)
            return live.current(changed, clocks)

    def forget(self, channel: str, memory_ids: Iterable[str], reject: bool = False) -> int:
        """Forget memories: each becomes a tombstone without text, embedding or edges, and
        what quoted its text (event messages, webhook deliveries waiting in the outbox)
        is rewritten without it, in one batch; the bytes leave the disk at the next purge.

        What holds a copy of a forgotten text goes with it: the memories a dream merged
        into it (and into those), and the Evaluate findings that quote it. With
        ``reject``, each one's embedding stays behind as a rejection of the channel
        (:mod:`calor.server.engine.rejections`). Returns how many memories were
        forgotten, those included.
        """
        live = self._channels.find(channel)
        if live is None:
            return 0
        with live.lock:
            now = self._clock.now()
            gone = forgotten_with(live, memory_ids)
            if not gone:
                return 0  # nothing to forget: write nothing
            kept = [self._store.get_vector(channel, record.id) for record in gone] if reject else []
            with changing(self._store, live) as change:
                for record in gone:
                    change.forget(record, now)
                change.keep(
                    [
                        rejection(channel, record.id, vector)
                        for record, vector in zip(gone, kept, strict=False)
                        if vector is not None
                    ]
                )
            return len(gone)
