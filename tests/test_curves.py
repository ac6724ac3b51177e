"""Retention curves (DESIGN §3): a channel's ``decay_curve`` is exponential, huber or
elastic; each is pinned to values computed apart from the server, solves its crossings in
closed form (on_decay fires at the moment), and survives export and import."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import replace

import grpc
import pytest

from calor.server.clock import ManualClock
from calor.server.records import MemoryRecord
from calor.server.thermo.heat import DECAY_CURVES, decayed, half_lives_until
from calor.server.thermo.lifecycle import Clocks, crossing_at, current_heat, migrate_at
from calor.server.thermo.policy import ChannelPolicy
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, VECTORS, store, update_settings

PINNED = json.loads((VECTORS / "curves.json").read_text())
CURVE_NUMBERS = {
    "exponential": memory_pb2.DECAY_CURVE_EXPONENTIAL,
    "huber": memory_pb2.DECAY_CURVE_HUBER,
    "elastic": memory_pb2.DECAY_CURVE_ELASTIC,
}


def record(memory_type: str, heat0: float = 1.0, stability: float = 1.0) -> MemoryRecord:
    return MemoryRecord(
        id="01J0000000000000000000000A",
        channel="c",
        text="x",
        memory_type=memory_type,
        created_at=0.0,
        updated_at=0.0,
        heat0=heat0,
        t0=0.0,
        stability=stability,
    )


def policy(curve: str) -> ChannelPolicy:
    return replace(ChannelPolicy(), decay_curve=curve)


@pytest.mark.parametrize("case", PINNED["cases"], ids=lambda c: f"{c['curve']}-{c['memory_type']}")
def test_each_curve_matches_its_pinned_heats(case: dict) -> None:  # type: ignore[type-arg]
    memory = record(case["memory_type"], case["heat0"], case["stability"])
    heat = current_heat(memory, policy(case["curve"]), Clocks(now=case["dt_seconds"]))
    assert heat == pytest.approx(case["heat"], abs=1e-9)


@pytest.mark.parametrize(
    "case", PINNED["crossings"], ids=lambda c: f"{c['curve']}-{c['memory_type']}"
)
def test_each_curve_solves_its_cold_floor_and_migration_moments(case: dict) -> None:  # type: ignore[type-arg]
    memory, rules = record(case["memory_type"], case["heat0"]), policy(case["curve"])
    assert crossing_at(memory, rules, 0.10) == pytest.approx(case["cold_after_seconds"], abs=1e-6)
    assert migrate_at(memory, rules) == pytest.approx(case["archived_after_seconds"], abs=1e-6)
    # At the solved moments the formula reads the level itself.
    at_cold = Clocks(now=case["cold_after_seconds"])
    assert current_heat(memory, rules, at_cold) == pytest.approx(0.10, abs=1e-9)


def test_huber_is_exponential_for_a_half_life_then_keeps_more() -> None:
    for x in (0.25, 0.5, 1.0):
        assert decayed(0.8, x, "huber") == pytest.approx(decayed(0.8, x, "exponential"), abs=1e-12)
    for x in (1.5, 4.0, 30.0):
        assert decayed(0.8, x, "huber") > decayed(0.8, x, "exponential")
    # A burst of recalls, then 30 quiet half-lives: exponential is at 2^-30 of it; huber
    # still holds a tenth of a percent.
    assert decayed(1.0, 30.0, "exponential") < 1e-9 < 1e-3 < decayed(1.0, 30.0, "huber")


def test_elastic_keeps_strongly_held_memories_and_lets_weak_ones_fade() -> None:
    strong, weak = 0.95, 0.2
    assert decayed(strong, 1.0, "elastic") > decayed(strong, 1.0, "exponential")
    assert decayed(weak, 1.0, "elastic") < decayed(weak, 1.0, "exponential")
    # Weak memories run out: a finite time to zero, solved in closed form.
    gone = half_lives_until(0.0, weak, "elastic")
    assert math.isfinite(gone) and decayed(weak, gone * 1.0001, "elastic") == 0.0


@pytest.mark.parametrize("curve", DECAY_CURVES)
def test_every_curve_inverts_exactly(curve: str) -> None:
    for heat0 in (1.0, 0.7, 0.31):
        for level in (0.6, 0.25, 0.1, 0.011):
            if level < heat0:
                x = half_lives_until(level, heat0, curve)
                assert decayed(heat0, x, curve) == pytest.approx(level, abs=1e-12)


def set_curve(
    channel: grpc.Channel, name: str, curve: int, **fields: object
) -> memory_pb2.ChannelSettings:
    return update_settings(channel, name, decay_curve=curve, **fields)


def settings_of(channel: grpc.Channel, name: str) -> memory_pb2.ChannelSettings:
    return SettingsServiceStub(channel).GetSettings(spb.GetSettingsRequest(channel=name)).settings


def test_a_channel_chooses_its_curve_and_heat_follows_it(
    manual_server: tuple[ServerThread, ManualClock, MemoryServiceStub],
) -> None:
    server, clock, stub = manual_server
    with grpc.insecure_channel(server.target) as channel:
        assert settings_of(channel, "notes").decay_curve == memory_pb2.DECAY_CURVE_EXPONENTIAL
        stored = {}
        for curve, number in CURVE_NUMBERS.items():
            set_curve(channel, curve, number)
            assert settings_of(channel, curve).decay_curve == number
            text = "The build server is in rack four."
            stored[curve] = store(stub, curve, text, memory_type=EPISODIC)
        clock.advance(1.5 * DAY)  # one and a half half-lives of an episodic memory
        now = {
            c: stub.Inspect(pb.InspectRequest(channel=c, id=m.id)).memory for c, m in stored.items()
        }
    for curve, memory in now.items():
        assert memory.heat0 == stored[curve].heat0  # nothing touched it: only time passed
        assert memory.heat == pytest.approx(max(0.01, decayed(memory.heat0, 1.5, curve)), abs=1e-9)
    assert now["huber"].heat > now["exponential"].heat


def test_an_unknown_curve_is_refused_and_changes_nothing(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server()
    with grpc.insecure_channel(server.target) as channel:
        set_curve(channel, "notes", memory_pb2.DECAY_CURVE_HUBER)
        for number in (42, memory_pb2.DECAY_CURVE_UNSPECIFIED):
            with pytest.raises(grpc.RpcError) as refused:
                set_curve(channel, "notes", number, cold_threshold=0.3)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "decay_curve" in (refused.value.details() or "")
        assert "DECAY_CURVE_ELASTIC" in (refused.value.details() or "")  # says what it takes
        kept = settings_of(channel, "notes")
        assert (kept.decay_curve, kept.cold_threshold) == (memory_pb2.DECAY_CURVE_HUBER, 0.10)


@pytest.mark.parametrize(("curve", "chosen"), [("huber", "before"), ("elastic", "after")])
def test_a_decay_crossing_fires_at_the_moment_the_curve_solves(
    start_server: Callable[..., ServerThread], curve: str, chosen: str
) -> None:
    """With the curve chosen before the store, or after it (the pending crossing moves)."""
    server = start_server()  # the wall clock: the event must come when the formula says
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        profile = memory_pb2.TypeProfile(
            memory_type=EPISODIC, half_life_seconds=1.0, floor=0.01, stability_gain=1.5
        )
        first = CURVE_NUMBERS[curve] if chosen == "before" else memory_pb2.DECAY_CURVE_EXPONENTIAL
        set_curve(channel, "cooling", first, profiles=[profile])
        events = TriggerServiceStub(channel).Subscribe(
            tpb.SubscribeRequest(channels=["cooling"], kinds=[tpb.EVENT_KIND_ON_DECAY])
        )
        memory = store(stub, "cooling", "Left the umbrella on the tram.", memory_type=EPISODIC)
        if chosen == "after":
            set_curve(channel, "cooling", CURVE_NUMBERS[curve])
        t0 = memory.created_at.ToDatetime().timestamp()
        crossing = t0 + half_lives_until(0.10, memory.heat0, curve)
        assert abs(crossing - (t0 + half_lives_until(0.10, memory.heat0, "exponential"))) > 0.4
        event = next(iter(events)).event
        heard = time.time()
        events.cancel()
    assert (event.kind, event.memory_id) == (tpb.EVENT_KIND_ON_DECAY, memory.id)
    assert abs(event.at.ToDatetime().timestamp() - crossing) < 0.1
    assert heard - crossing < 0.5, "streamed as it happened"


def _export(stub: MemoryServiceStub, channel: str) -> str:
    chunks = stub.Export(pb.ExportRequest(channel=channel, include_archived=True))
    return "".join(c.markdown for c in chunks)


def test_an_export_from_a_curve_imports_with_the_same_heat_at_every_moment(
    manual_server: tuple[ServerThread, ManualClock, MemoryServiceStub],
) -> None:
    server, clock, stub = manual_server
    with grpc.insecure_channel(server.target) as channel:
        for name in ("from", "to"):
            set_curve(channel, name, memory_pb2.DECAY_CURVE_ELASTIC)
        set_curve(channel, "plain", memory_pb2.DECAY_CURVE_EXPONENTIAL)
        kept = store(stub, "from", "Standup moved to 9:30 on Tuesdays.", memory_type=EPISODIC)
        store(stub, "from", "The release train leaves every second Thursday.")
        clock.advance(0.4 * DAY)
        stub.Recall(pb.RecallRequest(channel="from", query="when is standup?", limit=1))
        clock.advance(0.3 * DAY)
        document = _export(stub, "from")
        for name in ("to", "plain"):
            first = pb.ImportRequest(channel=name, markdown=document)
            stub.Import(iter([first]))
        for _ in range(3):
            heats = {
                name: stub.Inspect(pb.InspectRequest(channel=name, id=kept.id)).memory.heat
                for name in ("from", "to", "plain")
            }
            assert heats["to"] == pytest.approx(heats["from"], abs=1e-12)
            clock.advance(0.5 * DAY)
        assert heats["plain"] != pytest.approx(heats["from"], abs=1e-3), "the curve matters"
