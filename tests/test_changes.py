"""The one write path: what a change says is what reaches RocksDB and then the view, and a
failed commit leaves both as they were."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rocksdict

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock
from calor.server.commands import NewMemory, RecallQuery, UpdateChange
from calor.server.engine.channel import Channel
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.engine.states import RecordTable
from calor.server.errors import StoreMismatchError
from calor.server.events import EventRecord
from calor.server.recall.columns import RecordColumns
from calor.server.recall.index import ChannelIndex
from calor.server.records import MemoryRecord
from calor.server.storage.ops import (
    AddMemory,
    ChangeList,
    DeleteKey,
    DropVector,
    Forget,
    Link,
    Log,
    OpenConflict,
    PutKey,
    PutMemory,
    SetHeat,
    SetPolicy,
    SetState,
    SettleConflict,
    StageVector,
    Unlink,
    decode,
    encode,
)
from calor.server.storage.store import SCHEMA_VERSION, Keys, MemoryStore
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.policy import ChannelPolicy
from tests.helpers import CrashAfter

CHANNEL = "notes"
START = 1_780_000_000.0


@pytest.fixture
def opened(embedder: OnnxEmbedder, tmp_path: Path) -> Iterator[MemoryStore]:
    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    yield store
    store.close()


def put(engine: MemoryEngine, embedder: OnnxEmbedder, *texts: str, **fields: Any) -> list[str]:
    items = [NewMemory(channel=CHANNEL, text=text, **fields) for text in texts]
    vectors = np.asarray(embedder.embed_passages(list(texts)))
    return [stored.record.id for stored in engine.store(items, vectors)]


def view(channel: Channel) -> dict[str, Any]:
    """What a channel's live view holds, in a comparable form."""
    edges = {
        (min(e.from_id, e.to_id), max(e.from_id, e.to_id), e.kind, e.weight)
        for memory_id in channel.records
        for e in channel.graph.edges(memory_id)
    }
    return {
        "records": {i: json.loads(r.to_json()) for i, r in channel.records.items()},
        "edges": edges,
        "conflicts": dict(channel.conflicts),
        "entities": {k: sorted(v) for k, v in channel.entity_members.items() if v},
        "sessions": dict(channel.last_in_session),
        "index": sorted(i for i in channel.records if i in channel.index),
        "heat columns": {
            i: (columns.heat0[label], columns.t0[label], columns.interactions0[label])
            for index in (channel.index, channel.attic)
            for i, label, columns in _labelled(index, list(channel.records))
        },
        "attic": sorted(i for i in channel.records if i in channel.attic),
        "state": channel.state,
        "policy": channel.policy,
    }


def _labelled(index: ChannelIndex, ids: list[str]) -> list[tuple[str, int, RecordColumns]]:
    found = [(i, index.label(i)) for i in ids]
    return [(i, label, index.columns) for i, label in found if label is not None]


def test_a_store_whose_commit_failed_leaves_no_trace_that_later_stores_link_to(
    embedder: OnnxEmbedder, opened: MemoryStore
) -> None:
    engine = MemoryEngine.open(opened, ManualClock(START), ChannelPolicy())
    [first] = put(
        engine, embedder, "Our plumber Zorblax repaired the boiler.", tags={"session": "s1"}
    )
    crashing = CrashAfter(opened, budget=0)
    engine._storing._store = crashing  # type: ignore[assignment]
    with pytest.raises(OSError):
        put(engine, embedder, "Zorblax ordered a spare valve.", tags={"session": "s1"})
    assert crashing.refused == 1
    engine._storing._store = opened

    [third] = put(engine, embedder, "Zorblax tested the new valve.", tags={"session": "s1"})
    _, edges = engine.inspect(CHANNEL, third)
    linked = {e.to_id for e in edges}
    assert linked == {first}, "only the memory that was stored is linked to"
    kinds = {e.kind for e in edges}
    assert {"entity", "sequence"} <= kinds
    status = engine.channels.status(CHANNEL)
    assert status.total == 2
    assert status.interactions == 2, "the failed store counted no interactions"
    channel = engine.channels.find(CHANNEL)
    assert channel is not None
    assert sorted(channel.entity_members["zorblax"]) == sorted([first, third])


