"""A channel's policy: decay profiles, recall weights, thresholds and gates, with DESIGN's defaults.

A policy is a frozen record; changing a channel's settings swaps in a new one, and
every read after that uses it (stored memories are never rewritten).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from calor.server.thermo.heat import DEFAULT_PROFILES, TypeProfile

__all__ = [
    "BANDS",
    "ContextWeights",
    "DECAY_MODES",
    "ChannelPolicy",
    "ConfidenceBands",
    "DreamThresholds",
    "IngestTuning",
    "RecallWeights",
]

DECAY_MODES = ("time", "interaction", "hybrid")


@dataclass(frozen=True)
class RecallWeights:
    """How recall blends its signals into one score (DESIGN §5)."""

    similarity: float = 0.70
    heat: float = 0.30
    keyword: float = 0.15
    lexical: float = 0.40
    source: float = 0.30
    temporal: float = 0.40
    own_channel: float = 0.10
    temporal_fade_days: float = 7.0


@dataclass(frozen=True)
class ConfidenceBands:
    """Where a recall hit's confidence band starts, from its evidence of relevance (DESIGN §5).

    Attributes:
        high: Cosine similarity at or above which a hit is ``high``.
        mid: Cosine similarity at or above which a hit is ``mid``.
        keyword_similarity / keyword_overlap: A hit with at least this similarity and
            at least this share of the query's words is ``mid`` too.
    """

    high: float = 0.65
    mid: float = 0.50
    keyword_similarity: float = 0.45
    keyword_overlap: float = 0.50


@dataclass(frozen=True)
class DreamThresholds:
    """What a dream merges, promotes, prunes and archives (DESIGN §6).

    Attributes:
        conflict_similarity: Cosine at or above which two memories that disagree (a
            negation, a differing number) open a conflict.
        merge_similarity: Cosine every pair of a cluster reaches for it to merge.
        keystone_recalls / keystone_heat: Recalls and heat that make a keystone.
        semantic_importance / semantic_recalls: Importance and recalls that promote an
            episodic memory to semantic.
        archive_age_days / archive_heat / archive_importance / archive_recalls: Older
            than, and below each of, these a memory moves to cold storage.
        archive_exempt_types: Memory types archival never moves (nor keystones).
        prune_heat: Heat below which a ghost is pruned.
        channel_cooling: Share of the channel's heat a dream takes away.
        max_conflicts: Most conflicts one dream opens, the closest pairs first.
        interval_seconds: The curator's schedule: a dream this long after the last one
            (or after the setting is made); 0 (the default) dreams only when asked, when
            offered entropy crosses the threshold, or in a consolidation sweep.
        episode_min: The curator's episode summaries: a session of at least this many
            episodic memories (linked by sequence edges) not summarised yet gets one
            semantic memory of its most central sentences; 0 turns them off.
        episode_cooling: Share of each summarised memory's heat the summary takes away.
    """

    conflict_similarity: float = 0.80
    merge_similarity: float = 0.85
    keystone_recalls: int = 5
    keystone_heat: float = 0.70
    semantic_importance: float = 0.70
    semantic_recalls: int = 5
    archive_age_days: float = 90.0
    archive_heat: float = 0.15
    archive_importance: float = 0.30
    archive_recalls: int = 3
    archive_exempt_types: tuple[str, ...] = ("semantic", "procedural", "core")
    prune_heat: float = 1e-3
    channel_cooling: float = 0.50
    max_conflicts: int = 20
    interval_seconds: float = 0.0
    episode_min: int = 8
    episode_cooling: float = 0.50


@dataclass(frozen=True)
class IngestTuning:
    """How a store weighs a new memory against what the channel holds (DESIGN §4).

    Attributes:
        near_duplicate_similarity: Cosine to the nearest memory at or above which a new
            memory is a near-duplicate (it loses ``near_duplicate_penalty`` importance and
            confirms the older one).
        novelty_neighbours: Nearest memories a store compares a new one with.
        novelty_bonus: Most importance a novel memory gains.
        near_duplicate_penalty: Importance a near-duplicate loses.
        familiar_similarity / novel_similarity: Cosine to the nearest memory at or above
            which a memory earns no novelty bonus, and at or below which it earns all of
            it (linearly between).
        entity_hub: Memories naming one entity past which a store links no more of them
            by that entity (such hubs, often a capitalised word that merely opens many
            sentences, would tie the whole channel together).
    """

    near_duplicate_similarity: float = 0.95
    novelty_neighbours: int = 5
    novelty_bonus: float = 0.30
    near_duplicate_penalty: float = 0.20
    familiar_similarity: float = 0.85
    novel_similarity: float = 0.50
    entity_hub: int = 50


@dataclass(frozen=True)
class ContextWeights:
    """How Context ranks its candidates (DESIGN §8), and how long a block is reused.

    Attributes:
        similarity / heat / recency / source: The score's weights.
        reuse_seconds: How long the same message gets the byte-identical block back
            while nothing it shows changed (for prompt caches).
    """

    similarity: float = 0.40
    heat: float = 0.30
    recency: float = 0.20
    source: float = 0.10
    reuse_seconds: float = 300.0


BANDS = ("low", "mid", "high")
"""Recall's confidence bands, weakest first."""


