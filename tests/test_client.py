"""The Python clients against a real server: store, recall, tend, page, and the error tree."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

import calor.client
from calor.client import (
    AsyncCalorClient,
    CalorClient,
    CalorClientError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    ServerError,
    from_rpc_error,
)


def test_public_surface_is_pinned_and_sorted() -> None:
    assert calor.client.__all__ == [
        "AlreadyExistsError",
        "AsyncCalorClient",
        "AsyncEventStream",
        "Backoff",
        "CalorClient",
        "CalorClientError",
        "DeadlineExceededError",
        "EventStream",
        "InvalidArgumentError",
        "NotFoundError",
        "OutOfRangeError",
        "PermissionDeniedError",
        "ResourceExhaustedError",
        "ServerError",
        "UnauthenticatedError",
        "UnavailableError",
        "UnimplementedError",
        "from_rpc_error",
        "to_dict",
    ]
    assert calor.client.__all__ == sorted(calor.client.__all__)
    for name in calor.client.__all__:
        assert getattr(calor.client, name) is not None


def test_health_is_serving(client: CalorClient) -> None:
    assert client.health() == "SERVING"


def test_store_then_recall_finds_it(client: CalorClient) -> None:
    memory = client.store("The user is allergic to peanuts.", memory_type="fact", tags={"k": "v"})
    assert memory.id
    assert memory.text == "The user is allergic to peanuts."
    assert client.store("The office moved to the third floor.").id != memory.id

    hits = client.recall("what is the user allergic to?").hits

    assert hits, "recall found nothing"
    assert hits[0].memory.id == memory.id
    assert dict(hits[0].memory.tags) == {"k": "v"}


def test_channel_per_call_overrides_the_default(client: CalorClient, channel_name: str) -> None:
    other = f"{channel_name}-other"
    client.store("Deployments happen on Tuesdays.", channel=other)

    assert not client.recall("when do deployments happen?").hits
    assert client.recall("when do deployments happen?", channel=other).hits


def test_store_many_keeps_the_order(client: CalorClient) -> None:
    texts = [
        "Alice prefers tea over coffee.",
        "The build server runs on port 8080.",
        "Bob's birthday is in March.",
    ]

    ids = client.store_many(texts, memory_type="fact")

    assert len(ids) == len(set(ids)) == 3
    assert [client.inspect(memory_id).memory.text for memory_id in ids] == texts
    assert client.store_many([]) == []


def test_inspect_unknown_id_is_not_found(client: CalorClient) -> None:
    with pytest.raises(NotFoundError) as caught:
        client.inspect("01JD0000000000000000000000")

    assert isinstance(caught.value, CalorClientError)
    assert caught.value.code is grpc.StatusCode.NOT_FOUND
    assert isinstance(caught.value.__cause__, grpc.RpcError)


def test_empty_text_is_invalid_and_stores_nothing(client: CalorClient) -> None:
    client.store("A memory so the channel exists.")
    before = client.identity().total

    with pytest.raises(InvalidArgumentError) as caught:
        client.store("")

    assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details
    assert client.identity().total == before


def test_unknown_memory_type_is_rejected_before_sending(client: CalorClient) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown memory type"):
        client.store("Some text.", memory_type="gossip")


def test_keystone_and_boost_change_the_memory(client: CalorClient) -> None:
    # Stored as if two days old, an episodic memory has cooled enough to warm visibly.
    memory = client.store(
        "We met the supplier in Lyon.",
        memory_type="episodic",
        created_at=datetime.now(UTC) - timedelta(days=2),
    )
    assert not memory.keystone

    pinned = client.keystone(memory.id)
    assert pinned.keystone
    assert not client.keystone(memory.id, on=False).keystone

    boosted = client.boost(memory.id, delta=0.3)
    assert boosted.heat > memory.heat


def test_update_sets_only_the_fields_given(client: CalorClient) -> None:
    memory = client.store("The meeting is on Monday.", memory_type="fact", tags={"a": "1"})

    updated = client.update(memory.id, text="The meeting is on Tuesday.")

    assert updated.text == "The meeting is on Tuesday."
    assert dict(updated.tags) == {"a": "1"}


def test_forget_counts_what_it_forgot(client: CalorClient) -> None:
    ids = client.store_many(["Forget me first.", "Forget me too.", "Keep me around."])

    assert client.forget(ids[:2]) == 2
    remaining = {hit.memory.id for hit in client.recall("forget me", peek=True).hits}
    assert not remaining & set(ids[:2])


def test_iter_memories_walks_every_page(client: CalorClient) -> None:
    ids = client.store_many([f"Numbered note {n}: the value is {n * 7}." for n in range(5)])

    first = client.list_memories(page_size=2)
    assert len(first.memories) == 2
    assert first.next_page_token

    seen = [memory.id for memory in client.iter_memories(page_size=2)]
    assert sorted(seen) == sorted(ids)


def test_async_client_store_and_recall(calor_target: str, channel_name: str) -> None:
    async def scenario() -> tuple[str, list[str], str]:
        async with AsyncCalorClient(calor_target, channel=channel_name) as calor:
            memory = await calor.store("The garage code is 4417.", memory_type="fact")
            response = await calor.recall("what is the garage code?")
            listed = [m.id async for m in calor.iter_memories(page_size=1)]
            assert listed == [memory.id]
            with pytest.raises(NotFoundError):
                await calor.inspect("01JD0000000000000000000000")
            return memory.id, [hit.memory.id for hit in response.hits], await calor.health()

    memory_id, hit_ids, health = asyncio.run(scenario())

    assert hit_ids[:1] == [memory_id]
    assert health == "SERVING"


class _FailedCall(grpc.RpcError, grpc.Call):
    """A failed call as grpc raises it: the network seam, faked to carry rich details."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple = ()) -> None:
        self._code, self._details, self._metadata = code, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._metadata

    def initial_metadata(self) -> tuple:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


def test_resource_exhausted_carries_the_retry_delay() -> None:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=2)))
    status = status_pb2.Status(
        code=code_pb2.RESOURCE_EXHAUSTED, message="load gate closed", details=[detail]
    )
    call = _FailedCall(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "load gate closed",
        (("grpc-status-details-bin", status.SerializeToString()),),
    )

    error = from_rpc_error(call)

    assert isinstance(error, ResourceExhaustedError)
    assert error.retry_after == 2.0
    assert str(error) == "RESOURCE_EXHAUSTED: load gate closed"
    assert (
        from_rpc_error(_FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")).retry_after is None
    )


def test_unmapped_codes_are_server_errors() -> None:
    error = from_rpc_error(_FailedCall(grpc.StatusCode.INTERNAL, "boom"))

    assert type(error) is ServerError
    assert error.code is grpc.StatusCode.INTERNAL
    assert error.details == "boom"
