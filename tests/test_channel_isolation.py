"""Channels as the memory model seed names them (issue 34, point 5): an agent's standard
channels are Calor channels (``agent-7/hearing``, ``agent-7/seeing``,
``agent-7/thinking``), and a channel no call names is never reached. The agent's own
``thinking`` audit trail stays out of recall, Context, entity cards, Share and the
subscriptions of its other channels, however close its memories are to the question."""

from __future__ import annotations

import grpc
import pytest

from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.helpers import store

THOUGHTS = (
    "I suspect our client Zed is lying about the unpaid invoice.",
    "Plan: ask our client Zed for the bank receipt before shipping.",
    "Note to self: our client Zed was late paying twice before.",
    "Our client Zed seemed nervous when the invoice came up.",
    "If our client Zed cannot show the receipt, escalate to Ana.",
)


def test_a_channel_no_call_names_is_never_reached(
    memories: MemoryServiceStub, grpc_channel: grpc.Channel, channel_name: str
) -> None:
    agent = channel_name
    hearing, seeing, thinking = f"{agent}/hearing", f"{agent}/seeing", f"{agent}/thinking"
    private = {store(memories, thinking, text).id for text in THOUGHTS}
    heard = store(memories, hearing, "Our client Zed said the invoice was paid last week.")
    seen = store(memories, seeing, "The bank statement shows no payment from our client Zed.")
    question = "Did our client Zed pay the invoice?"

    # Recall: its own channel, and the others it names; never the unnamed one.
    for extra in ([], [seeing]):
        reply = memories.Recall(
            pb.RecallRequest(channel=hearing, channels=extra, query=question, limit=50, peek=True)
        )
        found = {hit.memory.id for hit in reply.hits}
        assert heard.id in found and not found & private
        assert (seen.id in found) == bool(extra)
    # Named, it is reached (the isolation is by naming, not by accident).
    named = memories.Recall(
        pb.RecallRequest(channel=hearing, channels=[thinking], query=question, peek=True)
    )
    assert {hit.memory.id for hit in named.hits} & private

    block = memories.Context(pb.ContextRequest(channel=hearing, message=question)).block
    assert "Our client Zed said the invoice was paid" in block
    assert not any(thought in block for thought in THOUGHTS)

    # The card of Zed in thinking (five memories name him) is not hearing's card.
    card = pb.EntityCardRequest(channel=thinking, entity="Zed")
    assert "receipt" in memories.EntityCard(card).card
    with pytest.raises(grpc.RpcError) as no_card:
        memories.EntityCard(pb.EntityCardRequest(channel=hearing, entity="Zed"))
    assert no_card.value.code() == grpc.StatusCode.NOT_FOUND

    # Share copies a memory of the channel it names only.
    for thought in private:
        with pytest.raises(grpc.RpcError) as not_there:
            memories.Share(pb.ShareRequest(channel=hearing, id=thought, target_channel=seeing))
        assert not_there.value.code() == grpc.StatusCode.NOT_FOUND

    # A subscription of the other channels hears nothing of thinking.
    done = store(memories, seeing, "End of the day.")
    stream = TriggerServiceStub(grpc_channel).Subscribe(
        tpb.SubscribeRequest(channels=[hearing, seeing]), timeout=30
    )
    heard_from: set[str] = set()
    for reply in stream:
        heard_from.add(reply.event.channel)
        assert reply.event.memory_id not in private
        if reply.event.memory_id == done.id:
            break
    stream.cancel()
    assert heard_from == {hearing, seeing}
