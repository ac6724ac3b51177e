"""Trigger feedback (the memory skill's SITU): each firing of a trigger may be rated useful
or noise; a trigger's precision is the useful share of its rated firings of the last 30
days, and one whose precision over enough of them falls under the channel's threshold is
flagged (and, where the channel says so, paused)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

__all__ = ["MIN_RATED", "RATINGS", "WINDOW_SECONDS", "Rating", "Standing", "standing"]

RATINGS = ("useful", "noise")
WINDOW_SECONDS = 30 * 86_400.0
"""How far back a trigger's precision looks (by when the rated firing happened)."""
MIN_RATED = 20
"""Rated firings in the window before a trigger can be flagged."""


@dataclass(frozen=True)
class Rating:
    """How one firing was rated: when it fired, whether it was useful, when it was rated."""

    fired_at: float
    useful: bool
    rated_at: float

    def to_json(self) -> bytes:
        """The rating as JSON, for storage."""
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Rating:
        """A rating from :meth:`to_json`."""
        raw = json.loads(data)
        return cls(float(raw["fired_at"]), bool(raw["useful"]), float(raw["rated_at"]))


@dataclass(frozen=True)
class Standing:
    """A trigger's precision (None while nothing is rated), how many firings of the
    window were rated, and whether it is flagged."""

    precision: float | None
    rated: int
    flagged: bool

    def reason(self, min_precision: float) -> str:
        """Why a flagged trigger would be paused, in plain words."""
        return (
            f"precision {self.precision or 0.0:.2f} over {self.rated} rated firings of the "
            f"last 30 days is under trigger_min_precision {min_precision:.2f}"
        )


def standing(ratings: Iterable[Rating], now: float, min_precision: float) -> Standing:
    """A trigger's standing from its ratings, as of ``now``."""
    recent = [r for r in ratings if r.fired_at >= now - WINDOW_SECONDS]
    if not recent:
        return Standing(None, 0, False)
    precision = sum(r.useful for r in recent) / len(recent)
    return Standing(precision, len(recent), len(recent) >= MIN_RATED and precision < min_precision)
