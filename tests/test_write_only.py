"""A key granted ``write`` but not ``read`` learns nothing a memory says from any answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.test_access import add_key, bearer

SECRET = "the launch code is 4417 and Alice keeps it in the blue binder"


@dataclass
class Keys:
    stub: MemoryServiceStub
    writer: tuple[tuple[str, str], ...]
    """write on team-a/* only"""
    owner: tuple[tuple[str, str], ...]
    """read and write on team-a/*"""


@pytest.fixture(scope="module")
def keys(
    start_server: Callable[..., ServerThread], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Keys]:
    path = tmp_path_factory.mktemp("auth") / "keys.toml"
    _, writer = add_key(path, "team-a/*=write")
    _, owner = add_key(path, "team-a/*=read,write", "shared=write")
    server = start_server(auth_file=path)
    with grpc.insecure_channel(server.target) as channel:
        yield Keys(MemoryServiceStub(channel), bearer(writer), bearer(owner))


def assert_withheld(memory: memory_pb2.Memory, memory_id: str) -> None:
    """The id, state and heat are there; nothing the memory says is."""
    assert memory.id == memory_id
    assert memory.content_withheld
    assert memory.heat > 0
    assert memory.state == memory_pb2.MEMORY_STATE_ACTIVE
    assert (memory.text, dict(memory.tags), list(memory.entities)) == ("", {}, [])
    assert not memory.provenance


def stored_by_owner(keys: Keys, channel: str, **fields: object) -> str:
    request = pb.StoreRequest(
        channel=channel,
        text=SECRET,
        tags={"project": "apollo"},
        **fields,  # type: ignore[arg-type]
    )
    reply = keys.stub.Store(request, metadata=keys.owner)
    assert reply.memory.text == SECRET and not reply.memory.content_withheld
    return reply.memory.id


def test_boost_keystone_update_answer_without_content(keys: Keys) -> None:
    memory_id = stored_by_owner(keys, "team-a/ops")
    boosted = keys.stub.Boost(
        pb.BoostRequest(channel="team-a/ops", id=memory_id, delta=0.1), metadata=keys.writer
    )
    assert_withheld(boosted.memory, memory_id)
    pinned = keys.stub.Keystone(
        pb.KeystoneRequest(channel="team-a/ops", id=memory_id, keystone=True),
        metadata=keys.writer,
    )
    assert_withheld(pinned.memory, memory_id)
    assert pinned.memory.keystone
    updated = keys.stub.Update(
        pb.UpdateRequest(channel="team-a/ops", id=memory_id, tags={"reviewed": "yes"}),
        metadata=keys.writer,
    )
    assert_withheld(updated.memory, memory_id)
    # The writes happened: the owner (who may read) sees them, content and all.
    seen = keys.stub.Inspect(
        pb.InspectRequest(channel="team-a/ops", id=memory_id), metadata=keys.owner
    )
    assert seen.memory.keystone and seen.memory.tags["reviewed"] == "yes"
    assert seen.memory.text == SECRET and not seen.memory.content_withheld


def test_idempotent_store_does_not_read_back_an_earlier_memory(keys: Keys) -> None:
    memory_id = stored_by_owner(keys, "team-a/ingest", idempotency_key="batch-7")
    again = keys.stub.Store(
        pb.StoreRequest(channel="team-a/ingest", text="anything", idempotency_key="batch-7"),
        metadata=keys.writer,
    )
    assert_withheld(again.memory, memory_id)


def test_a_write_only_store_answers_its_id_and_the_memory_is_whole(keys: Keys) -> None:
    reply = keys.stub.Store(
        pb.StoreRequest(channel="team-a/ingest", text="the backup runs at 02:00 UTC"),
        metadata=keys.writer,
    )
    assert_withheld(reply.memory, reply.memory.id)
    seen = keys.stub.Inspect(
        pb.InspectRequest(channel="team-a/ingest", id=reply.memory.id), metadata=keys.owner
    )
    assert seen.memory.text == "the backup runs at 02:00 UTC"


def test_a_share_into_a_write_only_channel_answers_without_content(keys: Keys) -> None:
    memory_id = stored_by_owner(keys, "team-a/notes")
    shared = keys.stub.Share(
        pb.ShareRequest(channel="team-a/notes", id=memory_id, target_channel="shared"),
        metadata=keys.owner,
    )
    assert shared.memory.channel == "shared"
    assert_withheld(shared.memory, shared.memory.id)


def test_write_only_still_may_not_read(keys: Keys) -> None:
    memory_id = stored_by_owner(keys, "team-a/ops")
    for call in (
        lambda: keys.stub.Inspect(
            pb.InspectRequest(channel="team-a/ops", id=memory_id), metadata=keys.writer
        ),
        lambda: keys.stub.Recall(
            pb.RecallRequest(channel="team-a/ops", query="launch code"), metadata=keys.writer
        ),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
