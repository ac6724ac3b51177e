"""What falls due by itself happens on time, with no request to prompt it: memories turn
COLD with an ON_DECAY event at the computed moment, and a channel holding enough cold
memories sweeps (DESIGN §3)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import grpc
from google.protobuf.field_mask_pb2 import FieldMask

from calor.server.clock import ManualClock
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, store, ts

COLD = "MEMORY_STATE_COLD"


def fast_decay(channel: grpc.Channel, name: str, half_life: float, cold_count: int) -> None:
    """Episodic memories of ``name`` halve every ``half_life`` seconds; ``cold_count`` cold
    ones call for a sweep."""
    profile = memory_pb2.TypeProfile(
        memory_type=EPISODIC, half_life_seconds=half_life, floor=0.01, stability_gain=1.5
    )
    SettingsServiceStub(channel).UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=name,
            settings=memory_pb2.ChannelSettings(profiles=[profile], cold_count_trigger=cold_count),
            update_mask=FieldMask(paths=["profiles", "cold_count_trigger"]),
        )
    )


def sweeps_within(stub: MemoryServiceStub, name: str, seconds: float) -> pb.IdentityResponse:
    """The channel's Identity once a sweep was counted, or as it stands after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        identity = stub.Identity(pb.IdentityRequest(channel=name))
        if identity.consolidation_sweeps or time.monotonic() > deadline:
            return identity
        time.sleep(0.05)


def test_a_channel_sweeps_the_moment_enough_memories_turn_cold(
    start_server: Callable[..., ServerThread],
) -> None:
    clock = ManualClock(1_780_000_000.0)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        fast_decay(channel, "left-alone", half_life=2.0, cold_count=3)
        for n in range(3):
            store(stub, "left-alone", f"Diary line {n}: watered the ferns.", memory_type=EPISODIC)
        assert sweeps_within(stub, "left-alone", 1.5).consolidation_sweeps == 0
        clock.advance(9.0)  # heat 2^-4.5 = 0.044: all three are cold; nobody asks anything
        identity = sweeps_within(stub, "left-alone", 5.0)
    assert identity.consolidation_sweeps == 1
    assert identity.by_state[COLD] + identity.by_state["MEMORY_STATE_ARCHIVED"] == 3


def test_memories_that_arrive_cold_count_toward_the_sweep(
    start_server: Callable[..., ServerThread],
) -> None:
    clock = ManualClock(1_780_000_000.0)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        fast_decay(channel, "backdated", half_life=DAY, cold_count=3)
        month_ago = ts(clock.now() - 30 * DAY)
        for n in range(3):
            text = f"Old diary line {n}: the harbour froze over."
            store(stub, "backdated", text, memory_type=EPISODIC, created_at=month_ago)
        identity = sweeps_within(stub, "backdated", 5.0)
    assert identity.consolidation_sweeps == 1


def test_a_decay_crossing_is_an_event_at_its_computed_moment(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server()  # the wall clock: the event must come when the formula says
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        fast_decay(channel, "cooling", half_life=1.0, cold_count=1000)
        events = TriggerServiceStub(channel).Subscribe(
            tpb.SubscribeRequest(channels=["cooling"], kinds=[tpb.EVENT_KIND_ON_DECAY])
        )
        memory = store(stub, "cooling", "Left the umbrella on the tram.", memory_type=EPISODIC)
        # Heat 1.0 halves each second: it crosses the cold threshold 0.10 log2(10) s later.
        crossing = memory.created_at.ToDatetime().timestamp() + math.log2(1 / 0.10)
        event = next(iter(events)).event
        heard = time.time()
        events.cancel()
    assert (event.kind, event.memory_id) == (tpb.EVENT_KIND_ON_DECAY, memory.id)
    assert event.payload["threshold"] == "0.1"
    assert abs(event.at.ToDatetime().timestamp() - crossing) < 0.1
    assert heard - crossing < 0.5, "streamed as it happened"
