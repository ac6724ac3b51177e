"""A big batch staged part by part as it arrives (a stream) is written in one atomic batch
at its end and makes the view one batch makes; if the channel changed meanwhile in a way
its parts cannot stand, it is stored afresh; abandoned, it leaves nothing behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from calor.models.embedder import OnnxEmbedder
from calor.server.api import stream_store
from calor.server.clock import ManualClock, SystemClock
from calor.server.commands import NewMemory
from calor.server.config import ServerConfig
from calor.server.engine import storing
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.records import DELETED
from calor.server.storage.store import MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.test_bulk_store import CHANNEL, _view

NOW = 1_800_000_000.0


def batch(count: int, keyed: bool = False, first: int = 40) -> list[NewMemory]:
    """Names that repeat and sessions; every other item a near-repeat of an earlier
    memory (the elders among them: links and confirmations)."""
    names = ["Ada", "Grace", "Linus"]
    texts = [
        f"{names[i % 3]} shipped build {i // 2} to Lisbon again."
        if i % 2
        else f"{names[i % 3]} shipped build {first + i} to Lisbon."
        for i in range(count)
    ]
    return [
        NewMemory(
            channel=CHANNEL,
            text=text,
            tags={"session": f"s{i // 100}"},
            idempotency_key=f"k{i}" if keyed else "",
        )
        for i, text in enumerate(texts)
    ]


def elders() -> list[NewMemory]:
    names = ["Ada", "Grace", "Linus"]
    texts = [f"{names[i % 3]} shipped build {i} to Lisbon." for i in range(40)]
    return [NewMemory(channel=CHANNEL, text=text) for text in texts]


@pytest.fixture
def engines(tmp_path: Path, embedder: OnnxEmbedder) -> Iterator[list[MemoryEngine]]:
    """Two engines on stores of their own, each holding the same 40 elders."""
    stores = [
        MemoryStore.open(tmp_path / name, model_id=embedder.model_id, dim=embedder.dim)
        for name in ("whole", "staged")
    ]
    made = [MemoryEngine.open(store, ManualClock(NOW), ChannelPolicy()) for store in stores]
    first = elders()
    vectors = embedder.embed_passages([item.text for item in first])
    for engine in made:
        engine.store(first, vectors)
    yield made
    for store in stores:
        store.close()


def vector_ids(engine: MemoryEngine) -> set[str]:
    return {memory_id for _, memory_id, _ in engine._store.vectors(CHANNEL)}


def record_ids(engine: MemoryEngine) -> set[str]:
    view = engine.channels.find(CHANNEL)
    return set() if view is None else set(view.records)


def test_a_batch_staged_in_uneven_parts_makes_the_view_one_batch_makes(
    embedder: OnnxEmbedder,
    engines: list[MemoryEngine],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(storing, "_PART", 128)
    items = batch(700)
    vectors = embedder.embed_passages([item.text for item in items])
    engines[0].store(items, vectors)
    staged = engines[1].staged()
    # Parts of uneven size whose edges fall on the link chunks' edges (as a stream's do):
    # pairs of the batch are then scored alike, and near ties broken alike.
    for start, end in ((0, 128), (128, 448), (448, 700)):
        staged.add(items[start:end], vectors[start:end])
        assert len(record_ids(engines[1])) == 40, "nothing is seen before the batch is written"
    ids = staged.finish(items, vectors)

    view = engines[1].channels.find(CHANNEL)
    assert view is not None
    assert [view.records[i].text for i in ids] == [item.text for item in items]
    whole, parts = _view(engines[0]), _view(engines[1])
    assert any(memory[4] > 0 for memory in whole[0].values())  # the elders were confirmed
    assert parts == whole
    assert vector_ids(engines[1]) == record_ids(engines[1])
    engines[1]._store.close()  # what the store holds, read back, is what the view held
    reopened = MemoryStore.open(tmp_path / "staged", model_id=embedder.model_id, dim=embedder.dim)
    try:
        assert _view(MemoryEngine.open(reopened, ManualClock(NOW), ChannelPolicy())) == parts
    finally:
        reopened.close()


def test_a_memory_forgotten_while_the_batch_was_staged_is_never_linked_to(
    embedder: OnnxEmbedder, engines: list[MemoryEngine]
) -> None:
    items = batch(300)
    vectors = embedder.embed_passages([item.text for item in items])
    elder_text = "Ada shipped build 3 to Lisbon."
    # Stored whole, the batch links to this elder (so its first parts do, staged).
    control = engines[0]
    linked = {
        edge.to_id
        for stored in control.store(list(items), vectors)
        for edge in control.inspect(CHANNEL, stored.record.id)[1]
    }
    assert elder_text in {control.channels.find(CHANNEL).records[i].text for i in linked}  # type: ignore[union-attr]

    engine = engines[1]
    view = engine.channels.find(CHANNEL)
    assert view is not None
    elder = next(r.id for r in view.records.values() if r.text == elder_text)
    staged = engine.staged()
    staged.add(items[:200], vectors[:200])
    assert engine.edits.forget(CHANNEL, [elder]) == 1  # the lock is free between parts
    staged.add(items[200:], vectors[200:])
    ids = staged.finish(items, vectors)

    assert len(set(ids)) == 300 and all(i in view.records for i in ids)
    assert view.records[elder].state == DELETED
    for memory_id in ids:
        assert elder not in {edge.to_id for edge in engine.inspect(CHANNEL, memory_id)[1]}
    assert any(engine.inspect(CHANNEL, i)[1] for i in ids), "stored afresh, the batch links"
    # the embeddings the first staging wrote ahead were taken back
    assert vector_ids(engine) == {i for i, r in view.records.items() if r.state != DELETED}


def test_a_key_taken_while_the_batch_was_staged_answers_the_memory_that_took_it(
    embedder: OnnxEmbedder, engines: list[MemoryEngine]
) -> None:
    engine = engines[1]
    items = batch(300, keyed=True)
    vectors = embedder.embed_passages([item.text for item in items])
    staged = engine.staged()
    staged.add(items[:150], vectors[:150])
    [first] = engine.store([items[7]], vectors[7:8])  # another caller, same key
    staged.add(items[150:], vectors[150:])
    ids = staged.finish(items, vectors)
    assert ids[7] == first.record.id
    assert len(set(ids)) == 300
    texts = [r.text for r in engine.channels.find(CHANNEL).records.values()]  # type: ignore[union-attr]
    assert texts.count(first.record.text) == 1


def test_a_channel_dropped_while_the_batch_was_staged_gets_the_batch_afresh(
    embedder: OnnxEmbedder, engines: list[MemoryEngine]
) -> None:
    engine = engines[1]
    items = batch(300)
    vectors = embedder.embed_passages([item.text for item in items])
    staged = engine.staged()
    staged.add(items[:200], vectors[:200])
    engine.drop_channel(CHANNEL)
    staged.add(items[200:], vectors[200:])
    ids = staged.finish(items, vectors)
    assert record_ids(engine) == set(ids) and len(ids) == 300
    assert vector_ids(engine) == set(ids)


def test_a_discarded_batch_leaves_nothing_behind(
    embedder: OnnxEmbedder, engines: list[MemoryEngine]
) -> None:
    engine = engines[1]
    before = (record_ids(engine), vector_ids(engine))
    items = batch(600)
    vectors = embedder.embed_passages([item.text for item in items])
    staged = engine.staged()
    staged.add(items, vectors)
    assert vector_ids(engine) != before[1], "the parts' embeddings were written ahead"
    staged.discard()
    assert (record_ids(engine), vector_ids(engine)) == before


def test_a_stream_cut_off_after_parts_were_staged_stores_nothing(
    embedder: OnnxEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_store, "STAGED_PART", 256)
    server = ServerThread(
        ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=0), SystemClock(), lambda: embedder
    )
    engine: MemoryEngine = server.server.runtime.engine
    release = threading.Event()

    def requests() -> Iterator[pb.StoreStreamRequest]:
        for item in batch(900):
            yield pb.StoreStreamRequest(store=pb.StoreRequest(channel=CHANNEL, text=item.text))
        release.wait(60)  # the stream stays open, its last items unsent

    try:
        with grpc.insecure_channel(server.target) as channel:
            call = MemoryServiceStub(channel).StoreStream.future(requests(), timeout=120)
            deadline = time.monotonic() + 60
            while len(vector_ids(engine)) < 768:  # three parts staged, written ahead
                assert time.monotonic() < deadline, "the parts were not staged as they arrived"
                time.sleep(0.05)
            assert record_ids(engine) == set()
            call.cancel()
            release.set()
            deadline = time.monotonic() + 30
            while vector_ids(engine):
                assert time.monotonic() < deadline, "the staged parts were not taken back"
                time.sleep(0.05)
        assert record_ids(engine) == set()
    finally:
        release.set()
        server.stop()
