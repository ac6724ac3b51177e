"""Input hygiene through the real server: trigger secrets are write-only, page tokens are
checked, text must show something, and reads on an unknown channel write nothing."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import rocksdict

from calor.client.cli import main
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock
from calor.server.config import ServerConfig
from calor.server.ids import new_id
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2, settings_service_pb2_grpc
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import store, total

SECRET = "hmac-key-do-not-show-4f1c"
HOOK = "http://127.0.0.1:9/hook"  # the discard port: nothing answers there


def rejected(call: Callable[[], object], *words: str) -> str:
    """Run ``call``; it must fail with INVALID_ARGUMENT naming ``words``. Returns the message."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    details = caught.value.details() or ""
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (caught.value.code(), details)
    for word in words:
        assert word in details, details
    return details


def token(position: str) -> str:
    """A page token shaped like the server's, around a position it would never issue."""
    return base64.urlsafe_b64encode(position.encode()).decode()


@pytest.fixture(scope="module")
def triggers(grpc_channel: grpc.Channel) -> TriggerServiceStub:
    return TriggerServiceStub(grpc_channel)


@pytest.fixture(scope="module")
def hooked(start_server: Callable[..., ServerThread]) -> Iterator[tuple[str, grpc.Channel]]:
    """A server of its own whose allow-list holds HOOK (the shared one allows no webhook
    host, so it refuses every webhook trigger at creation), and a channel to it."""
    server = start_server(webhook_allow=("127.0.0.1:9",))
    with grpc.insecure_channel(server.target) as channel:
        yield server.target, channel


def webhook(stub: TriggerServiceStub, channel: str, trigger_id: str) -> tpb.Trigger:
    trigger = tpb.Trigger(
        id=trigger_id,
        channel=channel,
        event=tpb.EVENT_KIND_ON_STORE,
        action=tpb.ACTION_KIND_WEBHOOK,
        config={"url": HOOK, "secret": SECRET},
    )
    return stub.CreateTrigger(tpb.CreateTriggerRequest(trigger=trigger)).trigger


# --- 4. trigger secrets are write-only ------------------------------------------------------


def test_no_reply_ever_carries_a_webhook_secret(
    hooked: tuple[str, grpc.Channel], channel_name: str
) -> None:
    memories, triggers = MemoryServiceStub(hooked[1]), TriggerServiceStub(hooked[1])
    created = webhook(triggers, channel_name, f"{channel_name[:50]}:hook")
    assert created.config["url"] == HOOK
    assert created.config["secret"] == "[redacted]", "a secret is set, and it is not shown"

    memory = store(memories, channel_name, "The release train leaves on Thursday.")
    listed = triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name))
    dry_run = triggers.EvaluateTriggers(
        tpb.EvaluateTriggersRequest(
            channel=channel_name, event=tpb.EVENT_KIND_ON_STORE, memory_id=memory.id
        )
    )

    assert [t.id for t in listed.triggers] == [created.id]
    assert [m.trigger.id for m in dry_run.matches] == [created.id]
    for reply in (created, listed, dry_run):
        assert SECRET.encode() not in reply.SerializeToString(), type(reply).__name__


@pytest.mark.parametrize("bad", ["nightly\n", "nightly\r\n", " nightly", "a/b"])
def test_a_trigger_id_is_checked_to_its_last_character(
    triggers: TriggerServiceStub, channel_name: str, bad: str
) -> None:
    rejected(lambda: webhook(triggers, channel_name, bad), "trigger.id")
    assert not triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers


def test_the_redacted_placeholder_is_not_taken_as_a_secret(
    triggers: TriggerServiceStub, channel_name: str
) -> None:
    copied = tpb.Trigger(
        channel=channel_name,
        event=tpb.EVENT_KIND_ON_STORE,
        action=tpb.ACTION_KIND_WEBHOOK,
        config={"url": HOOK, "secret": "[redacted]"},
    )
    rejected(
        lambda: triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=copied)), "config.secret"
    )
    assert not triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers


