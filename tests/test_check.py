"""The offline consistency check (``calor check``): a store the engine wrote is consistent;
each kind of damage is reported without changing the store, repaired with ``fix``, and
the repaired store serves again. Real RocksDB, real model, real engine; the damage is
done with raw keys, as a crash or a bug would leave it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import rocksdict

from calor.client import _progress
from calor.client.cli import main
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock, SystemClock
from calor.server.commands import NewMemory, RecallQuery, UpdateChange
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.errors import FailedPreconditionError, NotFoundError
from calor.server.events import EventRecord
from calor.server.heap import BULK_ITEMS
from calor.server.records import ARCHIVED, DELETED, GHOST, MERGED
from calor.server.storage.consistency import (
    PLACEHOLDER_MESSAGE,
    Checker,
    Problem,
    check,
    open_offline,
)
from calor.server.storage.heats import heat_bytes
from calor.server.storage.store import Keys, MemoryStore
from calor.server.thermo.policy import ChannelPolicy

CHANNEL = "c"
TEXTS = [
    "The spare key is under the blue flower pot by the back door.",
    "Recycling goes out on Tuesday mornings.",
    "The user's dentist is Dr. Okafor on Elm Street.",
]
START = 1_780_000_000.0
DAY = 86_400.0
NOWHERE = "01JD0000000000000000000000"  # an id no memory has


# --- helpers -----------------------------------------------------------------------------


@contextmanager
def opened(path: Path, embedder: OnnxEmbedder) -> Iterator[MemoryStore]:
    store = MemoryStore.open(path, model_id=embedder.model_id, dim=embedder.dim)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def engine_on(path: Path, embedder: OnnxEmbedder) -> Iterator[MemoryEngine]:
    with opened(path, embedder) as store:
        yield MemoryEngine.open(store, SystemClock(), ChannelPolicy())


@contextmanager
def raw(path: Path) -> Iterator[rocksdict.Rdict]:
    """The store's RocksDB itself, for damage no engine would do."""
    db = rocksdict.Rdict(str(path / "rocksdb"), rocksdict.Options(raw_mode=True))
    try:
        yield db
    finally:
        db.close()


def snapshot(path: Path) -> dict[bytes, bytes]:
    with raw(path) as db:
        return {cast(bytes, key): cast(bytes, value) for key, value in db.items()}


def value(db: rocksdict.Rdict, key: bytes) -> bytes:
    """The value under a key that must be there."""
    found = db.get(key)
    assert found is not None
    return cast(bytes, found)


@pytest.fixture
def seeded(tmp_path: Path, embedder: OnnxEmbedder) -> list[str]:
    """Three facts in channel ``c`` of the store in ``tmp_path`` (closed): their ids."""
    items = [NewMemory(channel=CHANNEL, text=text, memory_type="fact") for text in TEXTS]
    with engine_on(tmp_path, embedder) as engine:
        return [s.record.id for s in engine.store(items, embedder.embed_passages(TEXTS))]


def found_then_fixed(path: Path, embedder: OnnxEmbedder, kind: str) -> Problem:
    """Check: one problem of ``kind``, the store untouched; fix it; check again: none."""
    before = snapshot(path)
    with opened(path, embedder) as store:
        problems = check(store)
    assert [(p.kind, p.fixed) for p in problems] == [(kind, False)], problems
    assert snapshot(path) == before
    with opened(path, embedder) as store:
        fixed = check(store, fix=True, embed=embedder.embed_passages)
        assert [(p.kind, p.fixed) for p in fixed] == [(kind, True)]
        assert check(store) == []
    return problems[0]


def find(engine: MemoryEngine, embedder: OnnxEmbedder, query: str) -> list[str]:
    """The ids a peek recall finds, best first."""
    recall = RecallQuery(channel=CHANNEL, query=query, limit=3, peek=True)
    return [hit.record.id for hit in engine.recall(recall, embedder.embed_query(query)).hits]


# --- a healthy store -----------------------------------------------------------------------


