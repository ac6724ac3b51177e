"""Heat that resonance changed is kept beside the record, read back with it, and gone
once the record is written whole, forgotten, or its channel dropped."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calor.server.records import MemoryRecord
from calor.server.storage.batch import put_ops
from calor.server.storage.ops import (
    AddMemory,
    ChangeList,
    DropChannel,
    Forget,
    PutMemory,
    SetHeat,
)
from calor.server.storage.store import MemoryStore

DIM = 8
CHANNEL = "warm"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    opened = MemoryStore.open(tmp_path, model_id="test", dim=DIM)
    yield opened
    opened.close()


def memory(memory_id: str) -> MemoryRecord:
    return MemoryRecord(
        id=memory_id, channel=CHANNEL, text=f"text of {memory_id}", memory_type="episodic",
        created_at=1.0, updated_at=1.0, heat0=0.4, t0=1.0, interactions0=2,
    )  # fmt: skip


def write(store: MemoryStore, *ops: object) -> None:
    store.write([ChangeList(CHANNEL, list(ops))])  # type: ignore[arg-type]


def added(store: MemoryStore, *ids: str) -> None:
    write(store, *(AddMemory(memory(i), np.ones(DIM, dtype=np.float32)) for i in ids))


def test_a_set_heat_is_read_back_on_the_record_and_in_a_scan(store: MemoryStore) -> None:
    added(store, "a", "b", "c")
    write(store, SetHeat(("a", "c"), (0.7, 0.9), 50.0, 11))
    a = store.record(CHANNEL, "a")
    assert a is not None
    assert (a.heat0, a.t0, a.updated_at, a.interactions0) == (0.7, 50.0, 50.0, 11)
    assert a.text == "text of a" and a.created_at == 1.0, "nothing else changes"
    scanned = {r.id: (r.heat0, r.t0, r.interactions0) for r in store.records(CHANNEL)}
    assert scanned == {"a": (0.7, 50.0, 11), "b": (0.4, 1.0, 2), "c": (0.9, 50.0, 11)}
    assert [r.heat0 for r in store.records()] == [0.7, 0.4, 0.9], "all channels too"


def test_the_record_written_whole_carries_the_heat_from_then_on(store: MemoryStore) -> None:
    added(store, "a")
    write(store, SetHeat(("a",), (0.7,), 50.0, 11))
    whole = replace(memory("a"), heat0=0.2, t0=60.0, recall_count=3)
    write(store, PutMemory(whole))
    assert store.record(CHANNEL, "a") == whole, "the older heat beside it is gone"
    assert list(store.heats(CHANNEL)) == []


def test_forgetting_or_dropping_the_channel_leaves_no_heat(store: MemoryStore) -> None:
    added(store, "a", "b")
    write(store, SetHeat(("a", "b"), (0.7, 0.8), 50.0, 11))
    write(store, Forget(replace(memory("a"), state="deleted", text="")))
    assert [key for key, _ in store.heats(CHANNEL)] == [b"w:warm\x00b"]
    write(store, DropChannel())
    assert list(store.heats()) == [] and list(store.records()) == []


def test_heats_written_without_waiting_for_the_disk_reach_it_moments_later(
    tmp_path: Path,
) -> None:
    """A recall's heat effects answer before their fsync: the syncer does it moments
    later, and a close syncs whatever still waits; reopened, the store holds them."""
    store = MemoryStore.open(tmp_path, model_id="test", dim=DIM)
    added(store, "a", "b")
    held = store.open_batch()
    put_ops(held, ChangeList(CHANNEL, [SetHeat(("a",), (0.7,), 50.0, 11)]))
    store.write_batch(held, synced=False)
    assert store.record(CHANNEL, "a").heat0 == 0.7  # type: ignore[union-attr]
    deadline = time.monotonic() + 5
    while store.syncing:
        assert time.monotonic() < deadline, "the write-ahead log was never synced"
        time.sleep(0.005)
    held = store.open_batch()
    put_ops(held, ChangeList(CHANNEL, [SetHeat(("b",), (0.8,), 60.0, 12)]))
    store.write_batch(held, synced=False)
    store.close()
    reopened = MemoryStore.open(tmp_path, model_id="test", dim=DIM)
    try:
        assert {r.id: r.heat0 for r in reopened.records(CHANNEL)} == {"a": 0.7, "b": 0.8}
    finally:
        reopened.close()


_NEVER_CLOSED = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path
    import numpy as np
    from calor.server.records import MemoryRecord
    from calor.server.storage.batch import put_ops
    from calor.server.storage.ops import AddMemory, ChangeList, SetHeat
    from calor.server.storage.store import MemoryStore

    store = MemoryStore.open(Path(sys.argv[1]), model_id="test", dim=8)
    record = MemoryRecord(
        id="a", channel="warm", text="a", memory_type="episodic",
        created_at=1.0, updated_at=1.0, heat0=0.4, t0=1.0,
    )
    store.write([ChangeList("warm", [AddMemory(record, np.ones(8, dtype=np.float32))])])
    syncer = store._syncer
    sync = syncer._sync
    syncer._sync = lambda: [sync() for _ in range(2000)]  # a long fsync
    syncer._within = 0.0
    held = store.open_batch()
    put_ops(held, ChangeList("warm", [SetHeat(("a",), (0.7,), 50.0, 11)]))
    store.write_batch(held, synced=False)
    time.sleep(0.05)  # the syncer is inside it now; the program ends
    """
)


def test_a_process_that_never_closes_its_store_ends_cleanly_its_writes_kept(
    tmp_path: Path,
) -> None:
    """A program that exits while the store's syncer is inside the log's fsync ends
    normally (the syncer is closed at exit, not stopped in the fsync: that aborted the
    process), and what it wrote is there when the store is opened again."""
    run = subprocess.run(
        [sys.executable, "-c", _NEVER_CLOSED, str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (run.returncode, run.stderr) == (0, "")
    reopened = MemoryStore.open(tmp_path, model_id="test", dim=DIM)
    try:
        assert {r.id: r.heat0 for r in reopened.records(CHANNEL)} == {"a": 0.7}
    finally:
        reopened.close()
