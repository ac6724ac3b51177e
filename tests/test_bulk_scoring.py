"""Recall scores its candidates in bulk from packed columns; each memory must get exactly
the score, heat, band and verdict the per-record formula gives it, whatever its type,
source, state, age, decay mode or the query's filters (pure logic: a real FAISS and BM25
index over generated records, no server)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calor.server.commands import RecallQuery
from calor.server.recall.index import ChannelIndex
from calor.server.recall.ranking import Hit, rank_channel
from calor.server.recall.temporal import TimeWindow
from calor.server.records import ACTIVE, ARCHIVED, COLD, MemoryRecord
from calor.server.thermo.heat import DECAY_CURVES, MEMORY_TYPES, SOURCE_TRUST
from calor.server.thermo.lifecycle import DAY, Clocks
from calor.server.thermo.policy import ChannelPolicy

DIM = 8
NOW = 1_800_000_000.0
WORDS = ["alpha", "beta", "gamma", "delta", "oslo", "paris", "tea", "coffee"]

records_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "memory_type": st.sampled_from(MEMORY_TYPES),
            "source": st.sampled_from([*SOURCE_TRUST, "robot"]),
            "state": st.sampled_from([ACTIVE, COLD, ARCHIVED]),
            "heat0": st.sampled_from([0.0, 0.01, 0.05, 0.1, 1.0]) | st.floats(0.0, 1.0),
            "age_days": st.sampled_from([0.0, 1.0, 10.0, 20.0, 40.0]) | st.floats(0.0, 400.0),
            "stability": st.floats(0.5, 20.0),
            "utility": st.floats(0.0, 1.0),
            "keystone": st.booleans(),
            "superseded": st.booleans(),
            "interactions0": st.integers(0, 50),
            "words": st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
        }
    ),
    min_size=1,
    max_size=80,
)

query_strategy = st.fixed_dictionaries(
    {
        "words": st.lists(st.sampled_from(WORDS), min_size=0, max_size=3),
        "states": st.sampled_from([frozenset(), frozenset({ACTIVE}), frozenset({COLD, ARCHIVED})]),
        "memory_types": st.sampled_from([frozenset(), frozenset({"fact", "working"})]),
        "min_heat": st.sampled_from([0.0, 0.05, 0.3]),
        "min_band": st.sampled_from(["", "mid"]),
        "include_archived": st.booleans(),
        "window_days": st.sampled_from([None, (20.0, 10.0), (0.5, 0.0)]),
        "decay_mode": st.sampled_from(["time", "interaction", "hybrid"]),
        "decay_curve": st.sampled_from(DECAY_CURVES),
        "gate_fidelity": st.booleans(),
        "asks_agent": st.booleans(),
    }
)


def build(
    specs: list[dict[str, object]], seed: int
) -> tuple[ChannelIndex, dict[str, MemoryRecord]]:
    rng = np.random.default_rng(seed)
    index = ChannelIndex(DIM)
    records: dict[str, MemoryRecord] = {}
    for i, spec in enumerate(specs):
        age = float(spec["age_days"]) * DAY  # type: ignore[arg-type]
        record = MemoryRecord(
            id=f"m{i:03d}",
            channel="c",
            text=" ".join(spec["words"]),  # type: ignore[arg-type]
            memory_type=str(spec["memory_type"]),
            created_at=NOW - age,
            updated_at=NOW - age / 2,
            heat0=float(spec["heat0"]),  # type: ignore[arg-type]
            t0=NOW - age / 2,
            stability=float(spec["stability"]),  # type: ignore[arg-type]
            utility=float(spec["utility"]),  # type: ignore[arg-type]
            keystone=bool(spec["keystone"]),
            state=str(spec["state"]),
            source=str(spec["source"]),
            interactions0=int(spec["interactions0"]),  # type: ignore[call-overload]
            tags={"superseded_by": "m999"} if spec["superseded"] else {},
        )
        records[record.id] = record
        vector = rng.normal(size=DIM).astype(np.float32)
        index.add([record], (vector / np.linalg.norm(vector)).reshape(1, DIM))
    return index, records


def ranked(hits: list[Hit]) -> list[Hit]:
    return sorted(hits, key=lambda h: (-h.score, h.record.id))


def rank(index, records, policy, query, vector, window, clocks, top=None, bulk=True):  # type: ignore[no-untyped-def]
    return rank_channel((index,), records, policy, query, vector, window, clocks, True, top, bulk)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records_strategy, query_strategy, st.integers(0, 2**16))
def test_bulk_scores_equal_the_per_record_formula(specs, spec, seed) -> None:  # type: ignore[no-untyped-def]
    index, records = build(specs, seed)
    policy = replace(
        ChannelPolicy(),
        decay_mode=spec["decay_mode"],
        decay_curve=spec["decay_curve"],
        gate_fidelity=spec["gate_fidelity"],
    )
    text = " ".join(spec["words"]) + (" what did you recommend" if spec["asks_agent"] else "")
    query = RecallQuery(
        channel="c",
        query=text,
        limit=5,
        states=spec["states"],
        memory_types=spec["memory_types"],
        min_heat=spec["min_heat"],
        min_band=spec["min_band"],
        include_archived=spec["include_archived"],
    )
    window = None
    if spec["window_days"] is not None:
        back, forward = spec["window_days"]
        window = TimeWindow(
            start=datetime.fromtimestamp(NOW - back * DAY, UTC),
            end=datetime.fromtimestamp(NOW - forward * DAY, UTC),
            phrase="",
        )
    clocks = Clocks(NOW, interactions=60)
    vector = np.random.default_rng(seed + 1).normal(size=DIM).astype(np.float32)
    vector /= np.linalg.norm(vector)

    bulk = ranked(rank(index, records, policy, query, vector, window, clocks))
    each = ranked(rank(index, records, policy, query, vector, window, clocks, bulk=False))

    assert [h.record.id for h in bulk] == [h.record.id for h in each]
    for got, want in zip(bulk, each, strict=True):
        assert got.score == pytest.approx(want.score, rel=1e-9, abs=1e-12)
        assert got.heat == pytest.approx(want.heat, rel=1e-9, abs=1e-12)
        assert got.temporal == pytest.approx(want.temporal, rel=1e-9, abs=1e-12)
        assert (got.band, got.keyword, got.source) == (want.band, want.keyword, want.source)
        assert got.record == want.record  # the record as it stands now, evolved

    best = rank(index, records, policy, query, vector, window, clocks, top=3)
    assert [h.record.id for h in ranked(best)] == [h.record.id for h in each[:3]]


def test_a_changed_record_is_scored_with_its_new_heat() -> None:
    """The columns follow the record: after a put, recall sees the new heat at once."""
    oslo = {
        "memory_type": "fact",
        "source": "human",
        "state": ACTIVE,
        "heat0": 0.2,
        "age_days": 0.0,
        "stability": 1.0,
        "utility": 0.5,
        "keystone": False,
        "superseded": False,
        "interactions0": 0,
        "words": ["oslo"],
    }
    # A second candidate, so that the recall has a spread of relevance for heat to act in.
    index, records = build([oslo, {**oslo, "words": ["bergen"]}], seed=3)
    policy, clocks = ChannelPolicy(), Clocks(NOW)
    query = RecallQuery(channel="c", query="oslo", peek=True)
    vector = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)

    def ranked_first() -> Hit:
        hits = rank(index, records, policy, query, vector, None, clocks)
        return next(h for h in hits if h.record.id == "m000")

    before = ranked_first()
    hotter = replace(records["m000"], heat0=0.9)
    records["m000"] = hotter
    index.refresh(hotter)
    after = ranked_first()
    assert after.heat == pytest.approx(0.9)
    assert after.spread == pytest.approx(before.spread)
    assert after.spread > 0.0
    assert after.score - before.score == pytest.approx(policy.weights.heat * 0.7 * after.spread)


GRID_AGES = [0.0, 0.3, 2.0, 9.0, 15.0, 25.0, 60.0, 200.0, 400.0]
GRID_HEATS = [0.0, 0.01, 0.04, 0.2, 0.6, 1.0]


def grid_specs() -> list[dict[str, object]]:
    """Every type, state and keystone flag at ages and heats either side of the floors,
    the cold threshold and the migration moment."""
    specs: list[dict[str, object]] = []
    for memory_type in MEMORY_TYPES:
        for state in (ACTIVE, COLD, ARCHIVED):
            for keystone in (False, True):
                for age in GRID_AGES:
                    for heat0 in GRID_HEATS:
                        i = len(specs)
                        specs.append(
                            {
                                "memory_type": memory_type,
                                "source": [*SOURCE_TRUST, "robot"][i % 5],
                                "state": state,
                                "heat0": heat0,
                                "age_days": age,
                                "stability": 1.0 + i % 3,
                                "utility": (i % 4) / 3,
                                "keystone": keystone,
                                "superseded": i % 7 == 0,
                                "interactions0": i % 50,
                                "words": [WORDS[i % 8], WORDS[i % 5]],
                            }
                        )
    return specs


@pytest.mark.parametrize("decay_curve", DECAY_CURVES)
@pytest.mark.parametrize("decay_mode", ["time", "interaction", "hybrid"])
@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"include_archived": True},
        {"states": frozenset({COLD, ARCHIVED})},
        {"min_heat": 0.05, "min_band": "mid"},
    ],
)
def test_bulk_scores_equal_the_formula_over_a_grid(
    decay_mode: str,
    decay_curve: str,
    filters: dict,  # type: ignore[type-arg]
) -> None:
    specs = grid_specs()
    index, records = build(specs, seed=11)
    policy = replace(ChannelPolicy(), decay_mode=decay_mode, decay_curve=decay_curve)
    query = RecallQuery(channel="c", query="oslo tea alpha", limit=len(specs), **filters)
    clocks = Clocks(NOW, interactions=60)
    vector = np.full(DIM, 1 / np.sqrt(DIM), dtype=np.float32)
    bulk = ranked(rank(index, records, policy, query, vector, None, clocks))
    each = ranked(rank(index, records, policy, query, vector, None, clocks, bulk=False))
    assert len(each) > 50
    assert [h.record.id for h in bulk] == [h.record.id for h in each]
    assert [h.score for h in bulk] == pytest.approx([h.score for h in each], rel=1e-9)
    assert [h.record.state for h in bulk] == [h.record.state for h in each]
