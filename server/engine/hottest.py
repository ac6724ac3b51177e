"""A channel's hottest memories, and its profile (core memories, then the hottest of the
types that say who the user is): what a Context block shows beside what it found."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np

from calor.server.engine.cards import PROFILE_TYPES
from calor.server.engine.channel import Channel
from calor.server.recall.columns import (
    ACTIVE_CODE,
    COLD_CODE,
    TYPES,
    heats_and_states,
    needs_record,
    type_code,
)
from calor.server.records import ACTIVE, COLD, DELETED
from calor.server.thermo.lifecycle import Clocks, current_heat

__all__ = ["HOT_POOL", "PROFILE_POOL", "by_heat", "ranked", "ranked_all", "type_census"]

HOT_POOL = 50
"""Most of the hottest memories ranked."""
PROFILE_POOL = 400
"""Profile memories ranked: core ones, then the hottest."""

_LIVE = frozenset({ACTIVE, COLD})
_PROFILE_CODES = [type_code(name) for name in sorted(PROFILE_TYPES)]
_CORE_CODE = type_code("core")


def ranked(
    channel: Channel, clocks: Clocks, ids: Iterable[str], profile: bool = False
) -> list[str]:
    """The hottest live memories among ``ids`` (of the profile: core ones first), at most
    as many as a block considers."""
    policy, records = channel.policy, channel.records
    heat: dict[str, float] = {}
    for memory_id in ids:
        record = records.get(memory_id)
        if record is None or record.state not in _LIVE or memory_id in heat:
            continue
        if profile and record.memory_type not in PROFILE_TYPES:
            continue
        heat[memory_id] = current_heat(record, policy, clocks)
    if not profile:
        return heapq.nsmallest(HOT_POOL, heat, key=lambda i: (-heat[i], i))
    return heapq.nsmallest(
        PROFILE_POOL, heat, key=lambda i: (records[i].memory_type != "core", -heat[i], i)
    )


def ranked_all(channel: Channel, clocks: Clocks, profile: bool = False) -> list[str]:
    """:func:`ranked` over every live memory of the channel, from the live index's columns
    in bulk: only the memories that may make the list (and those the bulk formula does
    not cover) are ranked from their records."""
    ids, labels = channel.index.members()
    if not ids:
        return []
    batch = channel.index.columns.batch(labels)
    heats, _ = heats_and_states(batch, channel.policy, clocks)
    wanted = np.isin(batch.state, (ACTIVE_CODE, COLD_CODE))
    if profile:
        wanted &= np.isin(batch.memory_type, _PROFILE_CODES)
    odd = needs_record(batch)
    bulk = wanted & ~odd
    chosen = np.flatnonzero(wanted & odd)
    if profile:
        core = bulk & (batch.memory_type == _CORE_CODE)
        chosen = np.concatenate([chosen, np.flatnonzero(core)])
        bulk &= ~core
    pool = PROFILE_POOL if profile else HOT_POOL
    chosen = np.concatenate([chosen, _hottest(heats, bulk, pool)])
    return ranked(channel, clocks, (ids[i] for i in chosen.tolist()), profile)


def _indexed_heats(channel: Channel, clocks: Clocks) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The memories in the channel's indexes (live and attic: ACTIVE, COLD, ARCHIVED):
    their ids, heats now and type codes, in bulk from the columns (those the bulk
    formula does not cover from their records)."""
    ids: list[str] = []
    heats: list[np.ndarray] = [np.zeros(0)]
    types: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    for index in (channel.index, channel.attic):
        members, labels = index.members()
        if not members:
            continue
        batch = index.columns.batch(labels)
        found, _ = heats_and_states(batch, channel.policy, clocks)
        codes = batch.memory_type.astype(np.int64)
        for row in np.flatnonzero(needs_record(batch)).tolist():
            record = channel.evolved(channel.records[members[row]], clocks)
            found[row] = channel.heat(record, clocks)
            codes[row] = type_code(record.memory_type)
        ids += members
        heats.append(found)
        types.append(codes)
    return ids, np.concatenate(heats), np.concatenate(types)


def by_heat(channel: Channel, clocks: Clocks) -> list[str]:
    """Every memory of the channel (in any state), hottest first, ties by id: the
    indexed ones' heats in bulk, the others' from their records."""
    ids, heats, _ = _indexed_heats(channel, clocks)
    rest = _unindexed(channel, ids)
    others = np.array([channel.heat(channel.records[i], clocks) for i in rest], dtype=float)
    ids += rest
    order = np.lexsort((np.array(ids), -np.concatenate([heats, others])))
    return [ids[row] for row in order.tolist()]


def type_census(channel: Channel, clocks: Clocks) -> tuple[dict[str, int], dict[str, list[int]]]:
    """How many memories of each type the channel holds (forgotten ones aside), and for
    each type its memories in the indexes (ACTIVE, COLD, ARCHIVED) by tenth of heat:
    [0, 0.1), …, [0.9, 1]. The indexed ones are counted in bulk from their columns, only
    the others (ghosts, merged) from their records."""
    ids, heats, types = _indexed_heats(channel, clocks)
    tenths = np.minimum((heats * 10.0).astype(np.int64), 9)
    counts = np.zeros((len(TYPES), 10), dtype=np.int64)
    np.add.at(counts, (types, tenths), 1)
    by_tenth = {TYPES[code]: counts[code].tolist() for code in np.flatnonzero(counts.sum(axis=1))}
    by_type = {name: sum(tenths_of) for name, tenths_of in by_tenth.items()}
    for memory_id in _unindexed(channel, ids):
        record = channel.evolved(channel.records[memory_id], clocks)
        if record.state != DELETED:
            by_type[record.memory_type] = by_type.get(record.memory_type, 0) + 1
    return by_type, by_tenth


def _unindexed(channel: Channel, indexed: list[str]) -> list[str]:
    """The channel's memories outside its indexes (ghosts, merged, forgotten), by id."""
    held = set(indexed)
    return [memory_id for memory_id in channel.ids_after("") if memory_id not in held]


def _hottest(heats: np.ndarray, rows: np.ndarray, pool: int) -> np.ndarray:
    """The chosen rows whose heat reaches the ``pool``-th highest among them (ties kept,
    so the final order by heat, then id, is the full ranking's)."""
    candidates = np.flatnonzero(rows)
    if candidates.size <= pool:
        return candidates
    values = heats[candidates]
    least = np.partition(values, values.size - pool)[values.size - pool]
    chosen: np.ndarray = candidates[values >= least]
    return chosen
