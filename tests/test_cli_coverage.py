"""The ``calor`` CLI covers the API: every RPC has a verb, and each verb and flag added for
that works against a real server, as text and as ``--json``."""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from calor.client import CalorClient
from calor.client.cli import main
from calor.v1 import memory_pb2, memory_service_pb2, settings_service_pb2, trigger_service_pb2
from tests.helpers import Run

VERBS = {
    "Store": "store",
    "Recall": "recall",
    "Inspect": "inspect",
    "ListMemories": "list",
    "Update": "update",
    "Keystone": "keystone",
    "Boost": "boost",
    "Forget": "forget",
    "Connect": "connect",
    "Share": "share",
    "Evaluate": "evaluate",
    "EntityCard": "card",
    "Dream": "dream",
    "Offer": "offer",
    "Context": "context",
    "Identity": "status",
    "Feedback": "feedback",
    "Export": "export",
    "Import": "import",
    "Tune": "tune",
    "DropChannel": "drop-channel",
    "ListChannels": "channels",
    "GetSettings": "settings get",
    "UpdateSettings": "settings set",
    "ServerStatus": "status",
    "CreateTrigger": "trigger add",
    "ListTriggers": "trigger list",
    "DeleteTrigger": "trigger rm",
    "TriggerHistory": "trigger history",
    "TriggerFeedback": "trigger feedback",
    "EvaluateTriggers": "evaluate-triggers",
    "Subscribe": "subscribe",
}
"""The ``calor`` verb that makes each RPC."""

NO_VERB = {
    "StoreStream": "bulk stores from a shell go through `calor import` (Import)",
    "Progress": "`calor import` polls it to draw its bar",
}
"""RPCs without a verb of their own, and why."""


def _rpcs() -> list[str]:
    modules = (memory_service_pb2, settings_service_pb2, trigger_service_pb2)
    return [
        method.name
        for module in modules
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


@pytest.mark.parametrize("rpc", _rpcs())
def test_every_rpc_has_a_verb(rpc: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert rpc in VERBS or rpc in NO_VERB, f"{rpc} has no `calor` verb: add one, and map it here"
    if rpc in NO_VERB:
        return
    assert main([*VERBS[rpc].split(), "--help"]) == 0, f"`calor {VERBS[rpc]}` does not exist"
    assert "usage: calor" in capsys.readouterr().out


def _id(out: str) -> str:
    """The id in ``stored ID (…)``."""
    return out.split()[1]


def _json(calor: Run, *args: str) -> dict[str, object]:
    status, out, err = calor(*args, "--json")
    assert status == 0, err
    document: dict[str, object] = json.loads(out)
    return document


# --- dream and offer ------------------------------------------------------------------


def test_dream(calor: Run) -> None:
    for text in (
        "Our team standup meeting is at 9am every day.",
        "The daily team standup is at 9am.",
    ):
        calor("store", text, "--type", "fact")
    status, out, _ = calor("dream")
    assert status == 0
    assert "merged 1" in out and "channel heat" in out
    assert _json(calor, "dream")["merged"] == 0  # nothing left to do


def test_offer_from_a_file_and_from_stdin(
    calor: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calor("store", "The user reads the changelog every Monday.")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"abc")))
    status, out, _ = calor("offer")
    assert (status, out.strip()) == (0, "offered 3 bytes; 3 accumulated toward the next dream")

    transcript = tmp_path / "transcript.txt"
    transcript.write_bytes(b"x" * 5000)  # past the default threshold, 4096
    status, out, _ = calor("offer", str(transcript))
    assert status == 0
    assert out.startswith("offered 5000 bytes; 0 accumulated")
    assert "the channel dreamed: migrated " in out

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    answer = _json(calor, "offer", "-")
    assert (answer["accumulated"], answer["dreamed"]) == (0, False)


def test_offer_sends_a_large_file_in_chunks(calor: Run, tmp_path: Path) -> None:
    calor("store", "A long session transcript follows.")
    assert calor("settings", "set", "entropy_threshold=1000000")[0] == 0
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(600 * 1024))  # three offers of at most 256 KiB
    answer = _json(calor, "offer", str(big))
    assert (answer["accumulated"], answer["dreamed"]) == (600 * 1024, False)


def test_offer_of_a_missing_file_fails(calor: Run, tmp_path: Path) -> None:
    status, out, err = calor("offer", str(tmp_path / "nope.txt"))
    assert (status, out) == (1, "")
    assert "nope.txt" in err


# --- settings -------------------------------------------------------------------------


