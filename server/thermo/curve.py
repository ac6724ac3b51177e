"""A memory's heat curve on the wall clock: its past as its history records it, and its
future under the channel's settings now if nothing touches it, with the moments the
formulas solve (floor, cold threshold, cold storage)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from calor.server.records import MemoryRecord
from calor.server.thermo.history import Piece, Step, heats_at, past_points, steps
from calor.server.thermo.lifecycle import (
    Clocks,
    crossing_at,
    current_heat,
    floor_at,
    history_of,
    migrate_at,
    piece_of,
)
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["HeatCurve", "SPARKLINE_POINTS", "SPARKLINE_STEP", "heat_curve", "sparkline"]

SPARKLINE_POINTS = 29
"""Moments a sparkline samples: every :data:`SPARKLINE_STEP` from a week before now to
a week after."""
SPARKLINE_STEP = 12 * 3600.0
_PROJECTED_SAMPLES = 64
_MARGIN = 1.15  # the projection runs this far past its last moment, so the moment shows
_SHORTEST = 3600.0
_LONGEST = 5 * 365 * 86_400.0
_HALF_LIVES_SHOWN = 4.0


@dataclass(frozen=True)
class HeatCurve:
    """Heat over time: ``past`` and ``projected`` as ``(epoch seconds, heat)`` points
    (meeting at ``now``), the jumps of the past, the floor and cold threshold, and when
    heat reaches its floor, falls below the threshold and moves to cold storage (each
    ``None`` when it never does; in the past when it already did)."""

    past: list[tuple[float, float]]
    projected: list[tuple[float, float]]
    steps: list[Step]
    floor: float
    cold_threshold: float
    floor_at: float | None
    cold_at: float | None
    migration_at: float | None
    now: float


def sparkline(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> list[float]:
    """A memory's heat at :data:`SPARKLINE_POINTS` moments around ``clocks.now`` (the
    middle one), past and projected as :func:`heat_curve` draws them; ``nan`` before
    its kept history begins."""
    middle = SPARKLINE_POINTS // 2
    times = [clocks.now + (k - middle) * SPARKLINE_STEP for k in range(SPARKLINE_POINTS)]
    piece = _piece_now(record, policy, clocks)
    return heats_at(history_of(record, policy), piece, times, policy.decay_curve)


def _piece_now(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> Piece:
    """The record's piece on the wall clock; flat at its heat now where decay runs on
    interactions."""
    piece = piece_of(record, policy)
    if policy.decay_mode != "interaction":
        return piece
    return Piece(piece.start, current_heat(record, policy, clocks), math.inf, piece.floor)


def heat_curve(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> HeatCurve:
    """The curve of a memory as it stands at ``clocks`` (its record evolved to then).

    In a channel whose decay runs on interactions, not the clock, each piece is drawn
    flat at its heat and no moment is solved; in ``hybrid`` decay the clock alone is
    assumed to run on.
    """
    curve, now = policy.decay_curve, clocks.now
    piece = _piece_now(record, policy, clocks)
    moments: dict[str, float | None] = {"floor": None, "cold": None, "migration": None}
    flat = policy.decay_mode == "interaction"
    if not flat:
        moments["cold"] = crossing_at(record, policy, policy.cold_threshold)
        if piece.floor > 0.0:
            moments["floor"] = _finite(floor_at(record, policy))
        moments["migration"] = _finite(migrate_at(record, policy))
    history = history_of(record, policy)
    return HeatCurve(
        past=past_points(history, piece, now, curve, flat),
        projected=_projected(piece, now, curve, moments.values()),
        steps=steps(history, piece, curve),
        floor=piece.floor,
        cold_threshold=policy.cold_threshold,
        floor_at=moments["floor"],
        cold_at=moments["cold"],
        migration_at=moments["migration"],
        now=now,
    )


def _finite(moment: float) -> float | None:
    return moment if math.isfinite(moment) else None


def _projected(
    piece: Piece, now: float, curve: str, moments: Iterable[float | None]
) -> list[tuple[float, float]]:
    ahead = [moment for moment in moments if moment is not None and moment > now]
    if ahead:
        span = (max(ahead) - now) * _MARGIN
    elif math.isinf(piece.half_life):
        span = _SHORTEST * 24
    else:
        span = piece.half_life * _HALF_LIVES_SHOWN
    span = min(_LONGEST, max(_SHORTEST, span))
    times = [now + span * k / _PROJECTED_SAMPLES for k in range(_PROJECTED_SAMPLES + 1)]
    times = sorted({*times, *ahead})
    return [(at, piece.heat_at(at, curve)) for at in times]