@pytest.mark.parametrize("kept", [None, 1], ids=["records-kept", "records-read-back"])
def test_the_live_view_is_what_a_restart_rebuilds_from_rocksdb(
    embedder: OnnxEmbedder, opened: MemoryStore, monkeypatch: pytest.MonkeyPatch, kept: int | None
) -> None:
    """Also when the view keeps one full record and reads the others back from RocksDB:
    what a change replaces (entities a memory named) is what it was before the write."""
    if kept is not None:
        monkeypatch.setattr("calor.server.engine.states.RECORDS_CACHED", kept)
    clock = ManualClock(START)
    engine = MemoryEngine.open(opened, clock, ChannelPolicy())
    ids = put(
        engine,
        embedder,
        "Ada Lovelace wrote the first program.",
        "Ada Lovelace wrote the first computer program.",
        "The boiler is serviced every October by Zorblax.",
        "Zorblax said the boiler pressure is 2 bar.",
        "Zorblax said the boiler pressure is 3 bar.",
        "I prefer tea over coffee in the morning.",
        "The garage door code is 4411.",
    )
    engine.recall(RecallQuery(channel=CHANNEL, query="boiler"), embedder.embed_query("boiler"))
    engine.edits.connect(CHANNEL, ids[0], ids[5], 0.4)
    engine.edits.connect(CHANNEL, ids[0], ids[5], 0.2)  # the larger weight stays, on disk too
    engine.edits.update(
        UpdateChange(channel=CHANNEL, memory_id=ids[2], text="Zorblax services the boiler."),
        np.asarray(embedder.embed_passages(["Zorblax services the boiler."]))[0],
    )
    engine.edits.keystone(CHANNEL, ids[1], True)
    engine.dream(CHANNEL)
    clock.advance(40 * 86_400.0)
    engine.edits.forget(CHANNEL, [ids[6]])
    engine.recall(RecallQuery(channel=CHANNEL, query="tea"), embedder.embed_query("tea"))
    engine.recall(RecallQuery(channel=CHANNEL, query="Ada"), embedder.embed_query("Ada"))
    assert list(opened.heats(CHANNEL)), "resonance warmed memories without rewriting them"

    live = engine.channels.find(CHANNEL)
    rebuilt = MemoryEngine.open(opened, clock, ChannelPolicy()).channels.find(CHANNEL)
    assert live is not None and rebuilt is not None
    states = {r.state for r in live.records.values()}
    assert {"merged", "deleted"} <= states and live.conflicts, "the change mix was exercised"
    assert view(live) == view(rebuilt)


def test_a_change_list_survives_json_whole() -> None:
    record = MemoryRecord(
        id="m1", channel=CHANNEL, text="hi", memory_type="episodic",
        created_at=1.0, updated_at=2.0, heat0=1.0, t0=1.0, tags={"a": "b"},
    )  # fmt: skip
    vector = np.linspace(-1, 1, 8, dtype=np.float32)
    ops = [
        AddMemory(record, vector, staged=True),
        PutMemory(record),
        PutMemory(record, vector),
        Forget(record),
        Link("m1", "m2", "semantic", 0.8),
        Unlink("m1", "m2", "semantic"),
        OpenConflict("m1", "m2", "numbers differ"),
        SettleConflict("m1", "m2"),
        SetState(ChannelState(heat0=0.5, t0=3.0, interactions=7)),
        SetPolicy(ChannelPolicy(boost_delta=0.2)),
        Log(EventRecord(kind="notify", channel=CHANNEL, at=4.0, payload={"k": "v"})),
        StageVector("m3", vector),
        DropVector("m4"),
        PutKey(Keys.CURSOR, b"\x00\xff"),
        DeleteKey(Keys.trigger(CHANNEL, "t1")),
        SetHeat(("m1", "m2"), (0.25, 1.0), 5.0, 9),
    ]
    decoded = decode(encode(ChangeList(CHANNEL, ops)))
    assert decoded.channel == CHANNEL
    assert len(decoded.ops) == len(ops)
    for before, after in zip(ops, decoded.ops, strict=True):
        assert type(before) is type(after)
        for name, value in before.__dict__.items():
            if isinstance(value, np.ndarray):
                assert np.array_equal(value, after.__dict__[name])
            else:
                assert value == after.__dict__[name], name