def test_cli_never_prints_the_secret(
    hooked: tuple[str, grpc.Channel], channel_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def calor(*args: str) -> tuple[int, str, str]:
        status = main(["--target", hooked[0], "--channel", channel_name, *args])
        out, err = capsys.readouterr()
        return status, out, err

    added = calor(
        "trigger",
        "add",
        "--event",
        "on_store",
        "--action",
        "webhook",
        "--config",
        f"url={HOOK}",
        "--config",
        f"secret={SECRET}",
    )
    listed = calor("trigger", "list")
    as_json = calor("--json", "trigger", "list")
    for status, out, err in (added, listed, as_json):
        assert status == 0, err
        assert SECRET not in out + err
    assert "secret=[redacted]" in listed[1]


# --- 4. page tokens are checked ---------------------------------------------------------------


def _notify_history(
    memories: MemoryServiceStub, triggers: TriggerServiceStub, channel: str, count: int
) -> tuple[str, list[tpb.TriggerFiring]]:
    """A notify trigger that has fired ``count`` times, and its whole history."""
    trigger = triggers.CreateTrigger(
        tpb.CreateTriggerRequest(
            trigger=tpb.Trigger(
                channel=channel, event=tpb.EVENT_KIND_ON_STORE, action=tpb.ACTION_KIND_NOTIFY
            )
        )
    ).trigger
    for n in range(count):
        store(memories, channel, f"Observation number {n} about the greenhouse.")
    deadline = time.monotonic() + 10
    while True:
        firings = triggers.TriggerHistory(
            tpb.TriggerHistoryRequest(trigger_id=trigger.id, page_size=1000)
        ).firings
        if len(firings) >= count or time.monotonic() > deadline:
            return trigger.id, list(firings)
        time.sleep(0.05)


GARBAGE_TOKENS = {
    "not base64": "!!!",
    "text, not an offset": token("abc"),
    "a negative offset": token("-5"),
    "a signed offset": token("+1"),
    "an offset with a leading zero": token("03"),
    "stray characters after a real token": token("3") + "!!",
    "no padding": token("3").rstrip("="),
    "not UTF-8": base64.urlsafe_b64encode(b"\xff\xfe").decode(),
}


@pytest.mark.parametrize("bad", GARBAGE_TOKENS.values(), ids=GARBAGE_TOKENS.keys())
def test_trigger_history_refuses_a_token_it_did_not_issue(
    memories: MemoryServiceStub, triggers: TriggerServiceStub, channel_name: str, bad: str
) -> None:
    trigger = tpb.Trigger(
        channel=channel_name, event=tpb.EVENT_KIND_ON_STORE, action=tpb.ACTION_KIND_NOTIFY
    )
    created = triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=trigger)).trigger
    request = tpb.TriggerHistoryRequest(trigger_id=created.id, page_token=bad)
    rejected(lambda: triggers.TriggerHistory(request), "page_token", "next_page_token")


def test_trigger_history_pages_with_the_tokens_it_issues(
    memories: MemoryServiceStub, triggers: TriggerServiceStub, channel_name: str
) -> None:
    trigger_id, everything = _notify_history(memories, triggers, channel_name, 7)
    assert len(everything) == 7
    paged: list[tpb.TriggerFiring] = []
    request = tpb.TriggerHistoryRequest(trigger_id=trigger_id, page_size=3)
    while True:
        page = triggers.TriggerHistory(request)
        paged.extend(page.firings)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert [(f.memory_id, f.seq) for f in paged] == [(f.memory_id, f.seq) for f in everything]


