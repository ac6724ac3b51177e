"""MemoryService end to end: a real server, the real model, RocksDB in a temp dir."""

from __future__ import annotations

import time

import grpc
import pytest

from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.helpers import CORE, DAY, EPISODIC, FACT, SEMANTIC, store, texts, total, ts, utc


def test_store_then_recall_finds_the_memory(memories: MemoryServiceStub, channel_name: str) -> None:
    stored = store(memories, channel_name, "The user is allergic to peanuts.", memory_type=FACT)
    store(memories, channel_name, "Deploy process: build, test, tag, push.")
    reply = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="what is the user allergic to?")
    )
    top = reply.hits[0]
    assert top.memory.id == stored.id
    assert top.similarity == pytest.approx(0.699, abs=0.01)
    assert top.band == "high"
    # It holds both query words once ("user", "allergic"): part of the BM25 score that
    # unbounded repeats would reach. The other memory shares no word with the query.
    assert 0.3 < top.lexical < 1.0
    assert reply.hits[1].lexical == 0.0
    # Its words lift it: their share of relevance is weight_lexical times how far they
    # can be trusted here, at most all of it.
    assert 0.0 < top.lexical_weight <= 1.0
    assert top.relevance > reply.hits[1].relevance
    agent_trust = 0.30 * 0.7
    assert top.score == pytest.approx(
        0.70 * top.relevance
        + (0.30 * top.heat + 0.15 * top.keyword) * top.spread
        + top.temporal
        + 0.10
        + agent_trust
    )


def test_imported_history_has_decayed_since_created_at(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    now = time.time()
    episodic = store(
        memories,
        channel_name,
        "We had the kickoff meeting.",
        memory_type=EPISODIC,
        created_at=ts(now - DAY),
    )
    fact = store(
        memories,
        channel_name,
        "The office is in Lisbon.",
        memory_type=FACT,
        created_at=ts(now - 30 * DAY),
    )
    core = store(
        memories,
        channel_name,
        "The user's name is Ada.",
        memory_type=CORE,
        created_at=ts(now - 3 * 365 * DAY),
    )
    read = {
        m.id: memories.Inspect(pb.InspectRequest(channel=channel_name, id=m.id)).memory
        for m in (episodic, fact, core)
    }
    assert read[episodic.id].heat == pytest.approx(0.50, abs=0.005)
    assert read[fact.id].heat == pytest.approx(0.944, abs=0.005)
    assert read[core.id].heat == pytest.approx(0.60, abs=1e-9)
    assert read[episodic.id].created_at.seconds == int(now - DAY)


def test_relevant_memory_beats_a_hotter_irrelevant_one(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    relevant = store(
        memories,
        channel_name,
        "The user is allergic to peanuts.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - DAY),
    )
    hot = store(memories, channel_name, "Quarterly revenue grew 12 percent.", memory_type=FACT)
    reply = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="what is the user allergic to?", peek=True)
    )
    hits = {h.memory.id: h for h in reply.hits}
    assert hits[hot.id].heat > hits[relevant.id].heat + 0.4
    assert reply.hits[0].memory.id == relevant.id


def test_of_two_equally_similar_the_hotter_wins(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    cold = store(
        memories,
        channel_name,
        "Standup is at nine every morning.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - 2 * DAY),
    )
    hot = store(memories, channel_name, "Standup is at nine every morning.", memory_type=EPISODIC)
    reply = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="when is standup?", peek=True)
    )
    assert [h.memory.id for h in reply.hits] == [hot.id, cold.id]
    assert reply.hits[0].similarity == pytest.approx(reply.hits[1].similarity, abs=1e-4)


AS_OF = utc("2026-04-09T15:30:00")
DIARY = {
    "2026-04-08T10:00:00": "Had lunch with the design team at the noodle bar.",
    "2026-04-07T12:30:00": "Had lunch with the hardware team at the curry house.",
    "2026-04-06T12:00:00": "Had lunch with the finance team at the taco place.",
    "2026-04-01T12:00:00": "Had lunch with the legal team at the salad shop.",
    "2026-03-01T12:00:00": "Had lunch with the sales team at the pizza place.",
    "2026-02-10T12:00:00": "Had lunch with the support team at the burger joint.",
}


