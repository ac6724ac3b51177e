"""Resonance finds each memory it reaches through the mark its graph slot keeps (where
the memory is indexed); whatever happens to the memories in between — new ones,
links made and dropped, memories forgotten, moved to cold storage and back, slots
handed to other memories — a mark never says anything but where the memory is now."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from calor.server.clock import ManualClock
from calor.server.engine.channel import Channel
from calor.server.records import ACTIVE, ARCHIVED, DELETED, MemoryRecord
from calor.server.storage.ops import AddMemory, ChangeList, Forget, Link, PutMemory, Unlink
from calor.server.thermo.policy import ChannelPolicy

IDS = [f"m{i}" for i in range(5)]
DIM = 4

_memory = st.sampled_from(IDS)
_step = st.one_of(
    st.tuples(st.just("add"), _memory, st.booleans()),
    st.tuples(st.just("link"), _memory, _memory),
    st.tuples(st.just("unlink"), _memory, _memory),
    st.tuples(st.just("forget"), _memory),
    st.tuples(st.just("move"), _memory, st.booleans()),
    st.tuples(
        st.just("look"),
    ),
)


def memory(memory_id: str, archived: bool) -> MemoryRecord:
    return MemoryRecord(
        id=memory_id, channel="c", text=f"text of {memory_id}", memory_type="fact",
        created_at=0.0, updated_at=0.0, heat0=1.0, t0=0.0,
        state=ARCHIVED if archived else ACTIVE,
    )  # fmt: skip


def where(view: Channel, memory_id: str) -> int:
    """Where a memory is indexed, looked up by id."""
    live, attic = view.index.label(memory_id), view.attic.label(memory_id)
    return live << 1 if live is not None else attic << 1 | 1 if attic is not None else -1


def take(view: Channel, step: tuple[object, ...]) -> None:
    kind, *args = step
    ops: list[object] = []
    vector = np.ones(DIM, dtype=np.float32) / 2
    if kind == "add" and str(args[0]) not in view.records:
        ops = [AddMemory(memory(str(args[0]), bool(args[1])), vector)]
    elif kind in ("link", "unlink"):
        a, b = str(args[0]), str(args[1])
        if any(
            view.records.get(m) is not None and view.records[m].state == DELETED for m in (a, b)
        ):
            return
        # as a store does, a memory arrives with its links
        ops = [AddMemory(memory(m, False), vector) for m in {a, b} if m not in view.records]
        ops.append(Link(a, b, "manual", 1.0) if kind == "link" else Unlink(a, b, "manual"))
    elif kind in ("forget", "move"):
        held = view.records.get(str(args[0]))
        if held is not None and held.state != DELETED:
            if kind == "forget":
                ops = [Forget(replace(held, state=DELETED, text=""))]
            else:
                ops = [PutMemory(replace(held, state=ARCHIVED if args[1] else ACTIVE))]
    elif kind == "look":
        view.places(view.graph.slots(IDS)[view.graph.slots(IDS) >= 0])
    if ops:
        view.apply(ChangeList("c", ops))  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_step, min_size=5, max_size=40))
def test_a_slots_mark_always_says_where_its_memory_is_indexed(
    steps: list[tuple[object, ...]],
) -> None:
    view = Channel(name="c", dim=DIM, policy=ChannelPolicy(), clock=ManualClock(0.0))
    for step in steps:
        take(view, step)
        linked = [m for m in IDS if view.graph.slots([m])[0] >= 0]
        slots = view.graph.slots(linked)
        assert view.places(slots).tolist() == [where(view, m) for m in linked]


def test_marks_send_resonance_to_the_index_that_holds_the_memory_now() -> None:
    """A neighbour moved to cold storage after a first look is found in the attic."""
    view = Channel(name="c", dim=DIM, policy=ChannelPolicy(), clock=ManualClock(0.0))
    for step in [("add", "m0", False), ("add", "m1", False), ("link", "m0", "m1"), ("look",)]:
        take(view, step)
    slot = view.graph.slots(["m1"])
    assert view.places(slot)[0] == view.index.label("m1") << 1  # type: ignore[operator]
    take(view, ("move", "m1", True))
    assert view.places(slot)[0] == view.attic.label("m1") << 1 | 1  # type: ignore[operator]
