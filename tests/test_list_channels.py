"""ListChannels through the protos: the channels that hold anything, by name, paged."""

from __future__ import annotations

import json

import grpc
import pytest

from calor.client import CalorClient
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.helpers import Run


def test_channels_are_listed_by_name_in_pages_and_by_prefix(
    memories: MemoryServiceStub, calor_target: str
) -> None:
    names = [f"listing-{n}/notes" for n in range(5)]
    for name in reversed(names):
        memories.Store(pb.StoreRequest(channel=name, text=f"A note kept in {name}."))
    memories.Recall(pb.RecallRequest(channel="listing-never/written", query="anything"))
    seen: list[str] = []
    token = ""
    while True:
        page = memories.ListChannels(
            pb.ListChannelsRequest(prefix="listing-", page_size=2, page_token=token)
        )
        assert len(page.channels) <= 2
        seen += page.channels
        token = page.next_page_token
        if not token:
            break
    assert seen == names  # a read does not make a channel
    with CalorClient(calor_target) as client:
        assert client.list_channels("listing-3") == ["listing-3/notes"]
        assert set(names) <= set(client.list_channels())


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (pb.ListChannelsRequest(page_size=-1), "page_size"),
        (pb.ListChannelsRequest(page_token="not a token"), "page_token"),
        (pb.ListChannelsRequest(prefix="x" * 200), "prefix"),
    ],
)
def test_a_bad_listing_is_refused_with_the_field_named(
    memories: MemoryServiceStub, request_: pb.ListChannelsRequest, words: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        memories.ListChannels(request_)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in str(refused.value.details())


def test_calor_channels_prints_one_name_a_line(calor: Run, channel_name: str) -> None:
    assert calor("store", "A note so the channel holds something.")[0] == 0
    status, out, _ = calor("channels", "--prefix", channel_name)
    assert status == 0 and out.split() == [channel_name]
    status, out, _ = calor("--json", "channels", "--prefix", channel_name)
    assert status == 0 and json.loads(out)["channels"] == [channel_name]
    status, out, _ = calor("channels", "--prefix", "no-such-channel-prefix")
    assert status == 0 and "no channel" in out