def use_for_real(engine: MemoryEngine, embedder: OnnxEmbedder, clock: ManualClock) -> None:
    """Stores (one of them bulk), recalls, corrections, links, forgetting, dreams, and
    months going by."""

    def put(*items: NewMemory) -> list[str]:
        vectors = embedder.embed_passages([item.text for item in items])
        return [s.record.id for s in engine.store(list(items), vectors)]

    def states() -> Counter[str]:
        """The channel's states so far; the store is consistent at every step."""
        assert check(engine._store) == []
        return Counter(r.state for r in engine._store.records(CHANNEL))

    def recall(query: str) -> None:
        engine.recall(RecallQuery(channel=CHANNEL, query=query), embedder.embed_query(query))

    # Working memory turns into a ghost (floor 0) before it would become episodic.
    policy = ChannelPolicy(session_gap_seconds=600.0, working_promotion_seconds=30 * DAY)
    engine.channels.set_policy(CHANNEL, policy)
    facts = put(
        note("The gym opens at 6am on weekdays.", memory_type="fact"),
        note("The gym opens at 7am on weekdays.", memory_type="fact"),
        note("The gym opens at 6 am on weekdays.", memory_type="fact"),
        note("The user's cat is called Miso.", memory_type="fact"),
        note("The user has a cat named Miso.", memory_type="fact"),
        note("Standup is at 9:30 every weekday.", idempotency_key="standup"),
        note("Always run the linter before pushing.", memory_type="procedural", keystone=True),
    )
    put(note("Standup is at 9:30 every weekday.", idempotency_key="standup"))  # a replay
    crates = [f"Crate {i} of pears reached bay {i % 9}." for i in range(BULK_ITEMS)]
    put(*[note(text, channel="bulk") for text in crates])  # a bulk store: vectors ahead
    trip = put(
        note("Met Alice at the cafe on Main Street this morning.", tags={"session": "trip"}),
        note("Walked with Alice to the harbour after lunch.", tags={"session": "trip"}),
    )
    recall("what is the cat called?")
    engine.edits.connect(CHANNEL, facts[3], trip[0], 0.4)
    engine.dream(CHANNEL)  # merges the paraphrases, opens the gym conflicts
    merged = [r.id for r in engine._store.records(CHANNEL) if r.state == MERGED]
    assert states()[MERGED] == 2 and engine.channels.conflicts(CHANNEL)
    engine.edits.update(UpdateChange(CHANNEL, merged[0], clear_merge=True), None)  # un-merged
    corrected = "Alice and I walked to the harbour after a late lunch."
    engine.edits.update(
        UpdateChange(CHANNEL, trip[1], text=corrected, supersedes=trip[0]),
        embedder.embed_passages([corrected])[0],
    )
    put(note("Scratch: Alice wants Miso at the vet by 4pm.", memory_type="working"))
    clock.advance(6 * 3600.0)
    recall("when does the gym open?")  # the scratch note is a ghost by now
    engine.dream(CHANNEL)  # echoes around the ghost
    assert GHOST in states()
    engine.edits.forget(CHANNEL, [facts[1], facts[4]])  # one side of a conflict, a cat paraphrase
    clock.advance(200 * DAY)
    engine.dream(CHANNEL)  # prunes the ghost
    clock.advance(10 * DAY)
    engine.dream(CHANNEL)  # to cold storage
    assert ARCHIVED in states()
    put(note("The gym now opens at 5:30am on weekdays.", memory_type="fact"))
    recall("when does the gym open?")  # warms a memory back out of cold storage
    engine.dream(CHANNEL)


def note(text: str, channel: str = CHANNEL, **fields: object) -> NewMemory:
    return NewMemory(channel=channel, text=text, **fields)  # type: ignore[arg-type]


def test_a_store_after_real_use_is_consistent(tmp_path: Path, embedder: OnnxEmbedder) -> None:
    clock = ManualClock(START)
    with opened(tmp_path, embedder) as store:
        engine = MemoryEngine.open(store, clock, ChannelPolicy())
        use_for_real(engine, embedder, clock)
        states = Counter(r.state for r in store.records(CHANNEL))
        # The un-merged paraphrase stays apart; the other merged one was forgotten.
        assert states[MERGED] == 0 and states[DELETED] == 3  # 2 forgotten, 1 ghost pruned
        checker = Checker(store, embedder.embed_passages)
        assert checker.run() == []
        assert checker.tally.memories == len(list(store.records()))
    assert checker.tally.vectors > BULK_ITEMS and checker.tally.edges and checker.tally.conflicts
    with opened(tmp_path, embedder) as store:  # and as the engine rebuilt it
        MemoryEngine.open(store, clock, ChannelPolicy())
        assert check(store) == []


