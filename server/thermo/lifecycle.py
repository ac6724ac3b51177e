"""A memory's heat and state at a moment, and what recalls, boosts and pins do to them.

Nothing here ticks: heat, the COLD/ARCHIVED/GHOST states and working-memory promotion
are all functions of the stored record, the channel's policy, the clock and the
channel's interaction count, so a read is O(1) and an idle server does no work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from calor.server.records import ACTIVE, ARCHIVED, COLD, GHOST, MemoryRecord
from calor.server.thermo.heat import bumped, effective_half_life, heat_at, seconds_until
from calor.server.thermo.history import Piece, entries_with, since_store
from calor.server.thermo.policy import ChannelPolicy
from calor.server.thermo.utility import utility, utility_factors

__all__ = [
    "Clocks",
    "crossing_at",
    "apply_boost",
    "apply_cooling",
    "apply_gain",
    "apply_keystone",
    "apply_recall",
    "current_heat",
    "current_state",
    "evolve",
    "floor_at",
    "floor_of",
    "history_of",
    "migrate_at",
    "migrates",
    "next_change_at",
    "piece_of",
    "refresh_utility",
    "utility_evidence",
]

DAY = 86_400.0
_LIVE = (ACTIVE, COLD)


@dataclass(frozen=True)
class Clocks:
    """The two clocks decay can run on: wall time and the channel's interaction count."""

    now: float
    interactions: int = 0


def _elapsed_and_half_life(
    record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks
) -> tuple[float, float]:
    profile = policy.profile(record.memory_type)
    half_life = effective_half_life(profile, record.stability, record.source)
    by_time = clocks.now - record.t0
    if policy.decay_mode == "time":
        return by_time, half_life
    by_interactions = (clocks.interactions - record.interactions0) * policy.interaction_unit_seconds
    if policy.decay_mode == "interaction":
        return by_interactions, half_life
    return max(by_time, by_interactions), half_life * (1.0 + record.utility)


def floor_of(record: MemoryRecord, policy: ChannelPolicy) -> float:
    """The heat a memory does not decay below: its type's floor, but for settled history
    (superseded or deprecated) at most half the cold threshold, so that it reads COLD
    whatever its type and never outranks its successor by a floor alone."""
    floor = policy.profile(record.memory_type).floor
    return min(floor, policy.cold_threshold * 0.5) if record.superseded else floor


