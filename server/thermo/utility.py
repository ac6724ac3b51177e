"""A memory's utility in [0, 1]: its importance as the evidence of use accumulates (DESIGN §4)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import pairwise

from calor.server.thermo.heat import SOURCE_TRUST

__all__ = [
    "ACT_R_DECAY",
    "TYPE_BOOST",
    "UtilityWeights",
    "act_r_activation",
    "utility",
    "utility_factors",
]

HOUR = 3_600.0
DAY = 86_400.0

ACT_R_DECAY = 0.5
"""The decay exponent d of ACT-R base-level activation, ``ln Σ (now − t_j)^−d``."""

TYPE_BOOST: dict[str, float] = {
    "core": 1.0,
    "fact": 0.9,
    "procedural": 0.85,
    "semantic": 0.8,
    "codebase": 0.8,
    "preference": 0.75,
    "episodic": 0.4,
    "working": 0.1,
}
"""How much a memory's type alone says it is worth keeping: knowledge above events."""

_UNKNOWN_TYPE_BOOST = 0.5
_DEFAULT_TRUST = SOURCE_TRUST["agent"]  # the default source (DESIGN §3)
_FREQUENCY_SATURATION = 20  # recalls at which the log-scaled frequency term reaches 1
_RECENCY_HALF_LIFE = 7 * DAY
_REGULARITY_SPAN = DAY  # recalls spread over about this long count as steady use
_CONFIRMATION_SCALE = 2.0  # 1 − e^(−c/2): one confirmation ≈ 0.39, five ≈ 0.92
_MIN_AGE = 1.0  # seconds: a presentation "now" must not make activation infinite
# Logistic squash of activation: centred where one recall about 2.5 hours ago sits
# (ln 9000^−0.5 ≈ −4.55); one unit of activation is a factor e in Σ t^−0.5.
_ACTIVATION_CENTRE = -4.5
_ACTIVATION_SCALE = 1.0


@dataclass(frozen=True)
class UtilityWeights:
    """How much each piece of evidence counts toward utility.

    The defaults sum to 1.0. Other weights are normalised by their sum, so utility stays
    in [0, 1] whatever they are, provided none is negative and at least one is positive.
    """

    importance: float = 0.25
    frequency: float = 0.12
    recency: float = 0.12
    valence: float = 0.05
    regularity: float = 0.08
    type_boost: float = 0.10
    trust: float = 0.10
    confirmations: float = 0.08
    activation: float = 0.10

    def __post_init__(self) -> None:
        values = self._values()
        if any(not math.isfinite(v) or v < 0.0 for v in values) or sum(values) <= 0.0:
            raise ValueError(f"utility weights must be finite, non-negative, not all 0: {self}")

    def _values(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in fields(self)]

    @property
    def total(self) -> float:
        """The sum of the weights, by which the blend is normalised."""
        return math.fsum(self._values())


def _unit(value: float) -> float:
    """The value clamped into [0, 1]; NaN counts as 0."""
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))


def act_r_activation(times: Sequence[float], now: float) -> float:
    """ACT-R base-level activation ``ln Σ (now − t_j)^−0.5`` over presentation times.

    Each age is clamped to at least one second, so a presentation at (or after) ``now``
    adds 1 rather than infinity.

    Args:
        times: When the memory was presented (recalled), in epoch seconds.
        now: The moment the activation is read.

    Returns:
        The raw activation; ``-inf`` when there are no presentations.
    """
    total = math.fsum(max(now - t, _MIN_AGE) ** -ACT_R_DECAY for t in times)
    return math.log(total) if total > 0.0 else -math.inf


def _activation_score(activation: float) -> float:
    if activation == -math.inf:
        return 0.0
    exponent = -(activation - _ACTIVATION_CENTRE) / _ACTIVATION_SCALE
    return 1.0 / (1.0 + math.exp(min(exponent, 700.0)))


def _regularity(times: Sequence[float]) -> float:
    """Steady use scores near 1, a burst near 0; fewer than three recalls score 0.

    One minus the coefficient of variation of the intervals between recalls, scaled by
    how widely the recalls are spread (saturating over about a day), so that evenly
    spaced recalls seconds apart still count as one burst.
    """
    if len(times) < 3:
        return 0.0
    ordered = sorted(times)
    intervals = [later - earlier for earlier, later in pairwise(ordered)]
    mean = math.fsum(intervals) / len(intervals)
    if mean <= 0.0:
        return 0.0
    variance = math.fsum((i - mean) ** 2 for i in intervals) / len(intervals)
    steadiness = max(0.0, 1.0 - math.sqrt(variance) / mean)
    spread = 1.0 - math.exp2(-(ordered[-1] - ordered[0]) / _REGULARITY_SPAN)
    return steadiness * spread


def utility(
    *,
    importance: float,
    memory_type: str,
    source: str,
    valence: float,
    recall_times: Sequence[float],
    created_at: float,
    confirmations: int,
    now: float,
    weights: UtilityWeights = UtilityWeights(),
) -> float:
    """How much a memory is worth keeping at hand, in [0, 1].

    A weighted blend of its base importance, how often it is recalled (log scale), how
    recently it was last used, the magnitude of its emotional valence, how steadily it is
    recalled, its type, how far its source is trusted, how many independent
    near-duplicates confirmed it (saturating), and its ACT-R base-level activation
    (squashed by a logistic). ``hybrid`` decay stretches half-lives by ``1 + utility``.

    Args:
        importance: Base importance in [0, 1].
        memory_type: The memory type name (``fact``, ``episodic``, …).
        source: ``human``, ``agent``, ``extracted`` or ``ingest``.
        valence: Emotional valence in [-1, 1]; only its magnitude counts.
        recall_times: When the memory was recalled, epoch seconds.
        created_at: When the memory was created, epoch seconds; stands in for the last
            access and the one ACT-R presentation while it has no recalls.
        confirmations: Independent near-duplicates stored after it.
        now: The moment utility is evaluated, epoch seconds.
        weights: How much each piece of evidence counts.

    Returns:
        The utility, in [0, 1].
    """
    scores = utility_factors(
        importance=importance,
        memory_type=memory_type,
        source=source,
        valence=valence,
        recall_times=recall_times,
        created_at=created_at,
        confirmations=confirmations,
        now=now,
    )
    blended = math.fsum(getattr(weights, name) * score for name, score in scores.items())
    return _unit(blended / weights.total)


def utility_factors(
    *,
    importance: float,
    memory_type: str,
    source: str,
    valence: float,
    recall_times: Sequence[float],
    created_at: float,
    confirmations: int,
    now: float,
) -> dict[str, float]:
    """Each piece of evidence :func:`utility` blends, scored in [0, 1], by the name of
    its weight in :class:`UtilityWeights` (the arguments are :func:`utility`'s)."""
    presentations = list(recall_times) or [created_at]
    last_access = max(presentations)
    recalls = len(recall_times)
    return {
        "importance": _unit(importance),
        "frequency": _unit(math.log1p(recalls) / math.log1p(_FREQUENCY_SATURATION)),
        "recency": _unit(math.exp2(-max(now - last_access, 0.0) / _RECENCY_HALF_LIFE)),
        "valence": _unit(abs(valence)),
        "regularity": _regularity(recall_times),
        "type_boost": TYPE_BOOST.get(memory_type, _UNKNOWN_TYPE_BOOST),
        "trust": SOURCE_TRUST.get(source, _DEFAULT_TRUST),
        "confirmations": _unit(1.0 - math.exp(-max(confirmations, 0) / _CONFIRMATION_SCALE)),
        "activation": _activation_score(act_r_activation(presentations, now)),
    }
