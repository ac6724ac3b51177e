"""A snapshot of a store (cluster mode's starting point for a node) holds every memory as
of its write-log position, and loading one replaces what a store held before."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from calor.server.errors import StorageError
from calor.server.events import EventRecord
from calor.server.records import MemoryRecord
from calor.server.storage import snapshot
from calor.server.storage.ops import AddMemory, ChangeList, Log
from calor.server.storage.store import MemoryStore

DIM = 8


def memory(channel: str, memory_id: str) -> MemoryRecord:
    return MemoryRecord(
        id=memory_id, channel=channel, text=f"text of {memory_id}", memory_type="episodic",
        created_at=1.0, updated_at=1.0, heat0=0.4, t0=1.0, interactions0=2,
    )  # fmt: skip


def add(store: MemoryStore, channel: str, *ids: str) -> None:
    vectors = {i: np.full(DIM, n, dtype=np.float32) for n, i in enumerate(ids)}
    added = [AddMemory(memory(channel, i), vectors[i]) for i in ids]
    stored = [Log(EventRecord("on_store", channel, 1.0, memory_id=i)) for i in ids]
    store.write([ChangeList(channel, [*added, *stored])])


def open_store(path: Path) -> MemoryStore:
    return MemoryStore.open(path, model_id="test", dim=DIM)


def test_a_loaded_snapshot_holds_what_the_store_held_when_it_was_saved(tmp_path: Path) -> None:
    source, target = open_store(tmp_path / "source"), open_store(tmp_path / "target")
    ids = [f"m{n}" for n in range(1500)]  # more than one frame of the file
    add(source, "fleet", *ids)
    add(source, "ops", "o1")
    source.log_position = 42  # as if it had followed the write log this far
    add(target, "stale", "gone")  # what the other store held before goes
    taken = io.BytesIO()
    assert snapshot.save(source, taken) == 42
    add(source, "fleet", "after")  # written after the snapshot: not in it
    taken.seek(0)
    assert snapshot.load(target, taken) == 42
    assert target.log_position == 42
    assert {r.id for r in target.records("fleet")} == set(ids)
    assert [r.id for r in target.records("ops")] == ["o1"]
    assert list(target.records("stale")) == []
    assert target.last_seq == source.last_seq - 1 == 1501, "numbers go on from the snapshot's"
    reopened_path = target.path
    target.close()
    reopened = open_store(reopened_path)
    assert reopened.log_position == 42 and len(list(reopened.records("fleet"))) == 1500
    reopened.close()
    source.close()


def test_a_snapshot_cut_short_is_refused_and_leaves_the_store_to_be_loaded_again(
    tmp_path: Path,
) -> None:
    source, target = open_store(tmp_path / "source"), open_store(tmp_path / "target")
    add(source, "fleet", *(f"m{n}" for n in range(1000)))
    source.log_position = 7
    taken = io.BytesIO()
    snapshot.save(source, taken)
    with pytest.raises(StorageError, match="not a Calor snapshot"):
        snapshot.load(target, io.BytesIO(b"CW1 a log entry, not a snapshot"))
    assert target.log_position == 0
    with pytest.raises(StorageError, match="cut short"):
        snapshot.load(target, io.BytesIO(taken.getvalue()[:-10]))
    assert target.log_position == 0, "a node starting again loads the snapshot again"
    source.close()
    target.close()