def test_list_triggers_checks_its_tokens_and_pages_with_its_own(
    triggers: TriggerServiceStub, channel_name: str
) -> None:
    ids = sorted(
        triggers.CreateTrigger(
            tpb.CreateTriggerRequest(
                trigger=tpb.Trigger(
                    id=f"{channel_name[:50]}:{n}",
                    channel=channel_name,
                    event=tpb.EVENT_KIND_ON_STORE,
                    action=tpb.ACTION_KIND_NOTIFY,
                )
            )
        ).trigger.id
        for n in range(3)
    )
    for bad in ("!!!", token("no such id!"), token(ids[0]) + "=="):
        request = tpb.ListTriggersRequest(channel=channel_name, page_token=bad)
        rejected(lambda r=request: triggers.ListTriggers(r), "page_token")
    seen: list[str] = []
    request = tpb.ListTriggersRequest(channel=channel_name, page_size=1)
    while True:
        page = triggers.ListTriggers(request)
        seen.extend(t.id for t in page.triggers)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert seen == ids


def test_list_memories_checks_its_tokens_and_pages_with_its_own(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    ids = [store(memories, channel_name, f"Plant number {n} needs water.").id for n in range(5)]
    first = memories.ListMemories(pb.ListMemoriesRequest(channel=channel_name, page_size=2))
    assert first.next_page_token
    for bad in ("!!!", first.next_page_token + "!!", token("03"), token(new_id())[:-1]):
        request = pb.ListMemoriesRequest(channel=channel_name, page_size=2, page_token=bad)
        rejected(lambda r=request: memories.ListMemories(r), "page_token")
    seen = [m.id for m in first.memories]
    request = pb.ListMemoriesRequest(
        channel=channel_name, page_size=2, page_token=first.next_page_token
    )
    while True:
        page = memories.ListMemories(request)
        seen.extend(m.id for m in page.memories)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert seen == sorted(ids)


# --- 5. text must say something ---------------------------------------------------------------

INVISIBLE = {
    "NUL": "\x00",
    "NULs and controls": "\x00\x01\x7f",
    "zero-width space and BOM": "\u200b\ufeff",
    "zero-width joiners": "\u200c\u200d\u2060",
    "bidi marks": "\u200e\u202e\u2066",
    "soft hyphen": "\u00ad",
    "Hangul filler": "\u3164",
    "variation selector": "\ufe0f",
    "spaces and zero-widths": " \u200b\t\u3000\u200b\n",
    "line separator": "\u2028",
}
VISIBLE = [
    "用户喜欢在早上喝绿茶。",
    "Пользователь живёт в Берлине.",
    "המשתמש מעדיף תה.",
    "उपयोगकर्ता को चाय पसंद है।",
    "🚀",
    "👩\u200d👩\u200d👧 family trip in June",
    "\ufeffA note that starts with a BOM.",
    "zero\u200bwidth inside a word",
]


@pytest.mark.parametrize("text", INVISIBLE.values(), ids=INVISIBLE.keys())
def test_invisible_text_is_refused_everywhere_it_enters(
    memories: MemoryServiceStub, channel_name: str, text: str
) -> None:
    memory = store(memories, channel_name, "The greenhouse door sticks in the rain.")

    rejected(lambda: memories.Store(pb.StoreRequest(channel=channel_name, text=text)), "text")
    stream = [
        pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel_name, text="Fine words.")),
        pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel_name, text=text)),
    ]
    rejected(lambda: memories.StoreStream(iter(stream)), "item 1", "text")
    update = pb.UpdateRequest(channel=channel_name, id=memory.id, text=text)
    rejected(lambda: memories.Update(update), "text")
    rejected(lambda: memories.Recall(pb.RecallRequest(channel=channel_name, query=text)), "query")
    tagged = pb.StoreRequest(channel=channel_name, text="Tagged.", tags={text: "v"})
    rejected(lambda: memories.Store(tagged), "tags")

    assert total(memories, channel_name) == 1
    [kept] = memories.ListMemories(pb.ListMemoriesRequest(channel=channel_name)).memories
    assert kept.text == "The greenhouse door sticks in the rain."


