"""A channel's own state: its cognitive heat, its interaction clock, offered entropy; and the
heat-ceiling gate that reads it.

Channel heat is computed like memory heat: stored as (heat0, t0), halving every
``channel_heat_half_life_seconds``; each recall adds ``recall_heat``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from calor.server.errors import ResourceExhaustedError
from calor.server.policy import ChannelPolicy

__all__ = ["ChannelState", "active_gates"]

_SLACK = 1e-9


@dataclass
class ChannelState:
    """What a channel remembers about itself, kept in RocksDB beside its memories."""

    heat0: float = 0.0
    t0: float = 0.0
    interactions: int = 0
    entropy: int = 0
    sweeps: int = 0

    def heat(self, policy: ChannelPolicy, now: float) -> float:
        """The channel's heat now."""
        if self.heat0 <= 0.0:
            return 0.0
        return self.heat0 * math.exp2(-(now - self.t0) / policy.channel_heat_half_life_seconds)

    def check_ceiling(self, policy: ChannelPolicy, now: float) -> None:
        """Refuse a recall that would lift channel heat over the ceiling (when that gate is on).

        Raises:
            ResourceExhaustedError: with the seconds until the channel has cooled enough.
        """
        if not policy.gate_heat_ceiling:
            return
        heat = self.heat(policy, now)
        room = policy.heat_ceiling - policy.recall_heat
        if heat + policy.recall_heat <= policy.heat_ceiling + _SLACK:
            return
        if room <= 0.0:
            wait = policy.channel_heat_half_life_seconds * math.log2(heat / 1e-9)
        else:
            wait = policy.channel_heat_half_life_seconds * math.log2(heat / room)
        raise ResourceExhaustedError(
            f"channel heat {heat:.3f} is at its ceiling {policy.heat_ceiling:.3f}; "
            f"retry in {wait:.1f} s",
            retry_after=max(wait, 0.001),
        )

    def recalled(self, policy: ChannelPolicy, now: float) -> None:
        """Add one recall's heat."""
        self.heat0 = self.heat(policy, now) + policy.recall_heat
        self.t0 = now

    def cool(self, policy: ChannelPolicy, now: float, factor: float = 0.5) -> None:
        """Drop channel heat by ``factor`` (a dream halves it)."""
        self.heat0 = self.heat(policy, now) * factor
        self.t0 = now

    def to_json(self) -> bytes:
        """The state as JSON, for RocksDB."""
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ChannelState:
        """A state from :meth:`to_json`."""
        return cls(**json.loads(data))


def active_gates(policy: ChannelPolicy) -> list[str]:
    """The gates switched on in a channel, by name."""
    gates = (
        ("fidelity", policy.gate_fidelity),
        ("heat_ceiling", policy.gate_heat_ceiling),
        ("load", policy.gate_load),
    )
    return [name for name, on in gates if on]
