"""Cluster mode, first part: the JetStream write log is the truth, each node's RocksDB a
view of it. Three real ``nats-server`` processes (JetStream, clustered, the log kept on
all three) and real ``calor serve --cluster`` nodes on loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import rocksdict

from calor.server.storage.logged import LoggedBatch, entry_operations, replay
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.calor_process import CalorProcess
from tests.nats_cluster import NatsCluster

CHANNEL = "fleet"
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = NatsCluster(tmp_path_factory.mktemp("nats"))
    cluster.start()
    yield cluster
    cluster.stop()


class Node:
    """One ``calor serve --cluster`` process and a stub on it."""

    def __init__(self, nats: NatsCluster, data_dir: Path, name: str) -> None:
        self.process = CalorProcess(
            data_dir,
            data_dir.parent / f"{name}.log",
            "--cluster",
            ",".join(nats.urls),
            "--node-id",
            name,
        )
        self._channel: grpc.Channel | None = None

    def __enter__(self) -> Node:
        self.process.start()
        self._channel = grpc.insecure_channel(self.process.target)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._channel is not None:
            self._channel.close()
        self.process.close()

    @property
    def stub(self) -> MemoryServiceStub:
        assert self._channel is not None
        return MemoryServiceStub(self._channel)

    def store(self, text: str) -> str:
        request = pb.StoreRequest(channel=CHANNEL, text=text)
        return str(self.stub.Store(request, timeout=TIMEOUT).memory.id)

    def texts(self) -> dict[str, str]:
        """Every live memory of the channel: id -> text."""
        request = pb.ListMemoriesRequest(channel=CHANNEL, page_size=1000)
        page = self.stub.ListMemories(request, timeout=TIMEOUT)
        return {m.id: m.text for m in page.memories}

    def recall(self, query: str) -> list[str]:
        request = pb.RecallRequest(channel=CHANNEL, query=query, limit=3, peek=True)
        return [hit.memory.text for hit in self.stub.Recall(request, timeout=TIMEOUT).hits]


FACTS = [
    "The staging database moved to a host in Frankfurt in March.",
    "Maria prefers short status reports on Friday afternoons.",
    "The deploy pipeline fails when the cache volume is full.",
    "Our on-call rotation changes every Tuesday at nine.",
]


def test_a_node_rebuilt_from_the_log_alone_holds_every_acknowledged_write(
    nats: NatsCluster, tmp_path: Path
) -> None:
    with Node(nats, tmp_path / "a", "a") as first:
        ids = {first.store(text): text for text in FACTS}
        forgotten = next(iter(ids))
        request = pb.ForgetRequest(channel=CHANNEL, ids=[forgotten])
        assert first.stub.Forget(request, timeout=TIMEOUT).forgotten == 1
        first.process.kill()  # kill -9: nothing is flushed or said on the way out
    # A new node on an empty disk: everything it holds comes from the write log.
    with Node(nats, tmp_path / "b", "b") as second:
        live = {i: t for i, t in ids.items() if i != forgotten}
        assert second.texts() == live
        assert second.recall("how does Maria like her status reports?")[0] == FACTS[1]
        inspect = pb.InspectRequest(channel=CHANNEL, id=forgotten)
        assert (
            second.stub.Inspect(inspect, timeout=TIMEOUT).memory.state
            == memory_pb2.MEMORY_STATE_DELETED
        )


def test_a_node_that_was_away_catches_up_with_what_others_wrote_meanwhile(
    nats: NatsCluster, tmp_path: Path
) -> None:
    with Node(nats, tmp_path / "a", "a") as first:
        ids = {first.store(text): text for text in FACTS[:2]}
        first.process.stop()
    with Node(nats, tmp_path / "b", "b") as second:
        before = second.texts()
        ids.update({second.store(text): text for text in FACTS[2:]})
        second.process.stop()
    with Node(nats, tmp_path / "a", "a") as again:  # its own store, behind the log
        after = again.texts()
    assert set(ids) <= set(after)
    assert set(after) - set(before) >= set(ids) - set(before)
    assert {after[i] for i in ids} == set(FACTS)


def test_a_node_that_has_not_seen_the_latest_entries_refuses_writes_instead_of_forking(
    nats: NatsCluster, tmp_path: Path
) -> None:
    with Node(nats, tmp_path / "a", "a") as first, Node(nats, tmp_path / "b", "b") as second:
        second.store("A write the first node has not applied.")  # second caught up last
        with pytest.raises(grpc.RpcError) as refused:
            first.store("A write made on a stale view.")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "catch up" in (refused.value.details() or "")
        assert "A write made on a stale view." not in first.texts().values()
        assert "A write made on a stale view." not in second.texts().values()
    with Node(nats, tmp_path / "c", "c") as fresh:  # what the log holds
        texts = set(fresh.texts().values())
    assert "A write the first node has not applied." in texts
    assert "A write made on a stale view." not in texts


def test_writes_go_on_with_one_nats_server_killed(nats: NatsCluster, tmp_path: Path) -> None:
    with Node(nats, tmp_path / "a", "a") as node:
        try:
            nats.kill(2)  # the log keeps a quorum on the other two
            stored = {node.store(f"Entry {n} written with a log server down."): n for n in range(5)}
        finally:
            nats.start_server(2)
        node.process.kill()
    with Node(nats, tmp_path / "b", "b") as fresh:
        assert set(stored) <= set(fresh.texts())


def test_a_log_entry_replays_to_the_same_keys(tmp_path: Path) -> None:
    options = rocksdict.Options(raw_mode=True)
    written = rocksdict.Rdict(str(tmp_path / "written"), options)
    rebuilt = rocksdict.Rdict(str(tmp_path / "rebuilt"), options)
    for db in (written, rebuilt):
        db[b"k:old"] = b"stale"
        db[b"r:1"] = b"one"
        db[b"r:2"] = b"two"
    logged = LoggedBatch(rocksdict.WriteBatch(raw_mode=True))
    logged.put(b"k:new", b"\x00binary\xff")
    logged.delete(b"k:old")
    logged.delete_range(b"r:", b"r;")
    logged.put(b"r:3", b"three")  # after the range: order matters
    written.write(logged.batch)
    again = rocksdict.WriteBatch(raw_mode=True)
    replay(again, logged.entry())
    rebuilt.write(again)
    assert (
        dict(rebuilt.items())
        == dict(written.items())
        == {
            b"k:new": b"\x00binary\xff",
            b"r:3": b"three",
        }
    )
    assert [kind for kind, _, _ in entry_operations(logged.entry())] == [b"P", b"D", b"R", b"P"]
    written.close()
    rebuilt.close()