@pytest.mark.parametrize("text", ["\x00", "\u200b\ufeff", "\u3164", "\u00ad\u2060"])
def test_an_import_with_an_invisible_note_is_refused_whole(
    memories: MemoryServiceStub, channel_name: str, text: str
) -> None:
    plain = f"- A real note about the greenhouse.\n- {text}\n- Another real note.\n"
    exported = f"## t\n- type: fact\n\n```text\n{text}\n```\n"
    for markdown, line in ((plain, "line 2"), (exported, "line 1")):
        notes = [pb.ImportRequest(channel=channel_name, markdown=markdown)]
        rejected(lambda n=notes: memories.Import(iter(n)), line, "text")
    assert total(memories, channel_name) == 0


def test_visible_text_in_any_script_is_kept(memories: MemoryServiceStub, channel_name: str) -> None:
    stored = {store(memories, channel_name, text).text for text in VISIBLE}
    assert stored == set(VISIBLE)
    into = f"{channel_name}-import"
    markdown = "".join(f"- {text}\n" for text in VISIBLE)
    imported = memories.Import(iter([pb.ImportRequest(channel=into, markdown=markdown)]))
    assert len(imported.ids) == len(VISIBLE) == total(memories, into)
    hits = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="🚀", peek=True, limit=50)
    ).hits
    assert "🚀" in {h.memory.text for h in hits}


# --- 6. reads write nothing -------------------------------------------------------------------


def _dump(path: Path, embedder: OnnxEmbedder) -> dict[bytes, bytes]:
    """Every key and value of a stopped server's store."""
    db = rocksdict.Rdict(str(path / "rocksdb"), rocksdict.Options(raw_mode=True))
    try:
        return {bytes(k): bytes(v) for k, v in db.items()}
    finally:
        db.close()


def _quiet(config: ServerConfig, clock: ManualClock, embedder: OnnxEmbedder) -> dict[bytes, bytes]:
    """Restart the server with nothing to do until a restart changes nothing (background
    bookkeeping, such as the trigger dispatcher's cursor, has caught up); that store."""
    before = _dump(config.data_dir, embedder)
    for _ in range(20):
        ServerThread(config, clock, lambda: embedder).stop()
        after = _dump(config.data_dir, embedder)
        if after == before and _caught_up(after):
            return after
        before = after
    raise AssertionError("the store keeps changing across idle restarts")


def _caught_up(dump: dict[bytes, bytes]) -> bool:
    """Whether the trigger dispatcher's saved cursor is at the last logged event."""
    logged = [k for k in dump if k.startswith(b"l:")]
    last = int.from_bytes(max(logged)[2:], "big") if logged else 0
    cursor = dump.get(b"s:cursor")
    return cursor is not None and json.loads(cursor)["seq"] == last


