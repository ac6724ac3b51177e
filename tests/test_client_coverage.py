"""Both Python clients cover the API: every RPC the protos declare has a method on
``CalorClient`` and ``AsyncCalorClient``, and the methods added for it work against a
real server."""

from __future__ import annotations

import asyncio
import inspect
import re
from datetime import UTC, datetime, timedelta
from types import ModuleType

import pytest
from google.protobuf.descriptor import MethodDescriptor

from calor.client import AsyncCalorClient, CalorClient, InvalidArgumentError
from calor.v1 import (
    memory_pb2,
    memory_service_pb2,
    settings_service_pb2,
    trigger_service_pb2,
)
from tests.conftest import ServerThread

_MODULES: tuple[ModuleType, ...] = (memory_service_pb2, settings_service_pb2, trigger_service_pb2)

METHOD_NAMES = {
    "StoreStream": "store_many",
    "Import": "import_markdown",
    "ServerStatus": "status",
}
"""The client method of each RPC whose name is not the snake_case of the RPC's."""

NO_CHANNEL_ARGUMENT = {
    "TriggerHistory": "a trigger's history is read from the trigger's own channel",
    "DeleteTrigger": "the trigger is found among the key's channels (the channel only tells "
    "apart two triggers of one id)",
}
"""RPCs whose request has a ``channel`` that the client method need not take, and why."""


