"""A channel's policy: decay profiles, recall weights and thresholds, with DESIGN's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from calor.server.heat import DEFAULT_PROFILES, TypeProfile

__all__ = ["ChannelPolicy", "RecallWeights"]


@dataclass(frozen=True)
class RecallWeights:
    """How recall blends its signals into one score (DESIGN §5)."""

    similarity: float = 0.70
    heat: float = 0.30
    keyword: float = 0.15
    temporal: float = 0.40
    own_channel: float = 0.10
    temporal_fade_days: float = 7.0


@dataclass(frozen=True)
class ChannelPolicy:
    """Everything that governs how one channel's memories live and are found."""

    profiles: dict[str, TypeProfile] = field(default_factory=lambda: dict(DEFAULT_PROFILES))
    weights: RecallWeights = field(default_factory=RecallWeights)
    boost_delta: float = 0.15
    cold_threshold: float = 0.10
    cold_migration_days: float = 7.0
    default_importance: float = 0.5

    def profile(self, memory_type: str) -> TypeProfile:
        """The decay profile of a memory type."""
        return self.profiles[memory_type]
