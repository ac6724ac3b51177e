"""Feedback on recalls through the real server: recall ids and the recall log, per-type
feedback in Identity, and ``calor tune`` fitting a channel's recall weights to it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from calor.client import CalorClient, ServerError
from calor.client.cli import main
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock
from calor.server.config import ServerConfig
from calor.server.engine import feedback, recall_log, tuning
from calor.server.ids import new_id
from calor.server.thermo.policy import RecallWeights
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, FACT, store

HELPFUL = pb.FEEDBACK_RATING_HELPFUL
UNHELPFUL = pb.FEEDBACK_RATING_UNHELPFUL
PARTIAL = pb.FEEDBACK_RATING_PARTIAL
START = 1_780_000_000.0

Server = tuple[ServerThread, ManualClock, MemoryServiceStub]


def failure(call: Callable[[], object]) -> grpc.RpcError:
    """The error ``call`` fails with."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def recall(
    stub: MemoryServiceStub, channel: str, query: str, **fields: object
) -> pb.RecallResponse:
    return stub.Recall(pb.RecallRequest(channel=channel, query=query, **fields))  # type: ignore[arg-type]


def rate(
    stub: MemoryServiceStub, channel: str, recall_id: str, rating: int, *ids: str
) -> pb.FeedbackResponse:
    request = pb.FeedbackRequest(
        channel=channel,
        recall_id=recall_id,
        rating=rating,  # type: ignore[arg-type]
        memory_ids=list(ids),
    )
    return stub.Feedback(request)


def by_type(stub: MemoryServiceStub, channel: str) -> dict[str, pb.TypeFeedback]:
    feedback = stub.Identity(pb.IdentityRequest(channel=channel)).feedback
    return {memory_pb2.MemoryType.Name(f.memory_type): f for f in feedback}


