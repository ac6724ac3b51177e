"""A memory's heat and state at a moment, and what a recall, boost or pin does to them."""

from __future__ import annotations

from calor.server.heat import bumped, effective_half_life, heat_at
from calor.server.policy import ChannelPolicy
from calor.server.records import ACTIVE, COLD, MemoryRecord

__all__ = ["apply_boost", "apply_keystone", "apply_recall", "current_heat", "current_state"]


def current_heat(record: MemoryRecord, policy: ChannelPolicy, now: float) -> float:
    """The memory's heat at ``now``; a keystone's heat is frozen at its last value."""
    profile = policy.profile(record.memory_type)
    if record.keystone:
        return max(profile.floor, record.heat0)
    half_life = effective_half_life(profile, record.stability, record.source)
    return heat_at(record.heat0, now - record.t0, half_life, profile.floor)


def current_state(record: MemoryRecord, policy: ChannelPolicy, now: float) -> str:
    """The state to report: a live memory under the cold threshold reads COLD."""
    if record.state not in (ACTIVE, COLD):
        return record.state
    return COLD if current_heat(record, policy, now) < policy.cold_threshold else ACTIVE


def _materialise(record: MemoryRecord, policy: ChannelPolicy, now: float) -> float:
    heat = current_heat(record, policy, now)
    record.t0 = now
    record.updated_at = now
    return heat


def apply_recall(record: MemoryRecord, policy: ChannelPolicy, now: float) -> None:
    """A recall: materialise heat, add ``boost_delta``, multiply stability by Stab+."""
    heat = _materialise(record, policy, now)
    record.heat0 = bumped(heat, policy.boost_delta)
    record.stability *= policy.profile(record.memory_type).stability_gain
    record.recall_count += 1
    record.last_recalled_at = now


def apply_boost(record: MemoryRecord, policy: ChannelPolicy, now: float, delta: float) -> None:
    """A boost: materialise heat and add ``delta`` (negative cools), within [0, 1]."""
    heat = _materialise(record, policy, now)
    record.heat0 = bumped(heat, delta)


def apply_keystone(record: MemoryRecord, policy: ChannelPolicy, now: float, on: bool) -> None:
    """Pin (freeze heat at its current value) or unpin (decay resumes from now)."""
    record.heat0 = _materialise(record, policy, now)
    record.keystone = on
