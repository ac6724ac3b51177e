"""A memory's heat curve (``Inspect`` with ``heat_curve``): its past as its record keeps
it (recalls and resonance marked where heat jumped) and its projected future, with the
floor, the cold threshold and the moments heat reaches them and moves to cold storage,
each where the formulas put it."""

from __future__ import annotations

import math
from dataclasses import replace

import grpc
import pytest

from calor.server.clock import ManualClock
from calor.server.ids import new_id
from calor.server.records import MemoryRecord
from calor.server.thermo.curve import heat_curve
from calor.server.thermo.history import MAX_ENTRIES
from calor.server.thermo.lifecycle import Clocks, apply_recall, current_heat
from calor.server.thermo.policy import ChannelPolicy
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, FACT, store
from tests.test_heat import record

HOUR = 3600.0
BOOST = 0.15  # DESIGN §3 boost_delta
EPISODIC_STAB = 1.5
COLD, EPISODIC_FLOOR, MIGRATION_DAYS = 0.10, 0.01, 7.0

ManualServer = tuple[ServerThread, ManualClock, MemoryServiceStub]


def seconds(stamp: object) -> float:
    return stamp.ToNanoseconds() / 1e9  # type: ignore[attr-defined]


def moment(epoch_seconds: float) -> object:
    """Equal to the millisecond (pytest.approx's relative default is half an hour here)."""
    return pytest.approx(epoch_seconds, abs=1e-3)


def curve_of(stub: MemoryServiceStub, channel: str, memory_id: str) -> pb.InspectResponse:
    return stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id, heat_curve=True))


def test_the_curve_marks_the_recall_and_solves_floor_cold_and_migration(
    manual_server: ManualServer,
) -> None:
    _, clock, stub = manual_server
    created = clock.now()
    memory = store(
        stub, "curve", "The spare key hides under the blue flowerpot.", memory_type=EPISODIC
    )
    clock.advance(6 * HOUR)
    recalled_at = clock.now()
    hits = stub.Recall(pb.RecallRequest(channel="curve", query="where is the spare key?", limit=1))
    assert hits.hits[0].memory.id == memory.id
    clock.advance(1 * DAY)

    reply = curve_of(stub, "curve", memory.id)
    curve = reply.heat_curve

    before = 2 ** (-6 * HOUR / DAY)  # a day's half-life, six hours in
    after = before + BOOST
    [step] = curve.steps
    assert step.cause == pb.HEAT_STEP_CAUSE_RECALL
    assert seconds(step.at) == moment(recalled_at)
    assert (step.before, step.after) == (pytest.approx(before), pytest.approx(after))

    # The past starts where the memory was stored (heat 1) and ends at its heat now.
    assert seconds(curve.past[0].at) == moment(created)
    assert curve.past[0].heat == pytest.approx(1.0)
    assert seconds(curve.past[-1].at) == moment(clock.now())
    assert curve.past[-1].heat == pytest.approx(reply.memory.heat)
    assert seconds(curve.now) == moment(clock.now())
    # Both sides of the jump are drawn, at the moment of the recall.
    at_recall = [p.heat for p in curve.past if seconds(p.at) == moment(recalled_at)]
    assert at_recall == [pytest.approx(before), pytest.approx(after)]

    # Each moment is where the formula puts it: after the recall the half-life is
    # 1.5 days (Stab+), from `after` at the recall.
    half_life = DAY * EPISODIC_STAB
    cold_at = recalled_at + half_life * math.log2(after / COLD)
    floor_at = recalled_at + half_life * math.log2(after / EPISODIC_FLOOR)
    assert (curve.floor, curve.cold_threshold) == (pytest.approx(EPISODIC_FLOOR), COLD)
    assert seconds(curve.cold_at) == moment(cold_at)
    assert seconds(curve.floor_at) == moment(floor_at)
    assert seconds(curve.migration_at) == moment(floor_at + MIGRATION_DAYS * DAY)

    # The projection starts at the heat now, never rises, reaches the floor at its
    # moment and runs past the migration moment.
    projected = [(seconds(p.at), p.heat) for p in curve.projected]
    assert projected[0] == (moment(clock.now()), pytest.approx(reply.memory.heat))
    assert all(a[1] >= b[1] for a, b in zip(projected, projected[1:], strict=False))
    assert dict(projected)[seconds(curve.floor_at)] == pytest.approx(EPISODIC_FLOOR)
    assert projected[-1][0] > seconds(curve.migration_at)

    # Without asking, Inspect answers no curve.
    plain = stub.Inspect(pb.InspectRequest(channel="curve", id=memory.id))
    assert not plain.HasField("heat_curve")


