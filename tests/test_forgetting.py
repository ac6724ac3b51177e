"""Forgetting that forgets: after a Forget or a DropChannel and the purge that follows, a
forgotten text (and its embedding) is in no file under the data dir and in no answer;
the events stay, numbered as they were, without it."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from calor.client import AsyncCalorClient, CalorClient
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.commands import NewMemory
from calor.server.config import ServerConfig
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.events import EventRecord
from calor.server.records import DELETED
from calor.server.storage.consistency import Checker
from calor.server.storage.ops import Quote
from calor.server.storage.store import Keys, MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from calor.triggers.outbox import Delivery, drop_delivery, pending_deliveries, put_delivery
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import FACT, Run, store, total

VAULT = "The vault behind the bakery opens with code {marker} on 4 weekdays."
CONTRADICTION = "The vault behind the bakery opens with that code on 6 weekdays."


# --- helpers ----------------------------------------------------------------------------


def holding(folder: Path, needle: bytes) -> list[str]:
    """Every file under ``folder`` whose bytes hold ``needle`` (WAL, tables, LOG,
    MANIFEST, OPTIONS: all of them)."""
    found = []
    for path in sorted(folder.rglob("*")):
        try:
            if path.is_file() and needle in path.read_bytes():
                found.append(str(path.relative_to(folder)))
        except FileNotFoundError:  # RocksDB deleted it while we looked
            continue
    return found


class Stubs:
    """The three services on one connection."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.memories = MemoryServiceStub(channel)
        self.triggers = TriggerServiceStub(channel)
        self.settings = SettingsServiceStub(channel)


@pytest.fixture
def own(embedder: OnnxEmbedder, tmp_path: Path) -> Iterator[tuple[ServerThread, Stubs]]:
    """A server of the test's own on ``tmp_path`` that purges only when asked (the test
    calls ``engine.purge()``), so what is on disk is the test's to see."""
    server = ServerThread(_config(tmp_path), SystemClock(), lambda: embedder)
    try:
        with grpc.insecure_channel(server.target) as channel:
            yield server, Stubs(channel)
    finally:
        if not server.loop.is_closed():  # the test may have stopped it to look at the store
            server.stop()


def _config(data_dir: Path, **options: object) -> ServerConfig:
    fields: dict[str, object] = {"purge_delay_seconds": 3600.0, **options}
    return ServerConfig(data_dir=data_dir, host="127.0.0.1", port=0, **fields)  # type: ignore[arg-type]


def engine_of(server: ServerThread) -> MemoryEngine:
    return server.server.runtime.engine


def purge(server: ServerThread) -> None:
    """Run the pending purge now, on the server's own executor."""
    server.call(server.server.runtime.run(engine_of(server).purge))


def notify_on(stubs: Stubs, channel: str, pattern: str = "") -> tpb.Trigger:
    """A notify trigger on store whose message quotes the memory's text."""
    rule = tpb.Trigger(
        channel=channel,
        event=tpb.EVENT_KIND_ON_STORE,
        action=tpb.ACTION_KIND_NOTIFY,
        config={"message": "stored: {text}"},
        filter_pattern=pattern,
    )
    return stubs.triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=rule)).trigger


def wait_for_notify(stubs: Stubs, channel: str, needle: str) -> tpb.Event:
    """The first notify event of ``channel`` whose message holds ``needle`` (streamed)."""
    call = stubs.triggers.Subscribe(
        tpb.SubscribeRequest(channels=[channel], kinds=[tpb.EVENT_KIND_NOTIFY]), timeout=120
    )
    try:
        for reply in call:
            if needle in reply.event.message:
                return reply.event
    finally:
        call.cancel()
    raise AssertionError("the stream ended")


def every_event(stubs: Stubs) -> list[tpb.Event]:
    """Every event the log holds, read through Subscribe up to a sentinel stored last."""
    sentinel = store(stubs.memories, "sentinel", "A sentinel note marks the end of the test.")
    events: queue.Queue[tpb.Event] = queue.Queue()
    call = stubs.triggers.Subscribe(tpb.SubscribeRequest(after_seq=0))

    def read() -> None:
        try:
            for reply in call:
                events.put(reply.event)
        except grpc.RpcError:
            pass  # cancelled below

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[tpb.Event] = []
    try:
        while not any(
            e.memory_id == sentinel.id and e.kind == tpb.EVENT_KIND_ON_STORE for e in seen[-3:]
        ):
            seen.append(events.get(timeout=30))
    finally:
        call.cancel()
        reader.join(5)
    return seen


