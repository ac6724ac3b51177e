"""Settling what a channel says twice: a newer memory supersedes an older one
(``Update(supersedes=)``), or a trigger deprecates a memory.

A superseded or deprecated memory is settled history: it is tagged (``deprecated``, and
``superseded_by`` naming its successor, who is tagged ``supersedes`` and linked to it by a
``supersedes`` edge), cooled (:func:`~calor.server.thermo.lifecycle.apply_cooling`), left
out of default recall, Context, cards and dreams' conflicts and merges, and its open
conflicts are settled, each side tagged ``settled`` with the other's id.
"""

from __future__ import annotations

from collections.abc import Iterable

from calor.server.engine.changes import Changes
from calor.server.engine.channel import Channel
from calor.server.records import MemoryRecord
from calor.server.thermo.lifecycle import Clocks, apply_cooling, evolve
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["mark_superseded", "settle_conflicts"]

SETTLED = "settled"
"""The tag naming, on each side, the memories a settled conflict was with."""


def mark_superseded(
    record: MemoryRecord, successor: MemoryRecord | None, policy: ChannelPolicy, clocks: Clocks
) -> None:
    """Make a (copied, evolved) record settled history; with its ``successor`` (also a
    copy) tagged to match."""
    tags = {**record.tags, "deprecated": "true"}
    if successor is not None:
        tags["superseded_by"] = successor.id
        successor.tags = {**successor.tags, "supersedes": record.id}
    record.tags = tags
    apply_cooling(record, policy, clocks)


def settle_conflicts(
    change: Changes,
    channel: Channel,
    record: MemoryRecord,
    others: Iterable[MemoryRecord] = (),
    policy: ChannelPolicy | None = None,
    clocks: Clocks | None = None,
) -> None:
    """Settle the open conflicts of ``record`` (a copy the caller puts after this call):
    with each of ``others`` (copies the caller puts too), and with every other memory
    it is in conflict with, whose copies are put here. Both sides are tagged."""
    given = {other.id: other for other in others}
    for a, b in channel.conflicts_of(record.id):
        other_id = b if a == record.id else a
        other = given.get(other_id)
        if other is None:
            live = channel.records[other_id]
            other = evolve(live.copy(), policy or channel.policy, clocks or channel.clocks())
            _note(other, record.id)
            change.put(other)
        else:
            _note(other, record.id)
        _note(record, other_id)
        change.settle(a, b)


def _note(record: MemoryRecord, other_id: str) -> None:
    settled = {i for i in record.tags.get(SETTLED, "").split(",") if i}
    record.tags = {**record.tags, SETTLED: ",".join(sorted({*settled, other_id}))}
