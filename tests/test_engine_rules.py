"""Pure rules of the engine: resonance (seed table), decay modes, channel heat, migration."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from calor.server.clock import ManualClock
from calor.server.engine.channel import Channel
from calor.server.errors import ResourceExhaustedError
from calor.server.records import MemoryRecord
from calor.server.storage.ops import AddMemory, ChangeList, PutMemory
from calor.server.thermo.channel_state import ChannelState, active_gates
from calor.server.thermo.graph import Graph
from calor.server.thermo.lifecycle import Clocks, current_heat, evolve, migrate_at, next_change_at
from calor.server.thermo.policy import ChannelPolicy
from calor.server.thermo.resonance import Reach, one_by_one, resonance
from tests.helpers import DAY, VECTORS

SEEDS = json.loads((VECTORS / "heat.json").read_text())["resonance"]


def record(memory_type: str = "episodic", **fields: object) -> MemoryRecord:
    base: dict[str, object] = dict(
        id="01J0000000000000000000000A",
        channel="c",
        text="x",
        memory_type=memory_type,
        created_at=0.0,
        updated_at=0.0,
        heat0=1.0,
        t0=0.0,
    )
    base.update(fields)
    return MemoryRecord(**base)  # type: ignore[arg-type]


def chain(heats: dict[str, float], edges: list[tuple[str, str]]) -> tuple[Graph, dict[str, Reach]]:
    graph = Graph()
    for a, b in edges:
        graph.add(a, b, "manual", 1.0)
    return graph, {name: Reach(h) for name, h in heats.items()}


def test_seed_example_heat_080_gives_each_neighbour_024() -> None:
    seed = SEEDS[0]
    graph, reach = chain(
        {"n1": 0.5, "n2": 0.5, "far": 0.5}, [("r", "n1"), ("r", "n2"), ("n1", "far")]
    )
    policy = ChannelPolicy(resonance_spread=seed["spread"], resonance_damping=seed["damping"])
    gains = resonance(graph, {"r": seed["recalled_heat_after_bump"]}, one_by_one(reach.get), policy)
    assert gains["n1"] == pytest.approx(seed["gain_hop1"], abs=1e-9)
    assert gains["n2"] == pytest.approx(seed["gain_hop1"], abs=1e-9)
    assert gains["far"] == pytest.approx(seed["gain_hop2"], abs=1e-9)


def test_seed_example_with_the_thermal_gate() -> None:
    seed = SEEDS[1]
    graph, reach = chain(
        {
            "n": seed["neighbour_before"],
            "two": seed["two_hop_before"],
            "gated": seed["gated_neighbour_before"],
            "behind": 0.5,
        },
        [("r", "n"), ("n", "two"), ("r", "gated"), ("gated", "behind")],
    )
    gains = resonance(
        graph, {"r": seed["recalled_heat_after_bump"]}, one_by_one(reach.get), ChannelPolicy()
    )
    assert seed["neighbour_before"] + gains["n"] == pytest.approx(seed["neighbour_after"], abs=1e-9)
    assert seed["two_hop_before"] + gains["two"] == pytest.approx(seed["two_hop_after"], abs=1e-9)
    assert "gated" not in gains and "behind" not in gains


def test_a_neighbour_reached_twice_takes_the_largest_gain_once() -> None:
    graph, reach = chain(
        {"a": 0.5, "b": 0.5, "x": 0.5}, [("r1", "a"), ("a", "x"), ("r2", "x"), ("r1", "b")]
    )
    gains = resonance(graph, {"r1": 1.0, "r2": 0.6}, one_by_one(reach.get), ChannelPolicy())
    assert gains["x"] == pytest.approx(max(0.3 * 1.0 * 0.5, 0.3 * 0.6))
    assert gains["a"] == pytest.approx(0.3)


def test_depth_limits_the_spread() -> None:
    graph, reach = chain({"1": 0.5, "2": 0.5, "3": 0.5}, [("r", "1"), ("1", "2"), ("2", "3")])
    gains = resonance(graph, {"r": 1.0}, one_by_one(reach.get), ChannelPolicy())
    assert set(gains) == {"1", "2"}


def test_archived_neighbours_come_back_and_pass_heat_as_any_memory_at_their_heat() -> None:
    graph = Graph()
    graph.add("r", "old", "manual", 1.0)
    graph.add("old", "beyond", "manual", 1.0)
    below_gate = {"old": Reach(0.01, archived=True), "beyond": Reach(0.5)}
    gains = resonance(graph, {"r": 1.0}, one_by_one(below_gate.get), ChannelPolicy())
    assert gains == {"old": pytest.approx(0.3)}, "below the thermal gate: back, passing nothing"
    for archived in (True, False):  # at the gate (a semantic floor): passes on, archived or not
        at_gate = {"old": Reach(0.05, archived=archived), "beyond": Reach(0.5)}
        gains = resonance(graph, {"r": 1.0}, one_by_one(at_gate.get), ChannelPolicy())
        assert gains == {"old": pytest.approx(0.3), "beyond": pytest.approx(0.3 * 0.5)}


def test_interaction_mode_decays_by_the_channel_clock() -> None:
    policy = ChannelPolicy(decay_mode="interaction", interaction_unit_seconds=3600.0)
    memory = record(interactions0=10)
    assert current_heat(memory, policy, Clocks(now=10 * DAY, interactions=10)) == 1.0
    assert current_heat(memory, policy, Clocks(now=0.0, interactions=34)) == pytest.approx(0.5)


def test_hybrid_mode_takes_the_faster_clock_and_stretches_by_utility() -> None:
    policy = ChannelPolicy(decay_mode="hybrid", interaction_unit_seconds=3600.0)
    memory = record(utility=1.0)
    assert current_heat(memory, policy, Clocks(now=2 * DAY, interactions=0)) == pytest.approx(0.5)
    assert current_heat(memory, policy, Clocks(now=0.0, interactions=48)) == pytest.approx(0.5)
    assert current_heat(memory, policy, Clocks(now=2 * DAY, interactions=96)) == pytest.approx(0.25)


def test_migration_moment_matches_the_seed_floor_times() -> None:
    policy = ChannelPolicy()
    for seed in json.loads((VECTORS / "heat.json").read_text())["floor_times"]:
        memory = record(seed["memory_type"])
        assert migrate_at(memory, policy) == pytest.approx(seed["archived_after_seconds"], abs=1e-3)
    assert migrate_at(record("fact"), policy) == math.inf
    assert migrate_at(record("core"), policy) == math.inf
    assert migrate_at(record("episodic", keystone=True), policy) == math.inf


def test_evolve_reports_each_state_at_its_moment() -> None:
    policy = ChannelPolicy()
    memory = record("episodic")
    assert evolve(memory, policy, Clocks(0.5 * DAY)).state == "active"
    assert evolve(memory, policy, Clocks(4 * DAY)).state == "cold"
    assert evolve(memory, policy, Clocks(14 * DAY)).state == "archived"
    assert evolve(memory, policy, Clocks(14 * DAY)) is not memory
    assert evolve(memory, policy, Clocks(0.5 * DAY)) is memory
    working = record("working")
    promoted = evolve(working, policy, Clocks(3600.0))
    assert promoted.memory_type == "episodic"
    assert promoted.heat0 == pytest.approx(2**-0.5)
    assert next_change_at(working, policy) == pytest.approx(1800.0)


def test_channel_heat_halves_every_five_minutes_and_gates() -> None:
    policy = ChannelPolicy(gate_heat_ceiling=True, heat_ceiling=0.2)
    state = ChannelState()
    for _ in range(4):
        state.check_ceiling(policy, 0.0)
        state.recalled(policy, 0.0)
    assert state.heat(policy, 0.0) == pytest.approx(0.2)
    assert state.heat(policy, 300.0) == pytest.approx(0.1)
    with pytest.raises(ResourceExhaustedError) as caught:
        state.check_ceiling(policy, 0.0)
    assert caught.value.retry_after == pytest.approx(300 * math.log2(0.2 / 0.15))
    state.check_ceiling(policy, caught.value.retry_after or 0.0)
    state.cool(policy, 0.0)
    assert state.heat(policy, 0.0) == pytest.approx(0.1)
    assert active_gates(policy) == ["heat_ceiling"]


def test_a_channel_changed_many_times_keeps_a_bounded_schedule() -> None:
    """Each change schedules the memory's next state change anew; the outdated moments
    are dropped before they pile up, and the earliest real one stays."""
    clock = ManualClock(1_000.0)
    view = Channel(name="c", dim=4, policy=ChannelPolicy(), clock=clock)
    kept = record(id="keep", t0=1_000.0, created_at=1_000.0)
    busy = record(id="busy", t0=1_000.0, created_at=1_000.0)
    vector = np.ones(4, dtype=np.float32) / 2
    view.apply(ChangeList("c", [AddMemory(kept, vector), AddMemory(busy, vector)]))
    for step in range(3_000):
        hotter = replace(busy, heat0=0.5 + step / 10_000, t0=1_000.0 + step)
        view.apply(ChangeList("c", [PutMemory(hotter)]))
    assert len(view.schedule) <= 2 * len(view.records) + 1024
    for memory in view.records.values():  # every memory's coming change is still there
        assert (next_change_at(memory, view.policy), memory.id) in view.schedule
