"""Fitting a channel's recall weights to its feedback: a coarse coordinate search, judged
on feedback held back from the fit.

Each logged recall with feedback says which of its hits should rank above which: the
memories a helpful (or partial) rating names above the hits it leaves out, the hits
it leaves out above those an unhelpful rating names. A recall rated as a whole says
nothing about order, so it counts toward the recalls with feedback but not toward
agreement. *Agreement* is the share of such ordered pairs that a set of weights ranks
the right way round (a tie counts half), averaged over recalls.

The fit re-ranks the logged hits from their logged signals with candidate weights.
Scaling every weight alike (lexical is a share of similarity's) does not change the
ranking, so the similarity weight stays as it is and the others move relative to it,
one at a time over a fixed grid (:data:`GRID`), for a few rounds. A weight moves only
when some grid value agrees strictly better with the fitted feedback; it then takes the
middle of the values that agree best, rather than the one that just tips the ranking.
Every fourth recall (by id order) is held back, and the fit is worth applying only if
it agrees better with those than the weights in force.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from calor.server.engine.feedback import FeedbackEntry
from calor.server.engine.recall_log import RecallEntry
from calor.server.thermo.policy import RecallWeights

__all__ = [
    "FITTED",
    "GRID",
    "HOLD_BACK_EVERY",
    "MIN_RECALLS",
    "Rated",
    "TuneReport",
    "agreement",
    "fit",
    "rated",
]

MIN_RECALLS = 20
"""Recalls with feedback a channel needs before its weights are fitted."""
HOLD_BACK_EVERY = 4
"""Every this-many-th recall with feedback (by id order) is held back to judge the fit."""
FITTED = ("heat", "keyword", "lexical", "source", "temporal", "own_channel")
"""The weights the fit moves, in the order it tries them; similarity is the scale."""
GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.5, 2.0)
"""The values a weight may take in the fit (temporal at most 1, as its setting)."""
_CAPS = {"temporal": 1.0}
_TIE = 1e-12  # score differences this small are ties
_ROUNDS = 4
_GAIN = {"helpful": 1.0, "partial": 0.5, "unhelpful": 0.0}
# A hit that a rating does not name, by the rating: not what helped, or not what misled.
_UNNAMED_GAIN = {"helpful": 0.0, "partial": 0.0, "unhelpful": 0.5}
_SIGNALS = ("similarity", "lexical", "keyword", "heat", "temporal", "source", "own")
# What each weight rewards, for the explanation.
_WHAT = {
    "heat": "heat",
    "keyword": "share of the query's words",
    "lexical": "word match (BM25)",
    "source": "source trust",
    "temporal": "closeness to the time the query named",
    "own_channel": "being in the channel's own memories",
}


@dataclass(frozen=True)
class Rated:
    """One recall with feedback, as the fit sees it.

    Attributes:
        recall_id: The recall.
        diffs: One row per pair of hits the feedback orders: the better hit's signals
            minus the worse one's (similarity, lexical, keyword, heat, temporal,
            source, own), before weighting. No rows for a recall rated as a whole.
    """

    recall_id: str
    diffs: np.ndarray


def rated(recall: RecallEntry, feedback: FeedbackEntry) -> Rated:
    """A logged recall and the feedback on it, as the pairs of hits the feedback orders."""
    named = set(feedback.memory_ids)
    gains = np.array(
        [
            _GAIN[feedback.rating]
            if not named or hit.memory_id in named
            else _UNNAMED_GAIN[feedback.rating]
            for hit in recall.hits
        ]
    )
    signals = np.array(
        [
            [hit.similarity, hit.lexical, hit.keyword, hit.heat, hit.temporal, hit.source]
            + [1.0 if hit.own else 0.0]
            for hit in recall.hits
        ],
        dtype=np.float64,
    ).reshape(len(recall.hits), len(_SIGNALS))
    better, worse = np.nonzero(gains[:, None] > gains[None, :])
    return Rated(recall.recall_id, signals[better] - signals[worse])


def _coefficients(weights: RecallWeights) -> np.ndarray:
    """What each signal (in :data:`_SIGNALS` order) adds to recall's score per unit, under
    ``weights``: the score is linear in the signals (see ranking.py)."""
    return np.array(
        [
            weights.similarity,
            weights.similarity * weights.lexical,
            weights.keyword,
            weights.heat,
            weights.temporal,
            weights.source,
            weights.own_channel,
        ]
    )


@dataclass(frozen=True)
class _Pairs:
    """The ordered pairs of the recalls that order any, stacked; ``owner`` numbers each
    pair's recall (0 .. ``recalls`` - 1)."""

    diffs: np.ndarray
    owner: np.ndarray
    recalls: int

    @classmethod
    def of(cls, recalls: Sequence[Rated]) -> _Pairs:
        ordering = [r.diffs for r in recalls if len(r.diffs)]
        if not ordering:
            return cls(np.zeros((0, len(_SIGNALS))), np.zeros(0, dtype=np.int64), 0)
        owner = np.concatenate([np.full(len(d), n) for n, d in enumerate(ordering)])
        return cls(np.concatenate(ordering), owner, len(ordering))

    def agreement(self, weights: RecallWeights) -> float | None:
        """The share of pairs ``weights`` ranks right (a tie counts half), averaged over
        the recalls; None when no recall orders any pair."""
        if not self.recalls:
            return None
        margin = self.diffs @ _coefficients(weights)
        right = (margin > _TIE) + 0.5 * (np.abs(margin) <= _TIE)
        shares = np.bincount(self.owner, weights=right, minlength=self.recalls) / np.bincount(
            self.owner, minlength=self.recalls
        )
        return float(shares.mean())


