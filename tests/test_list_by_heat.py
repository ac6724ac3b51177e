"""Listing a channel hottest first (``ListMemories`` with ``order`` HEAT): every memory
once, in the order of their heat as it stands, paged by position, filters applied, and
a page token of one order refused by the other."""

from __future__ import annotations

import math

import grpc
import pytest

from calor.server.clock import ManualClock
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, FACT, store

HEAT = pb.MEMORY_ORDER_HEAT
ManualServer = tuple[ServerThread, ManualClock, MemoryServiceStub]
NOTES = [
    "The boiler was serviced in March.",
    "Ada's bike has a flat rear tyre.",
    "The library closes early on Fridays.",
    "The recycling goes out on Tuesday nights.",
    "The spare fuse box key is in the blue tin.",
    "Grandma's birthday is on the ninth of June.",
    "The car's next inspection is due in autumn.",
]


def pages(stub: MemoryServiceStub, channel: str, **fields: object) -> list[list[pb.Memory]]:
    found: list[list[pb.Memory]] = []
    token = ""
    while True:
        reply = stub.ListMemories(
            pb.ListMemoriesRequest(channel=channel, page_token=token, **fields)  # type: ignore[arg-type]
        )
        found.append(list(reply.memories))
        token = reply.next_page_token
        if not token:
            return found


def test_a_channel_lists_hottest_first_page_by_page(manual_server: ManualServer) -> None:
    _, clock, stub = manual_server
    ids = []
    for text in NOTES:  # each a few hours older than the next: colder, as episodic memories
        ids.append(store(stub, "heat", text, memory_type=EPISODIC).id)
        clock.advance(4 * 3600)
    fact = store(stub, "heat", "Water boils at 100 degrees at sea level.", memory_type=FACT).id
    clock.advance(2 * DAY)  # the fact decays slowest: it is the hottest now
    hits = stub.Recall(pb.RecallRequest(channel="heat", query=NOTES[0], limit=1))
    assert hits.hits[0].memory.id == ids[0]  # recalled: the oldest note is warm again

    listed = pages(stub, "heat", page_size=3, order=HEAT)
    assert [len(page) for page in listed] == [3, 3, 2]
    order = [m.id for page in listed for m in page]
    heats = [m.heat for page in listed for m in page]
    assert sorted(order) == sorted([*ids, fact])
    assert heats == sorted(heats, reverse=True)
    expected = [ids[0], fact, *reversed(ids[1:])]  # then the notes, newest (warmest) first
    assert set(order[:2]) == {ids[0], fact} and order[2:] == expected[2:]

    # Filters apply within the order; the id order is still the default.
    episodic = [
        m.id for page in pages(stub, "heat", order=HEAT, memory_types=[EPISODIC]) for m in page
    ]
    assert episodic == [i for i in order if i != fact]
    assert [m.id for page in pages(stub, "heat") for m in page] == sorted([*ids, fact])


def test_a_page_token_of_one_order_is_refused_by_the_other(manual_server: ManualServer) -> None:
    _, _, stub = manual_server
    for text in NOTES[:3]:
        store(stub, "tokens", text)
    by_id = stub.ListMemories(pb.ListMemoriesRequest(channel="tokens", page_size=1))
    by_heat = stub.ListMemories(pb.ListMemoriesRequest(channel="tokens", page_size=1, order=HEAT))
    for request in (
        pb.ListMemoriesRequest(channel="tokens", order=HEAT, page_token=by_id.next_page_token),
        pb.ListMemoriesRequest(channel="tokens", page_token=by_heat.next_page_token),
        pb.ListMemoriesRequest(channel="tokens", order=HEAT, page_token="aDEyMzQ1Njc4OTAxMjM0"),
        pb.ListMemoriesRequest(channel="tokens", order=7),  # type: ignore[arg-type]
    ):
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListMemories(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "order" in str(caught.value.details())


def test_each_listed_memory_can_carry_its_heat_sparkline(manual_server: ManualServer) -> None:
    _, clock, stub = manual_server
    old = store(stub, "spark", NOTES[0], memory_type=EPISODIC).id
    clock.advance(3 * DAY)
    new = store(stub, "spark", NOTES[1], memory_type=EPISODIC).id
    clock.advance(DAY)
    reply = stub.ListMemories(
        pb.ListMemoriesRequest(channel="spark", order=HEAT, heat_sparklines=True)
    )
    assert [m.id for m in reply.memories] == [new, old]
    assert reply.sparkline_now.ToNanoseconds() / 1e9 == pytest.approx(clock.now(), abs=1e-3)
    for memory, line in zip(reply.memories, reply.heat_sparklines, strict=True):
        heats = list(line.heat)
        assert len(heats) == 29  # every 12 hours, a week either side
        assert heats[14] == pytest.approx(memory.heat)  # the middle one is now
        known = [h for h in heats if not math.isnan(h)]
        assert known == sorted(known, reverse=True)  # untouched: it only cools
        # Before it was stored there is nothing to draw: 4 days ago for the old one
        # (8 half-days), 1 day ago for the new one.
        stored_ago = 4 if memory.id == old else 1
        assert sum(math.isnan(h) for h in heats) == 14 - 2 * stored_ago
    plain = stub.ListMemories(pb.ListMemoriesRequest(channel="spark"))
    assert not plain.heat_sparklines and not plain.HasField("sparkline_now")


def test_identity_counts_each_types_memories_by_tenth_of_heat(manual_server: ManualServer) -> None:
    _, clock, stub = manual_server
    for text in NOTES[:4]:
        store(stub, "tenths", text, memory_type=EPISODIC)
    store(stub, "tenths", "Water boils at 100 degrees at sea level.", memory_type=FACT)
    clock.advance(DAY)  # the episodic ones at half heat, the fact barely cooled
    reply = stub.Identity(pb.IdentityRequest(channel="tenths"))
    histograms = {h.memory_type: list(h.counts) for h in reply.heat_histograms}
    assert histograms == {
        EPISODIC: [0, 0, 0, 0, 0, 4, 0, 0, 0, 0],  # 2^-1 = 0.5: the sixth tenth
        FACT: [0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    }
