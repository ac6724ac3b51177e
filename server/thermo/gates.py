"""The three optional gates of a channel (DESIGN §3), each decided here and nowhere else.

*Fidelity*: recall returns no memory below the survival gate. *Heat ceiling*: a recall
that would lift the channel's heat over its ceiling is refused with RESOURCE_EXHAUSTED
and the seconds until it has cooled enough. *Load*: under critical server load, recall
returns a reduced number of hits.
"""

from __future__ import annotations

import math

from calor.server.errors import ResourceExhaustedError
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["active_gates", "ceiling_check", "fidelity_admits", "load_limit"]

_SLACK = 1e-9


def fidelity_admits(policy: ChannelPolicy, heat: float) -> bool:
    """Whether the fidelity gate lets a memory of this heat be returned by recall."""
    return not policy.gate_fidelity or heat >= policy.survival_gate


def ceiling_check(policy: ChannelPolicy, channel_heat: float) -> None:
    """Refuse a recall that would lift channel heat over the ceiling (when that gate is on).

    This is DESIGN §3's "when channel heat exceeds its ceiling": channel heat never
    exceeds it, because the recall that would make it is the one refused.

    Args:
        policy: The channel's policy.
        channel_heat: The channel's heat now, before this recall adds its own.

    Raises:
        ResourceExhaustedError: with ``retry_after``, the seconds until the channel has
            cooled enough for one more recall.
    """
    if not policy.gate_heat_ceiling:
        return
    if channel_heat + policy.recall_heat <= policy.heat_ceiling + _SLACK:
        return
    room = policy.heat_ceiling - policy.recall_heat
    half_life = policy.channel_heat_half_life_seconds
    wait = half_life * math.log2(channel_heat / (room if room > 0.0 else 1e-9))
    raise ResourceExhaustedError(
        f"this recall would raise channel heat from {channel_heat:.3f} to "
        f"{channel_heat + policy.recall_heat:.3f}, over the ceiling {policy.heat_ceiling:.3f}; "
        f"retry in {wait:.1f} s",
        retry_after=max(wait, 0.001),
    )


def load_limit(policy: ChannelPolicy, limit: int, inflight: int) -> int:
    """The most hits a recall may return with ``inflight`` calls in flight (this one
    counted): ``limit``, reduced under critical load when the load gate is on."""
    if policy.gate_load and inflight >= policy.load_inflight_critical:
        return min(limit, policy.load_reduced_limit)
    return limit


def active_gates(policy: ChannelPolicy) -> list[str]:
    """The gates switched on in a channel, by name."""
    gates = (
        ("fidelity", policy.gate_fidelity),
        ("heat_ceiling", policy.gate_heat_ceiling),
        ("load", policy.gate_load),
    )
    return [name for name, on in gates if on]
