"""A bulk store writes its vectors ahead of its records; the records' batch commits it."""

from __future__ import annotations

from pathlib import Path

import pytest

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock, SystemClock
from calor.server.commands import NewMemory, RecallQuery
from calor.server.engine import storing
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.heap import BULK_ITEMS
from calor.server.storage.store import MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from tests.helpers import CrashAfter

CHANNEL = "bulk"


def notes(count: int) -> list[NewMemory]:
    return [
        NewMemory(channel=CHANNEL, text=f"Shipment {i} of oak planks reached dock {i % 7}.")
        for i in range(count)
    ]


def vector_keys(store: MemoryStore) -> list[str]:
    return [memory_id for name, memory_id, _ in store.vectors() if name == CHANNEL]


@pytest.mark.parametrize("written_batches", [1, 2])
def test_a_bulk_store_cut_short_before_its_records_leaves_nothing_behind(
    embedder: OnnxEmbedder, tmp_path: Path, written_batches: int
) -> None:
    items = notes(BULK_ITEMS + 40)  # vectors ahead in two batches, then the records
    vectors = embedder.embed_passages([item.text for item in items])
    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    crashing = CrashAfter(store, budget=written_batches)
    engine = MemoryEngine.open(crashing, SystemClock(), ChannelPolicy())  # type: ignore[arg-type]
    with pytest.raises(OSError):
        engine.store(items, vectors)
    assert crashing.refused == 1  # the records' batch, after the vectors written ahead
    assert vector_keys(store)  # the vectors written ahead are on disk
    store.close()

    reopened = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    again = MemoryEngine.open(reopened, SystemClock(), ChannelPolicy())
    assert list(reopened.records(CHANNEL)) == []
    query = RecallQuery(channel=CHANNEL, query="oak planks", limit=5, peek=True)
    assert again.recall(query, embedder.embed_query("oak planks")).hits == []
    assert vector_keys(reopened) == []  # dropped once the channel loads: no records came
    stored = again.store(items, vectors)
    assert len(stored) == len(items)
    assert sorted(vector_keys(reopened)) == sorted(s.record.id for s in stored)
    reopened.close()


def test_a_bulk_store_is_found_after_a_restart(embedder: OnnxEmbedder, tmp_path: Path) -> None:
    items = notes(BULK_ITEMS)
    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    engine = MemoryEngine.open(store, SystemClock(), ChannelPolicy())
    engine.store(items, embedder.embed_passages([item.text for item in items]))
    store.close()

    reopened = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    again = MemoryEngine.open(reopened, SystemClock(), ChannelPolicy())
    query = RecallQuery(channel=CHANNEL, query="Shipment 17 of oak planks", limit=3, peek=True)
    hits = again.recall(query, embedder.embed_query(query.query)).hits
    assert "Shipment 17 of oak planks reached dock 3." in [h.record.text for h in hits]
    reopened.close()


def _view(engine: MemoryEngine) -> tuple[dict[str, tuple[object, ...]], set[tuple[object, ...]]]:
    """Each memory of the channel by its text (type, entities, importance, utility,
    confirmations, heat, state) and every edge by the texts it joins."""
    view = engine.channels.find(CHANNEL)
    assert view is not None
    text_of = {memory_id: view.records[memory_id].text for memory_id in view.records}
    memories: dict[str, tuple[object, ...]] = {}
    edges: set[tuple[object, ...]] = set()
    for memory_id, text in text_of.items():
        current, links = engine.inspect(CHANNEL, memory_id)
        record = current.record
        memories[text] = (
            record.memory_type,
            tuple(record.entities),
            round(record.importance, 9),
            round(record.utility, 9),
            record.confirmations,
            round(current.heat, 9),
            record.state,
            text_of.get(record.provenance.get("near_duplicate_of", ""), ""),
        )
        edges.update(
            (text, text_of[edge.to_id], edge.kind, round(edge.weight, 9)) for edge in links
        )
    return memories, edges


@pytest.mark.parametrize("part", [128, storing._PART])
def test_a_bulk_said_in_parts_makes_the_view_one_batch_makes(
    embedder: OnnxEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part: int
) -> None:
    monkeypatch.setattr(storing, "_PART", part)  # parts link to the parts before them
    # Enough for several slices; repeated names and near-repeats link and confirm.
    first = [f"{['Ada', 'Grace', 'Linus'][i % 3]} shipped build {i} to Lisbon" for i in range(400)]
    texts = [f"{text}." for text in first] + [f"{text} again." for text in first[:368]]
    items = [
        NewMemory(channel=CHANNEL, text=text, tags={"session": f"s{i // 100}"})
        for i, text in enumerate(texts)
    ]
    vectors = embedder.embed_passages([item.text for item in items])
    engines, stores = [], []
    for name in ("whole", "slices"):
        store = MemoryStore.open(tmp_path / name, model_id=embedder.model_id, dim=embedder.dim)
        stores.append(store)
        engines.append(MemoryEngine.open(store, ManualClock(1_800_000_000.0), ChannelPolicy()))
    for engine in engines:  # elders that the bulk's near-repeats confirm
        engine.store(items[:40], vectors[:40])
    items, vectors = items[40:], vectors[40:]
    stored = engines[0].store(items, vectors)
    taken = list(items)
    ids = engines[1].store_all(taken, vectors)

    assert taken == []  # handed over, not held twice
    view = engines[1].channels.find(CHANNEL)
    assert view is not None
    assert [view.records[i].text for i in ids] == [item.text for item in items]
    assert len(set(ids)) == len(items)
    whole, sliced = _view(engines[0]), _view(engines[1])
    assert len(whole[0]) == len(items) + 40 and len(whole[1]) > len(items)
    assert any(memory[4] > 0 for memory in whole[0].values())  # confirmations
    assert sliced == whole
    query = RecallQuery(channel=CHANNEL, query="Grace shipped build 7", limit=10, peek=True)
    vector = embedder.embed_query(query.query)
    found = [[h.record.text for h in e.recall(query, vector).hits] for e in engines]
    assert found[0] == found[1] and found[0]
    assert len(stored) == len(ids)
    stores[1].close()  # what the store holds, read back, is what the view held
    reopened = MemoryStore.open(tmp_path / "slices", model_id=embedder.model_id, dim=embedder.dim)
    try:
        again = MemoryEngine.open(reopened, ManualClock(1_800_000_000.0), ChannelPolicy())
        assert _view(again) == sliced
    finally:
        reopened.close()
