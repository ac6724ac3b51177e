"""A large channel's HNSW graph is saved when built and, after a restart, joined again to
the vectors RocksDB holds instead of built again: what changed since (memories gone,
re-embedded or new) is caught up from the store, and a file that does not fit is passed
over (real FAISS, real files; generated clustered vectors, and the real server)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from calor.client import CalorClient
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock, SystemClock
from calor.server.engine.channel import Channel
from calor.server.engine.graphs import GraphBuilds
from calor.server.recall.graph_files import GraphFiles, SavedGraph
from calor.server.recall.hnsw import GraphLinks, fingerprints
from calor.server.recall.vectors import VectorIndex
from calor.server.storage.ops import AddMemory, ChangeList
from calor.server.thermo.policy import ChannelPolicy
from tests.conftest import ServerThread
from tests.test_large_channels import (
    DIM,
    NOW,
    clustered,
    exact_top,
    found,
    graph_built,
    locker_facts,
    recall_at,
    record,
    small_threshold,
)


def built_graph(vectors: np.ndarray, ids: list[str]) -> SavedGraph:
    """A graph built over ``vectors`` (node i is ``ids[i]``), as it is saved."""
    index = VectorIndex(DIM, approximate_above=10)
    index.add(np.arange(len(ids), dtype=np.int64), vectors)
    build = index.snapshot()
    prints = fingerprints(build.vectors)
    build.run()
    assert index.install(build)
    return SavedGraph(GraphLinks.of(build.graph), ids, prints, sequence=42)


def test_a_saved_graph_comes_back_from_its_file(tmp_path: Path) -> None:
    vectors = clustered(300)
    ids = [f"m{i}" for i in range(300)]
    files = GraphFiles(tmp_path, DIM)
    files.save("team/ü", "live", built_graph(vectors, ids))

    loaded = files.load("team/ü", "live")
    assert loaded is not None
    assert loaded.ids == ids and loaded.sequence == 42 and loaded.links.size == 300
    assert files.load("team/ü", "attic") is None and files.load("other", "live") is None
    assert GraphFiles(tmp_path, DIM + 1).load("team/ü", "live") is None, "another model's"


def test_the_file_holds_no_vector(tmp_path: Path) -> None:
    """Forgetting must leave nothing behind: a saved graph holds ids and fingerprints."""
    vectors = clustered(300)
    files = GraphFiles(tmp_path, DIM)
    files.save("c", "live", built_graph(vectors, [f"m{i}" for i in range(300)]))
    written = b"".join(path.read_bytes() for path in tmp_path.iterdir())
    assert not any(vectors[i].tobytes()[:16] in written for i in range(300))


def test_an_unreadable_file_is_passed_over_and_a_dropped_channel_loses_its_files(
    tmp_path: Path,
) -> None:
    files = GraphFiles(tmp_path, DIM)
    files.save("c", "live", built_graph(clustered(200), [f"m{i}" for i in range(200)]))
    (path,) = tmp_path.iterdir()
    path.write_bytes(path.read_bytes()[:500])  # torn by something other than our writes
    assert files.load("c", "live") is None
    files.discard("c")
    assert list(tmp_path.iterdir()) == []


def test_a_restored_graph_catches_up_with_what_changed_since_it_was_built() -> None:
    """After a restart labels are handed out anew; since the save, 40 memories were
    forgotten, one re-embedded and 50 stored. The restored graph never finds the
    forgotten or the old vector, finds the new ones, and agrees with exact search."""
    vectors = clustered(900)
    saved = built_graph(vectors[:800], [f"m{i}" for i in range(800)])

    rng = np.random.default_rng(3)
    label_of = {f"m{i}": int(label) for i, label in enumerate(rng.permutation(800))}
    now = vectors.copy()
    now[5] = vectors[850]  # m5 was embedded again
    gone = {i for i in range(800) if i % 20 == 3}
    kept = [i for i in range(800) if i not in gone]
    index = VectorIndex(DIM, approximate_above=100)
    held = {label_of[f"m{i}"]: now[i] for i in kept}
    index.add(np.array([label_of[f"m{i}"] for i in kept], dtype=np.int64), now[kept])
    new_labels = np.arange(1000, 1050, dtype=np.int64)
    index.add(new_labels, vectors[800:850])
    held.update(zip(new_labels.tolist(), vectors[800:850], strict=True))

    labels = np.array(
        [-1 if int(i[1:]) in gone else label_of[i] for i in saved.ids], dtype=np.int64
    )
    assert index.adopt(saved.links, labels, saved.prints)
    assert index.approximate and not index.wants_graph()

    _, top = index.search(now[[5]], 1)
    assert top[0, 0] == label_of["m5"], "the re-embedded memory is found by its new vector"
    _, everything = index.search(vectors[:1], 900)
    assert sorted(everything[0][everything[0] >= 0].tolist()) == sorted(held)
    queries = clustered(40, seed=11)
    _, found = index.search(queries, 10)
    scores = [recall_at(row, exact_top(held, q, 10)) for row, q in zip(found, queries, strict=True)]
    assert np.mean(scores) >= 0.95


def test_a_graph_that_no_longer_fits_is_not_adopted() -> None:
    vectors = clustered(400)
    saved = built_graph(vectors, [f"m{i}" for i in range(400)])
    # A fifth of its memories are gone: rebuilding beats searching past the tombstones.
    index = VectorIndex(DIM, approximate_above=100)
    index.add(np.arange(320, dtype=np.int64), vectors[:320])
    labels = np.where(np.arange(400) < 320, np.arange(400), -1).astype(np.int64)
    assert not index.adopt(saved.links, labels, saved.prints)
    assert not index.approximate and index.wants_graph()
    # Two nodes claiming one memory is not a graph of these memories.
    index = VectorIndex(DIM, approximate_above=100)
    index.add(np.arange(400, dtype=np.int64), vectors)
    labels = np.arange(400, dtype=np.int64)
    labels[1] = 0
    assert not index.adopt(saved.links, labels, saved.prints)
    assert not index.approximate


@pytest.mark.timeout(120)
def test_after_a_restart_the_server_takes_the_saved_graph_end_to_end(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    """Through the real server and model: the graph built before the restart is the one
    searched after it (none is built), with a memory forgotten and one stored meanwhile
    caught up."""
    texts, config = locker_facts(), small_threshold(tmp_path)
    server = ServerThread(config, SystemClock(), lambda: embedder)
    try:
        with CalorClient(server.target, channel="big") as client:
            ids = client.store_many(texts)
            graph_built(server, "big")
            deadline = time.monotonic() + 30
            while not list((tmp_path / "graphs").glob("*-live-hot.npz")):
                assert time.monotonic() < deadline, "the graph was not saved"
                time.sleep(0.02)
            client.forget([ids[17]])
            late = client.store("A late fact: the copper key opens locker 999.").id
    finally:
        server.stop()
    again = ServerThread(config, SystemClock(), lambda: embedder)
    try:
        with CalorClient(again.target, channel="big") as client:
            assert client.recall("copper key locker 999", limit=1).hits[0].memory.id == late
            graphs = again.server.runtime.engine.channels.graphs
            view = again.server.runtime.engine.channels.find("big")
            assert view.index.vectors.approximate
            assert (graphs.restored, graphs.built) == (1, 0)
            near = found(client, texts[17], 60)
            assert ids[17] not in near and ids[42] in near
            assert found(client, texts[42], 1) == [ids[42]]
    finally:
        again.stop()


def test_a_graph_that_grew_asks_to_be_saved_again_and_restores_whole() -> None:
    """Memories keep arriving after a graph is built: once a restart would have more than
    half of what it may catch up, the graph in place is saved again, with every node."""
    vectors = clustered(3_000)
    index = VectorIndex(DIM, approximate_above=100)
    index.add(np.arange(500, dtype=np.int64), vectors[:500])
    build = index.snapshot()
    build.run()
    assert index.install(build) and not index.wants_save()
    index.add(np.arange(500, 1_400, dtype=np.int64), vectors[500:1_400])
    assert not index.wants_save(), "900 to catch up is within half of what adopt takes"
    index.add(np.arange(1_400, 1_600, dtype=np.int64), vectors[1_400:1_600])
    index.remove(3)
    assert index.wants_save()
    links, labels, prints = index.saving()
    assert not index.wants_save()
    assert links.size == labels.size == 1_600 and sorted(labels.tolist()) == list(range(1_600))
    live = labels != 3
    assert (prints[live] == fingerprints(vectors[labels[live]])).all()

    # After a restart the memories come back under new labels (here: shifted), one gone.
    again = VectorIndex(DIM, approximate_above=100)
    kept = np.array([i for i in range(1_600) if i != 3], dtype=np.int64)
    again.add(kept + 10_000, vectors[kept])
    now = np.where(labels == 3, -1, labels + 10_000)
    assert again.adopt(links, now, prints)
    _, everything = again.search(vectors[:1], 1_600)
    assert sorted(everything[0][everything[0] >= 0].tolist()) == (kept + 10_000).tolist()


@pytest.mark.timeout(60)
def test_a_channel_saves_its_grown_graph_in_the_background(tmp_path: Path) -> None:
    builds = GraphBuilds(GraphFiles(tmp_path, DIM), sequence=lambda: 7)
    view = Channel("big", DIM, ChannelPolicy(), ManualClock(NOW), approximate_above=300)
    view.on_large = builds.note
    vectors = clustered(1_800)
    with view.lock:
        view.apply(ChangeList("big", [AddMemory(record(i), vectors[i]) for i in range(400)]))
    saved = GraphFiles(tmp_path, DIM)
    deadline = time.monotonic() + 30
    while (first := saved.load("big", "live-hot")) is None:
        assert time.monotonic() < deadline, "the built graph was not saved"
        time.sleep(0.01)
    assert first.links.size == 400 and first.sequence == 7
    with view.lock:
        view.apply(ChangeList("big", [AddMemory(record(i), vectors[i]) for i in range(400, 1_800)]))
    while (grown := saved.load("big", "live-hot")) is None or grown.links.size < 1_800:
        assert time.monotonic() < deadline, "the grown graph was not saved again"
        time.sleep(0.01)
    assert sorted(grown.ids) == sorted(f"m{i:05d}" for i in range(1_800))
