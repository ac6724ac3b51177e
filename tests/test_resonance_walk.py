"""Resonance walked in bulk over the packed graph gives exactly what the rule says,
walked one memory at a time (DESIGN §3), on any graph, heats and depth."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calor.server.thermo.graph import Graph
from calor.server.thermo.policy import ChannelPolicy
from calor.server.thermo.resonance import Reach, one_by_one, resonance

IDS = [f"m{i}" for i in range(12)]


def walked_one_at_a_time(
    graph: Graph,
    recalled: Mapping[str, float],
    reach: Callable[[str], Reach | None],
    policy: ChannelPolicy,
) -> dict[str, float]:
    """The rule as written: from each recalled memory, hop by hop, each memory seen once
    per source; the largest gain wins."""
    gains: dict[str, float] = {}
    for source, heat in recalled.items():
        frontier, seen = [source], {source}
        for hop in range(1, policy.resonance_depth + 1):
            gain = policy.resonance_spread * heat * policy.resonance_damping ** (hop - 1)
            passing: list[str] = []
            for node in frontier:
                for other in graph.neighbours(node):
                    if other in seen:
                        continue
                    seen.add(other)
                    found = reach(other)
                    if found is None or other in recalled:
                        continue
                    passes = found.heat >= policy.thermal_gate
                    if passes or found.archived:
                        gains[other] = max(gains.get(other, 0.0), gain)
                    if passes:
                        passing.append(other)
            frontier = passing
    return gains


_reach = st.one_of(
    st.none(),
    st.builds(Reach, st.sampled_from([0.0, 0.01, 0.05, 0.3, 1.0]), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(
    edges=st.lists(
        st.tuples(st.sampled_from(IDS), st.sampled_from(IDS), st.sampled_from(["entity", "echo"])),
        max_size=40,
    ),
    reaches=st.fixed_dictionaries({i: _reach for i in IDS}),
    recalled=st.dictionaries(st.sampled_from(IDS), st.floats(0.0, 1.0), max_size=4),
    depth=st.integers(0, 4),
)
def test_the_bulk_walk_gives_what_the_rule_gives(
    edges: list[tuple[str, str, str]],
    reaches: dict[str, Reach | None],
    recalled: dict[str, float],
    depth: int,
) -> None:
    graph = Graph()
    for a, b, kind in edges:
        graph.add(a, b, kind, 1.0)
    policy = ChannelPolicy(resonance_depth=depth)
    asked: list[list[str]] = []

    def judge_counted(memory_ids: list[str]):  # type: ignore[no-untyped-def]
        asked.append(memory_ids)
        return one_by_one(reaches.get)(memory_ids)

    bulk = resonance(graph, recalled, judge_counted, policy)
    expected = walked_one_at_a_time(graph, recalled, reaches.get, policy)
    assert bulk == pytest.approx(expected, abs=1e-12)
    assert len(asked) <= depth, "the memories each hop reaches are judged in one batch"
    judged = [memory_id for ids in asked for memory_id in ids]
    assert len(judged) == len(set(judged)), "each memory is judged once"
    assert not set(judged) & set(recalled), "recalled memories are not asked about"