@dataclass(frozen=True)
class ChannelPolicy:
    """Everything that governs how one channel's memories live and are found.

    Attributes:
        profiles: Decay profile per memory type.
        decay_mode: ``time`` (wall clock), ``interaction`` (the channel's store and
            recall calls, each worth ``interaction_unit_seconds``) or ``hybrid`` (the
            larger of the two clocks, half-life stretched by ``1 + utility``).
        decay_curve: The retention curve heat follows: ``exponential`` (DESIGN §3's
            formula), ``huber`` or ``elastic`` (see :mod:`calor.server.thermo.heat`).
        weights: Recall score weights.
        boost_delta: Heat a recall (or a boost without a delta) adds.
        cold_threshold: Below it a memory is COLD.
        cold_count_trigger: Cold memories in a channel that start a consolidation sweep.
        cold_migration_days: Days at its floor before a memory moves to cold storage.
        resonance_spread / resonance_damping / resonance_depth: How a recall's heat
            spreads along graph edges.
        thermal_gate: Memories below it neither receive nor pass resonance.
        survival_gate: Floor-0 memories below it are GHOSTs; with ``gate_fidelity``
            no memory below it is returned by recall.
        gate_fidelity / gate_heat_ceiling / gate_load: The optional gates.
        heat_ceiling: Channel heat above which recall is refused (heat-ceiling gate).
        recall_heat: Channel heat each recall adds.
        channel_heat_half_life_seconds: How fast channel heat cools.
        entropy_threshold: Offered bytes that start a dream.
        load_inflight_critical: In-flight calls at which the server counts as under
            critical load (load gate).
        load_reduced_limit: Most hits a recall returns under critical load.
        semantic_link_threshold / semantic_link_max: Nearest-neighbour graph links.
        entity_link_max: Most recent memories sharing an entity that a store links to.
        session_gap_seconds: Episodic memories closer than this share a session when
            no ``session`` tag is given.
        working_promotion_seconds / working_promotion_recalls: When working memory
            becomes episodic.
        default_importance: Importance of a memory stored without one, before trust.
        bands: Where recall's confidence bands start.
        dreams: What a dream merges, promotes, prunes and archives.
        ingest: Novelty and near-duplicate tuning of the store pipeline.
        heat_min_band: The least confidence band a recall hit needs to be heated
            (relevance before heat).
        context: How Context ranks candidates and reuses blocks.
        trigger_min_precision: Useful share of a trigger's rated firings (last 30 days,
            at least 20 rated) under which it is flagged.
        trigger_auto_pause: Whether a flagged trigger is paused, with an event saying why.
    """

    profiles: dict[str, TypeProfile] = field(default_factory=lambda: dict(DEFAULT_PROFILES))
    decay_mode: str = "time"
    decay_curve: str = "exponential"
    interaction_unit_seconds: float = 60.0
    weights: RecallWeights = field(default_factory=RecallWeights)
    boost_delta: float = 0.15
    cold_threshold: float = 0.10
    cold_count_trigger: int = 20
    cold_migration_days: float = 7.0
    resonance_spread: float = 0.30
    resonance_damping: float = 0.50
    resonance_depth: int = 2
    thermal_gate: float = 0.05
    survival_gate: float = 0.05
    gate_fidelity: bool = False
    gate_heat_ceiling: bool = False
    gate_load: bool = False
    heat_ceiling: float = 1.0
    recall_heat: float = 0.05
    channel_heat_half_life_seconds: float = 300.0
    entropy_threshold: int = 4096
    load_inflight_critical: int = 256
    load_reduced_limit: int = 3
    semantic_link_threshold: float = 0.75
    semantic_link_max: int = 8
    entity_link_max: int = 8
    session_gap_seconds: float = 1800.0
    working_promotion_seconds: float = 1800.0
    working_promotion_recalls: int = 2
    default_importance: float = 0.5
    bands: ConfidenceBands = field(default_factory=ConfidenceBands)
    dreams: DreamThresholds = field(default_factory=DreamThresholds)
    ingest: IngestTuning = field(default_factory=IngestTuning)
    heat_min_band: str = "mid"
    context: ContextWeights = field(default_factory=ContextWeights)
    trigger_min_precision: float = 0.5
    trigger_auto_pause: bool = False

    def profile(self, memory_type: str) -> TypeProfile:
        """The decay profile of a memory type."""
        return self.profiles[memory_type]

    def to_json(self) -> bytes:
        """The policy as JSON, for RocksDB."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ChannelPolicy:
        """A policy from :meth:`to_json`; fields missing from older versions keep defaults."""
        raw: dict[str, Any] = json.loads(data)
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        policy = cls()
        if "profiles" in values:
            profiles = dict(policy.profiles)
            profiles.update({k: TypeProfile(**v) for k, v in values.pop("profiles").items()})
            values["profiles"] = profiles
        for name, group in _GROUPS.items():
            if name in values:
                values[name] = _group(group, values[name])
        return replace(policy, **values)


_GROUPS: dict[str, type] = {
    "weights": RecallWeights,
    "bands": ConfidenceBands,
    "dreams": DreamThresholds,
    "ingest": IngestTuning,
    "context": ContextWeights,
}


def _group(group: type, raw: dict[str, Any]) -> Any:
    """A nested settings group from JSON; fields it lacks keep their defaults, fields it
    no longer has are dropped, and lists become the tuples the group holds."""
    known = {f.name for f in fields(group)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known}
    return group(**values)
