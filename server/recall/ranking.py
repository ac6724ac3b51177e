"""Recall ranking: candidates from meaning and words, scored by relevance, heat and time.

score = w_sim·relevance + (w_heat·heat + w_kw·keyword_overlap)·spread
        + temporal_boost (≤ w_temporal, fading over the fade days) · time_share
        + w_own if the memory is in the caller's own channel
        + w_source·source_trust
        all × 0.5 for a memory a newer one superseded (or that was deprecated); such
        memories are left out unless the query names the states it wants

``relevance`` is the cosine mixed with the memory's BM25 score by how far the words can
be trusted for this query, and ``spread`` how far apart the ten most relevant
candidates are (:mod:`calor.server.recall.fusion`): heat and the query-word overlap
reorder hits of close relevance, and a time the query names boosts the most relevant
hits in full, weakly related ones not at all (``time_share``). ``lexical`` (reported)
is the BM25 score as a fraction of the best any memory could reach for the query.
bench/README.md says what each adds.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import reduce

import numpy as np
import numpy.typing as npt

from calor.server.commands import RecallQuery
from calor.server.recall.columns import (
    SOURCES,
    Batch,
    among,
    heats_and_states,
    needs_record,
    state_code,
    type_code,
)
from calor.server.recall.fusion import Fusion, fuse, specificity
from calor.server.recall.index import ChannelIndex
from calor.server.recall.lexical import Corpus, Match
from calor.server.recall.temporal import TimeWindow, detect_window, temporal_boost
from calor.server.records import ACTIVE, ARCHIVED, COLD, MemoryRecord
from calor.server.stages import stage
from calor.server.thermo.gates import fidelity_admits
from calor.server.thermo.heat import SOURCE_TRUST
from calor.server.thermo.lifecycle import DAY, Clocks, current_heat, evolve
from calor.server.thermo.policy import BANDS, ChannelPolicy, ConfidenceBands

__all__ = ["Hit", "band", "candidate_pool", "rank_channel", "reaches", "recall_window"]

_SEARCHABLE = frozenset({ACTIVE, COLD})
_ARCHIVE_TOO = frozenset({ACTIVE, COLD, ARCHIVED})
# "What did you recommend?", "in our previous chat": the answer is in the agent's own
# words, so for such a query the agent's memories get the trust a person's would.
_ASKS_FOR_AGENT_WORDS = re.compile(
    r"\byou(?:'d)?\s+(?:\w+\s+)?(?:told|said|mentioned|recommended|suggested|gave|provided"
    r"|listed|shared|explained|described|wrote|showed|offered|proposed|named|made|included)\b"
    r"|\b(?:our|the)\s+(?:previous|last|earlier)\s+(?:chat|conversation|discussion|talk)\b"
    r"|\bwe\s+(?:talked|spoke|chatted)\s+about\b|\bwe\s+discussed\b",
    re.IGNORECASE,
)
_AGENT_FIRST = {**SOURCE_TRUST, "human": SOURCE_TRUST["agent"], "agent": SOURCE_TRUST["human"]}


@dataclass
class Hit:
    """One ranked memory, the parts of its score and its confidence band (:func:`band`):
    ``relevance`` is meaning and words mixed, words weighing ``lexical_weight`` of it,
    and heat and keyword overlap were scaled by ``spread`` (see
    :mod:`calor.server.recall.fusion`)."""

    record: MemoryRecord
    score: float
    similarity: float
    keyword: float
    temporal: float
    heat: float
    channel_bonus: float
    lexical: float = 0.0
    source: float = 0.0
    band: str = "low"
    relevance: float = 0.0
    lexical_weight: float = 0.0
    spread: float = 1.0


def band(similarity: float, keyword: float, bands: ConfidenceBands) -> str:
    """A stable confidence band from the evidence of relevance alone (not heat or time).

    ``high`` when the meaning is close; ``mid`` when it is near, or when moderate
    meaning is backed by most of the query's words; ``low`` otherwise. Where each starts
    is the channel's setting (``bands``).
    """
    if similarity >= bands.high:
        return "high"
    if similarity >= bands.mid or (
        similarity >= bands.keyword_similarity and keyword >= bands.keyword_overlap
    ):
        return "mid"
    return "low"


def reaches(confidence: str, least: str) -> bool:
    """Whether a confidence band is ``least`` or stronger (``""`` is reached by any)."""
    return not least or BANDS.index(confidence) >= BANDS.index(least)


def recall_window(query: RecallQuery, now: float) -> TimeWindow | None:
    """The window recall boosts: the explicit range if given, else one the query names."""
    if query.time_from is not None or query.time_to is not None:
        start = datetime.fromtimestamp(query.time_from or 0.0, UTC)
        end = datetime.fromtimestamp(query.time_to if query.time_to is not None else now, UTC)
        return TimeWindow(start=start, end=end, phrase="")
    as_of = query.as_of if query.as_of is not None else now
    return detect_window(query.query, datetime.fromtimestamp(as_of, UTC))


# The fusion weighs words against meaning from statistics over the candidates: over
# each list's best ``_REFERENCE`` (by meaning, by words) whatever the pool, so that a
# recall's best hits do not change with how many were asked for, or with its filters.
_REFERENCE = 200
_POOL = _REFERENCE  # candidates per list of a recall without filters (at least)
_FILTERED_POOL = 1000  # with filters, which may leave few of them


def candidate_pool(query: RecallQuery) -> int:
    """How many candidates each index contributes: generous, more so under filters."""
    filtered = bool(query.memory_types or query.states or query.tags or query.min_heat)
    return max(query.limit * 4, _FILTERED_POOL if filtered else _POOL)


def _passes(record: MemoryRecord, heat: float, query: RecallQuery, policy: ChannelPolicy) -> bool:
    allowed = query.states or (_ARCHIVE_TOO if query.include_archived else _SEARCHABLE)
    if record.state not in allowed or record.state not in _ARCHIVE_TOO:
        return False
    if record.superseded and not query.states:
        return False  # settled history: only a states filter asks for it
    if query.memory_types and record.memory_type not in query.memory_types:
        return False
    if heat < query.min_heat:
        return False
    if not fidelity_admits(policy, heat):
        return False
    return all(record.tags.get(key) == value for key, value in query.tags)


# What a superseded memory's score is worth when a states filter asks for it: its
# successor, as close to the query, ranks above it.
_SUPERSEDED = 0.5


def rank_channel(
    indexes: Sequence[ChannelIndex],
    records: Mapping[str, MemoryRecord],
    policy: ChannelPolicy,
    query: RecallQuery,
    query_vector: np.ndarray,
    window: TimeWindow | None,
    clocks: Clocks,
    own: bool,
    top: int | None = None,
    bulk: bool = True,
) -> list[Hit]:
    """Score the candidates of a channel's indexes (its live index, and its attic when
    the query asks) for the query; unsorted, filters applied.

    The indexes are searched together: their words weighed by what they all hold, and
    meaning and words fused over all their candidates, so that their scores compare.
    Each hit carries the record as it stands now (promotions and state changes
    applied, not yet persisted). ``top``: only the best ``top`` hits of each index (by
    score, then id) are returned; None returns every candidate that passes. Candidates
    are scored in bulk from the index's columns; ``bulk=False`` scores each from its
    record with the same formula (what the bulk path is checked against), as the few the
    columns do not cover always are.
    """
    with stage("lexical search"):
        corpus = reduce(operator.add, (i.lexical.corpus(query.query) for i in indexes))
    pool = candidate_pool(query)
    found = [_Candidates.of(i, query.query, corpus, query_vector, pool) for i in indexes]
    with stage("fusion and scoring"):
        fusion = fuse(
            np.concatenate([c.cosines[c.reference] for c in found]),
            np.concatenate([c.shares[c.reference] for c in found]),
            specificity(corpus, query.query),
            policy.weights.lexical,
        )
        hits: list[Hit] = []
        for candidates in found:
            hits += _rank_index(
                candidates, fusion, records, policy, query, window, clocks, own, top, bulk
            )
    return hits


@dataclass(frozen=True)
class _Candidates:
    """One index's candidates for a query: the union of the nearest memories by meaning
    and by words (``labels``), with each one's cosine (``cosines``) and how fully it
    matches the query's words (``shares``: its BM25 score as a fraction of the best score
    any document could reach), position by position."""

    index: ChannelIndex
    words: Match
    labels: npt.NDArray[np.int64]
    cosines: npt.NDArray[np.float64]
    shares: npt.NDArray[np.float64]
    reference: npt.NDArray[np.bool_]
    """Among each list's best ``_REFERENCE``: the candidates the fusion is fitted to."""

    @classmethod
    def of(
        cls, index: ChannelIndex, query: str, corpus: Corpus, vector: np.ndarray, pool: int
    ) -> _Candidates:
        """The ``pool`` nearest memories of ``index`` by meaning and by words."""
        with stage("lexical search"):
            words = index.lexical.match(query, corpus)
            by_words, _ = words.top(pool)
        with stage("dense search"):
            labels, sims = index.dense(vector, pool)
            listed = index.label_mask(labels)
            lexical_only = by_words[~listed[by_words]]
            if lexical_only.size:
                labels = np.concatenate([labels, lexical_only])
                sims = np.concatenate([sims, index.similarities(vector, lexical_only)])
        with stage("lexical search"):
            shares = (
                words.scores(labels) / words.ceiling if words.ceiling > 0 else np.zeros(labels.size)
            )
        reference = np.arange(labels.size) < _REFERENCE  # the dense list comes first
        reference |= index.label_mask(by_words[:_REFERENCE])[labels]
        return cls(index, words, labels, sims.astype(np.float64), shares, reference)


