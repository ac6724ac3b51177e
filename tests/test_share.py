"""Share through the real server: a memory copied into another channel as a new memory of
its own, prefixed and with provenance; and the requests it refuses."""

from __future__ import annotations

import grpc
import pytest

from calor.server.clock import ManualClock
from calor.server.ids import new_id
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, FACT, store, total

Manual = tuple[ServerThread, ManualClock, MemoryServiceStub]
TEXT = "The staging database is restored from backup every Sunday night."


def share(stub: MemoryServiceStub, channel: str, memory_id: str, target: str) -> memory_pb2.Memory:
    request = pb.ShareRequest(channel=channel, id=memory_id, target_channel=target)
    return stub.Share(request).memory


def test_a_shared_memory_is_a_prefixed_copy_with_heat_of_its_own(manual_server: Manual) -> None:
    _, clock, stub = manual_server
    source = store(
        stub, "agent-7", TEXT, memory_type=EPISODIC, tags={"team": "infra", "env": "staging"}
    )
    clock.advance(DAY)
    stub.Recall(pb.RecallRequest(channel="agent-7", query="When is staging restored?"))
    before = stub.Inspect(pb.InspectRequest(channel="agent-7", id=source.id)).memory
    assert before.recall_count == 1 and before.heat < 1.0

    copy = share(stub, "agent-7", source.id, "agent-8")

    assert copy.id != source.id
    assert copy.channel == "agent-8"
    assert copy.text == f"[Shared by agent-7] {TEXT}"
    assert copy.memory_type == EPISODIC
    assert dict(copy.tags) == {"team": "infra", "env": "staging"}
    assert copy.provenance["shared_from_channel"] == "agent-7"
    assert copy.provenance["shared_from_id"] == source.id
    assert (copy.heat, copy.recall_count, copy.stability) == (1.0, 0, 1.0)
    assert copy.created_at.seconds == int(clock.now())
    after = stub.Inspect(pb.InspectRequest(channel="agent-7", id=source.id)).memory
    assert after == before, "sharing reads the source and changes nothing there"
    assert stub.Identity(pb.IdentityRequest(channel="agent-8")).total == 1


def test_the_copy_is_found_by_meaning_like_its_source(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    source = store(memories, channel_name, TEXT, memory_type=FACT)
    target = f"{channel_name}-team"
    copy = share(memories, channel_name, source.id, target)
    query = "how often is the staging database restored?"

    def top(channel: str) -> pb.RecallHit:
        request = pb.RecallRequest(channel=channel, query=query, peek=True)
        return memories.Recall(request).hits[0]

    here, there = top(channel_name), top(target)
    assert (here.memory.id, there.memory.id) == (source.id, copy.id)
    assert there.similarity == pytest.approx(here.similarity, abs=1e-6), "the same embedding"
    assert there.memory.memory_type == FACT


def test_a_copy_of_a_copy_names_the_channel_it_came_from(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    source = store(memories, channel_name, TEXT)
    first = share(memories, channel_name, source.id, f"{channel_name}-b")
    second = share(memories, f"{channel_name}-b", first.id, f"{channel_name}-c")
    assert second.text == f"[Shared by {channel_name}-b] [Shared by {channel_name}] {TEXT}"
    assert second.provenance["shared_from_id"] == first.id


def test_sharing_an_unknown_or_forgotten_memory_is_not_found(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    target = f"{channel_name}-target"
    gone = store(memories, channel_name, TEXT)
    memories.Forget(pb.ForgetRequest(channel=channel_name, ids=[gone.id]))
    for channel, memory_id in (
        (channel_name, new_id()),
        (channel_name, gone.id),
        ("nowhere", gone.id),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            share(memories, channel, memory_id, target)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value.details()
        assert memory_id in (caught.value.details() or "")
    assert total(memories, target) == 0


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("", ["target_channel", "required"]),
        ("bad name!", ["target_channel", "not a channel name"]),
        ("SAME", ["target_channel", "own channel"]),
    ],
)
def test_bad_targets_are_refused(
    memories: MemoryServiceStub, channel_name: str, target: str, words: list[str]
) -> None:
    source = store(memories, channel_name, TEXT)
    target = channel_name if target == "SAME" else target

    with pytest.raises(grpc.RpcError) as caught:
        share(memories, channel_name, source.id, target)

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for word in words:
        assert word in (caught.value.details() or ""), caught.value.details()
    assert total(memories, channel_name) == 1


def test_a_bad_id_is_refused(memories: MemoryServiceStub, channel_name: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        share(memories, channel_name, "not-an-id", f"{channel_name}-b")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "id" in (caught.value.details() or "")
