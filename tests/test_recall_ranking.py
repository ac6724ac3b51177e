"""Recall's ranking pieces end to end: words fused with meaning, source trust, and one
conversation not filling the answer. Each is shown by turning its weight off."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from tests.helpers import EPISODIC, store

HUMAN = memory_pb2.SOURCE_HUMAN
AGENT = memory_pb2.SOURCE_AGENT


@pytest.fixture(scope="module")
def settings(grpc_channel: grpc.Channel) -> SettingsServiceStub:
    return SettingsServiceStub(grpc_channel)


def set_weight(stub: SettingsServiceStub, channel: str, name: str, value: float) -> None:
    request = spb.UpdateSettingsRequest(
        channel=channel,
        settings=memory_pb2.ChannelSettings(**{name: value}),  # type: ignore[arg-type]
        update_mask=FieldMask(paths=[name]),
    )
    stub.UpdateSettings(request)


def recall(stub: MemoryServiceStub, channel: str, query: str, limit: int = 10) -> pb.RecallResponse:
    return stub.Recall(pb.RecallRequest(channel=channel, query=query, limit=limit, peek=True))


def test_a_rare_name_in_the_query_lifts_the_memory_that_holds_it(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    query = "When did I go to the Turbocharged Tuesdays meetup?"
    named = "By the way, Turbocharged Tuesdays was packed with people this week."
    for name in (channel_name, channel_name + "-nolex"):
        store(memories, name, named, memory_type=EPISODIC)
        store(memories, name, "I went to a car meetup on Tuesday evening.", memory_type=EPISODIC)
        store(memories, name, "Meetups for car fans happen every week downtown.")
    set_weight(settings, channel_name + "-nolex", "weight_lexical", 0.0)

    fused = recall(memories, channel_name, query)
    by_meaning = recall(memories, channel_name + "-nolex", query)

    assert by_meaning.hits[0].memory.text != named  # meaning alone prefers the paraphrase
    assert fused.hits[0].memory.text == named
    assert fused.hits[0].lexical > max(h.lexical for h in fused.hits[1:])


def test_what_a_person_said_outranks_the_agent_saying_the_same(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    text = "The spare key is under the blue flower pot."
    said = store(memories, channel_name, text, source=HUMAN)
    echoed = store(memories, channel_name, text + " ", source=AGENT)

    hits = recall(memories, channel_name, "where is the spare key?").hits

    assert [h.memory.id for h in hits] == [said.id, echoed.id]
    assert hits[0].source == pytest.approx(0.12 * 1.0)
    assert hits[1].source == pytest.approx(0.12 * 0.7)
    set_weight(settings, channel_name, "weight_source", 0.0)
    assert all(h.source == 0.0 for h in recall(memories, channel_name, "where is the key?").hits)


def test_one_conversation_does_not_fill_the_answer(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    chat = [
        "I adopted a puppy named Biscuit last weekend.",
        "Biscuit the puppy chewed through my slippers.",
        "My puppy Biscuit loves the dog park.",
    ]
    other = "At the vet, Biscuit the puppy got his first shots."
    for name in (channel_name, channel_name + "-nodiv"):
        for text in chat:
            store(memories, name, text, memory_type=EPISODIC, tags={"session": "1"})
        store(memories, name, other, memory_type=EPISODIC, tags={"session": "2"})
        store(memories, name, "The quarterly tax forms are due in April.")
    set_weight(settings, channel_name + "-nodiv", "weight_session", 0.0)
    query = "What did my puppy Biscuit do?"

    plain = recall(memories, channel_name + "-nodiv", query, limit=3)
    diverse = recall(memories, channel_name, query, limit=3)

    assert [h.memory.text for h in plain.hits] != [h.memory.text for h in diverse.hits]
    assert other not in [h.memory.text for h in plain.hits]
    assert other in [h.memory.text for h in diverse.hits]
    penalties = sorted(h.session_penalty for h in diverse.hits)
    assert penalties[0] == 0.0 and max(penalties) == pytest.approx(0.07)
    scores = [h.score for h in diverse.hits]
    assert scores == sorted(scores, reverse=True)