def agreement(weights: RecallWeights, recalls: Sequence[Rated]) -> float | None:
    """The share of the pairs the feedback orders that ``weights`` ranks right (a tie
    counts half), averaged over the recalls that order any; None when none do."""
    return _Pairs.of(recalls).agreement(weights)


@dataclass(frozen=True)
class TuneReport:
    """What a fit found.

    Attributes:
        fitted / held_back: Recalls with feedback fitted on, and held back to judge.
        held_back_before / held_back_after: Agreement on the held-back feedback with
            the weights in force and with the fitted ones (0 when none orders hits).
        before / after: The weights in force and the fitted ones.
        better: Whether the fitted weights agree better with the held-back feedback.
        explanation: One paragraph on what moved and why.
        applied: Whether the fitted weights were made the channel's own.
    """

    fitted: int
    held_back: int
    held_back_before: float
    held_back_after: float
    before: RecallWeights
    after: RecallWeights
    better: bool
    explanation: str
    applied: bool = False


def fit(weights: RecallWeights, recalls: Sequence[Rated]) -> TuneReport:
    """Fit ``weights`` to ``recalls`` (in recall id order), holding every fourth back."""
    last = HOLD_BACK_EVERY - 1
    held = [r for n, r in enumerate(recalls) if n % HOLD_BACK_EVERY == last]
    train = [r for n, r in enumerate(recalls) if n % HOLD_BACK_EVERY != last]
    fitting, judging = _Pairs.of(train), _Pairs.of(held)
    fitted = _search(weights, fitting)
    before, after = judging.agreement(weights), judging.agreement(fitted)
    better = before is not None and after is not None and after > before + _TIE
    return TuneReport(
        fitted=len(train),
        held_back=len(held),
        held_back_before=before or 0.0,
        held_back_after=after or 0.0,
        before=weights,
        after=fitted,
        better=better,
        explanation=" ".join(
            [
                _data(weights, len(train), fitting.recalls, len(held)),
                *_moves(weights, fitted, fitting),
                _verdict(before, after, better),
            ]
        ),
    )


def _search(weights: RecallWeights, pairs: _Pairs) -> RecallWeights:
    """Coordinate search over :data:`GRID` for the weights that agree best with ``pairs``."""
    best = pairs.agreement(weights)
    if best is None:
        return weights
    current = weights
    for _ in range(_ROUNDS):
        moved = False
        for name in FITTED:
            cap = _CAPS.get(name, np.inf)
            values = sorted({v for v in GRID if v <= cap} | {getattr(current, name)})
            scored = [pairs.agreement(replace(current, **{name: v})) or 0.0 for v in values]
            top = max(scored)
            if top <= best + _TIE:
                continue
            winners = [v for v, s in zip(values, scored, strict=True) if s >= top - _TIE]
            current = replace(current, **{name: winners[len(winners) // 2]})
            best, moved = top, True
        if not moved:
            break
    return current


def _data(weights: RecallWeights, fitted: int, ordering: int, held: int) -> str:
    return (
        f"Fitted on {fitted} recalls with feedback ({ordering} of them naming the memories "
        f"they were about, which is what orders hits) and judged on {held} held back (every "
        f"{HOLD_BACK_EVERY}th by id); similarity stays at {weights.similarity:g} as the "
        "scale the other weights are measured against."
    )


def _moves(weights: RecallWeights, fitted: RecallWeights, pairs: _Pairs) -> list[str]:
    """A sentence per weight the fit moved, with how the preferred hits differ in it."""
    said = []
    for name in FITTED:
        old, new = getattr(weights, name), getattr(fitted, name)
        if new == old:
            continue
        column = _SIGNALS.index({"own_channel": "own"}.get(name, name))
        lean = float(pairs.diffs[:, column].mean())
        said.append(
            f"{name} {'raised' if new > old else 'lowered'} from {old:g} to {new:g}; the hits "
            f"the feedback preferred differ in {_WHAT[name]} by {lean:+.2f} on average from "
            "the hits ranked against them."
        )
    return said or ["No weight on the grid agreed better with the fitted feedback."]


def _verdict(before: float | None, after: float | None, better: bool) -> str:
    if before is None or after is None:
        return "No held-back recall names its memories, so the fit cannot be judged."
    return (
        f"On the held-back feedback the ranking agreed with {before:.0%} of ordered pairs "
        f"before and {after:.0%} after, "
        + ("so the fitted weights are better." if better else "so the fit is no better.")
    )
