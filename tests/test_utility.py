"""Utility: a bounded blend of importance and the evidence of use (DESIGN §4)."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import pytest

from calor.server.thermo.utility import UtilityWeights, act_r_activation, utility

DAY = 86_400.0
NOW = 1_000 * DAY
BASE: dict[str, Any] = {
    "importance": 0.5,
    "memory_type": "semantic",
    "source": "agent",
    "valence": 0.0,
    "recall_times": [],
    "created_at": NOW - 30 * DAY,
    "confirmations": 0,
    "now": NOW,
}


def u(**changes: Any) -> float:
    return utility(**{**BASE, **changes})


def test_default_weights_sum_to_one() -> None:
    assert math.isclose(UtilityWeights().total, 1.0)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"importance": 0.0, "memory_type": "working", "source": "ingest"},
        {
            "importance": 1.0,
            "memory_type": "core",
            "source": "human",
            "valence": -1.0,
            "recall_times": [NOW - d * DAY for d in range(50)],
            "confirmations": 100,
        },
        {
            "importance": 7.0,
            "valence": 3.0,
            "confirmations": -4,
            "memory_type": "nonsense",
            "source": "nobody",
            "recall_times": [NOW + DAY, NOW + 2 * DAY],
        },
        {"importance": math.nan},
        {"recall_times": [NOW] * 10},
    ],
)
def test_utility_is_bounded(changes: dict[str, Any]) -> None:
    assert 0.0 <= u(**changes) <= 1.0


def test_monotonic_in_importance() -> None:
    values = [u(importance=i / 10) for i in range(11)]
    assert values == sorted(values)
    assert values[-1] > values[0]


def test_more_recalls_raise_it() -> None:
    few = u(recall_times=[NOW - 3 * DAY, NOW - DAY])
    more = u(recall_times=[NOW - d * DAY for d in (5, 4, 3, 2, 1)])
    assert more > few > u()


def test_steady_recalls_beat_one_burst_of_the_same_count() -> None:
    last = NOW - 3_600.0
    steady = [last - d * DAY for d in range(5)]
    burst = [last - s * 10.0 for s in range(5)]
    assert u(recall_times=steady) > u(recall_times=burst)
    assert u(recall_times=burst[:2]) == pytest.approx(u(recall_times=burst[:2]))


def test_source_trust_orders_it() -> None:
    assert u(source="human") > u(source="agent") == u(source="extracted") > u(source="ingest")


def test_type_boost_orders_it() -> None:
    assert u(memory_type="core") > u(memory_type="fact") > u(memory_type="episodic")
    assert u(memory_type="semantic") > u(memory_type="episodic") > u(memory_type="working")


def test_valence_magnitude_raises_it() -> None:
    assert u(valence=0.8) == u(valence=-0.8) > u(valence=0.0)


def test_confirmations_raise_it_and_saturate() -> None:
    values = [u(confirmations=c) for c in (0, 1, 2, 5, 20, 40)]
    assert values == sorted(values) and values[1] > values[0]
    assert values[2] - values[1] < values[1] - values[0]
    assert values[-1] - values[-2] < 1e-4  # 20 → 40 confirmations adds almost nothing


def test_recent_use_beats_old_use() -> None:
    assert u(recall_times=[NOW - DAY]) > u(recall_times=[NOW - 60 * DAY])


def test_act_r_activation_against_a_hand_computation() -> None:
    now = 10_000.0
    times = [now - 100.0, now - 400.0, now - 2_500.0]
    # 100^-0.5 + 400^-0.5 + 2500^-0.5 = 0.1 + 0.05 + 0.02 = 0.17
    assert act_r_activation(times, now) == pytest.approx(math.log(0.17), abs=1e-12)


def test_act_r_activation_edges() -> None:
    assert act_r_activation([], 5.0) == -math.inf
    assert act_r_activation([5.0], 5.0) == 0.0  # Δt clamped to one second: ln 1
    assert act_r_activation([9.0], 5.0) == 0.0  # a presentation in the future, too


def test_no_recalls_uses_creation_as_the_one_presentation() -> None:
    fresh = u(created_at=NOW - 60.0)
    stale = u(created_at=NOW - 300 * DAY)
    assert fresh > stale


def test_custom_weights_are_normalised_and_validated() -> None:
    others = {f.name: 0.0 for f in fields(UtilityWeights) if f.name != "importance"}
    only_importance = UtilityWeights(importance=2.0, **others)
    assert u(importance=0.3, weights=only_importance) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        UtilityWeights(importance=-0.1)
    with pytest.raises(ValueError):
        UtilityWeights(0, 0, 0, 0, 0, 0, 0, 0, 0)
