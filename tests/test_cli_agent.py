"""The CLI's agent verbs against a real server: context, evaluate, share, card, feedback."""

from __future__ import annotations

import json

from tests.helpers import Run


def stored_id(calor: Run, text: str, *options: str) -> str:
    status, out, err = calor("--json", "store", text, *options)
    assert status == 0, err
    return str(json.loads(out)["id"])


def test_context_shows_the_profile_and_its_recall_id_takes_feedback(calor: Run) -> None:
    stored_id(calor, "The user is allergic to peanuts.", "--type", "core")
    stored_id(calor, "The user went hiking in the Alps last summer.")

    status, out, err = calor("context", "What should we cook for dinner tonight?")
    assert status == 0, err
    assert "allergic to peanuts" in out
    assert "tokens" in out.splitlines()[-1]

    status, out, err = calor("--json", "context", "What should we cook for dinner tonight?")
    assert status == 0, err
    reply = json.loads(out)
    assert reply["reused"] is True and reply["recall_id"]

    status, out, err = calor("feedback", reply["recall_id"], "helpful")
    assert status == 0, err
    assert out.startswith(f"rated {reply['recall_id']} helpful")
    assert "core" in out

    status, _, err = calor("feedback", "not-an-id", "helpful")
    assert status != 0 and "recall_id" in err


def test_evaluate_names_the_memory_a_text_contradicts(calor: Run) -> None:
    allergy = stored_id(calor, "The user is allergic to peanuts.", "--type", "fact")
    status, out, err = calor("evaluate", "The user is not allergic to peanuts.")
    assert status == 0, err
    assert out.splitlines()[0].startswith("conflict (alignment 0.")
    assert any(line.startswith("contradiction") and allergy in line for line in out.splitlines())
    assert "  correction: The user is allergic to peanuts." in out.splitlines()

    status, out, _ = calor("evaluate", "The weather is pleasant.")
    assert (status, out.strip()) == (0, "aligned (alignment 1.00)")


def test_share_copies_a_memory_into_another_channel(calor: Run, channel_name: str) -> None:
    source = stored_id(calor, "The deploy key rotates every Monday.")
    target = channel_name + "-team"
    status, out, err = calor("share", source, target)
    assert status == 0, err
    assert out.startswith(f"shared into {target}:")
    assert f"[Shared by {channel_name}] The deploy key rotates every Monday." in out

    status, _, err = calor("share", source, channel_name)
    assert status != 0 and "INVALID_ARGUMENT" in err


def test_card_gathers_an_entity_named_five_times(calor: Run) -> None:
    for text in (
        "Our plumber Zorblax maintains the boiler.",  # a name mid-sentence: then known
        "Zorblax prefers morning appointments.",
        "Zorblax charged 80 euros last time.",
        "Zorblax lives in Ghent.",
    ):
        stored_id(calor, text)
    status, _, err = calor("card", "Zorblax")
    assert status != 0 and "NOT_FOUND" in err

    stored_id(calor, "Zorblax will come back in March.")
    status, out, err = calor("card", "Zorblax")
    assert status == 0, err
    assert "Zorblax" in out.splitlines()[0]
    for fragment in ("boiler", "morning", "80 euros", "Ghent", "March"):
        assert fragment in out