def test_settings_get(calor: Run) -> None:
    status, out, _ = calor("settings", "get")
    assert status == 0
    rows = dict(line.split(None, 1) for line in out.splitlines())
    assert rows["entropy_threshold"] == "4096"
    assert rows["decay_mode"] == "time"
    assert rows["decay_curve"] == "exponential"
    assert rows["gate_fidelity"] in ("true", "false")
    assert rows["profiles.fact.half_life_seconds"] == "31536000"
    assert rows["dream_archive_exempt_types"] == "semantic,procedural,core"
    assert _json(calor, "settings", "get")["cold_threshold"] == pytest.approx(0.10)


def test_settings_set_reads_each_value_by_its_type(calor: Run, client: CalorClient) -> None:
    status, out, err = calor(
        "settings",
        "set",
        "cold_threshold=0.2",
        "entropy_threshold=2048",
        "decay_mode=hybrid",
        "decay_curve=huber",
        "gate_fidelity=yes",
        "heat_min_band=high",
        "dream_archive_exempt_types=core,semantic",
        "profiles.fact.floor=0.25",
        "profiles.episodic.half_life_seconds=7200",
    )
    assert status == 0, err
    rows = dict(line.split(None, 1) for line in out.splitlines())
    assert rows == {
        "cold_threshold": "0.2",
        "entropy_threshold": "2048",
        "decay_mode": "hybrid",
        "decay_curve": "huber",
        "gate_fidelity": "true",
        "heat_min_band": "high",
        "dream_archive_exempt_types": "semantic,core",
        "profiles.fact.floor": "0.25",
        "profiles.episodic.half_life_seconds": "7200",
    }
    settings = client.get_settings()
    assert settings.decay_mode == memory_pb2.DECAY_MODE_HYBRID and settings.gate_fidelity
    assert settings.decay_curve == memory_pb2.DECAY_CURVE_HUBER
    profiles = {p.memory_type: p for p in settings.profiles}
    fact = profiles[memory_pb2.MEMORY_TYPE_FACT]
    assert (fact.floor, fact.half_life_seconds) == (0.25, 365 * 86_400.0)  # the rest kept
    assert profiles[memory_pb2.MEMORY_TYPE_EPISODIC].half_life_seconds == 7200.0
    document = _json(calor, "settings", "set", "gate_fidelity=off")
    assert document["gate_fidelity"] is False and document["entropy_threshold"] == 2048


def test_settings_set_unknown_key_is_a_usage_error_listing_the_known(
    calor: Run, client: CalorClient
) -> None:
    before = client.get_settings()
    status, out, err = calor("settings", "set", "cold_threshold=0.3", "colder=1")
    assert (status, out) == (2, "")
    assert "unknown setting 'colder'" in err
    assert "cold_threshold" in err and "dream_max_conflicts" in err
    assert "profiles.TYPE.FIELD" in err and "half_life_seconds" in err
    for bad in ("profiles.fact=1", "profiles.fact.speed=1", "profiles.nonsense.floor=1"):
        assert calor("settings", "set", bad)[0] == 2
    assert client.get_settings() == before


@pytest.mark.parametrize(
    ("assignment", "says"),
    [
        ("cold_threshold=cold", "not a number"),
        ("entropy_threshold=1.5", "not a whole number"),
        ("gate_fidelity=maybe", "expected true or false"),
        ("decay_mode=sometimes", "time, interaction, hybrid"),
        ("decay_curve=sigmoid", "exponential, huber, elastic"),
        ("dream_archive_exempt_types=core,rocks", "unknown value 'rocks'"),
        ("cold_threshold", "KEY=VALUE"),
    ],
)
def test_settings_set_bad_values_are_usage_errors(calor: Run, assignment: str, says: str) -> None:
    status, _, err = calor("settings", "set", assignment)
    assert status == 2
    assert says in err


def test_settings_set_out_of_range_changes_nothing(calor: Run, client: CalorClient) -> None:
    before = client.get_settings()
    status, out, err = calor("settings", "set", "entropy_threshold=99", "cold_threshold=7")
    assert (status, out) == (2, "")
    assert err.startswith("error: INVALID_ARGUMENT: cold_threshold")
    assert client.get_settings() == before


# --- connect and update ---------------------------------------------------------------


def test_connect(calor: Run, client: CalorClient) -> None:
    a = _id(calor("store", "The build server is named Forge.")[1])
    b = _id(calor("store", "Forge runs the nightly release job.")[1])
    status, out, _ = calor("connect", a, b, "--weight", "0.5")
    assert (status, out.strip()) == (0, f"linked {a} -> {b} (manual, weight 0.50)")
    edges = client.inspect(a).edges
    assert any(e.kind == memory_pb2.EDGE_KIND_MANUAL and e.to_id == b for e in edges)
    edge = _json(calor, "connect", b, a)
    assert (edge["from_id"], edge["kind"], edge["weight"]) == (b, "EDGE_KIND_MANUAL", 1.0)
    assert calor("connect", a, "01JD0000000000000000000000")[0] == 1  # NOT_FOUND