def _write_v1_store(path: Path, embedder: OnnxEmbedder, cursor: bytes) -> None:
    """A store as Calor wrote it before schema version 2: the cursor a bare number."""
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    db = rocksdict.Rdict(str(path / "rocksdb"), options)
    meta = {"schema_version": 1, "model_id": embedder.model_id, "dim": embedder.dim}
    db[b"meta:schema"] = json.dumps(meta).encode()
    db[b"s:cursor"] = cursor
    db.close()


def test_an_older_store_is_migrated_by_name_and_the_migration_is_recorded(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    _write_v1_store(tmp_path, embedder, b"42")
    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    try:
        assert store.migrations() == ["cursor_as_json", "triggers_by_channel"]
        assert json.loads(store.get(Keys.CURSOR) or b"") == {"seq": 42, "done": []}
    finally:
        store.close()
    again = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    try:
        assert again.migrations() == ["cursor_as_json", "triggers_by_channel"], "once"
    finally:
        again.close()


def test_a_new_store_needs_no_migration_and_a_newer_one_is_refused(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    store = MemoryStore.open(tmp_path / "new", model_id=embedder.model_id, dim=embedder.dim)
    assert store.migrations() == []
    store.close()
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    db = rocksdict.Rdict(str(tmp_path / "newer" / "rocksdb"), options)
    meta = {"schema_version": SCHEMA_VERSION + 1, "model_id": embedder.model_id, "dim": 384}
    db[b"meta:schema"] = json.dumps(meta).encode()
    db.close()
    with pytest.raises(StoreMismatchError, match="schema_version"):
        MemoryStore.open(tmp_path / "newer", model_id=embedder.model_id, dim=embedder.dim)


def test_event_numbers_go_on_after_retention_emptied_the_log(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    engine = MemoryEngine.open(store, ManualClock(START), ChannelPolicy())
    note = EventRecord(kind="notify", channel=CHANNEL, at=START, message="hello")
    engine.log(note, note, note)
    store.trim_events(store.last_seq)
    assert store.events_after(0) == []
    store.close()
    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    try:
        MemoryEngine.open(store, ManualClock(START), ChannelPolicy()).log(note)
        assert [e.seq for e in store.events_after(0)] == [4], "a subscriber's cursor stays valid"
    finally:
        store.close()


def test_the_view_names_the_memories_recent_changes_touched(
    embedder: OnnxEmbedder, opened: MemoryStore
) -> None:
    engine = MemoryEngine.open(opened, ManualClock(START), ChannelPolicy())
    first, second = put(engine, embedder, "The kettle is blue.", "The mug is red.")
    channel = engine.channels.find(CHANNEL)
    assert channel is not None
    mark = channel.revision
    assert channel.touched_since(mark) == set()
    engine.edits.keystone(CHANNEL, first, True)
    engine.edits.forget(CHANNEL, [second])
    [third] = put(engine, embedder, "The teapot is green.")
    assert channel.touched_since(mark) == {first, second, third}
    assert channel.touched_since(mark + 1) == {second, third}
    assert channel.touched_since(-1) is None and channel.touched_since(channel.revision + 1) is None


def test_a_put_the_view_had_no_record_of_names_its_entities_though_the_store_has_it() -> None:
    """With records read back from the store, a memory the view holds no state for is
    never read from it: by the time a put is applied the store holds the new record,
    which would pass for the one replaced (and leave the entities unnamed)."""
    record = MemoryRecord(
        id="m1", channel=CHANNEL, text="Zorblax fixed it.", memory_type="episodic",
        created_at=START, updated_at=START, heat0=1.0, t0=START, entities=["Zorblax"],
    )  # fmt: skip
    written = {record.id: record}  # the store, once the commit has written
    view = Channel(
        CHANNEL, 8, ChannelPolicy(), ManualClock(START), records=RecordTable(reader=written.get)
    )
    view.apply(ChangeList(CHANNEL, [PutMemory(record, np.ones(8, dtype=np.float32))]), {})
    assert view.entity_members.get("zorblax") == ["m1"]
