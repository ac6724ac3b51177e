"""The thermodynamic formulas, pure: heat is computed from (heat0, t0, stability), never ticked.

    H(t) = max(floor, heat0 · 2^(−Δ / (half_life · stability)))

Extracted memories decay three times faster; keystones do not decay at all.

That is the ``exponential`` retention curve, the default. With ``x = Δ / half_life`` (the
half-lives elapsed, stability and the rest folded into the half-life), a channel may
choose instead:

- ``huber``: ``H = heat0 · 2^(−ρ(x))`` where ``ρ(x) = x`` up to the knee (``HUBER_KNEE``
  half-lives) and ``2·√(knee·x) − knee`` past it: the Huber function of ``√(2x)``,
  quadratic (exponential decay) near-term and linear (in ``√x``) for old memories, so
  after the knee a memory fades ever more slowly and a long quiet spell does not erase
  it. ρ and its slope are continuous at the knee.
- ``elastic``: heat fades at a rate that depends on how strongly it is held,
  ``dH/dΔ = −(ln 2 / half_life) · H · (pivot / H)^γ`` (``ELASTIC_PIVOT``,
  ``ELASTICITY``): above the pivot slower than exponential, below it faster, so
  ``H^γ = heat0^γ − γ · ln 2 · pivot^γ · x`` until it reaches 0.

Each curve is monotone in ``x`` and inverted in closed form
(:func:`half_lives_until`), so floor, threshold and migration moments are solved, never
searched for; floors apply to every curve alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "DECAY_CURVES",
    "DEFAULT_PROFILES",
    "ELASTICITY",
    "ELASTIC_PIVOT",
    "EXTRACTED_DECAY_FACTOR",
    "HUBER_KNEE",
    "MEMORY_TYPES",
    "SOURCE_TRUST",
    "TypeProfile",
    "bumped",
    "decayed",
    "decayed_array",
    "effective_half_life",
    "half_lives_until",
    "half_lives_until_array",
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

DECAY_CURVES = ("exponential", "huber", "elastic")
"""The retention curves a channel may choose (see the module docstring)."""
HUBER_KNEE = 1.0
"""Half-lives after which a ``huber`` curve's decay slows from exponential."""
ELASTICITY = 0.5
"""γ of the ``elastic`` curve: how much a memory's own heat changes its rate of decay."""
ELASTIC_PIVOT = 0.5
"""The heat at which an ``elastic`` curve decays exactly as fast as ``exponential``."""
_LN2 = math.log(2.0)
_ELASTIC_RATE = ELASTICITY * _LN2 * math.pow(ELASTIC_PIVOT, ELASTICITY)  # H^γ lost per half-life


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


def heat_at(
    heat0: float, elapsed: float, half_life: float, floor: float, curve: str = "exponential"
) -> float:
    """Heat after ``elapsed`` seconds (or interaction units) of decay from ``heat0``."""
    if elapsed <= 0.0 or half_life == math.inf:
        return max(floor, heat0)
    return max(floor, decayed(heat0, elapsed / half_life, curve))


def decayed(heat0: float, half_lives: float, curve: str = "exponential") -> float:
    """Heat ``half_lives`` (> 0) after ``heat0`` on a retention curve, before any floor."""
    if curve == "exponential":
        return heat0 * math.exp2(-half_lives)
    if curve == "huber":
        return heat0 * math.exp2(-_huber(half_lives))
    if curve == "elastic":
        held = math.pow(heat0, ELASTICITY) - _ELASTIC_RATE * half_lives
        return math.pow(held, 1.0 / ELASTICITY) if held > 0.0 else 0.0
    raise ValueError(f"unknown decay curve {curve!r}")


def _huber(half_lives: float) -> float:
    if half_lives <= HUBER_KNEE:
        return half_lives
    return 2.0 * math.sqrt(HUBER_KNEE * half_lives) - HUBER_KNEE


def decayed_array(
    heat0: npt.NDArray[np.float64], half_lives: npt.NDArray[np.float64], curve: str
) -> npt.NDArray[np.float64]:
    """:func:`decayed` of many memories at once (``half_lives`` ≥ 0, element-wise)."""
    if curve == "exponential":
        return heat0 * np.exp2(-half_lives)
    if curve == "huber":
        past = np.sqrt(HUBER_KNEE * np.maximum(half_lives, HUBER_KNEE))
        exponent = np.where(half_lives <= HUBER_KNEE, half_lives, 2.0 * past - HUBER_KNEE)
        return heat0 * np.exp2(-exponent)
    if curve == "elastic":
        held = np.maximum(np.power(heat0, ELASTICITY) - _ELASTIC_RATE * half_lives, 0.0)
        return np.asarray(np.power(held, 1.0 / ELASTICITY), dtype=np.float64)
    raise ValueError(f"unknown decay curve {curve!r}")


def half_lives_until(level: float, heat0: float, curve: str = "exponential") -> float:
    """How many half-lives until decay from ``heat0`` reaches ``level``: the inverse of
    :func:`decayed`. 0 when the heat is already at or below the level; ``math.inf`` when
    it never gets there (a level at or below zero, except on ``elastic``, which reaches 0)."""
    if heat0 <= level:
        return 0.0
    if curve == "elastic":
        strength = math.pow(heat0, ELASTICITY) - math.pow(max(level, 0.0), ELASTICITY)
        return strength / _ELASTIC_RATE
    if level <= 0.0:
        return math.inf
    exponent = math.log2(heat0 / level)
    if curve == "exponential":
        return exponent
    if curve == "huber":
        if exponent <= HUBER_KNEE:
            return exponent
        return (exponent + HUBER_KNEE) ** 2 / (4.0 * HUBER_KNEE)
    raise ValueError(f"unknown decay curve {curve!r}")


def half_lives_until_array(
    level: npt.NDArray[np.float64], heat0: npt.NDArray[np.float64], curve: str
) -> npt.NDArray[np.float64]:
    """:func:`half_lives_until` of many memories at once, for levels above zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if curve == "elastic":
            until = (heat0**ELASTICITY - level**ELASTICITY) / _ELASTIC_RATE
        else:
            exponent = np.log2(heat0 / level)
            if curve == "exponential":
                until = exponent
            elif curve == "huber":
                slow = (exponent + HUBER_KNEE) ** 2 / (4.0 * HUBER_KNEE)
                until = np.where(exponent <= HUBER_KNEE, exponent, slow)
            else:
                raise ValueError(f"unknown decay curve {curve!r}")
    return np.where(heat0 <= level, 0.0, until)


def seconds_until(
    level: float, heat0: float, half_life: float, curve: str = "exponential"
) -> float:
    """How long until decay from ``heat0`` reaches ``level``: the inverse of :func:`heat_at`.

    Returns 0 when the heat is already at or below the level and ``math.inf`` when it
    never gets there (see :func:`half_lives_until`).
    """
    half_lives = half_lives_until(level, heat0, curve)
    return 0.0 if half_lives == 0.0 else half_life * half_lives


def bumped(heat: float, delta: float) -> float:
    """Heat after a recall or boost adds ``delta``, kept within [0, 1]."""
    return min(1.0, max(0.0, heat + delta))