def test_calls_on_an_unknown_channel_leave_rocksdb_unchanged(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    clock = ManualClock(1_780_000_000.0)
    config = ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=0)
    first = ServerThread(config, clock, lambda: embedder)
    try:
        with grpc.insecure_channel(first.target) as channel:
            stub = MemoryServiceStub(channel)
            kept = store(stub, "known", "The boiler is serviced every October.")
            store(stub, "known", "The boiler is serviced each October.")
            stub.Recall(pb.RecallRequest(channel="known", query="boiler service"))
    finally:
        first.stop()
    before = _quiet(config, clock, embedder)
    assert any(key.startswith(b"m:known\x00") for key in before)

    unknown = "never-used"
    second = ServerThread(config, clock, lambda: embedder)
    try:
        with grpc.insecure_channel(second.target) as channel:
            stub = MemoryServiceStub(channel)
            settings = settings_service_pb2_grpc.SettingsServiceStub(channel)
            hooks = TriggerServiceStub(channel)
            dream = stub.Dream(pb.DreamRequest(channel=unknown))
            recall = stub.Recall(
                pb.RecallRequest(channel=unknown, query="boiler", channels=["known"])
            )
            peek = stub.Recall(pb.RecallRequest(channel=unknown, query="boiler", peek=True))
            identity = stub.Identity(pb.IdentityRequest(channel=unknown))
            listed = stub.ListMemories(pb.ListMemoriesRequest(channel=unknown))
            offered = stub.Offer(pb.OfferRequest(channel=unknown, entropy=b""))
            exported = list(stub.Export(pb.ExportRequest(channel=unknown)))
            forgot = stub.Forget(pb.ForgetRequest(channel=unknown, ids=[kept.id]))
            forgot_none = stub.Forget(pb.ForgetRequest(channel="known", ids=[new_id()]))
            dropped = stub.DropChannel(pb.DropChannelRequest(channel=unknown))
            got = settings.GetSettings(settings_service_pb2.GetSettingsRequest(channel=unknown))
            evaluated = stub.Evaluate(
                pb.EvaluateRequest(
                    channel=unknown, text="The boiler is never serviced.", store_findings=True
                )
            )
            triggers = hooks.ListTriggers(tpb.ListTriggersRequest(channel=unknown))
            with pytest.raises(grpc.RpcError) as tune_failed:
                stub.Tune(pb.TuneRequest(channel=unknown))
            tuned = tune_failed.value
            blocks = [
                stub.Context(pb.ContextRequest(channel=unknown, message="boiler", heat=True)),
                stub.Context(pb.ContextRequest(channel=unknown, message="boiler")),
            ]
            for call in (
                lambda: stub.Inspect(pb.InspectRequest(channel=unknown, id=kept.id)),
                lambda: stub.Boost(pb.BoostRequest(channel=unknown, id=kept.id, delta=0.1)),
                lambda: stub.Keystone(
                    pb.KeystoneRequest(channel=unknown, id=kept.id, keystone=True)
                ),
                lambda: stub.Feedback(
                    pb.FeedbackRequest(
                        channel=unknown, recall_id=new_id(), rating=pb.FEEDBACK_RATING_HELPFUL
                    )
                ),
                lambda: stub.Share(
                    pb.ShareRequest(channel=unknown, id=kept.id, target_channel="known")
                ),
                lambda: stub.EntityCard(pb.EntityCardRequest(channel=unknown, entity="Boiler")),
                lambda: stub.EntityCard(pb.EntityCardRequest(channel="known", entity="October")),
            ):
                with pytest.raises(grpc.RpcError) as caught:
                    call()
                assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        second.stop()

    assert dream == pb.DreamResponse(), "an unknown channel dreams an all-zero report"
    assert recall.hits and {h.memory.channel for h in recall.hits} == {"known"}
    assert not peek.hits
    assert (identity.total, identity.channel_heat, dict(identity.by_state)) == (0, 0.0, {})
    assert not listed.memories and not listed.next_page_token
    assert (offered.accumulated, offered.dreamed) == (0, False)
    assert sum(part.memories for part in exported) == 0
    assert (forgot.forgotten, forgot_none.forgotten) == (0, 0)
    assert dropped.dropped == 0, "dropping a channel that holds nothing writes nothing"
    assert not recall.recall_id, "a recall from a channel that does not exist logs nothing"
    assert tuned.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert got.settings.entropy_threshold > 0
    assert evaluated.alignment == 1.0 and not evaluated.issues and not evaluated.stored_ids
    assert not triggers.triggers
    assert [(b.block, b.tokens_used, len(b.items)) for b in blocks] == [("", 0, 0)] * 2
    after = _dump(config.data_dir, embedder)
    assert [k for k in after if k not in before] == []
    assert after == before


def test_offered_entropy_still_counts_on_a_new_channel(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    offered = memories.Offer(pb.OfferRequest(channel=channel_name, entropy=b"x" * 100))
    assert (offered.accumulated, offered.dreamed) == (100, False)
    again = memories.Offer(pb.OfferRequest(channel=channel_name, entropy=b""))
    assert (again.accumulated, again.dreamed) == (100, False)
