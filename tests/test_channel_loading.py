"""Channels load when first asked for: a restart reads which channels exist (a seek or two
each), not their memories; a call for a channel loads that channel alone, whole; the rest
load in the background; counts over the server see them all (real RocksDB, real model)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from calor.client import CalorClient
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.commands import NewMemory, RecallQuery
from calor.server.config import ServerConfig
from calor.server.engine import registry
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.engine.registry import BYTES_PER_MEMORY
from calor.server.storage.ops import ChangeList, StageVector
from calor.server.storage.store import MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from tests.conftest import ServerThread

# Names that share prefixes: each must be found as itself, none skipped.
NAMES = ["a", "a b", "ab", "abc", "b", "team/alpha", "team/alpha-2", "z"]


@contextmanager
def opened(embedder: OnnxEmbedder, folder: Path, memory_budget: int = 0) -> Iterator[MemoryEngine]:
    """An engine over the store in ``folder``, as a restart opens it; closed after."""
    store = MemoryStore.open(folder, model_id=embedder.model_id, dim=embedder.dim)
    try:
        yield MemoryEngine.open(store, SystemClock(), ChannelPolicy(), memory_budget=memory_budget)
    finally:
        store.close()


def fill(embedder: OnnxEmbedder, folder: Path) -> dict[str, list[str]]:
    with opened(embedder, folder) as engine:
        return _fill(engine, embedder)


def _fill(engine: MemoryEngine, embedder: OnnxEmbedder) -> dict[str, list[str]]:
    texts = {
        name: [f"{name} keeps note {i} about the harbour." for i in range(3)] for name in NAMES
    }
    for name, notes in texts.items():
        items = [NewMemory(channel=name, text=text) for text in notes]
        engine.store(items, embedder.embed_passages(notes))
    engine.channels.set_policy("settings-only", ChannelPolicy(cold_threshold=0.2))
    return texts


def test_a_restart_loads_a_channel_only_when_it_is_asked_for(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    texts = fill(embedder, tmp_path)
    with opened(embedder, tmp_path) as engine:
        assert engine.channels.unloaded() == len(NAMES) + 1, "every channel known, none loaded"

        query = RecallQuery(channel="ab", query="note 1 about the harbour", limit=5, peek=True)
        hits = engine.recall(query, embedder.embed_query(query.query)).hits
        assert {h.record.text for h in hits} == set(texts["ab"])  # whole, and no other's
        assert engine.channels.unloaded() == len(NAMES)
        assert engine.channels.policy("settings-only").cold_threshold == 0.2

        engine.channels.load_all()
        assert engine.channels.unloaded() == 0
        holding, states = engine.channels.census()
        assert holding == len(NAMES) and states["active"] == 3 * len(NAMES)


def test_after_a_restart_every_channel_answers_and_the_rest_load_in_the_background(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    texts = fill(embedder, tmp_path)
    config = ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=0)
    server = ServerThread(config, SystemClock(), lambda: embedder)
    try:
        with CalorClient(server.target, channel="team/alpha") as client:
            found = client.recall("note 2 about the harbour", limit=3, peek=True).hits
            assert found[0].memory.text == texts["team/alpha"][2]
            client.store("team/alpha adds a fourth note.")
        registry = server.server.runtime.engine.channels
        deadline = time.monotonic() + 30
        while registry.unloaded():
            assert time.monotonic() < deadline, "the background warm-up did not finish"
            time.sleep(0.02)
        assert registry.census()[1]["active"] == 3 * len(NAMES) + 1
    finally:
        server.stop()


def test_under_a_memory_budget_the_least_recently_used_channels_are_unloaded(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    texts = fill(embedder, tmp_path)
    with opened(embedder, tmp_path, memory_budget=2 * 3 * BYTES_PER_MEMORY) as engine:
        registry = engine.channels
        held = registry.find("a")  # in a caller's hand: never unloaded under it
        assert held is not None
        revision = held.revision
        for name in NAMES[1:]:
            assert registry.find(name) is not None
            assert registry.unloaded() >= len(NAMES) + 1 - 3, "at most the budget, and 'a'"
        assert registry.find("a") is held
        registry.load_all()
        assert registry.unloaded() >= len(NAMES) + 1 - 3, "the warm-up stops at the budget"

        del held  # let go: "a" may go now, and comes back whole when asked for
        for name in NAMES[1:]:
            registry.find(name)
        query = RecallQuery(channel="a", query="note 0 about the harbour", limit=5, peek=True)
        hits = engine.recall(query, embedder.embed_query(query.query)).hits
        assert {h.record.text for h in hits} == set(texts["a"])
        again = registry.find("a")
        assert again is not None and again.revision > revision, "derived caches see a new view"


def test_a_channel_loaded_a_few_records_at_a_time_is_whole_and_drops_orphans(
    embedder: OnnxEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A channel is read back a chunk of records at a time, each chunk's embeddings found
    beside it: every memory is found by its own words, and embeddings without a record
    (a bulk store cut short), before, between and after the records, are dropped."""
    monkeypatch.setattr(registry, "_LOAD_CHUNK", 3)
    words = "oak pine birch cedar maple walnut ash elm teak larch spruce".split()
    notes = [f"Crate {i} of the {word} shipment left the harbour." for i, word in enumerate(words)]
    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    engine = MemoryEngine.open(store, SystemClock(), ChannelPolicy())
    items = [NewMemory(channel="c", text=text) for text in notes]
    ids = sorted(s.record.id for s in engine.store(items, embedder.embed_passages(notes)))
    orphans = ["0", ids[4] + "0", ids[7] + "0", "~"]  # in key order among the ids
    spare = embedder.embed_passages(["an embedding whose record never came"])[0]
    store.write([ChangeList("c", [StageVector(o, spare) for o in orphans])])
    store.close()

    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    try:
        engine = MemoryEngine.open(store, SystemClock(), ChannelPolicy())
        for text in notes:
            query = RecallQuery(channel="c", query=text, limit=1, peek=True)
            hits = engine.recall(query, embedder.embed_query(text)).hits
            assert [hit.record.text for hit in hits] == [text]
        kept = sorted(memory_id for name, memory_id, _ in store.vectors() if name == "c")
        assert kept == ids
    finally:
        store.close()
