"""A bulk store writes its vectors ahead of its records; the records' batch commits it."""

from __future__ import annotations

from pathlib import Path

import pytest

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.commands import NewMemory, RecallQuery
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
