"""A channel's policy: decay profiles, recall weights, thresholds and gates, with DESIGN's defaults.

A policy is a frozen record; changing a channel's settings swaps in a new one, and
every read after that uses it (stored memories are never rewritten).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from calor.server.heat import DEFAULT_PROFILES, TypeProfile

__all__ = ["DECAY_MODES", "ChannelPolicy", "RecallWeights"]

DECAY_MODES = ("time", "interaction", "hybrid")


@dataclass(frozen=True)
class RecallWeights:
    """How recall blends its signals into one score (DESIGN §5)."""

    similarity: float = 0.70
    heat: float = 0.30
    keyword: float = 0.15
    lexical: float = 0.10
    source: float = 0.30
    temporal: float = 0.40
    own_channel: float = 0.10
    temporal_fade_days: float = 7.0


@dataclass(frozen=True)
class ChannelPolicy:
    """Everything that governs how one channel's memories live and are found.

    Attributes:
        profiles: Decay profile per memory type.
        decay_mode: ``time`` (wall clock), ``interaction`` (the channel's store and
            recall calls, each worth ``interaction_unit_seconds``) or ``hybrid`` (the
            larger of the two clocks, half-life stretched by ``1 + utility``).
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
    """

    profiles: dict[str, TypeProfile] = field(default_factory=lambda: dict(DEFAULT_PROFILES))
    decay_mode: str = "time"
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
        if "weights" in values:
            values["weights"] = RecallWeights(**values["weights"])
        return replace(policy, **values)