@pytest.mark.parametrize(
    ("query", "expected", "window_day"),
    [
        ("Who did I have lunch with yesterday?", "design team", "2026-04-08"),
        ("Who did I have lunch with the day before yesterday?", "hardware team", "2026-04-07"),
        ("Where was lunch 3 days ago?", "finance team", "2026-04-06"),
        ("Who did I have lunch with last week?", "legal team", "2026-03-30"),
        ("Where did we have lunch on 2026-03-01?", "sales team", "2026-03-01"),
    ],
)
def test_temporal_references_boost_their_window(
    memories: MemoryServiceStub, channel_name: str, query: str, expected: str, window_day: str
) -> None:
    for created, text in DIARY.items():
        store(memories, channel_name, text, memory_type=EPISODIC, created_at=ts(utc(created)))
    # Months-old episodic history sits in cold storage (DESIGN §5): search it too.
    reply = memories.Recall(
        pb.RecallRequest(
            channel=channel_name, query=query, as_of=ts(AS_OF), peek=True, include_archived=True
        )
    )
    assert expected in reply.hits[0].memory.text
    assert reply.hits[0].temporal == pytest.approx(0.40)
    assert reply.temporal_window.start.ToDatetime().date().isoformat() == window_day
    assert reply.temporal_window.phrase


def test_no_time_reference_means_no_window(memories: MemoryServiceStub, channel_name: str) -> None:
    store(memories, channel_name, "Deploy the server with make deploy.")
    reply = memories.Recall(pb.RecallRequest(channel=channel_name, query="Deploy the server"))
    assert not reply.HasField("temporal_window")
    assert all(h.temporal == 0.0 for h in reply.hits)


def test_keyword_overlap_lifts_the_exact_match(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    exact = store(memories, channel_name, "The nightly build failed with error code E4021.")
    other = store(memories, channel_name, "The nightly build failed with error code E9917.")
    reply = memories.Recall(pb.RecallRequest(channel=channel_name, query="error E4021", peek=True))
    hits = {h.memory.id: h for h in reply.hits}
    assert reply.hits[0].memory.id == exact.id
    assert hits[exact.id].keyword > hits[other.id].keyword
    assert hits[exact.id].keyword == pytest.approx(1.0)


def test_channels_are_isolated(memories: MemoryServiceStub, channel_name: str) -> None:
    mine = store(memories, channel_name + "-a", "The launch code word is marigold.")
    store(memories, channel_name + "-b", "Lunch is at noon.")
    other = memories.Recall(pb.RecallRequest(channel=channel_name + "-b", query="launch code word"))
    assert "marigold" not in " ".join(texts(other))
    with pytest.raises(grpc.RpcError) as caught:
        memories.Inspect(pb.InspectRequest(channel=channel_name + "-b", id=mine.id))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    named = memories.Recall(
        pb.RecallRequest(
            channel=channel_name + "-b",
            query="launch code word",
            channels=[channel_name + "-a"],
            peek=True,
        )
    )
    hit = next(h for h in named.hits if h.memory.id == mine.id)
    assert hit.memory.channel == channel_name + "-a"
    assert hit.channel_bonus == 0.0


def test_idempotent_retry_returns_the_first_memory(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    first = store(memories, channel_name, "Paid the invoice.", idempotency_key="inv-1")
    again = store(memories, channel_name, "Paid the invoice.", idempotency_key="inv-1")
    assert again.id == first.id
    assert total(memories, channel_name) == 1
    elsewhere = store(memories, channel_name + "-x", "Paid the invoice.", idempotency_key="inv-1")
    assert elsewhere.id != first.id


def test_store_stream_answers_ids_in_order(memories: MemoryServiceStub, channel_name: str) -> None:
    notes = [f"Note number {i} about topic {i % 7}" for i in range(150)]
    reply = memories.StoreStream(
        iter(
            pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel_name, text=t))
            for t in notes
        )
    )
    assert len(reply.ids) == 150 and len(set(reply.ids)) == 150
    for index in (0, 63, 64, 149):
        memory = memories.Inspect(
            pb.InspectRequest(channel=channel_name, id=reply.ids[index])
        ).memory
        assert memory.text == notes[index]