def test_update_fields(calor: Run, client: CalorClient, monkeypatch: pytest.MonkeyPatch) -> None:
    memory_id = _id(calor("store", "The user likes tea.", "--tag", "topic=drinks")[1])
    status, out, err = calor(
        "update",
        memory_id,
        "--text",
        "The user likes green tea.",
        "--type",
        "preference",
        "--tag",
        "topic=tea",
        "--tag",
        "checked=yes",
        "--importance",
        "0.9",
    )
    assert status == 0, err
    assert out.startswith(f"updated {memory_id} (preference, heat ")
    memory = client.inspect(memory_id).memory
    assert memory.text == "The user likes green tea."
    assert dict(memory.tags) == {"topic": "tea", "checked": "yes"}
    assert memory.importance == pytest.approx(0.9)

    monkeypatch.setattr("sys.stdin", io.StringIO("The user likes oolong.\n"))
    document = _json(calor, "update", memory_id, "--text", "-")
    assert document["text"] == "The user likes oolong."
    status, _, err = calor("update", memory_id)
    assert status == 2 and "nothing to change" in err


def test_update_supersedes(calor: Run, client: CalorClient) -> None:
    old = _id(calor("store", "The office wifi password is hunter2.", "--type", "fact")[1])
    new = _id(calor("store", "The office wifi password is now swordfish.", "--type", "fact")[1])
    assert calor("update", new, "--supersedes", old)[0] == 0
    assert client.inspect(old).memory.tags["superseded_by"] == new
    hits = client.recall("office wifi password", peek=True).hits
    assert [h.memory.id for h in hits] == [new]


def test_update_clear_merge(calor: Run, client: CalorClient) -> None:
    ids = [
        _id(calor("store", text, "--type", "fact")[1])
        for text in (
            "Our team standup meeting is at 9am every day.",
            "The daily team standup is at 9am.",
        )
    ]
    assert client.dream().merged == 1
    absorbed = next(
        i for i in ids if client.inspect(i).memory.state == memory_pb2.MEMORY_STATE_MERGED
    )
    status, out, _ = calor("update", absorbed, "--clear-merge")
    assert status == 0
    assert client.inspect(absorbed).memory.state == memory_pb2.MEMORY_STATE_ACTIVE


# --- evaluate-triggers ------------------------------------------------------------------


def test_evaluate_triggers(calor: Run) -> None:
    memory_id = _id(calor("store", "Invoice 42 is due on Friday.")[1])
    status, out, _ = calor("evaluate-triggers", "on_store", memory_id)
    assert (status, out.strip()) == (0, "no trigger would fire")
    status, out, _ = calor(
        "trigger",
        "add",
        "--event",
        "on_store",
        "--action",
        "notify",
        "--pattern",
        "(?i)invoice",
        "--config",
        "message=due: {text}",
        "--id",
        f"invoices-{memory_id}",
    )
    assert status == 0
    status, out, _ = calor("evaluate-triggers", "on_store", memory_id)
    assert status == 0
    first, would = out.splitlines()
    assert first.startswith(f"invoices-{memory_id}  on_store -> notify")
    assert would.startswith("  would: ") and "due: Invoice 42 is due on Friday." in would
    matches = _json(calor, "evaluate-triggers", "on_store", memory_id)["matches"]
    assert [m["trigger"]["id"] for m in matches] == [f"invoices-{memory_id}"]  # type: ignore[index]
    assert calor("evaluate-triggers", "on_lunch", memory_id)[0] == 2


# --- forget with a filter ----------------------------------------------------------------


def test_forget_by_type_tag_state_and_date(calor: Run, client: CalorClient) -> None:
    scratch = _id(calor("store", "Scratch: ping the staging box.", "--type", "working")[1])
    tagged = _id(
        calor("store", "Lunch is at noon.", "--tag", "topic=lunch", "--type", "episodic")[1]
    )
    old = _id(calor("store", "We used SVN back then.", "--created-at", "2020-01-01")[1])
    keep = _id(calor("store", "The user is allergic to peanuts.", "--type", "fact")[1])

    assert calor("forget", "--type", "working")[1].strip() == "forgot 1 memory"
    assert (
        calor("forget", "--tag", "topic=lunch", "--type", "fact")[1].strip() == "forgot 0 memories"
    )
    assert calor("forget", "--tag", "topic=lunch")[1].strip() == "forgot 1 memory"
    assert _json(calor, "forget", "--before", "2021-06-30")["forgotten"] == 1
    for gone in (scratch, tagged, old):
        assert client.inspect(gone).memory.state == memory_pb2.MEMORY_STATE_DELETED
    assert calor("forget", "--state", "merged")[1].strip() == "forgot 0 memories"
    assert [m.id for m in client.list_memories().memories] == [keep]


