"""A curator that runs itself (issue 34, point 2, its schedule): with
``dream_interval_seconds`` set, a channel dreams that long after its last dream, with no
request to prompt it; off (0, the default), it never does by itself."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from calor.server.clock import ManualClock
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import store, update_settings

HOUR = 3600.0


def dreams(channel: grpc.Channel, name: str, seconds: float) -> list[tpb.Event]:
    """The channel's dream events (sweeps aside) logged within ``seconds`` from now on
    (and before)."""
    stream = TriggerServiceStub(channel).Subscribe(
        tpb.SubscribeRequest(channels=[name], kinds=[tpb.EVENT_KIND_DREAM]), timeout=seconds
    )
    found = []
    try:
        for reply in stream:
            if reply.event.payload.get("sweep") == "false":
                found.append(reply.event)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return found


def test_a_channel_dreams_on_its_schedule_and_not_without_one(
    start_server: Callable[..., ServerThread],
) -> None:
    clock = ManualClock(1_780_000_000.0)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        update_settings(channel, "curated", dream_interval_seconds=HOUR)
        for name in ("curated", "left-alone"):
            store(stub, name, "The spare key is under the blue flowerpot.")
            store(stub, name, "The spare key is under the blue flowerpot!")
        clock.advance(HOUR - 60)
        assert dreams(channel, "curated", 1.5) == [], "not before its hour"
        clock.advance(61)
        first = dreams(channel, "curated", 3.0)
        assert len(first) == 1
        assert first[0].at.ToDatetime().timestamp() >= 1_780_000_000.0 + HOUR
        assert first[0].payload["merged"] == "1"  # a real dream: the twins were merged
        clock.advance(HOUR + 1)
        assert len(dreams(channel, "curated", 3.0)) == 2, "and again an hour later"
        assert dreams(channel, "left-alone", 0.5) == [], "off by default"
        deadline = time.monotonic() + 5
        while (
            stub.Identity(pb.IdentityRequest(channel="curated")).by_state.get(
                "MEMORY_STATE_MERGED", 0
            )
            != 1
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