def _rank_index(
    candidates: _Candidates,
    fusion: Fusion,
    records: Mapping[str, MemoryRecord],
    policy: ChannelPolicy,
    query: RecallQuery,
    window: TimeWindow | None,
    clocks: Clocks,
    own: bool,
    top: int | None,
    bulk: bool,
) -> list[Hit]:
    """The hits of one index's candidates (see :func:`rank_channel`)."""
    labels, index = candidates.labels, candidates.index
    if not labels.size:
        return []
    scoring = _Scoring(query, policy, window, clocks, own, candidates.words, fusion)
    batch = index.columns.batch(labels)
    by_record = needs_record(batch) | (not bulk) | bool(query.tags)
    cosines, shares = candidates.cosines, candidates.shares
    hits = [
        hit
        for row in np.flatnonzero(by_record).tolist()
        if (hit := scoring.one(index, records, int(labels[row]), cosines[row], shares[row]))
    ]
    quick = ~by_record
    if quick.any():
        hits += scoring.bulk(
            index, records, labels[quick], batch, quick, cosines[quick], shares[quick], top
        )
    if top is not None and len(hits) > top:
        hits.sort(key=lambda h: (-h.score, h.record.id))
        del hits[top:]
    return hits


class _Scoring:
    """One query's scoring of one channel's candidates (the formula in this module's
    docstring), per record or in bulk."""

    def __init__(
        self,
        query: RecallQuery,
        policy: ChannelPolicy,
        window: TimeWindow | None,
        clocks: Clocks,
        own: bool,
        words: Match,
        fusion: Fusion,
    ) -> None:
        self.query, self.policy, self.window, self.clocks = query, policy, window, clocks
        self.words, self.fusion = words, fusion
        self.weights = policy.weights
        self.trust_of = _AGENT_FIRST if _ASKS_FOR_AGENT_WORDS.search(query.query) else SOURCE_TRUST
        self.bonus = self.weights.own_channel if own else 0.0

    def one(
        self,
        index: ChannelIndex,
        records: Mapping[str, MemoryRecord],
        label: int,
        sim: float,
        words: float,
    ) -> Hit | None:
        """The hit of one candidate, scored from its record; None if it is filtered out."""
        policy, weights, clocks, query = self.policy, self.weights, self.clocks, self.query
        record = evolve(records[index.memory_id(label)], policy, clocks)
        heat = current_heat(record, policy, clocks)
        if not _passes(record, heat, query, policy):
            return None
        keyword = float(self.words.overlap(np.array([label], dtype=np.int64))[0])
        relevance = self.fusion.relevance(sim, words)
        boost = 0.0
        if self.window is not None:
            boost = self.fusion.time_share(relevance) * temporal_boost(
                datetime.fromtimestamp(record.created_at, UTC),
                self.window,
                weights.temporal,
                weights.temporal_fade_days,
            )
        trust = weights.source * self.trust_of.get(record.source, SOURCE_TRUST["agent"])
        score = (
            weights.similarity * relevance
            + (weights.heat * heat + weights.keyword * keyword) * self.fusion.spread
            + boost
            + self.bonus
            + trust
        )
        if record.superseded:
            score *= _SUPERSEDED
        confidence = band(sim, keyword, policy.bands)
        if not reaches(confidence, query.min_band):
            return None
        return Hit(
            record,
            score,
            sim,
            keyword,
            boost,
            heat,
            self.bonus,
            words,
            trust,
            confidence,
            relevance,
            self.fusion.lexical_weight,
            self.fusion.spread,
        )

    def bulk(
        self,
        index: ChannelIndex,
        records: Mapping[str, MemoryRecord],
        labels: npt.NDArray[np.int64],
        whole: Batch,
        rows: npt.NDArray[np.bool_],
        sims: npt.NDArray[np.float64],
        words: npt.NDArray[np.float64],
        top: int | None,
    ) -> list[Hit]:
        """The hits of many candidates (``labels``, with their cosines and lexical shares),
        scored from the index's columns (``whole``'s ``rows``); only the best ``top``
        become hits."""
        policy, weights, query = self.policy, self.weights, self.query
        batch = whole.select(rows)
        keyword = self.words.overlap(labels)
        heat, state = heats_and_states(batch, policy, self.clocks)
        keep = self._passes(batch, heat, state)
        trust = weights.source * self._trust[batch.source]
        relevance = self.fusion.relevance(sims, words)
        boost = self._boosts(batch.created_at, relevance)
        score = (
            weights.similarity * relevance
            + (weights.heat * heat + weights.keyword * keyword) * self.fusion.spread
            + boost
            + self.bonus
            + trust
        )
        score = np.where(batch.superseded, score * _SUPERSEDED, score)
        bands = self._bands(sims, keyword)
        if query.min_band:
            keep &= bands >= BANDS.index(query.min_band)
        chosen = np.flatnonzero(keep)
        if top is not None and chosen.size > top:
            cut = np.partition(score[chosen], chosen.size - top)[chosen.size - top]
            chosen = chosen[score[chosen] >= cut]  # ties at the cut stay: ids decide later
        hits = []
        for row in chosen.tolist():
            record = evolve(records[index.memory_id(int(labels[row]))], policy, self.clocks)
            hits.append(
                Hit(
                    record,
                    float(score[row]),
                    float(sims[row]),
                    float(keyword[row]),
                    float(boost[row]),
                    float(heat[row]),
                    self.bonus,
                    float(words[row]),
                    float(trust[row]),
                    BANDS[int(bands[row])],
                    float(relevance[row]),
                    self.fusion.lexical_weight,
                    self.fusion.spread,
                )
            )
        return hits

    @property
    def _trust(self) -> npt.NDArray[np.float64]:
        unknown = SOURCE_TRUST["agent"]
        return np.array([self.trust_of.get(name, unknown) for name in SOURCES])

    def _passes(
        self, batch: Batch, heat: npt.NDArray[np.float64], state: npt.NDArray[np.int8]
    ) -> npt.NDArray[np.bool_]:
        """:func:`_passes` in bulk (the tags filter is always judged per record)."""
        query, policy = self.query, self.policy
        allowed = query.states or (_ARCHIVE_TOO if query.include_archived else _SEARCHABLE)
        codes = [state_code(name) for name in allowed & _ARCHIVE_TOO]
        keep = among(state, codes)
        if not query.states:
            keep &= ~batch.superseded
        if query.memory_types:
            keep &= among(batch.memory_type, [type_code(t) for t in query.memory_types])
        keep &= heat >= query.min_heat
        if policy.gate_fidelity:
            keep &= heat >= policy.survival_gate
        return keep

    def _boosts(
        self, created_at: npt.NDArray[np.float64], relevance: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """:func:`temporal_boost` of each creation time, in bulk, times its hit's
        :meth:`Fusion.time_share`."""
        window, weights = self.window, self.weights
        if window is None:
            return np.zeros(created_at.shape[0])
        start, end = window.start.timestamp(), window.end.timestamp()
        distance = np.where(created_at < start, start - created_at, created_at - end) / DAY
        fading = (
            weights.temporal * (1.0 - distance / weights.temporal_fade_days)
            if weights.temporal_fade_days > 0
            else np.zeros_like(distance)
        )
        outside = np.where(distance >= weights.temporal_fade_days, 0.0, fading)
        inside = (created_at >= start) & (created_at <= end)
        return self.fusion.time_share(relevance) * np.where(inside, weights.temporal, outside)

    def _bands(
        self, sims: npt.NDArray[np.float64], keyword: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.int64]:
        """:func:`band` in bulk, as indexes into ``BANDS``."""
        bands = self.policy.bands
        mid = (sims >= bands.mid) | (
            (sims >= bands.keyword_similarity) & (keyword >= bands.keyword_overlap)
        )
        return np.where(
            sims >= bands.high, BANDS.index("high"), np.where(mid, BANDS.index("mid"), 0)
        )