def current_heat(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> float:
    """The memory's heat now; a keystone's heat is frozen at its last value."""
    floor = floor_of(record, policy)
    if record.keystone:
        return max(floor, record.heat0)
    elapsed, half_life = _elapsed_and_half_life(record, policy, clocks)
    return heat_at(record.heat0, elapsed, half_life, floor, policy.decay_curve)


def migrates(record: MemoryRecord, policy: ChannelPolicy) -> bool:
    """Whether the memory can move to cold storage by sitting at its floor.

    Only types whose floor lies below the cold threshold do; ``core`` and keystones
    never do, and floor-0 types become GHOSTs instead.
    """
    floor = floor_of(record, policy)
    return (
        not record.keystone and record.memory_type != "core" and 0.0 < floor < policy.cold_threshold
    )


def migrate_at(record: MemoryRecord, policy: ChannelPolicy) -> float:
    """When the memory moves to cold storage: its floor moment plus the migration days.

    The floor moment is solved from the formula on the wall clock (in interaction
    mode that is a bound, not the exact moment). ``math.inf`` when it never migrates.
    """
    if not migrates(record, policy):
        return math.inf
    return floor_at(record, policy) + policy.cold_migration_days * DAY


def floor_at(record: MemoryRecord, policy: ChannelPolicy) -> float:
    """When the memory's heat reaches its floor if nothing touches it, solved on the wall
    clock: its last materialisation when it was already there, ``math.inf`` when it
    never gets there (a keystone, a floor of 0 on a curve that only nears it)."""
    piece = piece_of(record, policy)
    return piece.start + seconds_until(piece.floor, piece.heat, piece.half_life, policy.decay_curve)


def piece_of(record: MemoryRecord, policy: ChannelPolicy) -> Piece:
    """The piece of heat the memory decays along now on the wall clock: from ``heat0`` at
    ``t0`` with its half-life (stretched by utility in ``hybrid`` decay; ``math.inf`` for
    a keystone) down to its floor."""
    if record.keystone:
        half_life = math.inf
    else:
        profile = policy.profile(record.memory_type)
        half_life = effective_half_life(profile, record.stability, record.source)
        if policy.decay_mode == "hybrid":
            half_life *= 1.0 + record.utility
    return Piece(record.t0, record.heat0, half_life, floor_of(record, policy))


def _promoted(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> MemoryRecord:
    """Working memory becomes episodic after ``working_promotion_seconds``.

    Its heat at the moment of promotion carries over; from then it decays as episodic.
    """
    if record.memory_type != "working" or record.keystone:
        return record
    due = record.created_at + policy.working_promotion_seconds
    if clocks.now < due:
        return record
    at_due = Clocks(now=max(due, record.t0), interactions=clocks.interactions)
    heat = current_heat(record, policy, at_due)
    if heat < policy.survival_gate:
        return record  # already a ghost: nothing to promote
    return replace(
        record, memory_type="episodic", heat0=heat, t0=at_due.now, interactions0=clocks.interactions
    )


def evolve(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> MemoryRecord:
    """The record as it stands at ``clocks``: promotion and state transitions applied.

    Returns the same object when nothing changed, else a changed copy (the caller
    decides whether to persist it). States other than ACTIVE/COLD are sticky.
    """
    if record.state not in _LIVE:
        return record
    evolved = _promoted(record, policy, clocks)
    heat = current_heat(evolved, policy, clocks)
    floor = floor_of(evolved, policy)
    if floor == 0.0 and not evolved.keystone and heat < policy.survival_gate:
        state = GHOST
    elif clocks.now >= migrate_at(evolved, policy):
        state = ARCHIVED
    else:
        state = COLD if heat < policy.cold_threshold else ACTIVE
    if state == evolved.state:
        return evolved
    changed_at = max(record.updated_at, _transition_at(evolved, state, policy, clocks))
    if evolved is record:
        return replace(record, state=state, updated_at=changed_at)
    evolved.state, evolved.updated_at = state, changed_at
    return evolved


def _transition_at(
    record: MemoryRecord, state: str, policy: ChannelPolicy, clocks: Clocks
) -> float:
    """When a record that decays untouched reached ``state``: the solved moment on the wall
    clock (so every read of it, persisted or not, says the same), else now."""
    if state == ARCHIVED:
        moment: float | None = migrate_at(record, policy)
    elif state == COLD:
        moment = crossing_at(record, policy, policy.cold_threshold)
    elif state == GHOST:
        moment = crossing_at(record, policy, policy.survival_gate)
    else:
        moment = None  # back to ACTIVE: a setting changed under it
    if moment is None or not math.isfinite(moment):
        return clocks.now
    return min(moment, clocks.now)


def current_state(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> str:
    """The state to report now."""
    return evolve(record, policy, clocks).state


def _materialise(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> float:
    heat = current_heat(record, policy, clocks)
    record.t0 = clocks.now
    record.interactions0 = clocks.interactions
    record.updated_at = clocks.now
    return heat


def history_of(record: MemoryRecord, policy: ChannelPolicy) -> list[list[Any]]:
    """The record's heat history (see ``thermo/history.py``), from its store (heat 1 at
    ``created_at``, decaying as its type does at stability 1) when it holds no jump yet;
    a change made before histories were kept is entered as of unknown cause."""
    history = record.heat_history
    if history or record.t0 <= record.created_at:
        return history or []
    stored = replace(record, heat0=1.0, t0=record.created_at, stability=1.0, keystone=False)
    return since_store(
        piece_of(stored, policy), piece_of(record, policy), policy.decay_curve, history is None
    )


_Before = tuple[list[list[Any]], Piece]


def _before_change(record: MemoryRecord, policy: ChannelPolicy) -> _Before:
    """What a change needs to enter itself in the record's heat history: the history so
    far and the piece of heat the change ends."""
    return history_of(record, policy), piece_of(record, policy)


def _marked(
    record: MemoryRecord, policy: ChannelPolicy, before: _Before, heat: float, cause: str
) -> None:
    """Enter the change just made (at heat ``heat``) in the record's heat history."""
    history, ended = before
    after = piece_of(record, policy)
    record.heat_history = entries_with(history, ended, after, heat, cause, policy.decay_curve)


def apply_recall(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> None:
    """A recall: materialise heat, add ``boost_delta``, multiply stability by Stab+.

    A working memory recalled ``working_promotion_recalls`` times becomes episodic; a
    memory recalled out of cold storage returns to ACTIVE.
    """
    before = _before_change(record, policy)
    heat = _materialise(record, policy, clocks)
    record.heat0 = bumped(heat, policy.boost_delta)
    record.stability *= policy.profile(record.memory_type).stability_gain
    record.recall_count += 1
    record.last_recalled_at = clocks.now
    record.recall_times = [*record.recall_times[-31:], clocks.now]
    if record.memory_type == "working" and record.recall_count >= policy.working_promotion_recalls:
        record.memory_type = "episodic"
    record.state = ACTIVE
    _marked(record, policy, before, heat, "recall")


def apply_boost(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks, delta: float) -> None:
    """A boost: materialise heat and add ``delta`` (negative cools), within [0, 1]."""
    before = _before_change(record, policy)
    heat = _materialise(record, policy, clocks)
    record.heat0 = bumped(heat, delta)
    _marked(record, policy, before, heat, "boost")


def apply_cooling(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> None:
    """Superseded: materialise heat and lower it to half the cold threshold at most, so
    the memory reads COLD (settled history's floor is no higher: see :func:`floor_of`)."""
    before = _before_change(record, policy)
    heat = _materialise(record, policy, clocks)
    record.heat0 = min(heat, policy.cold_threshold * 0.5)
    _marked(record, policy, before, heat, "settled")


def apply_gain(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks, gain: float) -> None:
    """Resonance: materialise heat and add a neighbour's share, capped at 1.0.

    A memory in cold storage that resonance reaches returns to ACTIVE.
    """
    before = _before_change(record, policy)
    heat = _materialise(record, policy, clocks)
    record.heat0 = bumped(heat, gain)
    record.state = ACTIVE
    _marked(record, policy, before, heat, "resonance")


def refresh_utility(record: MemoryRecord, now: float) -> None:
    """Recompute a memory's utility from the evidence it has gathered so far."""
    record.utility = utility(**_evidence(record, now))


def utility_evidence(record: MemoryRecord, now: float) -> dict[str, float]:
    """Each factor of a memory's utility as of ``now``, scored in [0, 1], by the name of
    its weight in :class:`~calor.server.thermo.utility.UtilityWeights`."""
    return utility_factors(**_evidence(record, now))


def _evidence(record: MemoryRecord, now: float) -> dict[str, Any]:
    return {
        "importance": record.importance,
        "memory_type": record.memory_type,
        "source": record.source,
        "valence": record.valence,
        "recall_times": record.recall_times,
        "created_at": record.created_at,
        "confirmations": record.confirmations,
        "now": now,
    }


def apply_keystone(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks, on: bool) -> None:
    """Pin (freeze heat at its current value) or unpin (decay resumes from now)."""
    record.heat0 = _materialise(record, policy, clocks)
    record.keystone = on


def next_change_at(record: MemoryRecord, policy: ChannelPolicy) -> float:
    """The next moment the record's state or type changes by itself, if nothing touches it.

    The earliest of: turning COLD, working-memory promotion, becoming a ghost, moving
    to cold storage. ``math.inf`` when none is ahead.
    """
    if record.state not in _LIVE or record.keystone:
        return math.inf
    moments = [migrate_at(record, policy)]
    profile = policy.profile(record.memory_type)
    floor = floor_of(record, policy)
    if record.state == ACTIVE and floor < policy.cold_threshold:
        half_life = effective_half_life(profile, record.stability, record.source)
        cold = seconds_until(policy.cold_threshold, record.heat0, half_life, policy.decay_curve)
        moments.append(record.t0 + cold)
    if record.memory_type == "working":
        moments.append(record.created_at + policy.working_promotion_seconds)
    if floor == 0.0:
        half_life = effective_half_life(profile, record.stability, record.source)
        gate = seconds_until(policy.survival_gate, record.heat0, half_life, policy.decay_curve)
        moments.append(record.t0 + gate)
    return min(moments)


def crossing_at(record: MemoryRecord, policy: ChannelPolicy, level: float) -> float | None:
    """When the memory's heat falls below ``level`` if nothing touches it.

    ``None`` when it never will on the wall clock: a keystone, a floor at or above the
    level, heat already at or below it, or a channel whose decay runs on interactions.
    """
    if record.keystone or floor_of(record, policy) >= level or record.state not in _LIVE:
        return None
    if record.heat0 <= level or policy.decay_mode == "interaction":
        return None
    piece = piece_of(record, policy)
    return piece.start + seconds_until(level, piece.heat, piece.half_life, policy.decay_curve)
