"""Relevance before heat, through the real server: a recall heats only hits whose band
reaches the channel's ``heat_min_band``, and ``min_band`` leaves weaker hits out."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from calor.server.clock import ManualClock
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, store

GARDEN = [
    "The greenhouse door sticks when it rains.",
    "Tomatoes need watering every morning in July.",
    "The compost bin is emptied on Saturdays.",
    "The rain barrel overflows after a storm.",
]
UNRELATED = "Which stock exchange lists the airline?"
COMPOST = "When is the compost bin emptied?"

Manual = tuple[ServerThread, ManualClock, MemoryServiceStub]


def _garden(stub: MemoryServiceStub, channel: str, clock: ManualClock) -> dict[str, str]:
    """The garden memories (episodic, linked in sequence), a day old: heat 0.50. By text."""
    ids = {text: store(stub, channel, text, memory_type=EPISODIC).id for text in GARDEN}
    clock.advance(DAY)
    return ids


def _inspect(stub: MemoryServiceStub, channel: str, memory_id: str) -> memory_pb2.Memory:
    return stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id)).memory


def _thermal(memory: memory_pb2.Memory) -> tuple[float, float, float, int, int]:
    """What a recall bump or resonance would change."""
    return (memory.heat, memory.heat0, memory.stability, memory.recall_count, memory.t0.seconds)


def test_a_recall_of_only_unrelated_hits_heats_none_of_them(manual_server: Manual) -> None:
    _, clock, stub = manual_server
    channel = "relevance-unrelated"
    ids = _garden(stub, channel, clock)
    before = {i: _thermal(_inspect(stub, channel, i)) for i in ids.values()}
    identity = stub.Identity(pb.IdentityRequest(channel=channel))

    hits = stub.Recall(pb.RecallRequest(channel=channel, query=UNRELATED, limit=10)).hits

    assert {h.memory.id for h in hits} == set(ids.values()), "every memory fills the limit"
    assert {h.band for h in hits} == {"low"}
    after = {i: _thermal(_inspect(stub, channel, i)) for i in ids.values()}
    assert after == before
    assert all(heat == pytest.approx(0.5) for heat, *_ in after.values())
    counted = stub.Identity(pb.IdentityRequest(channel=channel))
    assert counted.interactions == identity.interactions + 1, "the recall itself counts"
    assert counted.channel_heat > identity.channel_heat, "and warms the channel"


def test_a_relevant_hit_is_heated_and_the_unrelated_ones_beside_it_are_not(
    manual_server: Manual,
) -> None:
    _, clock, stub = manual_server
    channel = "relevance-mixed"
    ids = _garden(stub, channel, clock)
    compost = ids["The compost bin is emptied on Saturdays."]

    hits = stub.Recall(pb.RecallRequest(channel=channel, query=COMPOST, limit=10)).hits

    bands = {h.memory.id: h.band for h in hits}
    assert bands[compost] in ("mid", "high")
    heated = _inspect(stub, channel, compost)
    assert heated.recall_count == 1
    assert heated.heat == pytest.approx(0.5 + 0.15)
    for text, memory_id in ids.items():
        if bands[memory_id] == "low":
            assert _inspect(stub, channel, memory_id).recall_count == 0, text


def test_heat_min_band_low_heats_every_hit_again(manual_server: Manual) -> None:
    server, clock, stub = manual_server
    channel = "relevance-low"
    ids = _garden(stub, channel, clock)
    with grpc.insecure_channel(server.target) as wire:
        SettingsServiceStub(wire).UpdateSettings(
            spb.UpdateSettingsRequest(
                channel=channel,
                settings=memory_pb2.ChannelSettings(heat_min_band="low"),
                update_mask=FieldMask(paths=["heat_min_band"]),
            )
        )

    stub.Recall(pb.RecallRequest(channel=channel, query=UNRELATED, limit=10))

    assert [_inspect(stub, channel, i).recall_count for i in ids.values()] == [1] * len(ids)


def test_min_band_leaves_out_weaker_hits(memories: MemoryServiceStub, channel_name: str) -> None:
    for text in GARDEN:
        store(memories, channel_name, text)

    def bands(min_band: str) -> list[str]:
        request = pb.RecallRequest(
            channel=channel_name, query=COMPOST, limit=10, peek=True, min_band=min_band
        )
        return [h.band for h in memories.Recall(request).hits]

    everything = bands("")
    assert len(everything) == len(GARDEN) and "low" in everything
    assert bands("low") == everything
    assert bands("mid") == [b for b in everything if b != "low"]
    assert bands("high") == [b for b in everything if b == "high"] == ["high"]


@pytest.mark.parametrize("bad", ["medium", "HIGH", " low", "lowest", "none"])
def test_an_unknown_min_band_is_refused_naming_the_allowed_ones(
    memories: MemoryServiceStub, channel_name: str, bad: str
) -> None:
    memory = store(memories, channel_name, "The compost bin is emptied on Saturdays.")
    interactions = memories.Identity(pb.IdentityRequest(channel=channel_name)).interactions
    request = pb.RecallRequest(channel=channel_name, query=COMPOST, min_band=bad)

    with pytest.raises(grpc.RpcError) as caught:
        memories.Recall(request)

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert "min_band" in details
    assert all(f"'{band}'" in details for band in ("low", "mid", "high")), details
    after = memories.Identity(pb.IdentityRequest(channel=channel_name))
    assert after.interactions == interactions, "a refused recall counts for nothing"
    kept = memories.Inspect(pb.InspectRequest(channel=channel_name, id=memory.id)).memory
    assert kept.recall_count == 0