def answers_hold(stubs: Stubs, channel: str, needle: str) -> list[str]:
    """The answers of ``channel`` that carry ``needle``: listing (every state), export,
    recall, and the inspection of every memory with its edges."""
    found = []
    listed = stubs.memories.ListMemories(pb.ListMemoriesRequest(channel=channel, page_size=1000))
    if needle in str(listed):
        found.append("ListMemories")
    exported = stubs.memories.Export(pb.ExportRequest(channel=channel, include_archived=True))
    if needle in "".join(part.markdown for part in exported):
        found.append("Export")
    hits = stubs.memories.Recall(
        pb.RecallRequest(channel=channel, query=f"vault code {needle}", peek=True, limit=50)
    )
    if needle in str(hits):
        found.append("Recall")
    for memory in listed.memories:
        inspected = stubs.memories.Inspect(pb.InspectRequest(channel=channel, id=memory.id))
        if needle in str(inspected):
            found.append(f"Inspect {memory.id}")
    return found


def checked(path: Path, embedder: OnnxEmbedder) -> list[object]:
    """``calor check`` of a stopped server's store: the problems it finds."""
    store = MemoryStore.open(path, model_id=embedder.model_id, dim=embedder.dim)
    try:
        return list(Checker(store, embedder.embed_passages).run())
    finally:
        store.close()


# --- Forget -----------------------------------------------------------------------------


def test_a_forgotten_memory_leaves_no_trace_on_disk_or_in_any_answer(
    own: tuple[ServerThread, Stubs], embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    server, stubs = own
    marker = "zq-marker-7f3a"
    channel = "vault"
    trigger = notify_on(stubs, channel)
    filler = store(stubs.memories, channel, "The bakery sells rye bread on Mondays.")
    store(stubs.memories, channel, "The vault behind the bakery has a steel door.")
    secret = store(stubs.memories, channel, VAULT.format(marker=marker), memory_type=FACT)
    recalled = stubs.memories.Recall(pb.RecallRequest(channel=channel, query="vault code"))
    assert recalled.hits and recalled.recall_id
    stubs.memories.Feedback(
        pb.FeedbackRequest(
            channel=channel, recall_id=recalled.recall_id, rating=pb.FEEDBACK_RATING_HELPFUL
        )
    )
    evaluated = stubs.memories.Evaluate(
        pb.EvaluateRequest(channel=channel, text=CONTRADICTION, store_findings=True)
    )
    assert evaluated.stored_ids, "a finding that quotes the secret"
    assert marker in wait_for_notify(stubs, channel, marker).message
    # The embedding as RocksDB holds it (the index holds it at half precision).
    vector = engine_of(server)._store.get_vector(channel, secret.id)
    assert vector is not None
    needle = np.ascontiguousarray(vector, dtype="<f4").tobytes()[:64]

    # Something else forgotten first, so that its purge flushes the secret to a table file.
    stubs.memories.Forget(pb.ForgetRequest(channel=channel, ids=[filler.id]))
    purge(server)
    assert any(name.endswith(".sst") for name in holding(tmp_path, marker.encode()))
    assert holding(tmp_path, needle)

    forgot = stubs.memories.Forget(pb.ForgetRequest(channel=channel, ids=[secret.id]))
    assert forgot.forgotten == 2, "the memory, and the Evaluate finding that quotes it"
    purge(server)

    assert holding(tmp_path, marker.encode()) == []
    assert holding(tmp_path, needle) == []
    assert answers_hold(stubs, channel, marker) == []
    history = stubs.triggers.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=trigger.id))
    assert history.firings and marker not in str(history)
    events = every_event(stubs)
    assert [e.seq for e in events] == list(range(events[0].seq, events[-1].seq + 1))
    assert not [e for e in events if marker in str(e)]
    quoted = [e for e in events if e.kind == tpb.EVENT_KIND_NOTIFY and e.memory_id == secret.id]
    assert [(e.message, e.payload["forgotten"]) for e in quoted] == [("", "true")]
    tombstone = stubs.memories.Inspect(pb.InspectRequest(channel=channel, id=secret.id))
    assert (tombstone.memory.state, tombstone.memory.text, list(tombstone.edges)) == (
        memory_pb2.MEMORY_STATE_DELETED,
        "",
        [],
    )

    server.stop()
    assert checked(tmp_path, embedder) == []
    again = ServerThread(_config(tmp_path), SystemClock(), lambda: embedder)
    try:
        with grpc.insecure_channel(again.target) as connection:
            stubs = Stubs(connection)
            back = stubs.memories.Inspect(pb.InspectRequest(channel=channel, id=secret.id))
            assert (back.memory.state, back.memory.text) == (memory_pb2.MEMORY_STATE_DELETED, "")
            assert answers_hold(stubs, channel, marker) == []
    finally:
        again.stop()
    assert holding(tmp_path, marker.encode()) == []


