"""Evaluate through the real server: a text checked against a channel's memories for
contradictions, preference drift and stale references; findings stored on request."""

from __future__ import annotations

import grpc
import pytest

from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.helpers import EPISODIC, FACT, store, total

PREFERENCE = memory_pb2.MEMORY_TYPE_PREFERENCE
ALLERGY = "The user is allergic to peanuts."


def evaluate(
    stub: MemoryServiceStub, channel: str, text: str, store_findings: bool = False
) -> pb.EvaluateResponse:
    return stub.Evaluate(
        pb.EvaluateRequest(channel=channel, text=text, store_findings=store_findings)
    )


def kinds(reply: pb.EvaluateResponse) -> dict[str, str]:
    """Each flagged memory's issue kind, by memory id."""
    return {issue.memory_id: issue.kind for issue in reply.issues}


@pytest.fixture
def household(memories: MemoryServiceStub, channel_name: str) -> dict[str, str]:
    """A channel of facts, preferences and events about one user; ids by text."""
    facts = [
        (ALLERGY, FACT),
        ("The standup meeting is at 9am on Mondays.", FACT),
        ("The user does not like spicy food.", PREFERENCE),
        ("The user loves jazz music.", PREFERENCE),
        ("The user prefers tea over coffee.", PREFERENCE),
        ("The user walked the dog in the park this morning.", EPISODIC),
    ]
    return {text: store(memories, channel_name, text, memory_type=kind).id for text, kind in facts}


def test_a_negated_fact_is_a_contradiction_naming_the_memory(
    memories: MemoryServiceStub, channel_name: str, household: dict[str, str]
) -> None:
    reply = evaluate(memories, channel_name, "The user is not allergic to peanuts")

    assert kinds(reply) == {household[ALLERGY]: "contradiction"}
    [issue] = reply.issues
    assert ALLERGY in issue.message and "negates" in issue.message
    assert issue.similarity >= 0.8
    assert reply.alignment == pytest.approx(1.0 - issue.similarity)
    assert not reply.stored_ids


def test_a_different_number_is_a_contradiction(
    memories: MemoryServiceStub, channel_name: str, household: dict[str, str]
) -> None:
    reply = evaluate(memories, channel_name, "The standup meeting is at 10am on Mondays.")

    standup = household["The standup meeting is at 9am on Mondays."]
    assert kinds(reply) == {standup: "contradiction"}
    assert "different numbers" in reply.issues[0].message
    assert "10" in reply.issues[0].message and "9" in reply.issues[0].message


@pytest.mark.parametrize(
    ("text", "preference"),
    [
        ("The user hates jazz music.", "The user loves jazz music."),
        ("You don't like tea, so I ordered coffee.", "The user prefers tea over coffee."),
    ],
)
def test_going_against_a_preference_is_drift(
    memories: MemoryServiceStub,
    channel_name: str,
    household: dict[str, str],
    text: str,
    preference: str,
) -> None:
    reply = evaluate(memories, channel_name, text)

    assert kinds(reply) == {household[preference]: "preference_drift"}
    assert preference in reply.issues[0].message
    assert 0.0 <= reply.alignment < 0.5


