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

import numpy as np
import numpy.typing as npt

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
from calor.server.thermo.graph import Slots
from calor.server.thermo.lifecycle import (
    Clocks,
    apply_gain,
    apply_recall,
    current_heat,
    evolve,
    refresh_utility,
)
from calor.server.thermo.policy import ChannelPolicy
from calor.server.thermo.resonance import Reach, Reached, spread

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
    judge = _Judge(channel, policy, clocks)
    slots, gains = spread(channel.graph, recalled, judge, policy)
    warmed, simple = judge.warmed(slots, gains)
    others = np.flatnonzero(~simple)
    ids = channel.graph.ids_at(slots[others])
    for memory_id, gain in zip(ids, gains[others].tolist(), strict=True):
        record = evolve(channel.records[memory_id].copy(), policy, clocks)
        if record.state != ARCHIVED and current_heat(record, policy, clocks) >= _NEAR_CAP:
            continue  # already at the cap: the gain would change nothing worth a write
        apply_gain(record, policy, clocks, gain)
        changed[memory_id] = record
    state = replace(channel.state, interactions=clocks.interactions)
    state.recalled(policy, clocks.now)
    return RecallEffects(list(recalled), changed, warmed, state)


class _Judge:
    """What resonance needs of each memory it reaches, read in bulk from the columns of
    the index that holds it (found by graph slot, :meth:`Channel.places`); a memory the
    columns do not cover is judged from its record. Keeps what the columns said, so the
    memories resonance only warms are settled without a second look (:meth:`warmed`)."""

    def __init__(self, channel: Channel, policy: ChannelPolicy, clocks: Clocks) -> None:
        self._channel = channel
        self._policy = policy
        self._clocks = clocks
        self._seen: list[tuple[Slots, npt.NDArray[np.float64], npt.NDArray[np.bool_]]] = []

    def __call__(self, slots: Slots) -> Reached:
        channel, policy, clocks = self._channel, self._policy, self._clocks
        count = len(slots)
        takes = np.zeros(count, dtype=bool)
        heat = np.zeros(count)
        archived = np.zeros(count, dtype=bool)
        by_record = np.ones(count, dtype=bool)
        simple = np.zeros(count, dtype=bool)
        places = channel.places(slots)
        for in_attic, index in ((0, channel.index), (1, channel.attic)):
            rows = np.flatnonzero((places >= 0) & ((places & 1) == in_attic))
            if not rows.size:
                continue
            batch = index.columns.batch(places[rows] >> 1)
            heats, states = heats_and_states(batch, policy, clocks)
            odd = needs_record(batch)
            takes[rows] = ~batch.superseded & np.isin(states, _REACHABLE)
            heat[rows] = heats
            archived[rows] = states == ARCHIVED_CODE
            by_record[rows] = odd
            if not in_attic:  # ACTIVE and staying so: the bulk formula covers its gain
                live = (batch.state == ACTIVE_CODE) & (states == ACTIVE_CODE)
                simple[rows] = live & ~odd & ~batch.superseded
        rows = np.flatnonzero(by_record)
        for row, memory_id in zip(rows.tolist(), channel.graph.ids_at(slots[rows]), strict=True):
            found = _reach(channel.records.get(memory_id), policy, clocks)
            takes[row] = found is not None
            heat[row] = 0.0 if found is None else found.heat
            archived[row] = found is not None and found.archived
        self._seen.append((slots, heat, simple))
        return Reached(takes=takes, heat=heat, archived=archived)

    def warmed(
        self, slots: Slots, gains: npt.NDArray[np.float64]
    ) -> tuple[dict[str, float], npt.NDArray[np.bool_]]:
        """Of the memories resonance reaches (every one judged here), those it only
        warms: ACTIVE, staying ACTIVE, covered by the bulk formula. Returns their heat
        after the gain by id (none at the cap already: a gain would change nothing
        worth a write), and which of ``slots`` are settled so."""
        if not slots.size:
            return {}, np.zeros(0, dtype=bool)
        judged = np.concatenate([seen for seen, _, _ in self._seen])
        order = np.argsort(judged)
        rows = order[np.searchsorted(judged, slots, sorter=order)]
        heats = np.concatenate([heat for _, heat, _ in self._seen])[rows]
        simple = np.concatenate([flags for _, _, flags in self._seen])[rows]
        warm = simple & (heats < _NEAR_CAP)
        after = np.clip(heats[warm] + gains[warm], 0.0, 1.0)
        ids = self._channel.graph.ids_at(slots[warm])
        return dict(zip(ids, after.tolist(), strict=True)), simple


def _reach(record: MemoryRecord | None, policy: ChannelPolicy, clocks: Clocks) -> Reach | None:
    if record is None or record.superseded:
        return None  # settled history neither takes nor passes heat
    record = evolve(record, policy, clocks)
    if record.state == ARCHIVED:
        return Reach(current_heat(record, policy, clocks), archived=True)
    if record.state not in _LIVE:
        return None
    return Reach(current_heat(record, policy, clocks))
