"""How one recall weighs words against meaning, and how far heat may move a hit.

Dense similarity (a cosine) and lexical evidence (BM25) are on scales that do not
compare, and how far each can be trusted changes with the query and the channel. For
one recall, over the candidates it searched (every index of it together):

* the lexical evidence is put on the cosine's scale: its standard score among the
  candidates, times the cosines' spread, plus their mean (``words``);
* the two are mixed, ``relevance = similarity + λ·(words − similarity)``, with
  ``λ = weight_lexical · trust`` (at most 1). ``trust`` (0..2) is the sum of how
  specific the query's words are in the channel (their mean IDF over the most an IDF
  can be there: rare words name things, common ones do not) and how decisively the
  word ranking separates its best candidate, against the meaning ranking's (its best
  candidate's lead over the next nine, in standard deviations of the top fifty): when
  the two rankings disagree, the sharper one leads;
* ``spread`` is how far apart the ten most relevant candidates are (the best
  relevance less the tenth, and at least 0.001 so that heat breaks even a tie of all
  of them). Heat and the query-word overlap move a hit by their weight times
  ``spread`` at most, so they reorder hits of close relevance and never lift a weakly
  related hot memory over one that answers;
* a time the query names ("last week") boosts the hits among the most relevant (within
  one ``spread`` of the best relevance, and never more than 0.1 below it on the
  cosine's scale) in full, and less the further below them, none from twice that down
  (:meth:`Fusion.time_share`): it picks last week's lunch among the lunches, but last
  week's chatter does not bury the memory that answers from the week before.

Nothing here depends on a benchmark or a channel's name: only on the query's words,
the channel's word statistics, and the candidates' own scores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import overload

import numpy as np
import numpy.typing as npt

from calor.server.recall.lexical import Corpus, idf, tokenize

__all__ = ["NO_FUSION", "Fusion", "fuse", "specificity"]

_F64 = npt.NDArray[np.float64]
_LEAD = 10  # a ranking's lead: its best candidate over the mean of its best ten
_SCALE = 50  # measured in standard deviations of its best fifty
_SPREAD = 10  # heat and overlap reorder within the best ten's spread of relevance
_TIES = 1e-3  # the least spread: heat breaks a tie even where every candidate ties
# A named time boosts hits in full down to a band below the best relevance: the spread,
# but never wider than this (on the cosine's scale, where what answers a question and
# what does not lie tenths apart), so that in a channel with few relevant memories the
# band does not take in the irrelevant rest.
_TIME_BAND_MOST = 0.1


@dataclass(frozen=True)
class Fusion:
    """One recall's mix of meaning and words (see the module docstring).

    Attributes:
        lexical_weight: λ, the share of relevance the words have (0..1).
        dense_mean / dense_scale: The candidates' cosines: mean and standard deviation.
        lexical_mean / lexical_scale: Their lexical scores, likewise.
        spread: The best relevance less the tenth best: how far heat may move a hit.
        best: The best relevance.
    """

    lexical_weight: float
    dense_mean: float
    dense_scale: float
    lexical_mean: float
    lexical_scale: float
    spread: float
    best: float = 0.0

    @overload
    def time_share(self, relevance: float) -> float: ...
    @overload
    def time_share(self, relevance: _F64) -> _F64: ...
    def time_share(self, relevance: float | _F64) -> float | _F64:
        """How much of its temporal boost a hit of this relevance gets: all of it within
        one band of the best (the spread, at most ``_TIME_BAND_MOST``), none from two
        bands below (0..1)."""
        band = min(self.spread, _TIME_BAND_MOST)
        if band <= 0.0:
            return 0.0 * relevance
        shared = (relevance - self.best) / band + 2.0
        return (
            np.clip(shared, 0.0, 1.0)
            if isinstance(shared, np.ndarray)
            else min(1.0, max(0.0, shared))
        )

    @overload
    def words(self, lexical: float) -> float: ...
    @overload
    def words(self, lexical: _F64) -> _F64: ...
    def words(self, lexical: float | _F64) -> float | _F64:
        """Lexical evidence on the cosine's scale."""
        if self.lexical_scale <= 0.0:  # no candidate holds a query word
            return self.dense_mean + 0.0 * lexical  # (of ``lexical``'s shape)
        return self.dense_mean + self.dense_scale * (lexical - self.lexical_mean) / (
            self.lexical_scale
        )

    @overload
    def relevance(self, similarity: float, lexical: float) -> float: ...
    @overload
    def relevance(self, similarity: _F64, lexical: _F64) -> _F64: ...
    def relevance(self, similarity: float | _F64, lexical: float | _F64) -> float | _F64:
        """Meaning and words mixed, on the cosine's scale."""
        return similarity + self.lexical_weight * (self.words(lexical) - similarity)


NO_FUSION = Fusion(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
"""A recall with no candidates: nothing to mix, nothing to reorder."""


def specificity(corpus: Corpus, query: str) -> float:
    """How specific the query's words are in ``corpus`` (0..1): the mean IDF of those it
    holds over the most an IDF can be there (a word only one memory holds); 0 when it
    holds none."""
    idfs = [
        idf(corpus.docs, corpus.df[t]) for t in dict.fromkeys(tokenize(query)) if t in corpus.df
    ]
    if not idfs or corpus.docs < 1:
        return 0.0
    most = idf(corpus.docs, 1)
    return min(1.0, sum(idfs) / len(idfs) / most) if most > 0 else 0.0


def fuse(dense: _F64, words: _F64, specific: float, weight: float) -> Fusion:
    """The fusion of one recall's candidates: their cosines and lexical scores (in the
    same order), the query's :func:`specificity` and the channel's ``weight_lexical``."""
    if dense.size == 0:
        return NO_FUSION
    dense_scale, lexical_scale = float(dense.std()), float(words.std())
    if lexical_scale > 0.0:
        lead_words, lead_meaning = _lead(words), _lead(dense)
        both = lead_words + lead_meaning
        sharper = lead_words / both if both > 0.0 else 0.5
        trust = specific + sharper
    else:
        trust = 0.0  # no candidate holds a query word: meaning alone
    fusion = Fusion(
        lexical_weight=min(1.0, max(0.0, weight * trust)),
        dense_mean=float(dense.mean()),
        dense_scale=dense_scale,
        lexical_mean=float(words.mean()),
        lexical_scale=lexical_scale,
        spread=0.0,
    )
    best = _best(fusion.relevance(dense, words), _SPREAD)
    return replace(fusion, spread=max(_TIES, float(best[0] - best[-1])), best=float(best[0]))


def _lead(scores: _F64) -> float:
    """How far a ranking's best candidate leads its next nine, in standard deviations of
    its best fifty (0 when they are all alike)."""
    best = _best(scores, _SCALE)
    scale = float(best.std())
    if scale <= 0.0:
        return 0.0
    return float(best[0] - best[:_LEAD].mean()) / scale


def _best(scores: _F64, count: int) -> _F64:
    """The ``count`` highest scores (all, if fewer), highest first."""
    if scores.size > count:
        scores = np.partition(scores, scores.size - count)[scores.size - count :]
    return np.sort(scores)[::-1]
