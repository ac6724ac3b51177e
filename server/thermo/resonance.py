"""Resonance (DESIGN §3): how a recall's heat spreads along the memory graph.

Walked in bulk over the graph's slots: a recall's neighbourhood runs to thousands of
memories in a large channel, and each is judged once, in one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from calor.server.thermo.graph import Graph, Slots
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["Judge", "Reach", "Reached", "SlotJudge", "one_by_one", "resonance", "spread"]


@dataclass(frozen=True)
class Reach:
    """What resonance needs to know of one memory it reaches: its heat, and whether it
    sits in cold storage (reached, it comes back to ACTIVE)."""

    heat: float
    archived: bool = False


@dataclass(frozen=True)
class Reached:
    """What resonance needs to know of many memories, row by row: whether each can take
    heat at all (live or in cold storage, not settled history), its heat, and whether
    it sits in cold storage."""

    takes: npt.NDArray[np.bool_]
    heat: npt.NDArray[np.float64]
    archived: npt.NDArray[np.bool_]


Judge = Callable[[list[str]], Reached]
"""Judges memories by id."""
SlotJudge = Callable[[Slots], Reached]
"""Judges memories by their graph slot."""


def one_by_one(reach: Callable[[str], Reach | None]) -> Judge:
    """A judge of many memories from a judge of one (None: it takes no heat)."""

    def judge(memory_ids: list[str]) -> Reached:
        found = [reach(memory_id) for memory_id in memory_ids]
        return Reached(
            takes=np.array([f is not None for f in found], dtype=bool),
            heat=np.array([0.0 if f is None else f.heat for f in found], dtype=np.float64),
            archived=np.array([f is not None and f.archived for f in found], dtype=bool),
        )

    return judge


def resonance(
    graph: Graph, recalled: Mapping[str, float], judge: Judge, policy: ChannelPolicy
) -> dict[str, float]:
    """The heat each neighbour of the recalled memories gains, by memory id: what
    :func:`spread` walks, with a judge of memories by id."""
    slots, gains = spread(graph, recalled, lambda asked: judge(graph.ids_at(asked)), policy)
    return dict(zip(graph.ids_at(slots), gains.tolist(), strict=True))


def spread(
    graph: Graph, recalled: Mapping[str, float], judge: SlotJudge, policy: ChannelPolicy
) -> tuple[Slots, npt.NDArray[np.float64]]:
    """The heat each neighbour of the recalled memories gains: (slots, gains), by slot.

    A neighbour at hop h gains ``spread · H · damping^(h−1)``, where H is the recalled
    memory's heat after its bump. A memory reached by several paths takes its largest
    gain, once. Memories below the thermal gate neither receive nor pass heat, except
    that a memory in cold storage that is reached comes back (with its gain) whatever
    its heat; it passes heat on as any other memory at its heat would. ``judge`` is
    asked about memories by their graph slot, once each and in as few batches as the
    walk allows: a hop's memories together with their own neighbours (the next hop's,
    whichever of them pass), so a spread of depth 2 asks once. Recalled memories gain
    nothing here and pass nothing on as neighbours.

    The largest gain is the one over the fewest hops, so the spread is walked hop by
    hop for all recalled memories at once, each memory carrying the largest heat that
    reached it.
    """
    nothing = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))
    slots = graph.slots(recalled)
    sources = np.flatnonzero(slots >= 0)
    if not sources.size:
        return nothing
    known = _Known(np.sort(slots[sources]))  # recalled memories take nothing
    carried = np.array(list(recalled.values()), dtype=np.float64)[sources]
    order = np.argsort(slots[sources])
    senders, sent = slots[sources][order], policy.resonance_spread * carried[order]
    found: list[tuple[Slots, npt.NDArray[np.float64]]] = []
    links = graph.links_at(senders)  # the senders' links, and how many each has
    for hop in range(1, policy.resonance_depth + 1):
        if not senders.size:
            break
        reached, counts = links
        heats = np.repeat(sent, counts)
        order = np.argsort(reached, kind="stable")
        reached, heats = reached[order], heats[order]
        reached, firsts = np.unique(reached, return_index=True)
        heats = np.maximum.reduceat(heats, firsts) if reached.size else heats[:0]
        if hop < policy.resonance_depth:  # the next hop's memories are asked about now
            ahead, ahead_counts = graph.links_at(reached)
            known.learn(np.union1d(reached, ahead), judge, policy)
        else:
            known.learn(reached, judge, policy)
        passes, receives = known.verdicts(reached)
        found.append((reached[receives], heats[receives]))
        senders, sent = reached[passes], heats[passes] * policy.resonance_damping
        if hop < policy.resonance_depth:  # the next senders' links, looked up already
            links = ahead[np.repeat(passes, ahead_counts)], ahead_counts[passes]
    if not found:
        return nothing
    gained = np.concatenate([slots for slots, _ in found])
    gains = np.concatenate([heats for _, heats in found])
    order = np.argsort(gained, kind="stable")
    gained, firsts = np.unique(gained[order], return_index=True)
    if not gained.size:
        return nothing
    return gained, np.maximum.reduceat(gains[order], firsts)


class _Known:
    """The memories judged so far in one spread, by slot (sorted), with what the judge
    said of each: whether it passes heat on, and whether it receives it."""

    def __init__(self, recalled: Slots) -> None:
        self.slots = recalled
        none = np.zeros(len(recalled), dtype=bool)
        self.passes, self.receives = none, none

    def learn(self, slots: Slots, judge: SlotJudge, policy: ChannelPolicy) -> None:
        """Ask the judge, in one batch, about those of the (sorted, distinct) slots not
        judged before."""
        fresh = slots[~np.isin(slots, self.slots, assume_unique=True)]
        if not fresh.size:
            return
        said = judge(fresh)
        passes = said.takes & (said.heat >= policy.thermal_gate)
        receives = passes | (said.takes & said.archived)
        merged = np.concatenate([self.slots, fresh])
        order = np.argsort(merged, kind="stable")
        self.slots = merged[order]
        self.passes = np.concatenate([self.passes, passes])[order]
        self.receives = np.concatenate([self.receives, receives])[order]

    def verdicts(self, slots: Slots) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Whether each of the given judged slots passes heat on, and receives it."""
        rows = np.searchsorted(self.slots, slots)
        return self.passes[rows], self.receives[rows]
