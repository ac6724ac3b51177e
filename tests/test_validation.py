"""Bad input gets INVALID_ARGUMENT with a clear message, and changes nothing."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import grpc
import pytest

from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.helpers import store, total, ts


def rejected(call: Callable[[], object], *words: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    for word in words:
        assert word in (caught.value.details() or ""), caught.value.details()


BAD_STORES = {
    "empty text": (dict(text=""), "text"),
    "blank text": (dict(text="   \n\t"), "text"),
    "oversized text": (dict(text="x" * (32 * 1024 + 1)), "32768"),
    "unknown type": (dict(text="ok", memory_type=99), "memory_type"),
    "unknown source": (dict(text="ok", source=42), "source"),
    "NaN importance": (dict(text="ok", importance=math.nan), "importance"),
    "importance over 1": (dict(text="ok", importance=1.5), "importance"),
    "negative importance": (dict(text="ok", importance=-0.1), "importance"),
    "empty tag key": (dict(text="ok", tags={"": "v"}), "tags"),
    "oversized tag": (dict(text="ok", tags={"k": "v" * 300}), "tags"),
    "future created_at": (dict(text="ok", created_at=ts(time.time() + 86_400)), "created_at"),
    "long idempotency key": (dict(text="ok", idempotency_key="k" * 300), "idempotency_key"),
}


@pytest.mark.parametrize("case", BAD_STORES.values(), ids=BAD_STORES.keys())
def test_bad_store_changes_nothing(
    memories: MemoryServiceStub, channel_name: str, case: tuple[dict[str, object], str]
) -> None:
    fields, word = case
    store(memories, channel_name, "An existing memory.")
    rejected(lambda: memories.Store(pb.StoreRequest(channel=channel_name, **fields)), word)  # type: ignore[arg-type]
    assert total(memories, channel_name) == 1


@pytest.mark.parametrize("channel", ["", "has space", "-leading", "x" * 129, "semi;colon"])
def test_bad_channel_names(memories: MemoryServiceStub, channel: str) -> None:
    rejected(lambda: memories.Store(pb.StoreRequest(channel=channel, text="hello")), "channel")


BAD_RECALLS = {
    "limit over the cap": (dict(limit=1001), "limit"),
    "negative limit": (dict(limit=-1), "limit"),
    "NaN min_heat": (dict(min_heat=math.nan), "min_heat"),
    "min_heat over 1": (dict(min_heat=2.0), "min_heat"),
    "unknown type filter": (dict(memory_types=[77]), "memory_types"),
    "unspecified type filter": (dict(memory_types=[0]), "memory_types"),
    "unknown state filter": (dict(states=[77]), "states"),
    "reversed window": (dict(time_from=ts(2000.0), time_to=ts(1000.0)), "time_from"),
    "empty query": (dict(query=""), "query"),
    "bad extra channel": (dict(channels=["no spaces allowed"]), "channels"),
}


@pytest.mark.parametrize("case", BAD_RECALLS.values(), ids=BAD_RECALLS.keys())
def test_bad_recall_changes_nothing(
    memories: MemoryServiceStub, channel_name: str, case: tuple[dict[str, object], str]
) -> None:
    fields, word = case
    memory = store(memories, channel_name, "The deploy key is in the vault.")
    request = pb.RecallRequest(channel=channel_name, query="deploy key")
    for key, value in fields.items():
        if isinstance(value, list):
            getattr(request, key).extend(value)
        elif key in ("time_from", "time_to"):
            getattr(request, key).CopyFrom(value)
        else:
            setattr(request, key, value)
    rejected(lambda: memories.Recall(request), word)
    after = memories.Inspect(pb.InspectRequest(channel=channel_name, id=memory.id)).memory
    assert after.recall_count == 0


def test_bad_stream_item_stores_nothing(memories: MemoryServiceStub, channel_name: str) -> None:
    items = [
        pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel_name, text=f"row {i}"))
        for i in range(200)
    ]
    items[150].store.text = ""
    rejected(lambda: memories.StoreStream(iter(items)), "item 150", "text")
    assert total(memories, channel_name) == 0


def test_empty_stream_is_rejected(memories: MemoryServiceStub) -> None:
    rejected(lambda: memories.StoreStream(iter([])), "no items")


def test_bad_ids_and_deltas(memories: MemoryServiceStub, channel_name: str) -> None:
    memory = store(memories, channel_name, "Boost me.")
    rejected(lambda: memories.Inspect(pb.InspectRequest(channel=channel_name, id="nope")), "id")
    rejected(
        lambda: memories.Boost(pb.BoostRequest(channel=channel_name, id=memory.id, delta=math.inf)),
        "delta",
    )
    rejected(
        lambda: memories.Boost(pb.BoostRequest(channel=channel_name, id=memory.id, delta=1.5)),
        "delta",
    )
    rejected(lambda: memories.Forget(pb.ForgetRequest(channel=channel_name)), "forget")
    rejected(
        lambda: memories.Forget(pb.ForgetRequest(channel=channel_name, filter=pb.ForgetFilter())),
        "filter",
    )
    rejected(
        lambda: memories.ListMemories(
            pb.ListMemoriesRequest(channel=channel_name, page_token="!!")
        ),
        "page_token",
    )
    rejected(
        lambda: memories.ListMemories(pb.ListMemoriesRequest(channel=channel_name, page_size=5000)),
        "page_size",
    )
    after = memories.Inspect(pb.InspectRequest(channel=channel_name, id=memory.id)).memory
    assert after.heat == pytest.approx(memory.heat, abs=1e-3)
    assert total(memories, channel_name) == 1


def test_bad_updates_change_nothing(memories: MemoryServiceStub, channel_name: str) -> None:
    memory = store(
        memories, channel_name, "Original text.", memory_type=memory_pb2.MEMORY_TYPE_FACT
    )
    update = pb.UpdateRequest(channel=channel_name, id=memory.id, text="")
    update.update_mask.paths.append("text")
    rejected(lambda: memories.Update(update), "text")
    unknown = pb.UpdateRequest(channel=channel_name, id=memory.id, text="New")
    unknown.update_mask.paths.append("heat")
    rejected(lambda: memories.Update(unknown), "update_mask")
    rejected(
        lambda: memories.Update(pb.UpdateRequest(channel=channel_name, id=memory.id)), "nothing"
    )
    assert memories.Inspect(pb.InspectRequest(channel=channel_name, id=memory.id)).memory.text == (
        "Original text."
    )


def test_unknown_ids_are_not_found(memories: MemoryServiceStub, channel_name: str) -> None:
    ghost_id = "01J00000000000000000000000"
    for call in (
        lambda: memories.Inspect(pb.InspectRequest(channel=channel_name, id=ghost_id)),
        lambda: memories.Boost(pb.BoostRequest(channel=channel_name, id=ghost_id)),
        lambda: memories.Keystone(
            pb.KeystoneRequest(channel=channel_name, id=ghost_id, keystone=True)
        ),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
