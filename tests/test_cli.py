"""The ``calor`` command in-process against a real server: what a person and a script see."""

from __future__ import annotations

import io
import json

import pytest

from tests.helpers import Run


def test_store_then_recall_prints_the_text(calor: Run) -> None:
    status, out, _ = calor(
        "store", "The user is allergic to peanuts.", "--type", "fact", "--tag", "topic=health"
    )
    assert status == 0
    assert out.startswith("stored ")
    assert "(fact, heat " in out
    memory_id = out.split()[1]

    status, out, _ = calor("recall", "what is the user allergic to?")
    assert status == 0
    first = out.splitlines()[0]
    assert first.startswith("1. [")
    assert memory_id in first
    assert "The user is allergic to peanuts." in first


def test_store_reads_stdin_for_dash(calor: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("Piped in from a file.\n"))
    status, out, _ = calor("store", "-")
    assert status == 0
    memory_id = out.split()[1]

    status, out, _ = calor("inspect", memory_id)
    assert status == 0
    assert "Piped in from a file." in out


def test_json_output_parses(calor: Run) -> None:
    status, out, _ = calor("--json", "store", "Standup is at 9:30 every weekday.")
    assert status == 0
    memory = json.loads(out)
    assert memory["text"] == "Standup is at 9:30 every weekday."

    status, out, _ = calor("recall", "when is standup?", "--json", "--peek")
    assert status == 0
    hits = json.loads(out)["hits"]
    assert hits[0]["memory"]["id"] == memory["id"]

    status, out, _ = calor("--json", "status")
    assert status == 0
    assert int(json.loads(out)["total"]) == 1


def test_list_forget_and_status(calor: Run) -> None:
    ids = []
    for text in ("First note.", "Second note.", "Third note."):
        ids.append(calor("store", text)[1].split()[1])

    status, out, _ = calor("list", "--page-size", "2", "--all")
    assert status == 0
    assert sorted(line.split()[0] for line in out.splitlines()) == sorted(ids)

    status, out, _ = calor("keystone", ids[0])
    assert (status, out.split()[0]) == (0, "pinned")
    status, out, _ = calor("boost", ids[1], "--delta", "-0.5")
    assert (status, out.split()[0]) == (0, "boosted")
    # Hottest first: the cooled one last.
    status, out, _ = calor("list", "--by-heat", "--page-size", "2", "--all")
    assert status == 0 and [line.split()[0] for line in out.splitlines()][-1] == ids[1]

    status, out, _ = calor("forget", *ids[:2])
    assert (status, out.strip()) == (0, "forgot 2 memories")

    status, out, _ = calor("status")
    assert status == 0
    assert "memories" in out and "by type" in out
    assert "decay      time mode, exponential curve" in out
    lines = out.splitlines()
    hottest = lines.index("hottest")
    # The one memory left (the other two are forgotten), with its heat and text.
    assert lines[hottest + 1 :] == [f"  1.00  {ids[2]}  Third note."]


def test_bad_tag_is_a_usage_error(calor: Run) -> None:
    status, out, err = calor("store", "Some text.", "--tag", "no-equals-sign")
    assert status == 2
    assert out == ""
    assert "KEY=VALUE" in err


def test_empty_text_exits_2(calor: Run) -> None:
    status, _, err = calor("store", "")
    assert status == 2
    assert err.startswith("error: INVALID_ARGUMENT: ")


def test_unknown_id_fails_with_an_error_line(calor: Run) -> None:
    status, out, err = calor("inspect", "01JD0000000000000000000000")
    assert status == 1
    assert out == ""
    assert err.startswith("error: NOT_FOUND: ")
