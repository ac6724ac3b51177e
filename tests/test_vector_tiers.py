"""Vectors by heat tier (DESIGN §5): hot memories held at half precision, warm and cold
ones quantised (an index may hold half, 8- or 4-bit vectors; a cold tier's graph holds
4 bits, and its best hits are scored again from their whole vectors); recall searches
all tiers together and compares their scores as cosines; memories change tier in dreams
and sweeps, never when recalled, and one that warms up again takes its whole vector from
RocksDB (real FAISS; generated clustered vectors, then the real server, model and
RocksDB with a clock the test moves)."""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from calor.client import CalorClient
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock
from calor.server.config import ServerConfig
from calor.server.recall.index import ChannelIndex
from calor.server.recall.tiers import COLD, HOT, RESCORED, SETTLED, TIERS, WARM, TieredVectors
from calor.server.recall.vectors import VectorIndex
from calor.v1 import memory_pb2, memory_service_pb2, memory_service_pb2_grpc
from tests.conftest import ServerThread
from tests.test_large_channels import clustered, exact_top, recall_at

DIM = 32
DAY = 86_400.0


def bounds(vectors: np.ndarray) -> np.ndarray:
    return np.stack([vectors.min(axis=0), vectors.max(axis=0)])


@pytest.mark.parametrize(
    ("precision", "least_recall", "bytes_per_vector"),
    [("half", 0.99, 2 * DIM), ("int8", 0.97, DIM), ("int4", 0.7, DIM // 2)],
)
@pytest.mark.parametrize("through_graph", [False, True])
def test_each_precision_finds_what_exact_float32_finds(
    precision: str, least_recall: float, bytes_per_vector: int, through_graph: bool
) -> None:
    vectors = clustered(1_500)
    index = VectorIndex(DIM, 500, precision, bounds(vectors))
    index.add(np.arange(1_500, dtype=np.int64), vectors)
    if through_graph:
        build = index.snapshot()
        build.run()
        assert index.install(build) and index.approximate
    queries = clustered(60, seed=9)
    _, found = index.search(queries, 10)
    whole = dict(enumerate(vectors))
    wanted = [exact_top(whole, q, 10) for q in queries]
    assert np.mean([recall_at(f, w) for f, w in zip(found, wanted, strict=True)]) >= least_recall
    held = index.reconstruct_batch(np.arange(1_500, dtype=np.int64))
    assert np.abs(held @ queries.T - vectors @ queries.T).max() < 0.1, "scores are cosines"
    assert index.code_size == bytes_per_vector


def test_a_quantised_index_needs_the_bounds_of_its_vectors() -> None:
    with pytest.raises(ValueError, match="bounds"):
        VectorIndex(DIM, precision="int8")


def tiered(vectors: np.ndarray, tiers: np.ndarray) -> TieredVectors:
    held = TieredVectors(DIM, approximate_above=400)
    held.add(np.arange(len(vectors), dtype=np.int64), vectors, tiers.astype(np.int8))
    return held


def test_search_compares_the_tiers_scores_as_cosines() -> None:
    """A third of the memories in each tier: the ten nearest across tiers are nearly the
    ten nearest by exact float32 cosine (quantising blurs near ties), wherever each is held,
    best first, each with a score near its cosine."""
    vectors = clustered(1_200)
    tiers = np.arange(1_200) % 3
    held = tiered(vectors, tiers)
    assert [code for code, _ in held.held()] == [HOT, WARM, COLD]
    queries = clustered(60, seed=9)
    sims, found = held.search(queries, 10)
    whole = dict(enumerate(vectors))
    wanted = [exact_top(whole, q, 10) for q in queries]
    assert np.mean([recall_at(f, w) for f, w in zip(found, wanted, strict=True)]) >= 0.85
    assert (np.diff(sims, axis=1) <= 1e-6).all(), "best first across tiers"
    assert set(held.tiers_of(found.ravel()).tolist()) == {HOT, WARM, COLD}
    exact = np.einsum("ij,ij->i", vectors[found[:, 0]], queries)
    assert np.abs(sims[:, 0] - exact).max() < 0.05
    labels = np.array([5, 6, 7, 300], dtype=np.int64)
    assert held.similarities(queries[0], labels) == pytest.approx(
        vectors[labels] @ queries[0], abs=0.05
    )


def test_a_moved_memory_is_found_once_in_its_new_tier_even_through_graphs() -> None:
    vectors = clustered(900)
    held = tiered(vectors, np.zeros(900))
    for _, index in held.held():
        build = index.snapshot()
        build.run()
        assert index.install(build)
    moving = np.arange(0, 900, 2, dtype=np.int64)
    held.move(moving, np.full(moving.size, COLD, dtype=np.int8), vectors[moving])
    held.move(moving[:10], np.full(10, HOT, dtype=np.int8), vectors[moving[:10]])  # and back
    assert held.tiers_of(moving[:12]).tolist() == [HOT] * 10 + [COLD] * 2
    _, found = held.search(vectors[:40], 5)
    for row, label in enumerate(range(40)):
        assert found[row, 0] == label, "each memory finds itself first"
        assert len(set(found[row].tolist())) == 5, "no memory twice"
    held.remove(4)
    _, found = held.search(vectors[[4]], 900)
    assert 4 not in found[0] and (found[0] >= 0).sum() == 899


# --- through the server: re-tiered in dreams, by heat -------------------------------


def stored_vector(server: ServerThread, memory_id: str) -> np.ndarray:
    whole = server.server.runtime.engine._store.get_vector("tiers", memory_id)
    assert whole is not None
    return whole


def tiers_now(server: ServerThread, ids: list[str]) -> list[int]:
    view = server.server.runtime.engine.channels.find("tiers")
    with view.lock:
        return view.index.vectors.tiers_of(view.index.labels(ids)).tolist()


def test_memories_change_tier_as_they_cool_in_dreams_and_never_when_recalled(
    manual_server: tuple[ServerThread, ManualClock, memory_service_pb2_grpc.MemoryServiceStub],
) -> None:
    server, clock, stub = manual_server
    texts = [
        "The staging database runs on port 5433.",
        "Mira prefers tea without sugar in the afternoon.",
        "The quarterly report is due on the ninth of March.",
        "Our build agents run Debian trixie with two cores each.",
    ]
    semantic = memory_pb2.MEMORY_TYPE_SEMANTIC  # half-life 30 days
    ids = [
        stub.Store(
            memory_service_pb2.StoreRequest(channel="tiers", text=t, memory_type=semantic)
        ).memory.id
        for t in texts
    ]
    assert tiers_now(server, ids) == [HOT] * 4, "new memories are hot"

    def dream() -> int:
        return stub.Dream(memory_service_pb2.DreamRequest(channel="tiers")).retiered

    def first_hit(text: str, peek: bool = True) -> str:
        request = memory_service_pb2.RecallRequest(channel="tiers", query=text, peek=peek)
        return stub.Recall(request).hits[0].memory.id

    clock.advance(60 * DAY)  # heat 1/4
    assert tiers_now(server, ids) == [HOT] * 4, "heat alone moves nothing"
    assert dream() == 4
    assert tiers_now(server, ids) == [WARM] * 4
    assert [first_hit(t) for t in texts] == ids
    clock.advance(60 * DAY)  # heat 1/16: below the cold threshold
    assert dream() == 4
    assert tiers_now(server, ids) == [COLD] * 4
    assert [first_hit(t) for t in texts] == ids, "cold memories are still found first"

    assert first_hit(texts[1], peek=False) == ids[1]  # recalled: heat 1/16 + 0.15
    assert tiers_now(server, ids) == [COLD] * 4, "never re-tiered on the recall path"
    assert dream() == 1
    assert tiers_now(server, ids) == [COLD, WARM, COLD, COLD]
    view = server.server.runtime.engine.channels.find("tiers")
    with view.lock:
        held = view.index.vector(ids[1])
    whole = stored_vector(server, ids[1])
    assert held is not None
    # Back in a finer tier from the whole vector: within 8-bit rounding of it.
    assert np.abs(held - whole).max() < 0.01
    assert dream() == 0, "a dream with nothing cooler or warmer moves nothing"


def test_quantised_tiers_wait_for_settled_bounds_then_turn_to_their_precision() -> None:
    """Ranges trained on a handful of vectors would misplace the next ones: until the
    channel has been given SETTLED vectors its cold tier holds them at half precision;
    then it turns to its own precision, keeping every memory findable."""
    vectors = clustered(SETTLED + 200)
    held = TieredVectors(DIM)
    few = np.arange(10, dtype=np.int64)
    held.add(few, vectors[:10], np.full(10, COLD, dtype=np.int8))
    assert dict(held.held())[COLD].precision == "half"
    rest = np.arange(10, SETTLED + 200, dtype=np.int64)
    held.add(rest, vectors[10:], np.full(rest.size, COLD, dtype=np.int8))
    cold = dict(held.held())[COLD]
    assert cold.precision == TIERS[COLD][1] != "half" and cold.live == SETTLED + 200
    kept = held.reconstruct_batch(few)
    assert np.abs(kept - vectors[:10]).max() < 0.05, "within rounding of each vector"
    _, found = held.search(vectors[:10], 10)
    assert all(label in row for label, row in zip(few, found, strict=True))


# --- a cold tier's graph: 4 bits, its best hits scored again whole -----------------


class WholeVectors:
    """Where whole vectors are kept (RocksDB in the server): labels to rows, and which
    were found; counts what it was asked for."""

    def __init__(self, vectors: np.ndarray, missing: frozenset[int] = frozenset()) -> None:
        self.vectors, self.missing, self.asked = vectors, missing, 0

    def __call__(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.asked += labels.size
        found = np.array([label not in self.missing for label in labels.tolist()], dtype=bool)
        return np.where(found[:, None], self.vectors[labels], 0.0).astype(np.float32), found


def cold_through_graph(vectors: np.ndarray, whole: WholeVectors | None) -> TieredVectors:
    held = TieredVectors(DIM, approximate_above=400, whole=whole)
    held.add(np.arange(len(vectors), dtype=np.int64), vectors, np.full(len(vectors), COLD, np.int8))
    cold = dict(held.held())[COLD]
    assert cold.precision == "int8", "searched exactly, cold vectors are held in 8 bits"
    build = cold.snapshot()
    build.run()
    assert cold.install(build)
    return held


def test_a_cold_graph_holds_four_bits_and_scores_its_best_hits_whole() -> None:
    vectors = clustered(1_500)
    whole = WholeVectors(vectors)
    held = cold_through_graph(vectors, whole)
    cold = dict(held.held())[COLD]
    assert (cold.precision, cold.code_size) == ("int4", DIM // 2)
    queries = clustered(60, seed=9)
    sims, found = held.search(queries, 10)
    assert whole.asked == 60 * RESCORED, "each query's best hits, read whole once"
    exact = np.einsum("ij,ikj->ik", queries, vectors[found])
    assert sims == pytest.approx(exact, abs=1e-5), "each hit's score is its exact cosine"
    assert (np.diff(sims, axis=1) <= 1e-6).all(), "best first"
    every = dict(enumerate(vectors))
    wanted = [exact_top(every, q, 10) for q in queries]
    assert np.mean([recall_at(f, w) for f, w in zip(found, wanted, strict=True)]) >= 0.97
    labels = np.array([3, 700, 1_499], dtype=np.int64)
    assert np.array_equal(held.reconstruct_batch(labels), vectors[labels]), "read back whole"
    assert np.array_equal(held.reconstruct(700), vectors[700])
    assert held.similarities(queries[0], labels) == pytest.approx(
        vectors[labels] @ queries[0], abs=1e-6
    )


def test_a_hit_whose_whole_vector_is_not_found_keeps_its_estimate() -> None:
    vectors = clustered(1_500)
    held = cold_through_graph(vectors, WholeVectors(vectors, missing=frozenset({5})))
    sims, found = held.search(vectors[[5]], 3)
    assert found[0, 0] == 5, "still found, by its 4-bit estimate"
    assert sims[0, 0] == pytest.approx(1.0, abs=0.1) and sims[0, 0] != pytest.approx(1.0)
    assert held.similarities(vectors[6], np.array([5, 6])) == pytest.approx(
        [vectors[5] @ vectors[6], 1.0], abs=(0.1)
    )


def test_a_cold_channel_is_scored_from_rocksdb_through_the_server(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    """Through the real server, model and RocksDB: a large channel gone cold is searched
    through a 4-bit graph, each hit scored with the vector RocksDB keeps, also after a
    restart (the graph restored)."""
    texts = [
        f"Note {i}: the {colour} crate on shelf {i % 37} holds {i * 3} {thing}."
        for i, (colour, thing) in enumerate(
            zip(
                ["red", "blue", "green", "amber", "grey", "white"] * 200,
                ["bolts", "cables", "lamps", "gears", "valves", "fuses", "hinges"] * 172,
                strict=False,
            )
        )
    ]
    assert len(texts) > SETTLED
    clock = ManualClock(1_780_000_000.0)
    config = ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=0, approximate_above=300)
    query = embedder.embed_queries(["which crate holds the fuses on shelf 12?"])[0]

    def cold_hits(server: ServerThread) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        view = server.server.runtime.engine.channels.find("cold")
        deadline = time.monotonic() + 60
        while True:
            with view.lock:
                cold = dict(view.index.vectors.held()).get(COLD)
                if cold is not None and cold.approximate:
                    labels, sims = view.index.dense(query, 20)
                    ids = view.index.memory_ids(labels)
                    break
            assert time.monotonic() < deadline, "the cold tier's graph was not built"
            time.sleep(0.05)
        assert cold.precision == "int4"
        stored, found = server.server.runtime.engine._store.get_vectors("cold", ids)
        assert found.all()
        return labels, sims, stored @ query

    server = ServerThread(config, clock, lambda: embedder)
    try:
        with CalorClient(server.target, channel="cold") as client:
            client.store_many(texts, memory_type="semantic")
            clock.advance(120 * DAY)  # heat 1/16: cold, still live
            assert client.dream().retiered == len(texts)
        _, sims, exact = cold_hits(server)
        assert sims == pytest.approx(exact, abs=1e-5)
    finally:
        server.stop()
    again = ServerThread(config, clock, lambda: embedder)
    try:
        _, sims, exact = cold_hits(again)
        assert sims == pytest.approx(exact, abs=1e-5)
    finally:
        again.stop()


def test_an_index_that_reads_whole_vectors_is_freed_as_soon_as_it_is_let_go() -> None:
    """The server's loaded objects are frozen out of the cycle collector's view: an
    unloaded or dropped channel's index must go by reference counting alone, so reading
    whole vectors holds no reference back to it."""
    vectors = clustered(50)
    index = ChannelIndex(DIM, whole=lambda ids: (vectors[: len(ids)], np.ones(len(ids), bool)))
    gone = weakref.ref(index)
    collecting = gc.isenabled()
    gc.disable()
    try:
        del index
        assert gone() is None
    finally:
        if collecting:
            gc.enable()
