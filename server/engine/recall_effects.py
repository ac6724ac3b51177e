"""What a recall does to a channel (DESIGN §3): bumps, resonance along the graph, channel heat.

Only relevant hits are heated (relevance before heat): see :func:`heated`.

Computed on copies, without writing: the engine persists the outcome in one batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from calor.server.engine.channel import Channel
from calor.server.recall.columns import (
    ACTIVE_CODE,
    ARCHIVED_CODE,
    COLD_CODE,
    heats_and_states,
    needs_record,
)
from calor.server.recall.index import ChannelIndex
from calor.server.recall.ranking import Hit, reaches
from calor.server.records import ACTIVE, ARCHIVED, COLD, MemoryRecord
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.graph import Reach, resonance
from calor.server.thermo.lifecycle import (
    Clocks,
    apply_gain,
    apply_recall,
    current_heat,
    evolve,
    refresh_utility,
)
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["RecallEffects", "heated", "recall_effects"]

_LIVE = frozenset({ACTIVE, COLD})
_REACHABLE = frozenset({ACTIVE_CODE, COLD_CODE, ARCHIVED_CODE})
_NEAR_CAP = 1.0 - 1e-4


@dataclass(frozen=True)
class RecallEffects:
    """The records a recall changed (recalled and resonating), and the channel's next state."""

    recalled: list[str]
    changed: dict[str, MemoryRecord]
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
    # Every memory resonance could reach, judged once and in bulk: many sources share
    # neighbours, and a recall's neighbourhood runs to hundreds of memories.
    around = channel.graph.within(recalled, policy.resonance_depth)
    reached = _reaches(channel, around, policy, clocks)
    for memory_id, gain in resonance(channel.graph, recalled, reached.get, policy).items():
        found = reached[memory_id]
        if found is not None and not found.archived and found.heat >= _NEAR_CAP:
            continue  # already at the cap: the gain would change nothing worth a write
        record = evolve(channel.records[memory_id].copy(), policy, clocks)
        apply_gain(record, policy, clocks, gain)
        changed[memory_id] = record
    state = replace(channel.state, interactions=clocks.interactions)
    state.recalled(policy, clocks.now)
    return RecallEffects(list(recalled), changed, state)


def _reaches(
    channel: Channel, memory_ids: Iterable[str], policy: ChannelPolicy, clocks: Clocks
) -> dict[str, Reach | None]:
    """What resonance needs of each memory (:func:`_reach`), read from the columns of the
    index that holds it; memories the columns do not cover are judged from their record."""
    reached: dict[str, Reach | None] = {}
    held: dict[ChannelIndex, tuple[list[str], list[int]]] = {
        channel.index: ([], []),
        channel.attic: ([], []),
    }
    for memory_id in memory_ids:
        for index, (ids, labels) in held.items():
            label = index.label(memory_id)
            if label is not None:
                ids.append(memory_id)
                labels.append(label)
                break
        else:
            reached[memory_id] = _reach(channel.records.get(memory_id), policy, clocks)
    for index, (ids, labels) in held.items():
        if not ids:
            continue
        batch = index.columns.batch(np.array(labels, dtype=np.int64))
        heats, states = heats_and_states(batch, policy, clocks)
        odd, superseded = needs_record(batch).tolist(), batch.superseded.tolist()
        for memory_id, heat, state, by_record, settled in zip(
            ids, heats.tolist(), states.tolist(), odd, superseded, strict=True
        ):
            if by_record:
                reached[memory_id] = _reach(channel.records.get(memory_id), policy, clocks)
            elif settled or state not in _REACHABLE:
                reached[memory_id] = None
            else:
                reached[memory_id] = Reach(heat, archived=state == ARCHIVED_CODE)
    return reached


def _reach(record: MemoryRecord | None, policy: ChannelPolicy, clocks: Clocks) -> Reach | None:
    if record is None or record.superseded:
        return None  # settled history neither takes nor passes heat
    record = evolve(record, policy, clocks)
    if record.state == ARCHIVED:
        return Reach(current_heat(record, policy, clocks), archived=True)
    if record.state not in _LIVE:
        return None
    return Reach(current_heat(record, policy, clocks))
