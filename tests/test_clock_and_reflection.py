"""Decay read through the API on a server whose clock the test moves; server reflection."""

from __future__ import annotations

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from calor.server.clock import ManualClock
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.helpers import CORE, DAY, EPISODIC, FACT, store

ManualServer = tuple[ServerThread, ManualClock, MemoryServiceStub]


def heat(stub: MemoryServiceStub, channel: str, memory_id: str) -> float:
    return stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id)).memory.heat


def test_heat_decays_with_the_clock(manual_server: ManualServer) -> None:
    _, clock, stub = manual_server
    episodic = store(stub, "c", "We shipped the beta.", memory_type=EPISODIC)
    fact = store(stub, "c", "The beta runs on three servers.", memory_type=FACT)
    core = store(stub, "c", "The user's name is Ada.", memory_type=CORE)
    assert heat(stub, "c", episodic.id) == 1.0
    clock.advance(DAY)
    assert heat(stub, "c", episodic.id) == pytest.approx(0.5, abs=1e-12)
    clock.advance(29 * DAY)
    assert heat(stub, "c", fact.id) == pytest.approx(2 ** (-30 / 365), abs=1e-12)
    assert heat(stub, "c", episodic.id) == pytest.approx(0.01)  # at its floor
    clock.advance(3 * 365 * DAY)
    assert heat(stub, "c", core.id) == pytest.approx(0.60, abs=1e-12)


def test_recall_bump_then_slower_decay(manual_server: ManualServer) -> None:
    _, clock, stub = manual_server
    memory = store(stub, "r", "The standup moved to 10am.", memory_type=EPISODIC)
    clock.advance(DAY)
    hit = stub.Recall(pb.RecallRequest(channel="r", query="when is standup", limit=1)).hits[0]
    assert hit.heat == pytest.approx(0.5, abs=1e-12)
    assert hit.memory.heat == pytest.approx(0.65, abs=1e-12)
    clock.advance(1.5 * DAY)  # stability 1.5: one effective half-life
    assert heat(stub, "r", memory.id) == pytest.approx(0.325, abs=1e-12)


def test_keystone_does_not_decay(manual_server: ManualServer) -> None:
    _, clock, stub = manual_server
    memory = store(stub, "k", "Never deploy on Fridays.", memory_type=EPISODIC, keystone=True)
    clock.advance(400 * DAY)
    assert heat(stub, "k", memory.id) == 1.0


def test_reflection_lists_the_services(calor_target: str) -> None:
    with grpc.insecure_channel(calor_target) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "calor.v1.MemoryService" in services
    assert "grpc.health.v1.Health" in services
