"""The consolidation sweep acts (DESIGN §3, the engine seed's "archiving, merging, or
removing the coldest"): once `cold_count_trigger` memories turned cold, it merges
near-duplicates among the cold and moves the coldest to cold storage until the channel
holds fewer cold memories than the trigger, sparing keystones and core memories, and its
report names each memory it touched."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from calor.server.clock import ManualClock
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import CORE, DAY, EPISODIC, store, ts, update_settings

COLD = memory_pb2.MEMORY_STATE_COLD
ARCHIVED = memory_pb2.MEMORY_STATE_ARCHIVED
MERGED = memory_pb2.MEMORY_STATE_MERGED
TRIGGER = 4

DIARY = [
    "Watered the ferns on the balcony.",
    "Fixed the squeaky hinge on the shed door.",
    "Bought oat milk and rye bread at the corner shop.",
    "Rang the plumber about the dripping kitchen tap.",
    "Sorted the winter coats into the loft.",
    "Walked the long way round the reservoir.",
    "Cleaned the bike chain and pumped the tyres.",
]
TWINS = (
    "The spare house key is under the blue flowerpot.",
    "The spare house key is under the blue flowerpot!",
)


def test_the_sweep_archives_the_coldest_until_the_channel_is_under_its_trigger(
    start_server: Callable[..., ServerThread],
) -> None:
    clock = ManualClock(1_780_000_000.0)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        update_settings(channel, "diary", cold_count_trigger=TRIGGER)
        events = TriggerServiceStub(channel).Subscribe(
            tpb.SubscribeRequest(channels=["diary"], kinds=[tpb.EVENT_KIND_DREAM]), timeout=20
        )
        # Each stored an hour earlier than the one before it: older is colder.
        ids = []
        for hours, text in enumerate(DIARY):
            when = ts(clock.now() - hours * 3600.0)
            ids.append(store(stub, "diary", text, memory_type=EPISODIC, created_at=when).id)
        twins = [
            store(stub, "diary", text, memory_type=EPISODIC, created_at=ts(clock.now())).id
            for text in TWINS
        ]
        pinned = store(
            stub,
            "diary",
            "Grandma's birthday is on the ninth.",
            memory_type=EPISODIC,
            created_at=ts(clock.now() - 30 * 3600.0),
        ).id
        stub.Keystone(pb.KeystoneRequest(channel="diary", id=pinned, keystone=True))
        stub.Boost(pb.BoostRequest(channel="diary", id=pinned, delta=-0.95))  # cold, pinned
        core = store(stub, "diary", "The user's blood type is O negative.", memory_type=CORE).id
        clock.advance(4 * DAY)  # every episodic memory is under 0.10 now, none yet at its floor
        report = next(iter(events)).event
        events.cancel()
        deadline = time.monotonic() + 10
        while stub.Identity(pb.IdentityRequest(channel="diary")).consolidation_sweeps < 1:
            assert time.monotonic() < deadline, "no sweep"
            time.sleep(0.05)
        states = {
            memory_id: stub.Inspect(pb.InspectRequest(channel="diary", id=memory_id)).memory.state
            for memory_id in [*ids, *twins, pinned, core]
        }
    payload = dict(report.payload)
    assert payload["sweep"] == "true"
    merged = payload["merged_ids"].split(",")
    assert len(merged) == 1 and merged[0] in twins and states[merged[0]] == MERGED
    archived = payload["archived_ids"].split(",")
    cold_left = [i for i, state in states.items() if state == COLD]
    assert len(cold_left) == TRIGGER - 1, "back under the trigger"
    assert pinned in cold_left, "a keystone is never archived"
    assert states[core] != ARCHIVED
    # The coldest went first: the oldest diary lines, all of them before any newer one.
    assert archived == ids[::-1][: len(archived)]
    assert all(states[i] == ARCHIVED for i in archived)
    assert int(payload["swept"]) == len(archived)