def test_store_stream_retry_with_keys_stores_nothing_twice(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    def batch() -> list[pb.StoreStreamRequest]:
        return [
            pb.StoreStreamRequest(
                store=pb.StoreRequest(
                    channel=channel_name, text=f"row {i}", idempotency_key=f"k{i % 3}"
                )
            )
            for i in range(6)
        ]

    first = memories.StoreStream(iter(batch()))
    second = memories.StoreStream(iter(batch()))
    assert list(first.ids) == list(second.ids)
    assert first.ids[0] == first.ids[3]
    assert total(memories, channel_name) == 3


def test_recall_bumps_unless_peek(memories: MemoryServiceStub, channel_name: str) -> None:
    memory = store(
        memories,
        channel_name,
        "The API key rotates monthly.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - DAY),
    )
    query = pb.RecallRequest(channel=channel_name, query="API key rotation", limit=1, peek=True)
    memories.Recall(query)
    peeked = memories.Inspect(pb.InspectRequest(channel=channel_name, id=memory.id)).memory
    assert peeked.recall_count == 0 and peeked.heat == pytest.approx(0.5, abs=0.005)
    query.peek = False
    hit = memories.Recall(query).hits[0]
    assert hit.heat == pytest.approx(0.5, abs=0.005)
    assert hit.memory.heat == pytest.approx(0.65, abs=0.005)
    after = memories.Inspect(pb.InspectRequest(channel=channel_name, id=memory.id)).memory
    assert after.recall_count == 1
    assert after.stability == pytest.approx(1.5)
    assert after.heat == pytest.approx(0.65, abs=0.005)
    assert after.HasField("last_recalled_at")


def test_recall_limit_recalls_only_what_it_returns(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    a = store(memories, channel_name, "Alpha project ships in May.")
    b = store(memories, channel_name, "Beta project ships in June.")
    reply = memories.Recall(pb.RecallRequest(channel=channel_name, query="Alpha project", limit=1))
    assert [h.memory.id for h in reply.hits] == [a.id]
    counts = {
        m.id: memories.Inspect(pb.InspectRequest(channel=channel_name, id=m.id)).memory.recall_count
        for m in (a, b)
    }
    assert counts == {a.id: 1, b.id: 0}


def test_recall_filters_by_type_tag_and_heat(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    store(
        memories,
        channel_name,
        "Coffee order: flat white.",
        memory_type=FACT,
        tags={"topic": "food"},
    )
    store(
        memories,
        channel_name,
        "Coffee tasting last spring.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - 10 * DAY),
        tags={"topic": "food"},
    )
    store(
        memories,
        channel_name,
        "Coffee machine manual.",
        memory_type=SEMANTIC,
        tags={"topic": "office"},
    )
    by_type = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="coffee", peek=True, memory_types=[FACT])
    )
    assert texts(by_type) == ["Coffee order: flat white."]
    by_tag = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="coffee", peek=True, tags={"topic": "food"})
    )
    assert sorted(texts(by_tag)) == ["Coffee order: flat white.", "Coffee tasting last spring."]
    warm = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="coffee", peek=True, min_heat=0.5)
    )
    assert "Coffee tasting last spring." not in texts(warm)
    cold = memories.Recall(
        pb.RecallRequest(
            channel=channel_name, query="coffee", peek=True, states=[memory_pb2.MEMORY_STATE_COLD]
        )
    )
    assert texts(cold) == ["Coffee tasting last spring."]


