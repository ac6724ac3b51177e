"""The heat formulas against DESIGN §3's worked checks and the shared seed tables."""

from __future__ import annotations

import json
import math

import pytest

from calor.server.records import MemoryRecord
from calor.server.thermo.heat import (
    DEFAULT_PROFILES,
    SOURCE_TRUST,
    bumped,
    effective_half_life,
    heat_at,
    seconds_until,
)
from calor.server.thermo.lifecycle import (
    Clocks,
    apply_boost,
    apply_keystone,
    apply_recall,
    current_heat,
)
from calor.server.thermo.policy import ChannelPolicy
from tests.helpers import VECTORS

SEEDS = json.loads((VECTORS / "heat.json").read_text())
DAY = 86_400.0
MONTH = 365 * DAY / 12


def heat_of(
    memory_type: str, dt: float, stability: float = 1.0, source: str = "agent", heat0: float = 1.0
) -> float:
    profile = DEFAULT_PROFILES[memory_type]
    return heat_at(heat0, dt, effective_half_life(profile, stability, source), profile.floor)


def record(memory_type: str, t0: float = 0.0, **fields: object) -> MemoryRecord:
    return MemoryRecord(
        id="01J0000000000000000000000A",
        channel="c",
        text="x",
        memory_type=memory_type,
        created_at=t0,
        updated_at=t0,
        heat0=1.0,
        t0=t0,
        **fields,
    )  # type: ignore[arg-type]


def test_profiles_match_the_seed_table() -> None:
    for name, seed in SEEDS["profiles"].items():
        profile = DEFAULT_PROFILES[name]
        assert profile.half_life_seconds == seed["half_life_seconds"]
        assert profile.floor == seed["floor"]
        assert profile.stability_gain == seed["stability_gain"]


@pytest.mark.parametrize(
    "case", SEEDS["cases"], ids=lambda c: f"{c['memory_type']}-{c['source']}-{c['dt_seconds']}"
)
def test_seed_heats_match_to_1e9(case: dict[str, float | str]) -> None:
    got = heat_of(
        str(case["memory_type"]),
        float(case["dt_seconds"]),
        float(case["stability"]),
        str(case["source"]),
        float(case["heat0"]),
    )
    assert got == pytest.approx(float(case["heat"]), abs=1e-9)


@pytest.mark.parametrize("case", SEEDS["floor_times"], ids=lambda c: c["memory_type"])
def test_floor_reached_at_the_analytic_moment(case: dict[str, float | str]) -> None:
    profile = DEFAULT_PROFILES[str(case["memory_type"])]
    half_life = effective_half_life(profile, float(case["stability"]), "agent")
    at = seconds_until(profile.floor, float(case["heat0"]), half_life)
    assert at == pytest.approx(float(case["reaches_floor_after_seconds"]), abs=1e-3)
    migrated = at + ChannelPolicy().cold_migration_days * DAY
    assert migrated == pytest.approx(float(case["archived_after_seconds"]), abs=1e-3)


def test_worked_checks_of_design_section_3() -> None:
    # A fact with stability 2.5 after 12 months: 2^(-12/30).
    assert heat_of("fact", 12 * MONTH, stability=2.5) == pytest.approx(2 ** (-12 / 30), abs=1e-12)
    assert heat_of("fact", 12 * MONTH, stability=2.5) == pytest.approx(0.758, abs=5e-4)
    # A fact recalled three times: effective half-life 12 · 2.5³ = 187.5 months.
    fact = DEFAULT_PROFILES["fact"]
    assert effective_half_life(fact, 2.5**3, "agent") == pytest.approx(187.5 * MONTH)
    assert heat_of("episodic", DAY) == pytest.approx(0.5, abs=1e-12)
    assert heat_of("fact", 30 * DAY) == pytest.approx(2 ** (-30 / 365), abs=1e-12)
    assert heat_of("fact", 30 * DAY) == pytest.approx(0.944, abs=1e-3)
    assert heat_of("core", 30 * 365 * DAY) == pytest.approx(0.60, abs=1e-12)


def test_extracted_memories_decay_three_times_faster() -> None:
    assert heat_of("episodic", DAY / 3, source="extracted") == pytest.approx(0.5)
    assert heat_of("episodic", DAY / 3, source="human") > 0.79


def test_source_trust_weights() -> None:
    assert SOURCE_TRUST == {"human": 1.0, "agent": 0.7, "extracted": 0.7, "ingest": 0.5}


def test_seconds_until_edges() -> None:
    assert seconds_until(0.5, 0.4, 10.0) == 0.0
    assert seconds_until(0.0, 1.0, 10.0) == math.inf
    assert seconds_until(0.25, 1.0, 10.0) == pytest.approx(20.0)


def test_bump_is_capped_and_floored() -> None:
    assert bumped(0.95, 0.15) == 1.0
    assert bumped(0.1, -0.5) == 0.0


def test_recall_materialises_bumps_and_stretches_stability() -> None:
    policy = ChannelPolicy()
    memory = record("episodic")
    apply_recall(memory, policy, Clocks(DAY))
    assert memory.heat0 == pytest.approx(0.65)
    assert memory.t0 == DAY
    assert memory.stability == pytest.approx(1.5)
    assert memory.recall_count == 1 and memory.last_recalled_at == DAY
    # Next day it decays with half-life 1.5 days from 0.65.
    assert current_heat(memory, policy, Clocks(2 * DAY)) == pytest.approx(0.65 * 2 ** (-1 / 1.5))


def test_fact_recalled_three_times_decays_with_187_5_month_half_life() -> None:
    policy = ChannelPolicy()
    memory = record("fact")
    for _ in range(3):
        apply_recall(memory, policy, Clocks(0.0))
    assert memory.stability == pytest.approx(2.5**3)
    later = current_heat(memory, policy, Clocks(187.5 * MONTH))
    assert later == pytest.approx(memory.heat0 / 2)


def test_keystone_freezes_heat_and_recalls_still_bump_it() -> None:
    policy = ChannelPolicy()
    memory = record("episodic")
    apply_keystone(memory, policy, Clocks(DAY), on=True)
    assert current_heat(memory, policy, Clocks(100 * DAY)) == pytest.approx(0.5)
    apply_recall(memory, policy, Clocks(100 * DAY))
    assert current_heat(memory, policy, Clocks(400 * DAY)) == pytest.approx(0.65)
    apply_keystone(memory, policy, Clocks(400 * DAY), on=False)
    assert current_heat(memory, policy, Clocks(401 * DAY)) == pytest.approx(0.65 * 2 ** (-1 / 1.5))


def test_boost_adds_and_cools() -> None:
    policy = ChannelPolicy()
    memory = record("semantic")
    apply_boost(memory, policy, Clocks(0.0), delta=-0.5)
    assert current_heat(memory, policy, Clocks(0.0)) == pytest.approx(0.5)