def test_resonance_that_only_warmed_a_neighbour_shows_as_its_step(
    manual_server: ManualServer,
) -> None:
    _, clock, stub = manual_server
    recalled = store(stub, "warm", "The garden hose hangs in the shed by the door.")
    neighbour = store(stub, "warm", "The garden hose in the shed has a leak near the nozzle.")
    edges = stub.Inspect(pb.InspectRequest(channel="warm", id=recalled.id)).edges
    assert neighbour.id in {e.to_id for e in edges}
    clock.advance(2 * DAY)
    cooled = stub.Inspect(pb.InspectRequest(channel="warm", id=neighbour.id)).memory.heat
    hits = stub.Recall(
        pb.RecallRequest(channel="warm", query="where does the garden hose hang?", limit=1)
    )
    assert [hit.memory.id for hit in hits.hits] == [recalled.id]

    reply = curve_of(stub, "warm", neighbour.id)
    [step] = reply.heat_curve.steps
    assert step.cause == pb.HEAT_STEP_CAUSE_RESONANCE
    assert seconds(step.at) == moment(clock.now())
    assert step.before == pytest.approx(cooled)
    assert step.after > step.before
    assert reply.memory.heat == pytest.approx(step.after)


def test_a_fact_above_the_cold_threshold_never_turns_cold_or_migrates(
    manual_server: ManualServer,
) -> None:
    _, clock, stub = manual_server
    memory = store(stub, "fact", "Water boils at 100 degrees at sea level.", memory_type=FACT)
    clock.advance(30 * DAY)
    curve = curve_of(stub, "fact", memory.id).heat_curve
    assert curve.floor == pytest.approx(0.15)
    assert not curve.HasField("cold_at")
    assert not curve.HasField("migration_at")
    assert seconds(curve.floor_at) > clock.now()  # a year's half-life: far ahead
    assert curve.projected[-1].heat == pytest.approx(0.15)  # drawn down to the floor


def test_an_unknown_memory_has_no_curve(manual_server: ManualServer) -> None:
    _, _, stub = manual_server
    store(stub, "none", "Something to make the channel exist.")
    with pytest.raises(grpc.RpcError) as caught:
        curve_of(stub, "none", new_id())
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


# --- the history on the record (pure) ----------------------------------------


def _record(memory_type: str = "episodic") -> MemoryRecord:
    """A record stored at 0, as this version stores them: its history kept from then."""
    return record(memory_type, heat_history=[])


def test_a_record_keeps_its_latest_jumps_only() -> None:
    policy = ChannelPolicy()
    record = _record()
    for k in range(1, 3 * MAX_ENTRIES):
        apply_recall(record, policy, Clocks(now=k * HOUR))
    assert record.heat_history is not None
    assert len(record.heat_history) == MAX_ENTRIES
    curve = heat_curve(record, policy, Clocks(now=3 * MAX_ENTRIES * HOUR))
    assert [s.at for s in curve.steps] == [
        k * HOUR for k in range(2 * MAX_ENTRIES, 3 * MAX_ENTRIES)
    ]
    assert curve.past[0][0] == (2 * MAX_ENTRIES) * HOUR  # the oldest kept jump starts it


def test_heat_lowered_without_a_mark_shows_as_cooled_and_a_new_rate_alone_is_no_step() -> None:
    policy = ChannelPolicy()
    record = _record()
    apply_recall(record, policy, Clocks(now=HOUR))
    now = Clocks(now=5 * HOUR)
    shared = replace(record, heat0=current_heat(record, policy, now) * 0.5, t0=now.now)
    [recall, cooled] = heat_curve(shared, policy, Clocks(now=6 * HOUR)).steps
    assert (recall.cause, cooled.cause) == ("recall", "cooled")
    assert cooled.after == pytest.approx(cooled.before * 0.5)

    retyped = replace(
        record, memory_type="semantic", heat0=current_heat(record, policy, now), t0=now.now
    )
    assert [s.cause for s in heat_curve(retyped, policy, Clocks(now=6 * HOUR)).steps] == ["recall"]
    assert (
        len(heat_curve(retyped, policy, Clocks(now=6 * HOUR)).past) > 2 * 25
    )  # drawn as three pieces


def test_a_keystone_is_drawn_flat_with_no_moments() -> None:
    record = replace(_record(), keystone=True, heat0=0.8)
    curve = heat_curve(record, ChannelPolicy(), Clocks(now=90 * DAY))
    assert {heat for _, heat in curve.past + curve.projected} == {0.8}
    assert (curve.floor_at, curve.cold_at, curve.migration_at) == (None, None, None)


def test_decay_on_interactions_is_drawn_flat_on_the_clock() -> None:
    policy = replace(ChannelPolicy(), decay_mode="interaction")
    curve = heat_curve(_record(), policy, Clocks(now=10 * DAY))
    assert {heat for _, heat in curve.projected} == {1.0}
    assert (curve.floor_at, curve.cold_at, curve.migration_at) == (None, None, None)


def test_a_memory_stored_before_histories_were_kept_is_drawn_from_its_store() -> None:
    policy = ChannelPolicy()
    record = replace(_record(), heat_history=None, heat0=0.7, t0=2 * DAY, stability=1.5)
    curve = heat_curve(record, policy, Clocks(now=3 * DAY))
    assert curve.past[0] == (0.0, 1.0)
    [step] = curve.steps
    assert (step.at, step.cause) == (2 * DAY, "earlier")
    assert (step.before, step.after) == (pytest.approx(0.25), 0.7)  # two half-lives of a day
    assert curve.past[-1][1] == pytest.approx(0.7 * 2 ** (-1 / 1.5))