def test_list_memories_pages_through_everything(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    ids = [store(memories, channel_name, f"Item {i}", memory_type=FACT).id for i in range(7)]
    seen: list[str] = []
    token = ""
    while True:
        page = memories.ListMemories(
            pb.ListMemoriesRequest(channel=channel_name, page_size=3, page_token=token)
        )
        seen.extend(m.id for m in page.memories)
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(ids)
    facts = memories.ListMemories(
        pb.ListMemoriesRequest(channel=channel_name, memory_types=[EPISODIC])
    )
    assert len(facts.memories) == 0


def test_update_corrects_text_and_reembeds(memories: MemoryServiceStub, channel_name: str) -> None:
    memory = store(memories, channel_name, "The wifi password is hunter2.", memory_type=FACT)
    old = store(memories, channel_name, "The wifi network is called Attic.", memory_type=FACT)
    changed = memories.Update(
        pb.UpdateRequest(
            channel=channel_name,
            id=memory.id,
            text="The guest wifi password is swordfish.",
            supersedes=old.id,
        )
    ).memory
    assert changed.text == "The guest wifi password is swordfish."
    reply = memories.Recall(pb.RecallRequest(channel=channel_name, query="swordfish", peek=True))
    assert reply.hits[0].memory.id == memory.id
    deprecated = memories.Inspect(pb.InspectRequest(channel=channel_name, id=old.id)).memory
    assert deprecated.tags["deprecated"] == "true"


def test_keystone_freezes_heat_and_boost_adds(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    memory = store(
        memories,
        channel_name,
        "Trip to Porto.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - DAY),
    )
    pinned = memories.Keystone(
        pb.KeystoneRequest(channel=channel_name, id=memory.id, keystone=True)
    ).memory
    assert pinned.keystone and pinned.heat == pytest.approx(0.5, abs=0.005)
    assert pinned.heat0 == pytest.approx(pinned.heat)
    boosted = memories.Boost(pb.BoostRequest(channel=channel_name, id=memory.id, delta=0.2)).memory
    assert boosted.heat == pytest.approx(pinned.heat + 0.2, abs=1e-6)
    default = memories.Boost(pb.BoostRequest(channel=channel_name, id=memory.id)).memory
    assert default.heat == pytest.approx(boosted.heat + 0.15, abs=1e-6)


def test_forget_by_ids_and_by_filter(memories: MemoryServiceStub, channel_name: str) -> None:
    a = store(memories, channel_name, "Secret one.", tags={"scope": "tmp"})
    store(memories, channel_name, "Secret two.", tags={"scope": "tmp"})
    keep = store(memories, channel_name, "Keep me.")
    assert memories.Forget(pb.ForgetRequest(channel=channel_name, ids=[a.id, a.id])).forgotten == 1
    gone = memories.Inspect(pb.InspectRequest(channel=channel_name, id=a.id)).memory
    assert gone.state == memory_pb2.MEMORY_STATE_DELETED and gone.text == ""
    by_filter = memories.Forget(
        pb.ForgetRequest(channel=channel_name, filter=pb.ForgetFilter(tags={"scope": "tmp"}))
    )
    assert by_filter.forgotten == 1
    reply = memories.Recall(pb.RecallRequest(channel=channel_name, query="secret", peek=True))
    assert [h.memory.id for h in reply.hits] == [keep.id]
    assert total(memories, channel_name) == 1


def test_identity_counts_by_state_and_type(memories: MemoryServiceStub, channel_name: str) -> None:
    store(memories, channel_name, "A fact.", memory_type=FACT)
    store(
        memories,
        channel_name,
        "Old event.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - 5 * DAY),
    )
    status = memories.Identity(pb.IdentityRequest(channel=channel_name))
    assert status.total == 2
    assert dict(status.by_type) == {"MEMORY_TYPE_FACT": 1, "MEMORY_TYPE_EPISODIC": 1}
    assert dict(status.by_state) == {"MEMORY_STATE_ACTIVE": 1, "MEMORY_STATE_COLD": 1}


def test_unclassified_memories_get_a_type(memories: MemoryServiceStub, channel_name: str) -> None:
    assert store(memories, channel_name, "I prefer dark mode in every editor.").memory_type == (
        memory_pb2.MEMORY_TYPE_PREFERENCE
    )
    assert store(memories, channel_name, "How to release: tag, build, then push.").memory_type == (
        memory_pb2.MEMORY_TYPE_PROCEDURAL
    )
    code = "src/server/app.py defines serve() and _run()."
    assert store(memories, channel_name, code).memory_type == memory_pb2.MEMORY_TYPE_CODEBASE
