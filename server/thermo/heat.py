"""The thermodynamic formulas, pure: heat is computed from (heat0, t0, stability), never ticked.

    H(t) = max(floor, heat0 · 2^(−Δ / (half_life · stability)))

Extracted memories decay three times faster; keystones do not decay at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_PROFILES",
    "EXTRACTED_DECAY_FACTOR",
    "MEMORY_TYPES",
    "SOURCE_TRUST",
    "TypeProfile",
    "bumped",
    "effective_half_life",
    "heat_at",
    "seconds_until",
]

DAY = 86_400.0
EXTRACTED_DECAY_FACTOR = 3.0

MEMORY_TYPES = (
    "working",
    "episodic",
    "semantic",
    "procedural",
    "preference",
    "fact",
    "core",
    "codebase",
)

SOURCE_TRUST = {"human": 1.0, "agent": 0.7, "extracted": 0.7, "ingest": 0.5}


@dataclass(frozen=True)
class TypeProfile:
    """How one memory type decays: half-life in seconds, floor, and Stab+ per recall."""

    half_life_seconds: float
    floor: float
    stability_gain: float


DEFAULT_PROFILES: dict[str, TypeProfile] = {
    "working": TypeProfile(3600.0, 0.00, 1.0),
    "episodic": TypeProfile(1 * DAY, 0.01, 1.5),
    "semantic": TypeProfile(30 * DAY, 0.05, 2.0),
    "procedural": TypeProfile(180 * DAY, 0.05, 2.0),
    "preference": TypeProfile(90 * DAY, 0.10, 1.8),
    "fact": TypeProfile(365 * DAY, 0.15, 2.5),
    "core": TypeProfile(365 * DAY, 0.60, 2.5),
    "codebase": TypeProfile(180 * DAY, 0.05, 2.0),
}


def effective_half_life(profile: TypeProfile, stability: float, source: str) -> float:
    """The half-life a memory decays with: the profile's, stretched by stability.

    Extracted memories use a third of it: a model's reading is trusted less than a
    person's or the agent's own.
    """
    half_life = profile.half_life_seconds * stability
    if source == "extracted":
        half_life /= EXTRACTED_DECAY_FACTOR
    return half_life


def heat_at(heat0: float, elapsed: float, half_life: float, floor: float) -> float:
    """Heat after ``elapsed`` seconds (or interaction units) of decay from ``heat0``."""
    if elapsed <= 0.0 or half_life == math.inf:
        return max(floor, heat0)
    return max(floor, heat0 * math.exp2(-elapsed / half_life))


def seconds_until(level: float, heat0: float, half_life: float) -> float:
    """How long until decay from ``heat0`` reaches ``level``: the inverse of :func:`heat_at`.

    Returns 0 when the heat is already at or below the level and ``math.inf`` when it
    never gets there (a level at or below zero).
    """
    if heat0 <= level:
        return 0.0
    if level <= 0.0:
        return math.inf
    return half_life * math.log2(heat0 / level)


def bumped(heat: float, delta: float) -> float:
    """Heat after a recall or boost adds ``delta``, kept within [0, 1]."""
    return min(1.0, max(0.0, heat + delta))
