"""Meaning and words fused per query, and heat that reorders only hits of close relevance:
the fusion's rules on numbers, and what a recall through the real server shows."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from calor.server.clock import ManualClock
from calor.server.recall.fusion import NO_FUSION, fuse, specificity
from calor.server.recall.lexical import Corpus
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.helpers import DAY, EPISODIC, FACT, store, ts, utc


def test_without_a_candidate_that_holds_a_query_word_meaning_alone_decides() -> None:
    fusion = fuse(np.array([0.8, 0.6, 0.5]), np.zeros(3), specific=0.9, weight=0.4)
    assert fusion.lexical_weight == 0.0
    assert fusion.relevance(0.6, 0.0) == pytest.approx(0.6)
    assert fusion.spread == pytest.approx(0.3)  # the best relevance less the third
    tie = fuse(np.array([0.7, 0.7]), np.zeros(2), 0.5, 0.4)
    assert tie.spread > 0.0  # heat breaks even a tie of every candidate


def test_no_candidates_fuse_to_nothing() -> None:
    assert fuse(np.zeros(0), np.zeros(0), specific=1.0, weight=0.4) == NO_FUSION


def test_a_sharp_word_ranking_is_trusted_more_than_a_flat_one() -> None:
    rng = np.random.default_rng(7)
    cosines = rng.uniform(0.55, 0.65, size=60)
    flat = rng.uniform(0.2, 0.3, size=60)
    sharp = flat.copy()
    sharp[0] = 0.95  # one memory holds the query's words far better than the rest
    flat_fusion = fuse(cosines, flat, specific=0.5, weight=0.4)
    sharp_fusion = fuse(cosines, sharp, specific=0.5, weight=0.4)
    assert sharp_fusion.lexical_weight > flat_fusion.lexical_weight > 0.0
    # On the cosine's scale, the sharp word match lifts its memory above every other.
    relevance = sharp_fusion.relevance(cosines, sharp)
    assert int(np.argmax(relevance)) == 0


def test_the_weight_scales_the_words_share_up_to_all_of_it() -> None:
    cosines, words = np.array([0.9, 0.5, 0.4]), np.array([0.1, 0.9, 0.2])
    assert fuse(cosines, words, 0.5, weight=0.0).lexical_weight == 0.0
    assert fuse(cosines, words, 0.5, weight=100.0).lexical_weight == 1.0
    everything = fuse(cosines, words, 0.5, weight=100.0)
    # All words: the ranking is the word ranking, on the cosine's scale.
    assert np.argsort(-everything.relevance(cosines, words)).tolist() == [
        1,
        2,
        0,
    ]


def test_rare_words_are_more_specific_than_common_ones() -> None:
    corpus = Corpus(docs=1000, total_len=10_000, df={"zanzibar": 1, "the": 990, "office": 400})
    assert specificity(corpus, "zanzibar") == pytest.approx(1.0)
    assert specificity(corpus, "zanzibar office") > specificity(corpus, "office") > 0.0
    assert specificity(corpus, "nothing it holds") == 0.0


@pytest.fixture
def manual(start_server) -> Iterator[tuple[ManualClock, MemoryServiceStub]]:  # type: ignore[no-untyped-def]
    clock = ManualClock(1_800_000_000.0)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        yield clock, MemoryServiceStub(channel)


def test_an_old_memory_that_answers_is_not_buried_under_a_hot_one_that_does_not(
    manual: tuple[ManualClock, MemoryServiceStub],
) -> None:
    clock, stub = manual
    channel = "old-answer"
    answer = store(
        stub,
        channel,
        "The boiler's service contract is with Nordheat, renewed each March.",
        memory_type=EPISODIC,
    )
    clock.advance(40 * DAY)  # the answer has gone cold
    chatter = [  # about the boiler too, but none says who the contract is with
        "The boiler makes a clicking noise in the morning.",
        "We should get the boiler checked before winter.",
        "The plumber fixed the kitchen tap in May.",
    ]
    hot = [store(stub, channel, text, memory_type=FACT) for text in chatter]
    for memory in hot:  # recalled and boosted: as hot as memories get
        stub.Boost(pb.BoostRequest(channel=channel, id=memory.id, delta=1.0))
    hits = stub.Recall(
        pb.RecallRequest(
            channel=channel,
            query="Who is the boiler service contract with?",
            peek=True,
            include_archived=True,  # where the answer went: cold storage
        )
    ).hits
    assert hits[0].memory.id == answer.id
    assert hits[0].heat < min(h.heat for h in hits[1:])
    assert hits[0].spread > 0.0
    # Heat added as it was before fusion (0.30 x heat, whatever the relevance) would
    # have put a hot memory first.
    unscaled = [h.score - 0.30 * h.heat * h.spread + 0.30 * h.heat for h in hits]
    assert max(unscaled[1:]) > unscaled[0]


def test_heat_still_breaks_a_tie_of_relevance(
    manual: tuple[ManualClock, MemoryServiceStub],
) -> None:
    clock, stub = manual
    channel = "tie"
    text = "The spare bike lock code is written on the garage calendar."
    first, second = (store(stub, channel, text, memory_type=FACT) for _ in range(2))
    store(stub, channel, "The garage door opener needs new batteries.", memory_type=FACT)
    clock.advance(30 * DAY)
    stub.Boost(pb.BoostRequest(channel=channel, id=second.id, delta=1.0))
    hits = stub.Recall(
        pb.RecallRequest(channel=channel, query="where is the bike lock code?", peek=True)
    ).hits
    assert [h.memory.id for h in hits[:2]] == [second.id, first.id]
    assert hits[0].relevance == pytest.approx(hits[1].relevance)


def test_the_best_hits_are_the_same_whatever_limit_is_asked(
    manual: tuple[ManualClock, MemoryServiceStub],
) -> None:
    _, stub = manual
    channel = "limits"
    topics = ["invoice", "boiler", "garden", "passport", "router", "dentist", "car", "roof"]
    texts = [
        f"Note {n}: the {topics[n % 8]} {'and the ' + topics[(n * 3) % 8] if n % 3 else ''} "
        f"came up on day {n} of the {['spring', 'summer', 'autumn'][n % 3]} plan."
        for n in range(260)
    ]
    stored = stub.StoreStream(
        (pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel, text=t)) for t in texts),
        timeout=120,
    ).ids
    assert len(stored) == 260

    def best(limit: int) -> list[pb.RecallHit]:
        hits = stub.Recall(
            pb.RecallRequest(
                channel=channel,
                query="when did the router and the roof come up?",
                limit=limit,
                peek=True,
            )
        ).hits
        return list(hits)

    # More candidates than a small limit's pool: the fusion's statistics over them must
    # not change with the limit, or neither would the order of the best hits.
    ten = best(10)
    for more in (best(40), best(50), best(100)):
        assert [h.memory.id for h in more[:10]] == [h.memory.id for h in ten]
        assert [h.score for h in more[:10]] == pytest.approx([h.score for h in ten], abs=1e-6)


def test_a_time_the_query_names_picks_among_the_relevant_not_over_them(
    manual: tuple[ManualClock, MemoryServiceStub],
) -> None:
    _, stub = manual
    channel = "last-week"
    answer = store(
        stub,
        channel,
        "Signed the boiler service contract with Nordheat; they visit each March.",
        memory_type=EPISODIC,
        created_at=ts(utc("2026-03-18T10:00:00")),
    )
    chatter = [  # last week, and nothing about the boiler
        ("2026-03-30T09:00:00", "Went to the cinema with Priya on Monday evening."),
        ("2026-04-01T18:00:00", "Bought groceries and a new kettle on the way home."),
        ("2026-04-03T12:00:00", "Lunch with the design team at the noodle bar."),
    ]
    for created, text in chatter:
        store(stub, channel, text, memory_type=EPISODIC, created_at=ts(utc(created)))
    hits = stub.Recall(
        pb.RecallRequest(
            channel=channel,
            query="Who did we sign the boiler service contract with last week?",
            as_of=ts(utc("2026-04-08T12:00:00")),  # a Wednesday: last week is Mar 30-Apr 5
            peek=True,
            include_archived=True,
        )
    )
    assert hits.temporal_window.phrase  # the query named a week
    assert hits.hits[0].memory.id == answer.id  # misremembered by a week, still first
    assert all(h.temporal < 0.40 for h in hits.hits[1:])  # far less relevant: little boost
    # The full boost (0.40 for a memory inside the window), as before, would have put
    # last week's chatter first.
    unscaled = [h.score - h.temporal + 0.40 for h in hits.hits[1:]]
    assert max(unscaled) > hits.hits[0].score
