"""The memory graph of a channel, and resonance: how a recall's heat spreads along its edges.

Edges are undirected for spreading; each is kept in memory under both ends and in
RocksDB once (see ``store.py``). A pair may be linked by several kinds at once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from calor.server.thermo.policy import ChannelPolicy

__all__ = ["EDGE_KINDS", "Edge", "Graph", "Reach", "resonance"]

EDGE_KINDS = ("semantic", "entity", "sequence", "merged", "echo", "manual", "supersedes")


@dataclass(frozen=True)
class Edge:
    """A typed, weighted link between two memories of one channel."""

    from_id: str
    to_id: str
    kind: str
    weight: float


class Graph:
    """Adjacency of one channel's memories: id → neighbour → kind → weight.

    Not thread-safe: the caller holds the channel's lock.
    """

    def __init__(self) -> None:
        # A pair's kinds table is one object under both ends.
        self._adjacent: dict[str, dict[str, dict[str, float]]] = {}

    def add(self, a: str, b: str, kind: str, weight: float) -> Edge:
        """Link two memories (a second link of the same kind keeps the larger weight)."""
        # Both ends share one kinds table and one copy of each id (edges are read back
        # from keys, each a fresh string): a channel holds several edges per memory.
        a, b = sys.intern(a), sys.intern(b)
        kinds = self._adjacent.get(a, {}).get(b)
        if kinds is None:
            kinds = {}
            self._adjacent.setdefault(a, {})[b] = kinds
            self._adjacent.setdefault(b, {})[a] = kinds
        kinds[kind] = max(weight, kinds.get(kind, weight))
        return Edge(a, b, kind, kinds[kind])

    def remove(self, memory_id: str) -> list[Edge]:
        """Drop a memory and every edge touching it; returns the edges dropped."""
        dropped: list[Edge] = []
        for other, kinds in self._adjacent.pop(memory_id, {}).items():
            back = self._adjacent.get(other, {})
            back.pop(memory_id, None)
            if not back:
                self._adjacent.pop(other, None)
            dropped.extend(Edge(memory_id, other, k, w) for k, w in kinds.items())
        return dropped

    def unlink(self, a: str, b: str, kind: str) -> None:
        """Drop the edge of one kind between two memories, if there is one."""
        for here, there in ((a, b), (b, a)):
            kinds = self._adjacent.get(here, {}).get(there)
            if kinds is None:
                continue
            kinds.pop(kind, None)
            if not kinds:
                del self._adjacent[here][there]
                if not self._adjacent[here]:
                    del self._adjacent[here]

    def weight(self, a: str, b: str, kind: str) -> float | None:
        """The weight of the edge of one kind between two memories, or None."""
        return self._adjacent.get(a, {}).get(b, {}).get(kind)

    def neighbours(self, memory_id: str) -> Iterable[str]:
        """The memories linked to this one."""
        return self._adjacent.get(memory_id, {}).keys()

    def within(self, sources: Iterable[str], hops: int) -> set[str]:
        """The memories at most ``hops`` links away from any of the sources (sources
        excluded)."""
        seen = set(sources)
        frontier = list(seen)
        for _ in range(hops):
            step: list[str] = []
            for node in frontier:
                for other in self._adjacent.get(node, {}):
                    if other not in seen:
                        seen.add(other)
                        step.append(other)
            frontier = step
        return seen.difference(sources)

    def edges(self, memory_id: str) -> list[Edge]:
        """Every edge of a memory, as seen from it, in a stable order."""
        return [
            Edge(memory_id, other, kind, weight)
            for other, kinds in sorted(self._adjacent.get(memory_id, {}).items())
            for kind, weight in sorted(kinds.items())
        ]

    def kinds(self, a: str, b: str) -> frozenset[str]:
        """The kinds of the edges between two memories."""
        return frozenset(self._adjacent.get(a, {}).get(b, {}))


@dataclass(frozen=True)
class Reach:
    """What resonance needs to know of a memory it reaches: its heat, and whether it
    sits in cold storage (reached, it comes back to ACTIVE)."""

    heat: float
    archived: bool = False


def resonance(
    graph: Graph,
    recalled: Mapping[str, float],
    reach: Callable[[str], Reach | None],
    policy: ChannelPolicy,
) -> dict[str, float]:
    """The heat each neighbour of the recalled memories gains (DESIGN §3).

    A neighbour at hop h gains ``spread · H · damping^(h−1)``, where H is the recalled
    memory's heat after its bump. A memory reached by several paths takes its largest
    gain, once. Memories below the thermal gate neither receive nor pass heat, except
    that a memory in cold storage that is reached comes back (with its gain) whatever
    its heat; it passes heat on as any other memory at its heat would. ``reach``
    answers None for memories that cannot take heat (ghosts, merged, forgotten).
    Recalled memories gain nothing here.
    """
    gains: dict[str, float] = {}
    for source, heat in recalled.items():
        frontier = [source]
        seen = {source}
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
