"""A memory's heat history: the pieces its heat decayed along and the jumps between them.

Heat is stored as one piece (``heat0`` at ``t0``, decaying with a half-life down to a
floor); every change that sets a new piece (a recall, a boost, resonance, a summary's
share) ends the one before. The record keeps its latest pieces as *entries*, each
``[at, before, after, half_life, floor, cause]``: at ``at`` heat went from ``before`` to
``after`` and from then decays with ``half_life`` seconds (0: frozen) down to
``floor``. The first entry of a history is its ``origin`` (where the drawing starts).

Only changes that rewrite the record are marked as they happen; one that sets heat
alone (resonance warming a neighbour, a dream materialising it) is found afterwards as
a piece that starts later than the last entry and is entered then (``warmed``,
``cooled``, or ``rate`` when only the half-life changed).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calor.server.thermo.heat import heat_at

__all__ = [
    "CAUSES",
    "MAX_ENTRIES",
    "Piece",
    "Step",
    "entries_with",
    "heats_at",
    "origin",
    "past_points",
    "since_store",
    "steps",
]

MAX_ENTRIES = 16
"""How many entries a record keeps: its latest jumps, oldest dropped first."""

CAUSES = (
    "origin",
    "recall",
    "boost",
    "resonance",
    "settled",
    "warmed",
    "cooled",
    "rate",
    "earlier",
)
"""Why heat changed at an entry: where the history starts; a recall; a boost (or a
cooling boost); resonance from a recalled neighbour (written with the record, or
``warmed`` when heat alone was written); settled history (superseded); ``cooled`` when
heat fell without a record write (a summary took its share); ``rate`` when only the
half-life or floor changed (a new type); ``earlier`` for a change made before the
memory's history was kept (its cause unknown)."""

_SAME = 1e-9
_SAMPLES_PER_PIECE = 24


@dataclass(frozen=True, slots=True)
class Piece:
    """Heat from ``start`` on: ``heat`` decaying with ``half_life`` wall-clock seconds
    (``math.inf``: frozen) down to ``floor`` along the channel's curve."""

    start: float
    heat: float
    half_life: float
    floor: float

    def heat_at(self, at: float, curve: str) -> float:
        """The piece's heat at ``at`` (not before ``start``)."""
        return heat_at(self.heat, at - self.start, self.half_life, self.floor, curve)


@dataclass(frozen=True, slots=True)
class Step:
    """A jump in heat: at ``at`` from ``before`` to ``after``, and why (:data:`CAUSES`)."""

    at: float
    before: float
    after: float
    cause: str


def _entry(at: float, before: float, piece: Piece, cause: str) -> list[Any]:
    half_life = 0.0 if math.isinf(piece.half_life) else piece.half_life
    return [at, before, piece.heat, half_life, piece.floor, cause]


def origin(piece: Piece) -> list[list[Any]]:
    """A history that starts with ``piece``."""
    return [_entry(piece.start, piece.heat, piece, "origin")]


def _piece(entry: Sequence[Any]) -> Piece:
    half_life = float(entry[3]) or math.inf
    return Piece(float(entry[0]), float(entry[2]), half_life, float(entry[4]))


def since_store(stored: Piece, current: Piece, curve: str, unkept: bool) -> list[list[Any]]:
    """The history of a memory with no jump entered since its store (``stored``): to
    its piece now, through a change of unknown cause when the history was not kept yet
    (``unkept``)."""
    return _caught_up(origin(stored), current, curve, unmarked="earlier" if unkept else "")


def _caught_up(
    entries: list[list[Any]], current: Piece, curve: str, unmarked: str = ""
) -> list[list[Any]]:
    """``entries`` with ``current`` (the record's piece now) entered when it began after
    the last entry: heat or its decay was set without a mark (``unmarked``: the cause
    to enter, when known)."""
    if not entries:
        return origin(current)
    last = _piece(entries[-1])
    if current.start <= last.start + _SAME:
        return entries
    before = last.heat_at(current.start, curve)
    if abs(before - current.heat) > _SAME:
        cause = unmarked or ("warmed" if current.heat > before else "cooled")
    elif current.half_life != last.half_life or current.floor != last.floor:
        cause = "rate"
    else:
        return entries  # materialised with nothing changed: the same curve goes on
    return [*entries, _entry(current.start, before, current, cause)]


def entries_with(
    entries: list[list[Any]],
    before: Piece,
    after: Piece,
    heat_before: float,
    cause: str,
    curve: str,
) -> list[list[Any]]:
    """A record's entries once a change has moved its heat from piece ``before`` (the
    record's piece until now; ``heat_before`` its heat at the change) to ``after``."""
    caught_up = _caught_up(entries, before, curve)
    return [*caught_up, _entry(after.start, heat_before, after, cause)][-MAX_ENTRIES:]


def steps(entries: list[list[Any]], current: Piece, curve: str) -> list[Step]:
    """The jumps in a record's history, each recall among them even at the cap (its
    origin and changes of rate alone left out)."""
    return [
        Step(float(e[0]), float(e[1]), float(e[2]), str(e[5]))
        for e in _caught_up(entries, current, curve)
        if e[5] not in ("origin", "rate")
    ]


def _pieces(entries: list[list[Any]], current: Piece, curve: str) -> list[Piece]:
    """The pieces of a record's history, oldest first, the last one ``current``."""
    caught_up = _caught_up(entries, current, curve)
    return [_piece(entry) for entry in caught_up[:-1]] + [current]


def heats_at(
    entries: list[list[Any]], current: Piece, times: Sequence[float], curve: str
) -> list[float]:
    """Heat at each of ``times`` (ascending) on a record's history, projected along
    ``current`` past its start; ``nan`` before the history begins."""
    pieces = _pieces(entries, current, curve)
    starts = [piece.start for piece in pieces]
    heats = []
    for at in times:
        which = bisect.bisect_right(starts, at) - 1
        heats.append(math.nan if which < 0 else pieces[which].heat_at(at, curve))
    return heats


def past_points(
    entries: list[list[Any]], current: Piece, now: float, curve: str, flat: bool = False
) -> list[tuple[float, float]]:
    """Heat from the start of a record's history until ``now``, sampled along each piece,
    with both sides of every jump; the last piece is ``current`` (the record as it
    stands, under the channel's settings now). ``flat`` draws each piece at its start's
    heat (decay that runs on interactions, not the clock)."""
    pieces = _pieces(entries, current, curve)
    if flat:
        pieces = [Piece(p.start, p.heat, math.inf, p.floor) for p in pieces]
    ends = [piece.start for piece in pieces[1:]] + [now]
    points: list[tuple[float, float]] = []
    for piece, end in zip(pieces, ends, strict=True):
        end = max(end, piece.start)
        points.append((piece.start, piece.heat))
        for k in range(1, _SAMPLES_PER_PIECE + 1):
            at = piece.start + (end - piece.start) * k / _SAMPLES_PER_PIECE
            points.append((at, piece.heat_at(at, curve)))
    return points
