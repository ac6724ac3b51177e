"""A channel past ``approximate_above`` memories is searched through an HNSW graph built
in the background: it finds what exact search finds, never a forgotten memory, and
catches up with what changed while the graph was built (real FAISS, a real channel view,
generated clustered vectors)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from calor.client import CalorClient
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock, SystemClock
from calor.server.commands import NewMemory
from calor.server.config import ServerConfig
from calor.server.engine.channel import Channel
from calor.server.engine.graphs import GraphBuilds
from calor.server.engine.ingest import Neighbourhood, build_records
from calor.server.recall.index import ChannelIndex, ScratchIndex
from calor.server.recall.vectors import VectorIndex
from calor.server.records import MemoryRecord
from calor.server.storage.ops import AddMemory, ChangeList, Forget
from calor.server.thermo.policy import ChannelPolicy
from tests.conftest import ServerThread

DIM = 32
NOW = 1_800_000_000.0


def clustered(count: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, DIM))
    points = centres[rng.integers(0, 20, count)] + 0.3 * rng.normal(size=(count, DIM))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def exact_top(vectors: dict[int, np.ndarray], query: np.ndarray, k: int) -> list[int]:
    labels = list(vectors)
    sims = np.stack([vectors[label] for label in labels]) @ query
    return [labels[i] for i in np.argsort(-sims, kind="stable")[:k]]


def recall_at(found: np.ndarray, wanted: list[int]) -> float:
    return len(set(found.tolist()) & set(wanted)) / len(wanted)


def test_the_graph_finds_what_exact_search_finds_and_catches_up() -> None:
    vectors = clustered(900)
    index = VectorIndex(DIM, approximate_above=500)
    held = {label: vectors[label] for label in range(600)}
    index.add(np.arange(600, dtype=np.int64), vectors[:600])
    assert index.wants_graph() and not index.approximate

    build = index.snapshot()
    # While the graph is built: 300 more arrive, 50 of the old and 10 of the new go.
    index.add(np.arange(600, 900, dtype=np.int64), vectors[600:])
    held.update({label: vectors[label] for label in range(600, 900)})
    for label in [*range(0, 100, 2), *range(600, 610)]:
        index.remove(label)
        del held[label]
    assert not index.wants_graph(), "one build at a time"
    build.run()
    index.install(build)
    assert index.approximate

    queries = clustered(40, seed=9)
    _, found = index.search(queries, 10)
    scores = [recall_at(row, exact_top(held, q, 10)) for row, q in zip(found, queries, strict=True)]
    assert np.mean(scores) >= 0.95
    gone = {*range(0, 100, 2), *range(600, 610)}
    assert not gone & set(found.ravel().tolist()), "a removed memory is never found"
    _, everything = index.search(queries[:1], 900)
    assert sorted(everything[0][everything[0] >= 0].tolist()) == sorted(held)


def test_similarities_are_each_labels_cosine_in_the_order_asked_exact_or_through_a_graph() -> None:
    vectors = clustered(700)
    index = VectorIndex(DIM, approximate_above=500)
    index.add(np.arange(400, dtype=np.int64), vectors[:400])
    for label in range(0, 40, 3):
        index.remove(label)  # the exact index compacts: positions are no longer labels
    asked = np.array([399, 1, 250, 2, 77, 398], dtype=np.int64)
    query = clustered(1, seed=3)[0]
    expected = vectors[asked].astype(np.float16).astype(np.float32) @ query
    assert not index.approximate
    assert np.allclose(index.similarities(query, asked), expected, atol=1e-5)

    index.add(np.arange(400, 700, dtype=np.int64), vectors[400:])
    build = index.snapshot()
    build.run()
    index.install(build)
    assert index.approximate
    # Through the graph the vectors are held in 8 bits: close, not exact.
    assert np.allclose(index.similarities(query, asked), expected, atol=0.02)


def test_a_big_batch_searches_its_own_earlier_items_through_a_graph() -> None:
    vectors = clustered(1200)
    scratch = ScratchIndex(DIM, approximate_above=500)
    for start in range(0, 1200, 64):
        scratch.add(
            [f"m{i}" for i in range(start, min(start + 64, 1200))], vectors[start : start + 64]
        )
    assert scratch.approximate, "past the threshold the batch is searched through a graph"
    held = {label: vectors[label] for label in range(1200)}
    queries = clustered(40, seed=9)
    found = scratch.search(queries, 10)
    assert all(len(row) == 10 for row in found)
    scores = [
        recall_at(np.array([int(memory_id[1:]) for _, memory_id in row]), exact_top(held, q, 10))
        for row, q in zip(found, queries, strict=True)
    ]
    assert np.mean(scores) >= 0.95
    for (similarity, memory_id), q in zip((row[0] for row in found), queries, strict=True):
        assert similarity == pytest.approx(float(held[int(memory_id[1:])] @ q), abs=0.02)


def semantic_links(approximate_above: int, vectors: np.ndarray) -> set[tuple[int, int]]:
    """The semantic links one batch of ``vectors`` makes, by position in the batch."""
    items = [NewMemory(channel="c", text=f"note number {i}") for i in range(len(vectors))]
    hood = Neighbourhood(ChannelIndex(DIM, approximate_above), {}, {}, {})
    built = build_records(items, vectors, hood, ChannelPolicy(), NOW, 0)
    position = {entry.record.id: i for i, entry in enumerate(built)}
    return {
        (position[edge.from_id], position[edge.to_id])
        for entry in built
        for edge in entry.edges
        if edge.kind == "semantic"
    }


def test_a_batch_past_the_threshold_links_as_exact_search_would() -> None:
    rng = np.random.default_rng(11)
    centres = rng.normal(size=(300, DIM))
    points = centres[rng.integers(0, 300, 1500)] + 0.25 * rng.normal(size=(1500, DIM))
    vectors = (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)
    exact = semantic_links(10**9, vectors)
    approximate = semantic_links(500, vectors)
    assert len(exact) > 1500, "the batch links densely enough to tell"
    assert len(exact & approximate) >= 0.95 * len(exact)
    assert len(approximate - exact) <= 0.05 * len(exact)


def test_tombstones_past_a_tenth_of_the_graph_ask_for_a_rebuild() -> None:
    vectors = clustered(400)
    index = VectorIndex(DIM, approximate_above=100)
    index.add(np.arange(400, dtype=np.int64), vectors)
    build = index.snapshot()
    build.run()
    index.install(build)
    for label in range(40):
        index.remove(label)
    assert not index.wants_graph()
    index.remove(40)
    assert index.wants_graph()
    rebuilt = index.snapshot()
    assert len(rebuilt.labels) == 359
    rebuilt.run()
    index.install(rebuilt)
    assert not index.wants_graph()
    _, found = index.search(vectors[:50], 5)
    assert found.min() >= 41


def record(i: int) -> MemoryRecord:
    return MemoryRecord(
        id=f"m{i:05d}",
        channel="big",
        text=f"note {i}",
        memory_type="fact",
        created_at=NOW,
        updated_at=NOW,
        heat0=1.0,
        t0=NOW,
    )


@pytest.mark.timeout(60)
def test_a_channel_that_grows_past_the_threshold_gets_its_graph_in_the_background() -> None:
    builds = GraphBuilds()
    view = Channel("big", DIM, ChannelPolicy(), ManualClock(NOW), approximate_above=300)
    view.on_large = builds.note
    vectors = clustered(400)
    with view.lock:
        view.apply(ChangeList("big", [AddMemory(record(i), vectors[i]) for i in range(200)]))
    assert builds.idle() and not view.index.vectors.approximate
    with view.lock:
        view.apply(ChangeList("big", [AddMemory(record(i), vectors[i]) for i in range(200, 400)]))
    deadline = time.monotonic() + 30
    while not view.index.vectors.approximate:
        assert time.monotonic() < deadline, "the graph was not built in time"
        time.sleep(0.01)
    with view.lock:
        view.apply(ChangeList("big", [Forget(record(7))]))
        labels, sims = view.index.dense(vectors[7], 5)
        top = view.index.memory_id(int(labels[0]))
        assert "m00007" not in {view.index.memory_id(int(label)) for label in labels}
        labels, sims = view.index.dense(vectors[123], 5)
    # The graph holds 8-bit vectors: a memory's own vector scores within a hundredth of 1.
    assert view.index.memory_id(int(labels[0])) == "m00123" and sims[0] == pytest.approx(
        1.0, abs=0.01
    )
    assert top != "m00007"


def found(client: CalorClient, query: str, limit: int) -> list[str]:
    return [hit.memory.id for hit in client.recall(query, limit=limit, peek=True).hits]


def locker_facts() -> list[str]:
    """60 short facts, alike but for their numbers and colours."""
    colours = ["red", "blue", "green", "brass", "silver", "iron"] * 10
    return [f"Fact number {i}: the {w} key opens locker {i * 7}." for i, w in enumerate(colours)]


def small_threshold(data_dir: Path) -> ServerConfig:
    """A server whose channels go approximate past 40 memories."""
    return ServerConfig(data_dir=data_dir, host="127.0.0.1", port=0, approximate_above=40)


def graph_built(server: ServerThread, channel: str) -> None:
    view = server.server.runtime.engine.channels.find(channel)
    deadline = time.monotonic() + 30
    while not view.index.vectors.approximate:
        assert time.monotonic() < deadline, "the graph was not built in time"
        time.sleep(0.02)


def test_a_large_channel_recalls_through_its_graph_end_to_end(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    """Through the real server and model: stored past the threshold, the channel is
    searched through its graph, and a forgotten memory is gone from it (after a restart:
    see test_saved_graphs)."""
    texts, config = locker_facts(), small_threshold(tmp_path)
    server = ServerThread(config, SystemClock(), lambda: embedder)
    try:
        with CalorClient(server.target, channel="big") as client:
            ids = client.store_many(texts)
            graph_built(server, "big")
            assert found(client, texts[17], 3)[0] == ids[17]
            client.forget([ids[17]])
            assert ids[17] not in found(client, texts[17], 60)
            assert found(client, texts[42], 1) == [ids[42]]
    finally:
        server.stop()


def test_a_graph_outgrown_while_it_was_built_is_built_again() -> None:
    """Catching up happens under the channel's lock, so it must stay short: a build that
    thousands of arrivals overtook is dropped and the graph built from a new snapshot."""
    vectors = clustered(2_400)
    index = VectorIndex(DIM, approximate_above=200)
    index.add(np.arange(300, dtype=np.int64), vectors[:300])
    build = index.snapshot()
    index.add(np.arange(300, 2_400, dtype=np.int64), vectors[300:])
    build.run()
    assert not index.install(build)
    assert not index.approximate and index.wants_graph()
    again = index.snapshot()
    assert len(again.labels) == 2_400
    again.run()
    assert index.install(again) and index.approximate
