"""Recall's ranking pieces end to end: words fused with meaning and source trust, each
shown by turning its weight off."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp

from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from tests.helpers import EPISODIC, FACT, store

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
    named = "By the way, I found Turbocharged Tuesdays packed with people this week."
    words, meaning = channel_name + "-words", channel_name + "-meaning"
    for name in (words, meaning):
        store(memories, name, named, memory_type=EPISODIC)
        store(memories, name, "I went to a car meetup on Tuesday evening.", memory_type=EPISODIC)
        store(memories, name, "Meetups for car fans happen every week downtown.")
    set_weight(settings, words, "weight_lexical", 1.0)
    set_weight(settings, meaning, "weight_lexical", 0.0)

    by_words = recall(memories, words, query)
    by_meaning = {h.memory.text: h for h in recall(memories, meaning, query).hits}

    assert by_words.hits[0].memory.text == named
    assert by_words.hits[0].lexical > max(h.lexical for h in by_words.hits[1:]) > 0.0
    top = by_words.hits[0]
    assert 0.0 < top.lexical_weight <= 1.0  # the rare name is trusted
    assert top.relevance > top.similarity  # and lifts the memory that holds it
    for hit in by_words.hits:  # the same memories, scored with and without their words
        without = by_meaning[hit.memory.text]
        assert hit.lexical == pytest.approx(without.lexical)
        assert hit.similarity == pytest.approx(without.similarity)
        assert (without.lexical_weight, without.relevance) == (0.0, without.similarity)
        for shown in (hit, without):  # the score is its parts, as the hit reports them
            assert shown.score == pytest.approx(
                0.70 * shown.relevance
                + (0.30 * shown.heat + 0.15 * shown.keyword) * shown.spread
                + shown.temporal
                + shown.channel_bonus
                + shown.source
            )


def test_what_a_person_said_outranks_the_agent_saying_the_same(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    text = "The spare key is under the blue flower pot."
    said = store(memories, channel_name, text, source=HUMAN)
    echoed = store(memories, channel_name, text + " ", source=AGENT)

    hits = recall(memories, channel_name, "where is the spare key?").hits

    assert [h.memory.id for h in hits] == [said.id, echoed.id]
    assert hits[0].source == pytest.approx(0.30 * 1.0)
    assert hits[1].source == pytest.approx(0.30 * 0.7)
    set_weight(settings, channel_name, "weight_source", 0.0)
    assert all(h.source == 0.0 for h in recall(memories, channel_name, "where is the key?").hits)


def test_words_weigh_the_same_in_the_attic_as_in_the_live_index(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    """A recall with include_archived searches two indexes; BM25 weighs the query's words
    by what both hold, so the same text scores the same words wherever it lives."""
    text = "The Zanzibar office keys hang by the blue door."
    years_ago = Timestamp(seconds=int(time.time()) - 3 * 365 * 86400)
    store(memories, channel_name, text, memory_type=FACT)  # stays live
    store(memories, channel_name, text, memory_type=EPISODIC, created_at=years_ago)  # attic
    for n in range(12):  # the live index alone holds many more memories naming the keys
        store(
            memories,
            channel_name,
            f"Spare keys number {n} are kept in the top drawer of the cabinet in hall {n}.",
            memory_type=FACT,
        )
    set_weight(settings, channel_name, "weight_lexical", 1.0)
    both = memories.Recall(
        pb.RecallRequest(
            channel=channel_name,
            query="Where are the Zanzibar office keys, and which drawer?",
            limit=20,
            peek=True,
            include_archived=True,
        )
    )
    same = [h for h in both.hits if h.memory.text == text]
    assert sorted(h.memory.state for h in same) == sorted(
        [memory_pb2.MEMORY_STATE_ACTIVE, memory_pb2.MEMORY_STATE_ARCHIVED]
    ), "one copy live, one in the attic"
    assert same[0].lexical > 0.0
    assert same[0].lexical == pytest.approx(same[1].lexical)
    # Meaning and words are fused over both indexes' candidates at once (the cosines
    # agree to the attic's 4-bit rounding of its vectors).
    assert same[0].relevance == pytest.approx(same[1].relevance, abs=0.01)
    assert same[0].lexical_weight == same[1].lexical_weight > 0.0