def _rpcs() -> list[MethodDescriptor]:
    return [
        method
        for module in _MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def method_name(rpc: str) -> str:
    """The client method an RPC should have: ``GetSettings`` → ``get_settings``."""
    return METHOD_NAMES.get(rpc, re.sub(r"(?<!^)(?=[A-Z])", "_", rpc).lower())


RPCS = _rpcs()
RPC_IDS = [method.full_name for method in RPCS]


def test_the_walk_finds_every_service_and_the_mapping_names_real_rpcs() -> None:
    services = {method.containing_service.full_name for method in RPCS}
    assert services == {
        "calor.v1.MemoryService",
        "calor.v1.SettingsService",
        "calor.v1.TriggerService",
    }
    names = {method.name for method in RPCS}
    assert {"Offer", "Connect", "GetSettings", "UpdateSettings", "DropChannel"} <= names
    assert set(METHOD_NAMES) <= names
    assert set(NO_CHANNEL_ARGUMENT) <= names
    assert method_name("GetSettings") == "get_settings"
    assert method_name("EvaluateTriggers") == "evaluate_triggers"


@pytest.mark.parametrize("rpc", RPCS, ids=RPC_IDS)
def test_every_rpc_has_a_method_on_both_clients(rpc: MethodDescriptor) -> None:
    name = method_name(rpc.name)
    where = f"{rpc.full_name} has no client method {name}()"
    sync = getattr(CalorClient, name, None)
    assert callable(sync), f"CalorClient: {where}"
    assert not inspect.iscoroutinefunction(sync), f"CalorClient.{name} must block, not await"
    aio = getattr(AsyncCalorClient, name, None)
    assert callable(aio), f"AsyncCalorClient: {where}"
    if rpc.server_streaming:  # iterated with `async for`
        returns = str(inspect.signature(aio).return_annotation)
        assert (
            inspect.isasyncgenfunction(aio)
            or "AsyncGenerator" in returns
            or returns == "AsyncEventStream"  # an async iterator that may be awaited first
        ), f"AsyncCalorClient.{name} must stream"
    else:
        assert inspect.iscoroutinefunction(aio), f"AsyncCalorClient.{name} must be awaitable"


@pytest.mark.parametrize("rpc", RPCS, ids=RPC_IDS)
def test_a_method_of_a_channel_rpc_takes_channel(rpc: MethodDescriptor) -> None:
    if "channel" not in rpc.input_type.fields_by_name or rpc.name in NO_CHANNEL_ARGUMENT:
        pytest.skip("its request names no channel the caller chooses")
    name = method_name(rpc.name)
    for client in (CalorClient, AsyncCalorClient):
        parameters = inspect.signature(getattr(client, name)).parameters
        assert "channel" in parameters, f"{client.__name__}.{name} takes no channel"


def _manual(edge: memory_pb2.Edge) -> bool:
    return edge.kind == memory_pb2.EDGE_KIND_MANUAL


def test_the_new_methods_of_the_sync_client_work(client: CalorClient) -> None:
    a = client.store("The deploy runbook lives in the ops wiki.", memory_type="fact")
    b = client.store("Deploys need a green build on main first.", memory_type="procedural")

    edge = client.connect(a.id, b.id, weight=0.4)
    assert (edge.from_id, edge.to_id, _manual(edge)) == (a.id, b.id, True)
    assert edge.weight == pytest.approx(0.4)
    assert any(_manual(e) and b.id in (e.from_id, e.to_id) for e in client.inspect(a.id).edges)

    assert client.get_settings().entropy_threshold == 4096  # DESIGN's default
    fact = {"memory_type": "fact", "half_life_seconds": 3600.0, "floor": 0.2}
    settings = client.update_settings(
        entropy_threshold=64,
        decay_mode="hybrid",
        dream_archive_exempt_types=["core"],
        profiles=[{**fact, "stability_gain": 2.0}],
    )
    assert settings.entropy_threshold == 64
    assert settings.decay_mode == memory_pb2.DECAY_MODE_HYBRID
    assert list(settings.dream_archive_exempt_types) == [memory_pb2.MEMORY_TYPE_CORE]
    profiles = {p.memory_type: p for p in settings.profiles}
    assert profiles[memory_pb2.MEMORY_TYPE_FACT].half_life_seconds == 3600.0
    assert profiles[memory_pb2.MEMORY_TYPE_EPISODIC].half_life_seconds == 86_400.0  # untouched
    assert client.get_settings() == settings

    first = client.offer(b"x" * 40)
    assert (first.accumulated, first.dreamed) == (40, False)
    second = client.offer("y" * 30)  # text is offered as its UTF-8 bytes
    assert (second.accumulated, second.dreamed) == (0, True)
    assert second.report.duration_ms >= 0

    client.store("Scratch: try the staging box.", memory_type="working")
    client.store("Scratch: the staging box answered.", memory_type="working")
    assert client.forget(memory_types=["working"]) == 2
    assert client.forget(b.id, tags={"none": "such"}) == 1  # ids and a filter together
    kept = client.list_memories(states=["active", "cold"]).memories
    assert [m.id for m in kept] == [a.id]


def test_forget_by_creation_time_and_tags(client: CalorClient) -> None:
    old = client.store(
        "We moved to the new office in 2024.",
        tags={"topic": "office"},
        created_at=datetime.now(UTC) - timedelta(days=400),
    )
    new = client.store("The new office has a roof garden.", tags={"topic": "office"})
    cutoff = datetime.now(UTC) - timedelta(days=30)
    assert client.forget(created_before=cutoff, tags={"topic": "office"}) == 1
    assert client.inspect(old.id).memory.state == memory_pb2.MEMORY_STATE_DELETED
    assert client.inspect(new.id).memory.state == memory_pb2.MEMORY_STATE_ACTIVE


def test_update_clears_a_merge(client: CalorClient) -> None:
    ids = [
        client.store(text, memory_type="fact").id
        for text in (
            "Our team standup meeting is at 9am every day.",
            "The daily team standup is at 9am.",
        )
    ]
    assert client.dream().merged == 1
    absorbed = next(
        m for m in map(client.inspect, ids) if m.memory.state == memory_pb2.MEMORY_STATE_MERGED
    )
    restored = client.update(absorbed.memory.id, clear_merge=True)
    assert restored.state == memory_pb2.MEMORY_STATE_ACTIVE and not restored.merged_into


def test_bad_settings_change_nothing(client: CalorClient) -> None:
    before = client.get_settings()
    with pytest.raises(TypeError, match="no_such_setting"):
        client.update_settings(no_such_setting=1)
    with pytest.raises(InvalidArgumentError, match="decay_mode"):
        client.update_settings(decay_mode="sometimes")
    with pytest.raises(InvalidArgumentError, match="cold_threshold"):
        client.update_settings(cold_threshold=7.0, entropy_threshold=64)
    with pytest.raises(InvalidArgumentError):  # nothing named
        client.update_settings()
    assert client.get_settings() == before


def test_forget_with_neither_ids_nor_a_filter_is_refused(client: CalorClient) -> None:
    client.store("Keep me.")
    with pytest.raises(InvalidArgumentError):
        client.forget()
    with pytest.raises(InvalidArgumentError):
        client.forget(memory_types=[])  # an empty filter is no filter
    with pytest.raises(TypeError, match="created_after"):
        client.forget(created_after=datetime.now(UTC))  # type: ignore[call-arg]
    assert len(client.list_memories().memories) == 1


def test_the_new_methods_of_the_async_client_work(
    calor_server: ServerThread, channel_name: str
) -> None:
    async def scenario(calor: AsyncCalorClient) -> None:
        a = await calor.store("The office plants need water on Fridays.")
        b = await calor.store("Scratch note.", memory_type="working")
        edge = await calor.connect(b.id, a.id)
        assert (edge.from_id, edge.to_id, _manual(edge), edge.weight) == (b.id, a.id, True, 1.0)
        assert (await calor.get_settings()).cold_threshold == pytest.approx(0.10)
        settings = await calor.update_settings(cold_threshold=0.2, entropy_threshold=10)
        assert settings.cold_threshold == pytest.approx(0.2)
        assert await calor.get_settings() == settings
        assert await calor.forget(memory_types=["working"]) == 1
        offered = await calor.offer(b"0123456789")
        assert offered.dreamed and offered.report.channel_heat_before >= 0
        assert [m.id async for m in calor.iter_memories(states=["active"])] == [a.id]

    async def run() -> None:
        async with AsyncCalorClient(calor_server.target, channel=channel_name) as calor:
            await scenario(calor)

    asyncio.run(run())