def test_forget_by_filter_takes_the_copies_a_dream_merged_into_it(
    calor_server: ServerThread, memories: MemoryServiceStub, channel_name: str
) -> None:
    marker = "zq-marker-b41c"
    tags = {"vault": "b"}
    for text in (f"The vault code is {marker}.", f"The vault code is {marker}!"):
        store(memories, channel_name, text, tags=tags, memory_type=FACT)
    assert memories.Dream(pb.DreamRequest(channel=channel_name)).merged == 1
    survivor = pb.ForgetFilter(tags=tags, states=[memory_pb2.MEMORY_STATE_ACTIVE])
    forgot = memories.Forget(pb.ForgetRequest(channel=channel_name, filter=survivor))
    assert forgot.forgotten == 2, "the survivor, and the memory merged into it"
    purge(calor_server)
    with grpc.insecure_channel(calor_server.target) as connection:
        assert answers_hold(Stubs(connection), channel_name, marker) == []
    assert holding(calor_server.server.config.data_dir, marker.encode()) == []


def test_the_background_purge_clears_the_disk_by_itself(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    marker = "zq-marker-0c5d"
    server = ServerThread(
        _config(tmp_path, purge_delay_seconds=0.0), SystemClock(), lambda: embedder
    )
    try:
        with grpc.insecure_channel(server.target) as connection:
            memories = MemoryServiceStub(connection)
            kept = store(memories, "c", f"The locker combination is {marker}.")
            assert holding(tmp_path, marker.encode())
            memories.Forget(pb.ForgetRequest(channel="c", ids=[kept.id]))
            given_up = time.monotonic() + 60  # the purge runs on its own thread: wait for it
            while holding(tmp_path, marker.encode()) and time.monotonic() < given_up:
                time.sleep(0.05)
            assert holding(tmp_path, marker.encode()) == []
    finally:
        server.stop()


# --- DropChannel ------------------------------------------------------------------------


def test_dropping_a_channel_of_1000_memories_takes_one_call_and_nothing_comes_back(
    own: tuple[ServerThread, Stubs], embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    server, stubs = own
    marker = "zq-marker-d9e0"
    channel = "doomed"
    trigger = notify_on(stubs, channel, pattern="zq-marker")
    texts = [f"Crate {i} of pears reached bay {i % 9} on the north pier." for i in range(999)]
    texts.append(VAULT.format(marker=marker))
    # Stored through the engine with embeddings made once per bay: the model would spend
    # most of the test embedding 1,000 sentences that differ only in a number.
    bays = embedder.embed_passages([*texts[:9], texts[-1]])
    vectors = np.stack([bays[i % 9] for i in range(999)] + [bays[9]])
    items = [NewMemory(channel=channel, text=text) for text in texts]
    engine = engine_of(server)
    assert len(server.call(server.server.runtime.run(engine.store, items, vectors))) == 1000
    assert marker in wait_for_notify(stubs, channel, marker).message
    stubs.settings.UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=channel,
            settings=memory_pb2.ChannelSettings(entropy_threshold=8192),
            update_mask=FieldMask(paths=["entropy_threshold"]),
        )
    )
    assert stubs.memories.Recall(pb.RecallRequest(channel=channel, query="vault code")).recall_id
    default = stubs.settings.GetSettings(spb.GetSettingsRequest(channel="never-used")).settings

    dropped = stubs.memories.DropChannel(pb.DropChannelRequest(channel=channel))

    assert dropped.dropped == 1000
    assert stubs.memories.DropChannel(pb.DropChannelRequest(channel=channel)).dropped == 0
    purge(server)
    assert holding(tmp_path, marker.encode()) == []
    assert_empty(stubs, channel, default)
    history = stubs.triggers.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=trigger.id))
    assert not history.firings
    events = every_event(stubs)
    assert [e.seq for e in events] == list(range(events[0].seq, events[-1].seq + 1))
    assert not [e for e in events if marker in str(e)]
    said = [e for e in events if e.channel == channel and e.payload.get("dropped")]
    assert [(e.kind, e.payload["dropped"]) for e in said] == [(tpb.EVENT_KIND_NOTIFY, "1000")]

    server.stop()
    assert checked(tmp_path, embedder) == []
    again = ServerThread(_config(tmp_path), SystemClock(), lambda: embedder)
    try:
        with grpc.insecure_channel(again.target) as connection:
            assert_empty(Stubs(connection), channel, default)
    finally:
        again.stop()
    assert holding(tmp_path, marker.encode()) == []


