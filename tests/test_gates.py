"""The three gates (DESIGN §3), each decided by one function of calor.server.thermo.gates."""

from __future__ import annotations

import math

import pytest

from calor.server.errors import ResourceExhaustedError
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.gates import active_gates, ceiling_check, fidelity_admits, load_limit
from calor.server.thermo.policy import ChannelPolicy


def test_fidelity_admits_below_the_survival_gate_only_when_the_gate_is_off() -> None:
    off, on = ChannelPolicy(survival_gate=0.2), ChannelPolicy(survival_gate=0.2, gate_fidelity=True)
    assert fidelity_admits(off, 0.1) and fidelity_admits(off, 0.0)
    assert not fidelity_admits(on, 0.1)
    assert fidelity_admits(on, 0.2) and fidelity_admits(on, 0.9)


def test_the_heat_ceiling_refuses_with_the_time_to_cool() -> None:
    policy = ChannelPolicy(gate_heat_ceiling=True, heat_ceiling=0.2)
    ceiling_check(policy, 0.15)  # 0.15 + one recall's 0.05 is the ceiling: allowed
    with pytest.raises(ResourceExhaustedError) as caught:
        ceiling_check(policy, 0.2)
    assert caught.value.retry_after == pytest.approx(300 * math.log2(0.2 / 0.15))
    assert caught.value.message == (
        "this recall would raise channel heat from 0.200 to 0.250, over the ceiling 0.200; "
        f"retry in {300 * math.log2(0.2 / 0.15):.1f} s"
    )
    ceiling_check(ChannelPolicy(heat_ceiling=0.2), 0.9)  # the gate is off
    # No room for even one recall: the wait is until the channel is all but cold.
    tight = ChannelPolicy(gate_heat_ceiling=True, heat_ceiling=0.04)
    with pytest.raises(ResourceExhaustedError) as caught:
        ceiling_check(tight, 0.01)
    assert caught.value.retry_after == pytest.approx(300 * math.log2(0.01 / 1e-9))


def test_channel_state_asks_the_gate_with_its_heat_now() -> None:
    policy = ChannelPolicy(gate_heat_ceiling=True, heat_ceiling=0.2)
    state = ChannelState(heat0=0.4, t0=0.0)
    with pytest.raises(ResourceExhaustedError):
        state.check_ceiling(policy, 0.0)
    state.check_ceiling(policy, 600.0)  # two half-lives later: 0.1


def test_the_load_gate_reduces_the_limit_only_under_critical_load() -> None:
    on = ChannelPolicy(gate_load=True, load_reduced_limit=3)
    critical = on.load_inflight_critical
    assert load_limit(on, 10, inflight=critical) == 3
    assert load_limit(on, 2, inflight=critical + 5) == 2
    assert load_limit(on, 10, inflight=critical - 1) == 10
    assert load_limit(ChannelPolicy(load_reduced_limit=3), 10, inflight=critical) == 10


def test_active_gates_are_named_in_a_fixed_order() -> None:
    assert active_gates(ChannelPolicy()) == []
    every = ChannelPolicy(gate_load=True, gate_fidelity=True, gate_heat_ceiling=True)
    assert active_gates(every) == ["fidelity", "heat_ceiling", "load"]