def test_a_superseded_memory_is_a_stale_reference(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    old = store(memories, channel_name, "The deploy pipeline runs on Jenkins.", memory_type=FACT)
    new = store(memories, channel_name, "Deploys now run on GitHub Actions.", memory_type=FACT)
    memories.Update(pb.UpdateRequest(channel=channel_name, id=new.id, supersedes=old.id))

    stale = evaluate(memories, channel_name, "I'll trigger the Jenkins job to deploy.")
    current = evaluate(memories, channel_name, "Deploys run on GitHub Actions now.")
    moved_on = evaluate(memories, channel_name, "The deploy pipeline no longer runs on Jenkins.")

    assert kinds(stale) == {old.id: "stale_reference"}
    assert "Jenkins" in stale.issues[0].message and "GitHub Actions" in stale.issues[0].message
    assert stale.alignment < 1.0
    assert not current.issues and current.alignment == 1.0, "the text is up to date"
    assert old.id not in kinds(moved_on), "saying the old memory holds no more is up to date"


def test_a_harmless_text_is_fully_aligned(
    memories: MemoryServiceStub, channel_name: str, household: dict[str, str]
) -> None:
    for text in (
        "The weather in Paris is sunny today.",
        "The user is allergic to peanuts, so I left them out of the salad.",
        "The user is allergic to peanuts.",  # close in meaning to "does not like spicy food"
        "The standup meeting is at 9am on Mondays.",
    ):
        reply = evaluate(memories, channel_name, text)
        assert (reply.alignment, list(reply.issues)) == (1.0, []), text


def test_evaluate_reads_without_heating_or_counting(
    memories: MemoryServiceStub, channel_name: str, household: dict[str, str]
) -> None:
    def state() -> tuple[int, list[tuple[float, float, int]]]:
        listed = memories.ListMemories(pb.ListMemoriesRequest(channel=channel_name)).memories
        identity = memories.Identity(pb.IdentityRequest(channel=channel_name))
        return identity.interactions, [(m.heat0, m.stability, m.recall_count) for m in listed]

    before = state()
    evaluate(memories, channel_name, "The user is not allergic to peanuts")
    evaluate(memories, channel_name, "The weather in Paris is sunny today.")
    assert state() == before


def test_findings_are_stored_as_episodic_memories_once(
    memories: MemoryServiceStub, channel_name: str, household: dict[str, str]
) -> None:
    text = "The user is not allergic to peanuts"
    count = total(memories, channel_name)

    reply = evaluate(memories, channel_name, text, store_findings=True)
    again = evaluate(memories, channel_name, text, store_findings=True)

    assert len(reply.stored_ids) == len(reply.issues) == 1
    assert list(again.stored_ids) == list(reply.stored_ids), "the same finding is not repeated"
    assert total(memories, channel_name) == count + 1
    finding = memories.Inspect(
        pb.InspectRequest(channel=channel_name, id=reply.stored_ids[0])
    ).memory
    assert finding.memory_type == EPISODIC
    assert finding.tags["evaluation"] == "contradiction"
    assert finding.provenance["issue"] == "contradiction"
    assert finding.provenance["issue_memory_id"] == household[ALLERGY]
    assert finding.provenance["evaluated_text"] == text
    assert text in finding.text and ALLERGY in finding.text
    assert kinds(again) == kinds(reply), "a stored finding is not itself judged"


def test_store_findings_stores_nothing_for_an_aligned_text(
    memories: MemoryServiceStub, channel_name: str, household: dict[str, str]
) -> None:
    count = total(memories, channel_name)
    reply = evaluate(memories, channel_name, "The weather in Paris is sunny today.", True)
    assert (reply.alignment, list(reply.stored_ids)) == (1.0, [])
    assert total(memories, channel_name) == count


def test_each_issue_lowers_the_alignment(memories: MemoryServiceStub, channel_name: str) -> None:
    first = store(memories, channel_name, ALLERGY, memory_type=FACT)
    alone = evaluate(memories, channel_name, "The user is not allergic to peanuts.")
    second = store(memories, channel_name, "The user has a peanut allergy.", memory_type=FACT)
    both = evaluate(memories, channel_name, "The user is not allergic to peanuts.")

    assert kinds(alone) == {first.id: "contradiction"}
    assert kinds(both) == {first.id: "contradiction", second.id: "contradiction"}
    assert [i.memory_id for i in both.issues] == [first.id, second.id], "closest first"
    product = (1.0 - both.issues[0].similarity) * (1.0 - both.issues[1].similarity)
    assert both.alignment == pytest.approx(product)
    assert both.alignment < alone.alignment < 1.0


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.EvaluateRequest(channel="ok", text=""), "text"),
        (pb.EvaluateRequest(channel="ok", text="\u200b"), "text"),
        (pb.EvaluateRequest(channel="", text="Fine words."), "channel"),
        (pb.EvaluateRequest(channel="bad name", text="Fine words."), "channel"),
    ],
)
def test_bad_evaluate_requests_are_refused(
    memories: MemoryServiceStub, request_: pb.EvaluateRequest, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        memories.Evaluate(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (caught.value.details() or "")


def test_recommending_another_thing_than_a_stored_preference_is_drift_with_its_correction(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    preferred = "The user prefers Python for scripting."
    memory = store(memories, channel_name, preferred, memory_type=PREFERENCE)
    store(memories, channel_name, "The user deploys on Fridays.", memory_type=FACT)

    reply = evaluate(memories, channel_name, "Use TypeScript for scripting.")
    assert kinds(reply) == {memory.id: "preference_drift"}
    [issue] = reply.issues
    assert issue.correction == preferred
    assert (reply.status, reply.score) == ("review", reply.alignment)
    assert reply.score < 1.0

    # The same thing recommended, or another thing for another purpose: aligned.
    for fine in ("Use Python for scripting.", "Use TypeScript for the web frontend."):
        same = evaluate(memories, channel_name, fine)
        assert (same.status, same.score, list(same.issues)) == ("aligned", 1.0, []), fine


def test_a_contradiction_makes_the_status_conflict_and_names_the_correction(
    memories: MemoryServiceStub, channel_name: str, household: dict[str, str]
) -> None:
    reply = evaluate(memories, channel_name, "The user is not allergic to peanuts")
    assert reply.status == "conflict"
    assert [issue.correction for issue in reply.issues] == [ALLERGY]
    for harmless in ("The weather is mild today.", "Try the new jazz album tonight."):
        reply = evaluate(memories, channel_name, harmless)
        assert (reply.status, reply.score) == ("aligned", 1.0), harmless