def test_forget_needs_ids_or_a_filter(calor: Run) -> None:
    calor("store", "Keep me.")
    status, _, err = calor("forget")
    assert status == 2 and "give ids or a filter" in err
    assert calor("forget", "--before", "yesterday")[0] == 2
    assert calor("forget", "--tag", "no-equals")[0] == 2


# --- recall's flags ----------------------------------------------------------------------


def test_recall_type_and_time_window(calor: Run) -> None:
    fact = _id(calor("store", "The office is on the fifth floor.", "--type", "fact")[1])
    calor("store", "I walked up to the office on the fifth floor today.", "--type", "episodic")
    status, out, _ = calor("recall", "fifth floor office", "--type", "fact", "--peek")
    assert status == 0
    assert [line.split()[3] for line in out.splitlines()] == [fact]

    status, out, _ = calor(
        "recall", "office", "--from", "2026-03-01", "--to", "2026-03-07T23:59:59Z", "--peek"
    )
    assert (
        out.splitlines()[0] == "time window 2026-03-01T00:00:00+00:00 .. 2026-03-07T23:59:59+00:00"
    )

    status, out, _ = calor(
        "recall", "what happened yesterday?", "--as-of", "2026-03-05T12:00:00", "--peek"
    )
    assert out.splitlines()[0].startswith('time window "yesterday" 2026-03-04T00:00:00+00:00 .. ')
    window = _json(calor, "recall", "the office", "--as-of", "2026-03-05", "--peek")
    assert "temporal_window" not in window  # no time named: no window
    assert window["hits"]
    assert calor("recall", "office", "--as-of", "soon")[0] == 2


def test_recall_other_channels_names_them(calor: Run, client: CalorClient) -> None:
    other = f"{client.channel}-other"
    client.store("The user's sister lives in Lisbon.", channel=other)
    status, out, _ = calor("recall", "where does the sister live?", "--peek")
    assert "Lisbon" not in out
    status, out, _ = calor("recall", "where does the sister live?", "--channels", other, "--peek")
    assert status == 0
    first = out.splitlines()[0]
    assert f"[{other}]" in first and "Lisbon" in first


def test_recall_include_archived(calor: Run, client: CalorClient) -> None:
    long_ago = datetime.now(UTC) - timedelta(days=200)
    stale = client.store(
        "We once tried a standing desk experiment in the old office.",
        memory_type="episodic",
        importance=0.05,
        created_at=long_ago,
    )
    client.dream()
    assert client.inspect(stale.id).memory.state == memory_pb2.MEMORY_STATE_ARCHIVED
    query = "standing desk experiment"
    assert stale.id not in calor("recall", query, "--peek")[1]
    status, out, _ = calor("recall", query, "--include-archived", "--peek")
    assert status == 0 and stale.id in out.splitlines()[0]


def test_forget_reject_keeps_a_channel_from_learning_it_again(
    calor: Run, client: CalorClient
) -> None:
    said = "The staging password is tulip-42, written on the fridge."
    wrong = _id(calor("store", said)[1])
    assert calor("forget", wrong, "--reject")[1].strip() == "forgot 1 memory"
    again = client.store(said)
    assert again.provenance["resembles_rejected"] == wrong
    other = "Deploys to production happen on Tuesday mornings only."
    dropped = client.store(other).id
    assert client.forget(dropped, reject=True) == 1
    assert client.store(other).provenance["resembles_rejected"] == dropped
    plain = "Coffee beans are in the left cupboard."
    client.forget(client.store(plain).id)
    assert "resembles_rejected" not in client.store(plain).provenance


def test_trigger_feedback_rates_a_firing(calor: Run, client: CalorClient) -> None:
    status, _, err = calor(
        "trigger",
        "add",
        "--id",
        "pinger",
        "--event",
        "on_store",
        "--action",
        "notify",
        "--config",
        "message=stored",
    )
    assert status == 0, err
    client.store("A note to fire on.")
    deadline = time.monotonic() + 10
    while not (fired := client.trigger_history("pinger")) and time.monotonic() < deadline:
        time.sleep(0.05)
    status, out, err = calor("trigger", "feedback", "pinger", str(fired[0].seq), "noise")
    assert (status, out.strip()) == (0, "rated noise: precision 0.00 over 1 rated firings"), err
    assert client.trigger_history("pinger")[0].rating == "noise"
    assert client.trigger_feedback("pinger", fired[0].seq, "useful").precision == 1.0
    assert calor("trigger", "feedback", "pinger", str(fired[0].seq), "meh")[0] == 2