@pytest.fixture
def own_server(start_server: Callable[..., ServerThread], tmp_path: Path) -> Iterator[Server]:
    """A server of its own on a manual clock, its store in ``tmp_path``."""
    clock = ManualClock(START)
    server = start_server(data_dir=tmp_path, clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        yield server, clock, MemoryServiceStub(channel)


# --- the pure parts ----------------------------------------------------------------------


def _hit(memory_id: str, similarity: float, keyword: float) -> recall_log.LoggedHit:
    return recall_log.LoggedHit(
        memory_id, "fact", True, 0.0, "mid", similarity, 0.0, keyword, 1.0, 0.0, 0.7
    )


def test_recall_ids_carry_their_moment_and_scans_start_at_one() -> None:
    at = START + 0.25
    recall_id = recall_log.new_recall_id(at)
    assert recall_log.id_seconds(recall_id) == pytest.approx(at, abs=1e-9)
    assert recall_log.since_id(at) <= recall_id < recall_log.since_id(at + 0.001)
    assert recall_log.since_id(at - 0.001) < recall_id


def test_agreement_counts_the_pairs_the_feedback_orders() -> None:
    entry = recall_log.RecallEntry(
        "r1", START, (_hit("a", 0.9, 0.0), _hit("b", 0.8, 1.0), _hit("c", 0.7, 0.0))
    )
    helpful_b = feedback.feedback_entry(entry, "helpful", ["b"], START)
    unhelpful_a = feedback.feedback_entry(entry, "unhelpful", ["a"], START)
    whole = feedback.feedback_entry(entry, "helpful", [], START)
    plain = RecallWeights(keyword=0.0)

    # b above a and c: right for c only, until keyword outweighs 0.1 of similarity.
    assert tuning.agreement(plain, [tuning.rated(entry, helpful_b)]) == pytest.approx(0.5)
    keyed = replace(plain, keyword=0.2)
    assert tuning.agreement(keyed, [tuning.rated(entry, helpful_b)]) == pytest.approx(1.0)
    # b and c above a: both wrong by similarity alone.
    assert tuning.agreement(plain, [tuning.rated(entry, unhelpful_a)]) == pytest.approx(0.0)
    assert tuning.agreement(plain, [tuning.rated(entry, whole)]) is None
    assert whole.memory_types == ("fact",) and helpful_b.memory_ids == ("b",)


def test_the_fit_moves_keyword_when_it_orders_the_feedback() -> None:
    recalls = []
    for n in range(24):
        hits = (_hit(f"x{n}", 0.95, 0.5), _hit(f"y{n}", 0.90, 0.75), _hit(f"h{n}", 0.78, 1.0))
        entry = recall_log.RecallEntry(f"r{n:02d}", START + n, hits)
        recalls.append(tuning.rated(entry, feedback.feedback_entry(entry, "helpful", [f"h{n}"], 0)))

    report = tuning.fit(RecallWeights(), recalls)

    assert (report.fitted, report.held_back, report.better) == (18, 6, True)
    assert report.after.keyword > report.before.keyword == pytest.approx(0.15)
    assert report.after.similarity == report.before.similarity
    assert report.after.keyword == 1.0, "the middle of the values that order every pair"
    assert (report.held_back_before, report.held_back_after) == (0.0, 1.0)
    assert "keyword raised from 0.15" in report.explanation


def test_a_hint_names_the_type_and_its_share() -> None:
    assert feedback.hint("episodic", feedback.TypeTally(3, 17, 0)) == (
        "episodic recalls are mostly unhelpful (3 of 20 helpful); "
        "consider a shorter episodic half-life"
    )
    assert "only partly helpful" in feedback.hint("fact", feedback.TypeTally(1, 1, 2))
    assert feedback.hint("fact", feedback.TypeTally(2, 2, 0)) == ""
    assert feedback.hint("fact", feedback.TypeTally()) == ""


# --- recall ids ---------------------------------------------------------------------------


def test_every_recall_that_changes_something_has_an_id(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    store(memories, channel_name, "The user is allergic to peanuts.", memory_type=FACT)
    first = recall(memories, channel_name, "what is the user allergic to?")
    second = recall(memories, channel_name, "what is the user allergic to?")
    peek = recall(memories, channel_name, "what is the user allergic to?", peek=True)

    assert first.recall_id and second.recall_id and first.recall_id != second.recall_id
    assert peek.hits and not peek.recall_id, "a peek changes nothing, so it logs nothing"


# --- Feedback and Identity ----------------------------------------------------------------


def test_feedback_per_type_shows_in_identity_with_a_hint(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    for n in range(4):
        store(
            memories,
            channel_name,
            f"On trip {n} we hiked up the ridge at dawn.",
            memory_type=EPISODIC,
        )
        store(memories, channel_name, f"Locker {n} opens with code 40{n}.", memory_type=FACT)
    reply = pb.FeedbackResponse()
    for n in range(12):  # episodic recalls: 2 of 12 helpful
        got = recall(memories, channel_name, "the hike at dawn", memory_types=[EPISODIC], limit=3)
        assert {h.memory.memory_type for h in got.hits} == {EPISODIC}
        reply = rate(memories, channel_name, got.recall_id, HELPFUL if n < 2 else UNHELPFUL)
    for _ in range(18):  # fact recalls, naming the fact hits: all helpful
        got = recall(memories, channel_name, "which code opens the locker", limit=4)
        facts = [h.memory.id for h in got.hits if h.memory.memory_type == FACT]
        reply = rate(memories, channel_name, got.recall_id, HELPFUL, *facts)

    assert dict(reply.helpful_by_type) == {"MEMORY_TYPE_EPISODIC": 2, "MEMORY_TYPE_FACT": 18}
    assert dict(reply.unhelpful_by_type) == {"MEMORY_TYPE_EPISODIC": 10, "MEMORY_TYPE_FACT": 0}
    assert dict(reply.partial_by_type) == {"MEMORY_TYPE_EPISODIC": 0, "MEMORY_TYPE_FACT": 0}
    report = by_type(memories, channel_name)
    assert list(report) == ["MEMORY_TYPE_EPISODIC", "MEMORY_TYPE_FACT"]  # the enum's order
    episodic, fact = report["MEMORY_TYPE_EPISODIC"], report["MEMORY_TYPE_FACT"]
    assert (episodic.helpful, episodic.unhelpful, episodic.partial) == (2, 10, 0)
    assert episodic.helpful_share == pytest.approx(2 / 12)
    assert episodic.hint.startswith("episodic recalls are mostly unhelpful (2 of 12 helpful)")
    assert "shorter episodic half-life" in episodic.hint
    assert (fact.helpful, fact.helpful_share, fact.hint) == (18, 1.0, "")


def test_a_rating_counts_for_the_types_it_names_and_the_last_one_counts(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    fact = store(memories, channel_name, "The boiler is serviced every October.", memory_type=FACT)
    store(
        memories,
        channel_name,
        "We serviced the boiler together last October.",
        memory_type=EPISODIC,
    )
    got = recall(memories, channel_name, "boiler service in October")
    assert {h.memory.memory_type for h in got.hits} == {FACT, EPISODIC}

    whole = rate(memories, channel_name, got.recall_id, PARTIAL)
    assert dict(whole.partial_by_type) == {"MEMORY_TYPE_EPISODIC": 1, "MEMORY_TYPE_FACT": 1}
    named = rate(memories, channel_name, got.recall_id, UNHELPFUL, fact.id, fact.id)

    assert dict(named.unhelpful_by_type) == {"MEMORY_TYPE_FACT": 1}
    assert dict(named.partial_by_type) == {"MEMORY_TYPE_FACT": 0}, "the earlier rating is gone"
    fact_report = by_type(memories, channel_name)["MEMORY_TYPE_FACT"]
    assert (fact_report.unhelpful, fact_report.helpful_share) == (1, 0.0)
    assert "outdated fact memories" in fact_report.hint


def test_bad_feedback_is_refused_and_changes_nothing(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    stored = store(memories, channel_name, "The printer on floor two jams on card stock.")
    other = store(memories, f"{channel_name}-other", "The printer on floor two jams on card stock.")
    got = recall(memories, channel_name, "printer jams", limit=1)
    [hit] = got.hits
    assert hit.memory.id == stored.id

    def refused(request: pb.FeedbackRequest, *words: str) -> None:
        error = failure(lambda: memories.Feedback(request))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        for word in words:
            assert word in (error.details() or ""), error.details()

    good = pb.FeedbackRequest(channel=channel_name, recall_id=got.recall_id, rating=HELPFUL)
    for change, words in (
        ({"rating": pb.FEEDBACK_RATING_UNSPECIFIED}, ("rating",)),
        ({"rating": 99}, ("rating",)),
        ({"recall_id": ""}, ("recall_id",)),
        ({"recall_id": "not-a-recall"}, ("recall_id",)),
        ({"channel": ""}, ("channel",)),
        ({"memory_ids": ["nope"]}, ("memory_ids",)),
        ({"memory_ids": [other.id]}, ("memory_ids", other.id, "not a hit")),
        ({"memory_ids": [stored.id, new_id()]}, ("memory_ids", "not a hit")),
    ):
        request = pb.FeedbackRequest()
        request.CopyFrom(good)
        for name, value in change.items():
            if name == "memory_ids":
                request.memory_ids.extend(value)  # type: ignore[arg-type]
            else:
                setattr(request, name, value)
        refused(request, *words)

    assert by_type(memories, channel_name) == {}


def test_a_recall_id_the_channel_did_not_log_is_not_found(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    elsewhere = f"{channel_name}-elsewhere"
    store(memories, elsewhere, "The garden hose is in the shed.")
    theirs = recall(memories, elsewhere, "where is the hose").recall_id
    store(memories, channel_name, "The ladder is in the garage.")

    for recall_id in (new_id(), theirs):
        error = failure(lambda r=recall_id: rate(memories, channel_name, r, HELPFUL))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert recall_id in (error.details() or "")


# --- the recall log: restarts and retention -----------------------------------------------


def test_the_recall_log_survives_a_restart(embedder: OnnxEmbedder, tmp_path: Path) -> None:
    clock = ManualClock(START)
    config = ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=0)

    def serving(work: Callable[[MemoryServiceStub], object]) -> object:
        server = ServerThread(config, clock, lambda: embedder)
        try:
            with grpc.insecure_channel(server.target) as channel:
                return work(MemoryServiceStub(channel))
        finally:
            server.stop()

    def recalled(stub: MemoryServiceStub) -> str:
        store(stub, "agent", "The user's cat is called Miso.", memory_type=FACT)
        return recall(stub, "agent", "what is the cat called").recall_id

    recall_id = str(serving(recalled))
    reply = serving(lambda stub: rate(stub, "agent", recall_id, HELPFUL))
    report = serving(lambda stub: by_type(stub, "agent"))

    assert isinstance(reply, pb.FeedbackResponse) and isinstance(report, dict)
    assert dict(reply.helpful_by_type) == {"MEMORY_TYPE_FACT": 1}
    assert report["MEMORY_TYPE_FACT"].helpful == 1


def test_feedback_older_than_thirty_days_is_not_reported_and_its_recall_is_dropped(
    own_server: Server,
) -> None:
    _, clock, stub = own_server
    store(stub, "agent", "The spare key is under the blue pot.", memory_type=FACT)
    old = recall(stub, "agent", "where is the spare key").recall_id
    rate(stub, "agent", old, HELPFUL)
    assert by_type(stub, "agent")["MEMORY_TYPE_FACT"].helpful == 1

    clock.advance(31 * DAY)
    assert by_type(stub, "agent") == {}, "only the last 30 days are reported"
    recall(stub, "agent", "where is the spare key")  # a new entry drops the expired one
    assert failure(lambda: rate(stub, "agent", old, HELPFUL)).code() == grpc.StatusCode.NOT_FOUND


def test_a_channel_keeps_at_most_max_entries_recalls(
    own_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, stub = own_server
    monkeypatch.setattr(recall_log, "MAX_ENTRIES", 3)
    store(stub, "agent", "The recycling goes out on Mondays.", memory_type=FACT)
    ids = [recall(stub, "agent", "when is recycling day").recall_id for _ in range(5)]

    for gone in ids[:2]:
        assert failure(lambda g=gone: rate(stub, "agent", g, HELPFUL)).code() == (
            grpc.StatusCode.NOT_FOUND
        )
    for kept in ids[2:]:
        rate(stub, "agent", kept, HELPFUL)
    assert by_type(stub, "agent")["MEMORY_TYPE_FACT"].helpful == 3


# --- Tune ---------------------------------------------------------------------------------


def test_tune_needs_twenty_recalls_with_feedback(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    store(memories, channel_name, "The user's dentist is Dr Alvarez.", memory_type=FACT)
    for _ in range(3):
        got = recall(memories, channel_name, "who is the dentist")
        rate(memories, channel_name, got.recall_id, HELPFUL)
    recall(memories, channel_name, "who is the dentist")  # recalled, never rated

    for name, count in ((channel_name, 3), (f"{channel_name}-never-used", 0)):
        error = failure(lambda n=name: memories.Tune(pb.TuneRequest(channel=n)))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"has {count} recalls with feedback" in (error.details() or "")
        assert "at least 20" in (error.details() or "")


# Seven kinds of question about a numbered thing. For each number the channel holds the
# answer (naming the number, in other words than the question, padded with an errand) and
# two answers to the same question about a number with its digits swapped, worded as the
# question is. The embedding hardly tells the numbers apart and likes the question's
# wording, so by default the near misses often rank first; the answer is the one hit that
# holds every word of the question, the number included.
QUESTIONS = [
    (
        "Which platform does train {n} leave from?",
        "Which platform does train {n} leave from? Platform {a}.",
        "Heads-up for the trip: train {n} will leave from platform {a}, so bring the tickets.",
    ),
    (
        "What is the status of ticket {n}?",
        "What is the status of ticket {n}? It was closed.",
        "From the standup: the status of ticket {n} is blocked, waiting on QA sign-off.",
    ),
    (
        "What is the door code for flat {n}?",
        "What is the door code for flat {n}? It is {a}.",
        "Note from the landlord: the door code for flat {n} changed to {a} last week.",
    ),
    (
        "How much was invoice {n}?",
        "How much was invoice {n}? It was {a} euros.",
        "Accounts reminder: invoice {n} was {a} euros, much more than expected, due Friday.",
    ),
    (
        "What is the combination for locker {n}?",
        "What is the combination for locker {n}? It is {a}.",
        "Gym note: the combination for locker {n} is {a}, shared with Sam.",
    ),
    (
        "Who is sitting in seat {n}?",
        "Who is sitting in seat {n}? Maria is.",
        "Seating plan for the gala: Omar is sitting in seat {n}, next to the stage.",
    ),
    (
        "Which room is order {n} stored in?",
        "Which room is order {n} stored in? Room {a}.",
        "Warehouse update: order {n} is stored in room {a} until Monday.",
    ),
]
NUMBERS = [(1427, (1472, 4127)), (3861, (3816, 8361)), (5203, (5230, 2503)), (6794, (6749, 7694))]
ERRAND = " Also pack the umbrella, the phone charger and the spare car keys before leaving."


def _keyword_channel(stub: MemoryServiceStub, channel: str) -> int:
    """Fill ``channel``, recall each question once and rate the answer helpful by name;
    returns how many recalls were rated."""
    questions: list[tuple[str, str]] = []
    for question, near_miss, answer in QUESTIONS:
        for n, swapped in NUMBERS:
            text = answer.format(n=n, a=n % 97) + ERRAND
            questions.append(
                (question.format(n=n), store(stub, channel, text, memory_type=FACT).id)
            )
            for m in swapped:
                store(stub, channel, near_miss.format(n=m, a=m % 89), memory_type=FACT)
    rated = 0
    for question, answer_id in questions:
        got = recall(stub, channel, question, limit=12)
        if answer_id in {h.memory.id for h in got.hits}:
            rate(stub, channel, got.recall_id, HELPFUL, answer_id)
            rated += 1
    return rated


def test_calor_tune_moves_the_keyword_weight_up_when_feedback_favours_keyword_matches(
    own_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    server, _, stub = own_server
    assert _keyword_channel(stub, "desk") >= 24

    def tune(*args: str) -> dict[str, object]:
        status = main(["--target", server.target, "--json", "tune", "desk", *args])
        out, err = capsys.readouterr()
        assert status == 0, err
        report: dict[str, object] = json.loads(out)
        return report

    def keyword_setting() -> float:
        settings = stub.Identity(pb.IdentityRequest(channel="desk")).settings
        return settings.weight_keyword

    dry = tune("--dry-run")
    assert dry["applied"] is False and keyword_setting() == pytest.approx(0.15)
    done = tune()
    before, after = done["before"], done["after"]
    assert isinstance(before, dict) and isinstance(after, dict)

    assert done["applied"] is True
    assert after["weight_keyword"] > before["weight_keyword"] == pytest.approx(0.15)
    assert after["weight_similarity"] == before["weight_similarity"]
    assert float(done["held_back_after"]) > float(done["held_back_before"])  # type: ignore[arg-type]
    assert int(done["fitted"]) + int(done["held_back"]) >= 24  # type: ignore[call-overload]
    assert int(done["held_back"]) == (int(done["fitted"]) + int(done["held_back"])) // 4  # type: ignore[call-overload]
    assert "keyword raised from 0.15" in str(done["explanation"])
    assert (dry["after"], dry["held_back_after"]) == (after, done["held_back_after"])
    assert keyword_setting() == pytest.approx(after["weight_keyword"])

    text_status = main(["--target", server.target, "tune", "desk", "--dry-run"])
    text, _ = capsys.readouterr()
    assert text_status == 0
    assert text.startswith("tune desk: ")
    assert "weight_keyword" in text


def test_the_clients_give_feedback_and_tune(client: CalorClient) -> None:
    client.store("The user takes the 7:40 bus to work.", memory_type="fact")
    got = client.recall("which bus does the user take")
    reply = client.feedback(got.recall_id, "helpful", got.hits[0].memory.id)
    assert dict(reply.helpful_by_type) == {"MEMORY_TYPE_FACT": 1}
    with pytest.raises(ServerError) as caught:
        client.tune(dry_run=True)
    assert "has 1 recalls with feedback" in str(caught.value)