def test_an_episode_after_a_forgotten_one_links_to_no_tombstone(
    tmp_path: Path, embedder: OnnxEmbedder
) -> None:
    texts = ["Met Alice at the cafe on Main Street.", "Then walked to the park with Alice."]
    items = [NewMemory(channel=CHANNEL, text=t, tags={"session": "walk"}) for t in texts]
    vectors = embedder.embed_passages(texts)
    with engine_on(tmp_path, embedder) as engine:
        [first] = engine.store(items[:1], vectors[:1])
        engine.edits.forget(CHANNEL, [first.record.id])
        [second] = engine.store(items[1:], vectors[1:])
        assert second.record.session == first.record.session == "tag:walk"
        assert engine.inspect(CHANNEL, second.record.id)[1] == []
    with opened(tmp_path, embedder) as store:
        assert check(store) == []


# --- each kind of damage ---------------------------------------------------------------


def test_a_live_memory_without_its_embedding_is_embedded_again(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with raw(tmp_path) as db:
        db.delete(Keys.vector(CHANNEL, seeded[0]))
    with engine_on(tmp_path, embedder) as engine:
        assert seeded[0] not in find(engine, embedder, "where is the spare key?")
    with opened(tmp_path, embedder) as store:  # no model, no repair
        [unfixed] = check(store, fix=True)
        assert (unfixed.kind, unfixed.fixed) == ("missing_vector", False)
    problem = found_then_fixed(tmp_path, embedder, "missing_vector")
    assert problem.channel == CHANNEL
    assert problem.detail == f"memory {seeded[0]} (active) has no embedding"
    with engine_on(tmp_path, embedder) as engine:
        assert find(engine, embedder, "where is the spare key?")[0] == seeded[0]


def test_an_embedding_of_the_wrong_size_is_embedded_again(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with raw(tmp_path) as db:
        db[Keys.vector(CHANNEL, seeded[1])] = np.ones(8, dtype="<f4").tobytes()
    problem = found_then_fixed(tmp_path, embedder, "bad_vector")
    assert seeded[1] in problem.detail and "8 values" in problem.detail
    with engine_on(tmp_path, embedder) as engine:
        assert find(engine, embedder, "when is recycling collected?")[0] == seeded[1]


def test_a_forgotten_memory_that_kept_its_embedding_loses_it(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with engine_on(tmp_path, embedder) as engine:
        engine.edits.forget(CHANNEL, [seeded[1]])
    with raw(tmp_path) as db:
        db[Keys.vector(CHANNEL, seeded[1])] = value(db, Keys.vector(CHANNEL, seeded[0]))
    problem = found_then_fixed(tmp_path, embedder, "deleted_vector")
    assert problem.detail == f"memory {seeded[1]} is forgotten but keeps its embedding"
    with engine_on(tmp_path, embedder) as engine:
        assert engine._store.get_vector(CHANNEL, seeded[1]) is None
        assert engine.inspect(CHANNEL, seeded[1])[0].record.state == DELETED
        assert find(engine, embedder, "where is the spare key?")[0] == seeded[0]


def test_an_embedding_without_a_memory_is_dropped(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with raw(tmp_path) as db:
        db[Keys.vector(CHANNEL, NOWHERE)] = value(db, Keys.vector(CHANNEL, seeded[0]))
    problem = found_then_fixed(tmp_path, embedder, "orphan_vector")
    assert problem.detail == f"embedding of {NOWHERE} belongs to no memory record"
    with opened(tmp_path, embedder) as store:
        assert store.get_vector(CHANNEL, NOWHERE) is None


@pytest.mark.parametrize("gone", ["missing", "forgotten"])
def test_an_edge_to_a_memory_that_is_gone_is_dropped(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str], gone: str
) -> None:
    other = NOWHERE
    if gone == "forgotten":
        other = seeded[2]
        with engine_on(tmp_path, embedder) as engine:
            engine.edits.forget(CHANNEL, [other])
    with raw(tmp_path) as db:
        db[Keys.edge(CHANNEL, seeded[0], other, "manual")] = b"0.5"
    with engine_on(tmp_path, embedder) as engine:
        assert other in engine.channels.neighbours(CHANNEL, seeded[0])  # the damage, as served
    problem = found_then_fixed(tmp_path, embedder, "dangling_edge")
    why = "does not exist" if gone == "missing" else "is forgotten"
    assert problem.detail.endswith(f"memory {other} {why}")
    with engine_on(tmp_path, embedder) as engine:
        assert other not in engine.channels.neighbours(CHANNEL, seeded[0])
        assert engine.inspect(CHANNEL, seeded[0])[1] == []


def test_a_conflict_with_a_forgotten_memory_is_settled(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with engine_on(tmp_path, embedder) as engine:
        engine.edits.forget(CHANNEL, [seeded[1]])
    with raw(tmp_path) as db:
        db[Keys.conflict(CHANNEL, seeded[0], seeded[1])] = b"different days"
    with engine_on(tmp_path, embedder) as engine:
        assert engine.channels.conflicts(CHANNEL)  # the damage, as served
    problem = found_then_fixed(tmp_path, embedder, "dangling_conflict")
    assert problem.detail.endswith(f"memory {seeded[1]} is forgotten")
    with engine_on(tmp_path, embedder) as engine:
        assert engine.channels.conflicts(CHANNEL) == []


def test_an_idempotency_key_naming_no_memory_is_dropped(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with raw(tmp_path) as db:
        db[Keys.idempotency(CHANNEL, "weekly")] = NOWHERE.encode()
    item = NewMemory(channel=CHANNEL, text="Water the plants weekly.", idempotency_key="weekly")
    vectors = embedder.embed_passages([item.text])
    with engine_on(tmp_path, embedder) as engine, pytest.raises(NotFoundError):
        engine.store([item], vectors)  # the damage: a store with that key fails
    problem = found_then_fixed(tmp_path, embedder, "dangling_idempotency_key")
    assert problem.detail == (
        f"idempotency key 'weekly' names memory {NOWHERE}, which does not exist"
    )
    with engine_on(tmp_path, embedder) as engine:
        [stored] = engine.store([item], vectors)
        assert stored.created and stored.record.idempotency_key == "weekly"


def test_a_misnumbered_event_takes_its_keys_number(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with raw(tmp_path) as db:
        event = json.loads(value(db, Keys.event(2)))
        db[Keys.event(2)] = json.dumps({**event, "seq": 3}).encode()
    problem = found_then_fixed(tmp_path, embedder, "misnumbered_event")
    assert problem.detail == "event under key 2 carries sequence number 3"
    with opened(tmp_path, embedder) as store:
        assert [e.seq for e in store.events_after(0)] == [1, 2, 3]
        assert store.events_after(1, 1)[0] == EventRecord.from_json(json.dumps(event).encode())


@pytest.mark.parametrize("damage", ["lost", "unreadable"])
def test_a_hole_in_the_log_is_filled_with_a_placeholder(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str], damage: str
) -> None:
    with raw(tmp_path) as db:
        before = EventRecord.from_json(value(db, Keys.event(1)))
        if damage == "lost":
            db.delete(Keys.event(2))
        else:
            db[Keys.event(2)] = b"{not json"
    kind = "event_gap" if damage == "lost" else "unreadable_event"
    problem = found_then_fixed(tmp_path, embedder, kind)
    assert problem.channel == ""
    if damage == "lost":
        assert problem.detail == "event 2 missing between events 1 and 3"
    with opened(tmp_path, embedder) as store:
        placeholder = store.events_after(1, 1)[0]
        assert placeholder == EventRecord(
            kind="notify", channel="", at=before.at, message=PLACEHOLDER_MESSAGE, seq=2
        )
        assert [e.seq for e in store.events_after(0)] == [1, 2, 3]


def test_a_log_trimmed_from_the_oldest_has_no_hole(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with opened(tmp_path, embedder) as store:
        store.trim_events(2)  # retention
        assert store.first_seq() == 3
        assert check(store) == []


def test_fixing_several_problems_commits_them_together(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with raw(tmp_path) as db:
        db.delete(Keys.vector(CHANNEL, seeded[0]))
        db[Keys.vector(CHANNEL, NOWHERE)] = value(db, Keys.vector(CHANNEL, seeded[1]))
        db[Keys.edge(CHANNEL, seeded[1], NOWHERE, "semantic")] = b"0.9"
        db.delete(Keys.event(2))
    with opened(tmp_path, embedder) as store:
        fixed = check(store, fix=True, embed=embedder.embed_passages)
        assert sorted(p.kind for p in fixed if p.fixed) == [
            "dangling_edge",
            "event_gap",
            "missing_vector",
            "orphan_vector",
        ]
        assert check(store) == []


# --- opening a store for a check -------------------------------------------------------


def test_a_store_held_by_a_server_is_refused(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with opened(tmp_path, embedder), pytest.raises(FailedPreconditionError, match="in use"):
        open_offline(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    with pytest.raises(FailedPreconditionError, match="no Calor store"):
        open_offline(tmp_path / "empty", model_id=embedder.model_id, dim=embedder.dim)
    assert not (tmp_path / "empty").exists()


# --- the command -----------------------------------------------------------------------


def calor_check(data_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("calor")), "check", "--data-dir", str(data_dir)]
    return subprocess.run(
        [*command, *options],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_the_command_on_a_consistent_store(tmp_path: Path, seeded: list[str]) -> None:
    done = calor_check(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("consistent: 3 memories, ")
    assert done.stdout.rstrip().endswith(" 3 events checked")


def test_the_command_draws_its_steps_on_a_terminal(
    tmp_path: Path,
    seeded: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_progress, "_is_terminal", lambda stream: True)
    assert main(["check", "--data-dir", str(tmp_path), "--fix"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("consistent: 3 memories, ")
    lines = [line.strip() for line in err.replace("\r", "\n").splitlines() if line.strip()]
    steps = len(Checker.STEPS) + 1  # and the repair
    drawn = [re.match(r"check \((.*?)\)  \[[#.]+\]  (\d+)/", line) for line in lines[1:]]
    phases = list(dict.fromkeys((m.group(1), int(m.group(2))) for m in drawn if m))
    names = [*Checker.STEPS, "repairing", "done"]
    assert phases == list(zip(names, [*range(1, steps + 1), steps], strict=True))
    assert lines[-1].startswith(f"check (done)  [{'#' * 24}]  {steps}/{steps}  100%")


def test_the_command_lists_problems_and_fixes_them(tmp_path: Path, seeded: list[str]) -> None:
    with raw(tmp_path) as db:
        db.delete(Keys.vector(CHANNEL, seeded[0]))
        db[Keys.idempotency(CHANNEL, "weekly")] = NOWHERE.encode()
    done = calor_check(tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        f"missing_vector {CHANNEL}: memory {seeded[0]} (active) has no embedding",
        f"dangling_idempotency_key {CHANNEL}: idempotency key 'weekly' names memory "
        f"{NOWHERE}, which does not exist",
        "2 problems left; `calor check --fix` repairs them",
    ]
    done = calor_check(tmp_path, "--fix")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.endswith(" (fixed)") for line in lines[:2]] == [True, True]
    assert lines[2] == "repaired: all 2 problems fixed"
    done = calor_check(tmp_path)
    assert (done.returncode, done.stdout.split(":")[0]) == (0, "consistent")


def test_the_command_exits_1_when_a_fix_leaves_problems(tmp_path: Path, seeded: list[str]) -> None:
    with raw(tmp_path) as db:
        db[Keys.vector(CHANNEL, NOWHERE)] = value(db, Keys.vector(CHANNEL, seeded[0]))
        far = {**json.loads(value(db, Keys.event(3))), "seq": 500_000}
        db[Keys.event(500_000)] = json.dumps(far).encode()  # too wide a hole to fill
    done = calor_check(tmp_path, "--fix")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("orphan_vector c: ") and lines[0].endswith(" (fixed)")
    assert lines[1].startswith("event_gap: events 4..499999 missing") and "not filled" in lines[1]
    assert lines[-1] == "1 problem left, 1 fixed"


def test_the_command_refuses_a_store_in_use_or_missing(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with opened(tmp_path, embedder):
        done = calor_check(tmp_path)
    assert done.returncode == 2
    assert "in use" in done.stderr and done.stdout == ""
    done = calor_check(tmp_path / "nothing-here")
    assert done.returncode == 2
    assert "no Calor store" in done.stderr


def test_a_heat_kept_for_a_forgotten_memory_is_dropped(
    tmp_path: Path, embedder: OnnxEmbedder, seeded: list[str]
) -> None:
    with engine_on(tmp_path, embedder) as engine:
        engine.edits.forget(CHANNEL, [seeded[1]])
    with raw(tmp_path) as db:
        db[Keys.heat(CHANNEL, seeded[1])] = heat_bytes(0.9, 0.0, 0)
        db[Keys.heat(CHANNEL, NOWHERE)] = heat_bytes(0.9, 0.0, 0)
    before = snapshot(tmp_path)
    with opened(tmp_path, embedder) as store:
        problems = check(store)
    assert sorted((p.kind, p.detail) for p in problems) == sorted(
        [
            ("stray_heat", f"heat kept for memory {seeded[1]}: memory {seeded[1]} is forgotten"),
            ("stray_heat", f"heat kept for memory {NOWHERE}: memory {NOWHERE} does not exist"),
        ]
    )
    assert snapshot(tmp_path) == before
    with opened(tmp_path, embedder) as store:
        assert all(p.fixed for p in check(store, fix=True))
        assert check(store) == []
        assert list(store.heats()) == []