def assert_empty(stubs: Stubs, channel: str, default: memory_pb2.ChannelSettings) -> None:
    """The channel reads as one never written to."""
    identity = stubs.memories.Identity(pb.IdentityRequest(channel=channel))
    assert (identity.total, dict(identity.by_state)) == (0, {})
    assert not stubs.memories.ListMemories(pb.ListMemoriesRequest(channel=channel)).memories
    assert not stubs.triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel)).triggers
    settings = stubs.settings.GetSettings(spb.GetSettingsRequest(channel=channel)).settings
    assert settings == default
    hits = stubs.memories.Recall(pb.RecallRequest(channel=channel, query="crate of pears"))
    assert not hits.hits and not hits.recall_id


def test_a_dropped_channel_is_written_again_from_empty(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    said = ("sailed in June", "owns a red boat", "fears storms", "sings at dawn", "likes rye")
    for fact in said:
        store(memories, channel_name, f"Our friend Zorblax {fact}.")
    ask = pb.ContextRequest(channel=channel_name, message="What do we know about Zorblax?")
    card = pb.EntityCardRequest(channel=channel_name, entity="Zorblax")
    assert "June" in memories.Context(ask).block and "June" in memories.EntityCard(card).card
    assert memories.DropChannel(pb.DropChannelRequest(channel=channel_name)).dropped == 5

    now = ("sails in August", "owns a blue kayak", "loves storms", "hums at dusk", "likes oats")
    fresh = {store(memories, channel_name, f"Our friend Zorblax {fact}.").id for fact in now}
    assert total(memories, channel_name) == 5
    listed = memories.ListMemories(pb.ListMemoriesRequest(channel=channel_name)).memories
    assert {m.id for m in listed} == fresh
    block, shown = memories.Context(ask), memories.EntityCard(card)
    assert "August" in block.block and "June" not in block.block
    assert {m.id for m in shown.memories} <= fresh and "June" not in shown.card


def test_drop_channel_refuses_a_bad_channel_name(memories: MemoryServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        memories.DropChannel(pb.DropChannelRequest(channel="not a channel!"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_clients_and_the_cli_drop_a_channel(
    calor_target: str, client: CalorClient, calor: Run, channel_name: str
) -> None:
    client.store("A note to drop.")
    assert client.drop_channel(channel_name) == 1
    assert client.drop_channel(channel_name) == 0

    async def drop_async() -> int:
        async with AsyncCalorClient(calor_target, channel=channel_name) as calor_async:
            await calor_async.store("Another note to drop.")
            return await calor_async.drop_channel(channel_name)

    assert asyncio.run(drop_async()) == 1
    client.store("A third note to drop.")
    status, _, err = calor("drop-channel", channel_name)
    assert status == 2 and "--yes" in err
    assert client.identity().total == 1
    status, out, _ = calor("drop-channel", channel_name, "--yes")
    assert (status, out.strip()) == (0, f"dropped channel {channel_name} (1 memory)")
    assert client.identity().total == 0


# --- the store's quote index ------------------------------------------------------------


@pytest.fixture
def small_engine(tmp_path: Path) -> Iterator[tuple[MemoryEngine, MemoryStore]]:
    """An engine over a store of 8-dimensional embeddings (no model needed)."""
    store = MemoryStore.open(tmp_path, model_id="test", dim=8)
    try:
        yield MemoryEngine.open(store, SystemClock(), ChannelPolicy()), store
    finally:
        store.close()


def _stored(engine: MemoryEngine, text: str) -> str:
    vector = np.ones((1, 8), dtype=np.float32) / np.sqrt(8.0)
    [stored] = engine.store([NewMemory(channel="c", text=text)], vector)
    return stored.record.id


def _quote(memory_id: str, key: bytes, text: str) -> Quote:
    return Quote("c", memory_id, key, f"holds {text}".encode(), b"scrubbed")


def test_what_quotes_a_memory_is_scrubbed_when_it_is_forgotten(
    small_engine: tuple[MemoryEngine, MemoryStore],
) -> None:
    engine, store = small_engine
    memory_id = _stored(engine, "The safe code is 4711.")
    engine.log(
        EventRecord("notify", "c", 1.0, memory_id, "t1", "stored: The safe code is 4711."),
        extra=[_quote(memory_id, Keys.delivery("t1:1"), "4711")],
    )
    assert engine.edits.forget("c", [memory_id]) == 1
    assert store.get(Keys.delivery("t1:1")) == b"scrubbed"
    [event] = [e for e in store.events_after(0) if e.kind == "notify"]
    assert (event.message, event.payload) == ("", {"forgotten": "true"})
    assert not list(store._scan(Keys.quote("c", memory_id, b"")))
    assert store.purge_pending and engine.purge() > 0 and not store.purge_pending
    record = next(store.records("c"))
    assert (record.state, record.text, record.entities, record.tags) == (DELETED, "", [], {})


def test_what_quotes_a_memory_already_forgotten_is_written_scrubbed(
    small_engine: tuple[MemoryEngine, MemoryStore],
) -> None:
    engine, store = small_engine
    memory_id = _stored(engine, "The safe code is 4711.")
    engine.edits.forget("c", [memory_id])
    engine.log(  # a trigger that read the memory before the forget, writing after it
        EventRecord("notify", "c", 1.0, memory_id, "t1", "stored: The safe code is 4711."),
        extra=[_quote(memory_id, Keys.delivery("t1:1"), "4711")],
    )
    assert store.get(Keys.delivery("t1:1")) == b"scrubbed"
    assert [e.message for e in store.events_after(0) if e.kind == "notify"] == [""]
    assert not list(store._scan(Keys.quote("c", memory_id, b"")))


def test_a_webhook_waiting_in_the_outbox_loses_the_text_of_a_forgotten_memory(
    small_engine: tuple[MemoryEngine, MemoryStore],
) -> None:
    engine, store = small_engine
    memory_id = _stored(engine, "The safe code is 4711.")
    body = {"memory": {"id": memory_id, "text": "The safe code is 4711.", "tags": {"k": "v"}}}
    delivery = Delivery(
        "t1:7", "http://hooks.test/", body, "", None, None, "t1", "c", memory_id, 7, 1.0
    )
    engine.log(extra=[put_delivery(delivery)])
    engine.edits.forget("c", [memory_id])
    [waiting] = pending_deliveries(store)
    assert waiting.body["memory"] == {"id": memory_id, "text": "", "tags": {}, "forgotten": True}
    engine.log(extra=drop_delivery(waiting))  # delivered: gone, with its index entry
    assert pending_deliveries(store) == [] and not list(store._scan(b"k:"))


# --- Forget with reject -----------------------------------------------------------------


def test_a_rejected_memory_is_not_learned_again_and_keeps_no_text(
    own: tuple[ServerThread, Stubs], embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    """Forget(reject=true) keeps the memory's vector, not its text, as a rejection: a later
    store close to it comes with the near-duplicate penalty and a provenance flag naming
    it; a plain forget does not; a restart keeps rejections, dropping the channel drops
    them."""
    server, stubs = own
    marker = "zq-reject-91c"
    text = f"The alarm code is {marker}; the kids must never know it."
    rejected = store(stubs.memories, "house", text)
    plain = store(stubs.memories, "flat", text)
    forgot = stubs.memories.Forget(
        pb.ForgetRequest(channel="house", ids=[rejected.id], reject=True)
    )
    assert forgot.forgotten == 1
    stubs.memories.Forget(pb.ForgetRequest(channel="flat", ids=[plain.id]))
    purge(server)
    assert holding(tmp_path, marker.encode()) == [], "the text is gone from disk"

    again = store(stubs.memories, "house", text.replace(";", ","))
    learned = store(stubs.memories, "flat", text)
    assert again.provenance["resembles_rejected"] == rejected.id
    assert "resembles_rejected" not in learned.provenance, "a plain forget rejects nothing"
    assert again.importance == pytest.approx(learned.importance - 0.20 - 0.30, abs=0.02)
    other = store(stubs.memories, "house", "The bins go out on Thursday evenings.")
    assert "resembles_rejected" not in other.provenance

    server.stop()
    again_server = ServerThread(_config(tmp_path), SystemClock(), lambda: embedder)
    try:
        with grpc.insecure_channel(again_server.target) as wire:
            memories = MemoryServiceStub(wire)
            after = store(memories, "house", text)
            assert after.provenance["resembles_rejected"] == rejected.id
            memories.DropChannel(pb.DropChannelRequest(channel="house"))
            fresh = store(memories, "house", text)
            assert "resembles_rejected" not in fresh.provenance
    finally:
        again_server.stop()
