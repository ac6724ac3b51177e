"""A channel's own state: its cognitive heat, its interaction clock, offered entropy; and the
heat-ceiling gate that reads it (decided in :mod:`calor.server.thermo.gates`).

Channel heat is computed like memory heat: stored as (heat0, t0), halving every
``channel_heat_half_life_seconds``; each recall adds ``recall_heat``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from calor.server.thermo.gates import active_gates, ceiling_check
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["RECENT_DREAMS", "ChannelState", "active_gates"]

RECENT_DREAMS = 5
"""Dreams a channel's state keeps the report of."""


@dataclass
class ChannelState:
    """What a channel remembers about itself, kept in RocksDB beside its memories."""

    heat0: float = 0.0
    t0: float = 0.0
    interactions: int = 0
    entropy: int = 0
    sweeps: int = 0
    last_dream_at: float = 0.0
    """When the channel last dreamt (a consolidation sweep aside); 0 if never."""
    recent_dreams: list[dict[str, float]] = field(default_factory=list)
    """Its latest dreams and sweeps, oldest first (at most :data:`RECENT_DREAMS`): each
    report's counts, with ``at`` and ``sweep`` (1.0 for a consolidation sweep)."""

    def dreamt(self, at: float, sweep: bool, counts: dict[str, float]) -> None:
        """Keep a dream's (or sweep's) counts among the recent ones."""
        entry = {"at": at, "sweep": float(sweep), **counts}
        self.recent_dreams = [*self.recent_dreams[-(RECENT_DREAMS - 1) :], entry]

    def heat(self, policy: ChannelPolicy, now: float) -> float:
        """The channel's heat now."""
        if self.heat0 <= 0.0:
            return 0.0
        return self.heat0 * math.exp2(-(now - self.t0) / policy.channel_heat_half_life_seconds)

    def check_ceiling(self, policy: ChannelPolicy, now: float) -> None:
        """Refuse a recall that would lift channel heat over the ceiling (when that gate is
        on); the gate itself is :func:`calor.server.thermo.gates.ceiling_check`.

        Raises:
            ResourceExhaustedError: with the seconds until the channel has cooled enough.
        """
        ceiling_check(policy, self.heat(policy, now))

    def recalled(self, policy: ChannelPolicy, now: float) -> None:
        """Add one recall's heat."""
        self.heat0 = self.heat(policy, now) + policy.recall_heat
        self.t0 = now

    def cool(self, policy: ChannelPolicy, now: float) -> None:
        """Take a dream's share of channel heat (``dreams.channel_cooling``: half by default)."""
        self.heat0 = self.heat(policy, now) * (1.0 - policy.dreams.channel_cooling)
        self.t0 = now

    def to_json(self) -> bytes:
        """The state as JSON, for RocksDB."""
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ChannelState:
        """A state from :meth:`to_json`."""
        return cls(**json.loads(data))
