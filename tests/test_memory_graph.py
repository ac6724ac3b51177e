"""The packed memory graph answers exactly as a plain adjacency map would, through any
sequence of links, unlinks and removals."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from calor.server.thermo.graph import EDGE_KINDS, Edge, Graph

IDS = [f"m{i}" for i in range(8)]

_link = st.tuples(
    st.just("add"),
    st.sampled_from(IDS),
    st.sampled_from(IDS),
    st.sampled_from(EDGE_KINDS),
    st.floats(0.0, 1.0),
)
_unlink = st.tuples(
    st.just("unlink"), st.sampled_from(IDS), st.sampled_from(IDS), st.sampled_from(EDGE_KINDS)
)
_remove = st.tuples(st.just("remove"), st.sampled_from(IDS))


class PlainGraph:
    """The reference: id → neighbour → kind → weight, both ends kept."""

    def __init__(self) -> None:
        self.adjacent: dict[str, dict[str, dict[str, float]]] = {}

    def add(self, a: str, b: str, kind: str, weight: float) -> float:
        for here, there in ((a, b), (b, a)):
            kinds = self.adjacent.setdefault(here, {}).setdefault(there, {})
            kinds[kind] = max(weight, kinds.get(kind, weight))
        return self.adjacent[a][b][kind]

    def unlink(self, a: str, b: str, kind: str) -> None:
        for here, there in ((a, b), (b, a)):
            kinds = self.adjacent.get(here, {}).get(there)
            if kinds is not None:
                kinds.pop(kind, None)
                if not kinds:
                    del self.adjacent[here][there]

    def remove(self, memory_id: str) -> set[tuple[str, str, str, float]]:
        gone = self.adjacent.pop(memory_id, {})
        for other in gone:
            self.adjacent.get(other, {}).pop(memory_id, None)
        return {(memory_id, o, k, w) for o, kinds in gone.items() for k, w in kinds.items()}

    def edges(self, memory_id: str) -> list[Edge]:
        return [
            Edge(memory_id, other, kind, weight)
            for other, kinds in sorted(self.adjacent.get(memory_id, {}).items())
            for kind, weight in sorted(kinds.items())
        ]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_link, _link, _unlink, _remove), max_size=60))
def test_the_packed_graph_agrees_with_a_plain_map(operations: list[tuple]) -> None:
    graph, plain = Graph(), PlainGraph()
    for op, *args in operations:
        if op == "add":
            a, b, kind, weight = args
            assert graph.add(a, b, kind, weight).weight == plain.add(a, b, kind, weight)
        elif op == "unlink":
            graph.unlink(*args)
            plain.unlink(*args)
        else:
            dropped = {(e.from_id, e.to_id, e.kind, e.weight) for e in graph.remove(args[0])}
            assert dropped == plain.remove(args[0])
    for memory_id in IDS:
        expected = plain.edges(memory_id)
        assert graph.edges(memory_id) == expected
        assert set(graph.neighbours(memory_id)) == {e.to_id for e in expected}
        assert len(list(graph.neighbours(memory_id))) == len({e.to_id for e in expected})
        for other in IDS:
            kinds = frozenset(plain.adjacent.get(memory_id, {}).get(other, {}))
            assert graph.kinds(memory_id, other) == kinds
            for kind in EDGE_KINDS:
                assert graph.weight(memory_id, other, kind) == plain.adjacent.get(
                    memory_id, {}
                ).get(other, {}).get(kind)
    stored = {  # each edge once, as the store keeps it
        (min(a, b), max(a, b), kind, weight)
        for a, neighbours in plain.adjacent.items()
        for b, kinds in neighbours.items()
        for kind, weight in kinds.items()
    }
    loaded = Graph()
    loaded.load(sorted(stored))
    for memory_id in IDS:
        assert loaded.edges(memory_id) == graph.edges(memory_id), "loaded as it was built"
    for memory_id, slot in zip(IDS, graph.slots(IDS).tolist(), strict=True):
        if slot < 0:  # what a walk in bulk reads: each linked memory's slot and links
            assert list(graph.neighbours(memory_id)) == []
            continue
        links, counts = graph.links_at(np.array([slot]))
        assert counts.tolist() == [len(links)]
        assert set(graph.ids_at(links)) == set(graph.neighbours(memory_id))


def test_a_slot_freed_by_a_removal_serves_a_new_memory_without_old_links() -> None:
    graph = Graph()
    graph.add("a", "b", "entity", 0.5)
    graph.add("a", "c", "sequence", 1.0)
    graph.remove("a")
    assert graph.edges("b") == [] and graph.edges("c") == []
    graph.add("d", "e", "manual", 0.7)
    assert graph.edges("d") == [Edge("d", "e", "manual", 0.7)]
    assert list(graph.neighbours("a")) == []
    assert graph.ids_at(graph.links_at(graph.slots(["d"]))[0]) == ["e"]
    assert graph.slots(["a", "d"]).tolist()[0] == -1, "a memory without links holds no slot"
