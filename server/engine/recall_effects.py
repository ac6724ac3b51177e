"""What a recall does to a channel (DESIGN §3): bumps, resonance along the graph, channel heat.

Only relevant hits are heated (relevance before heat): see :func:`heated`.

Computed on copies, without writing: the engine persists the outcome in one batch.
Resonance reaches hundreds of memories in a large channel; those it only warms (ACTIVE
and staying so) are computed in bulk from the index's columns and written as heats
alone, without reading or rewriting their records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from calor.server.engine.channel import Channel
from calor.server.recall.columns import (
    ACTIVE_CODE,
    ARCHIVED_CODE,
    COLD_CODE,
    heats_and_states,
    needs_record,
)
from calor.server.recall.ranking import Hit, reaches
from calor.server.records import ACTIVE, ARCHIVED, COLD, MemoryRecord
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.lifecycle import (
    Clocks,
    apply_gain,
    apply_recall,
    current_heat,
    evolve,
    refresh_utility,
)
from calor.server.thermo.policy import ChannelPolicy
from calor.server.thermo.resonance import Reach, Reached, resonance

__all__ = ["RecallEffects", "heated", "recall_effects"]

_LIVE = frozenset({ACTIVE, COLD})
_REACHABLE = (ACTIVE_CODE, COLD_CODE, ARCHIVED_CODE)
_NEAR_CAP = 1.0 - 1e-4


@dataclass(frozen=True)
class RecallEffects:
    """What a recall changed: the records of the recalled memories and of those that
    resonance brought back or changed otherwise, the heat (``heat0`` as of the recall)
    of those it only warmed, and the channel's next state."""

    recalled: list[str]
    changed: dict[str, MemoryRecord]
    warmed: dict[str, float]
    state: ChannelState


def heated(hits: Sequence[Hit], policy: ChannelPolicy) -> list[str]:
    """The ids of the hits a recall heats: those whose confidence band reaches the
    channel's ``heat_min_band``, so a hit that only fills the limit is not rewarded."""
    return [hit.record.id for hit in hits if reaches(hit.band, policy.heat_min_band)]


def recall_effects(
    channel: Channel, memory_ids: list[str], policy: ChannelPolicy, clocks: Clocks
) -> RecallEffects:
    """Recall the given memories of a channel as of ``clocks``."""
    changed: dict[str, MemoryRecord] = {}
    for memory_id in memory_ids:
        live = channel.records.get(memory_id)
        if live is None:
            continue
        record = evolve(live.copy(), policy, clocks)
        apply_recall(record, policy, clocks)
        refresh_utility(record, clocks.now)
        changed[record.id] = record

    recalled = {i: current_heat(r, policy, clocks) for i, r in changed.items()}
    judge = partial(_judge, channel, policy=policy, clocks=clocks)
    gains = resonance(channel.graph, recalled, judge, policy)
    warmed, settled = _warmed(channel, gains, policy, clocks)
    for memory_id, gain in gains.items():
        if memory_id in settled:
            continue
        record = evolve(channel.records[memory_id].copy(), policy, clocks)
        if record.state != ARCHIVED and current_heat(record, policy, clocks) >= _NEAR_CAP:
            continue  # already at the cap: the gain would change nothing worth a write
        apply_gain(record, policy, clocks, gain)
        changed[memory_id] = record
    state = replace(channel.state, interactions=clocks.interactions)
    state.recalled(policy, clocks.now)
    return RecallEffects(list(recalled), changed, warmed, state)


def _warmed(
    channel: Channel, gains: dict[str, float], policy: ChannelPolicy, clocks: Clocks
) -> tuple[dict[str, float], set[str]]:
    """Of the memories resonance reaches, those it only warms, in bulk from the live
    index's columns: ACTIVE, staying ACTIVE, covered by the bulk formula. Returns their
    heat after the gain, and every memory settled here (warmed, or at the cap already:
    a gain would change nothing worth a write)."""
    memory_ids = list(gains)
    labels = channel.index.labels(memory_ids)
    rows = np.flatnonzero(labels >= 0)
    if not rows.size:
        return {}, set()
    batch = channel.index.columns.batch(labels[rows])
    heats, states = heats_and_states(batch, policy, clocks)
    simple = (batch.state == ACTIVE_CODE) & (states == ACTIVE_CODE)
    simple &= ~needs_record(batch) & ~batch.superseded
    rows, heats = rows[simple], heats[simple]
    ids = [memory_ids[row] for row in rows.tolist()]
    capped = heats >= _NEAR_CAP
    gained = np.array([gains[memory_id] for memory_id in ids], dtype=np.float64)
    after = np.clip(heats + gained, 0.0, 1.0)
    warmed = {
        memory_id: heat
        for memory_id, heat, cap in zip(ids, after.tolist(), capped.tolist(), strict=True)
        if not cap
    }
    return warmed, set(ids)


def _judge(
    channel: Channel, memory_ids: list[str], *, policy: ChannelPolicy, clocks: Clocks
) -> Reached:
    """What resonance needs of each memory, read in bulk from the columns of the index
    that holds it; a memory the columns do not cover is judged from its record."""
    count = len(memory_ids)
    takes = np.zeros(count, dtype=bool)
    heat = np.zeros(count)
    archived = np.zeros(count, dtype=bool)
    unjudged = np.ones(count, dtype=bool)
    for index in (channel.index, channel.attic):
        asked = np.flatnonzero(unjudged)
        labels = index.labels([memory_ids[row] for row in asked.tolist()])
        rows, labels = asked[labels >= 0], labels[labels >= 0]
        if not rows.size:
            continue
        unjudged[rows] = False
        batch = index.columns.batch(labels)
        heats, states = heats_and_states(batch, policy, clocks)
        by_record = needs_record(batch)
        takes[rows] = ~batch.superseded & np.isin(states, _REACHABLE)
        heat[rows] = heats
        archived[rows] = states == ARCHIVED_CODE
        unjudged[rows[by_record]] = True
    for row in np.flatnonzero(unjudged).tolist():
        found = _reach(channel.records.get(memory_ids[row]), policy, clocks)
        takes[row] = found is not None
        heat[row] = 0.0 if found is None else found.heat
        archived[row] = found is not None and found.archived
    return Reached(takes=takes, heat=heat, archived=archived)


def _reach(record: MemoryRecord | None, policy: ChannelPolicy, clocks: Clocks) -> Reach | None:
    if record is None or record.superseded:
        return None  # settled history neither takes nor passes heat
    record = evolve(record, policy, clocks)
    if record.state == ARCHIVED:
        return Reach(current_heat(record, policy, clocks), archived=True)
    if record.state not in _LIVE:
        return None
    return Reach(current_heat(record, policy, clocks))
