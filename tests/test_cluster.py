"""Cluster mode: the JetStream write log is the truth and each node's RocksDB a view of
it; one node at a time owns the store (a lease), the others forward calls to it and take
it over when its lease lapses. Three real ``nats-server`` processes (JetStream,
clustered, the log and the lease kept on all three) and real ``calor serve --cluster``
nodes on loopback.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import rocksdict

from calor.server.cluster.connection import NatsConnection, bucket_config
from calor.server.cluster.jetstream import JetStreamLog
from calor.server.cluster.local import NatsServers as NatsCluster
from calor.server.cluster.local import free_port
from calor.server.cluster.placement import BUCKET as PLACEMENT
from calor.server.cluster.placement import Lease, Owner
from calor.server.storage.logged import LoggedBatch, entry_operations, replay
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.calor_process import CalorProcess
from tests.cluster_nodes import CHANNEL, TIMEOUT, Node, nats_cluster, owner_and_other
from tests.tls_certs import make_tls_files


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from nats_cluster(tmp_path_factory)


FACTS = [
    "The staging database moved to a host in Frankfurt in March.",
    "Maria prefers short status reports on Friday afternoons.",
    "The deploy pipeline fails when the cache volume is full.",
    "Our on-call rotation changes every Tuesday at nine.",
]


def test_a_node_rebuilt_from_the_log_alone_takes_over_with_every_acknowledged_write(
    nats: NatsCluster, tmp_path: Path
) -> None:
    with Node(nats, tmp_path / "a", "a") as first:
        first.answering()
        ids = {first.store(text): text for text in FACTS}
        forgotten = next(iter(ids))
        request = pb.ForgetRequest(channel=CHANNEL, ids=[forgotten])
        assert first.stub.Forget(request, timeout=TIMEOUT).forgotten == 1
        first.process.kill()  # kill -9: its lease is not given up, it lapses
    # A new node on an empty disk: everything it holds comes from the write log.
    with Node(nats, tmp_path / "b", "b") as second:
        second.answering()
        live = {i: t for i, t in ids.items() if i != forgotten}
        assert second.texts() == live
        assert second.recall("how does Maria like her status reports?")[0] == FACTS[1]
        inspect = pb.InspectRequest(channel=CHANNEL, id=forgotten)
        tombstone = second.stub.Inspect(inspect, timeout=TIMEOUT).memory
        assert tombstone.state == memory_pb2.MEMORY_STATE_DELETED


def test_a_node_that_was_away_catches_up_with_what_others_wrote_meanwhile(
    nats: NatsCluster, tmp_path: Path
) -> None:
    with Node(nats, tmp_path / "a", "a") as first:
        first.answering()
        ids = {first.store(text): text for text in FACTS[:2]}
        first.process.stop()  # a clean stop gives the lease up at once
    with Node(nats, tmp_path / "b", "b") as second:
        second.answering()
        ids.update({second.store(text): text for text in FACTS[2:]})
        second.process.stop()
    with Node(nats, tmp_path / "a", "a") as again:  # its own store, behind the log
        again.answering()
        after = again.texts()
    assert {after[i] for i in ids} == set(FACTS)


def test_a_call_to_a_node_that_does_not_own_the_store_is_forwarded_to_the_owner(
    nats: NatsCluster, tmp_path: Path
) -> None:
    with owner_and_other(nats, tmp_path) as (owner, other):
        stored, call = other.stub.Store.with_call(
            pb.StoreRequest(channel=CHANNEL, text=FACTS[0]), timeout=TIMEOUT
        )
        trailing = dict(call.trailing_metadata() or ())
        assert trailing.get("calor-owner") == owner.process.target
        streamed = other.stub.StoreStream(
            iter(
                [
                    pb.StoreStreamRequest(store=pb.StoreRequest(channel=CHANNEL, text=t))
                    for t in FACTS[1:]
                ]
            ),
            timeout=TIMEOUT,
        )
        assert len(streamed.ids) == 3
        expected = {stored.memory.id, *streamed.ids}
        assert set(owner.texts()) >= expected
        assert set(other.texts()) >= expected
        assert other.recall("when does the on-call rotation change?")[0] == FACTS[3]
        bad = pb.StoreRequest(channel=CHANNEL, text="")
        with pytest.raises(grpc.RpcError) as refused:  # the owner's own answer, relayed
            other.stub.Store(bad, timeout=TIMEOUT)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_nodes_that_serve_mutual_tls_forward_to_each_other_over_it(
    nats: NatsCluster, tmp_path: Path
) -> None:
    (tmp_path / "tls").mkdir()
    tls = make_tls_files(tmp_path / "tls")
    options = ("--tls-cert", str(tls.node_cert), "--tls-key", str(tls.node_key))
    options += ("--tls-client-ca", str(tls.ca))  # every caller shows a certificate
    client = grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=tls.client_key.read_bytes(),
        certificate_chain=tls.client_cert.read_bytes(),
    )
    with Node(nats, tmp_path / "a", "a", *options, credentials=client) as owner:
        owner.answering()
        with Node(nats, tmp_path / "b", "b", *options, credentials=client) as other:
            stored, call = other.stub.Store.with_call(
                pb.StoreRequest(channel=CHANNEL, text=FACTS[2]), timeout=TIMEOUT
            )
            trailing = dict(call.trailing_metadata() or ())
            assert trailing.get("calor-owner") == owner.process.target
            assert stored.memory.id in owner.texts()
            with grpc.insecure_channel(other.process.target) as plain:  # still TLS only
                request = pb.ListMemoriesRequest(channel=CHANNEL, page_size=1)
                with pytest.raises(grpc.RpcError) as refused:
                    MemoryServiceStub(plain).ListMemories(request, timeout=5.0)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def cluster_gauges(port: int) -> dict[str, float]:
    """The ``calor_cluster_*`` gauges a node's metrics endpoint serves now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    pairs = (line.split() for line in lines if line.startswith("calor_cluster_"))
    return {name: float(value) for name, value in pairs}


def test_a_node_tells_its_metrics_whether_it_owns_the_store_and_how_far_it_follows(
    nats: NatsCluster, tmp_path: Path
) -> None:
    ports = [free_port(), free_port()]
    with Node(nats, tmp_path / "a", "a", "--metrics-port", str(ports[0])) as owner:
        owner.answering()
        with Node(nats, tmp_path / "b", "b", "--metrics-port", str(ports[1])) as other:
            other.store("Written through the node that forwards, followed by it.")
            owning, following = cluster_gauges(ports[0]), cluster_gauges(ports[1])
            owner_gauge, position = (
                'calor_cluster_owner{shard="0"}',
                'calor_cluster_log_position{shard="0"}',
            )
            assert (owning[owner_gauge], following[owner_gauge]) == (1, 0)
            end = owning[position]
            give_up = time.monotonic() + 10
            while cluster_gauges(ports[1])[position] < end:
                assert time.monotonic() < give_up, "the other node did not follow the log"
                time.sleep(0.1)


def test_an_owner_that_lost_its_lease_unknowing_cannot_write_and_forwards_instead(
    nats: NatsCluster, tmp_path: Path
) -> None:
    late = "Written on the old owner as it woke up."
    with owner_and_other(nats, tmp_path) as (first, second):
        kept = first.store("Written while the first node owned the store.")
        os.kill(first.process.pid, signal.SIGSTOP)  # frozen: it cannot renew its lease
        try:
            second.answering()  # the lease lapsed: the second node took the store over
            taken = second.store("Written after the second node took over.")
        finally:
            os.kill(first.process.pid, signal.SIGCONT)
        try:  # refused by the log's fence, or forwarded if it has stepped down already
            landed = [first.store(late)]
        except grpc.RpcError as refused:
            assert refused.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
            landed = []
        first.answering()  # it goes on, forwarding to the new owner (as it steps down it
        # may answer a moment that no node owns the store: call again, it says)
        forwarded = first.store("Written through the old owner once it stepped down.", within=30)
        texts = second.texts()
        assert first.process.process is not None and first.process.process.poll() is None
        said = first.process.log_tail(500)  # its lease loop or the log's fence noticed
        stepped_down = "lost the shard's lease" in said or "another node's entry" in said
        assert stepped_down or landed
    assert {kept, taken, forwarded, *landed} <= set(texts)
    assert list(texts.values()).count(late) == len(landed)


def test_a_subscriber_that_resumes_on_another_node_after_the_owner_died_misses_nothing(
    nats: NatsCluster, tmp_path: Path
) -> None:
    with owner_and_other(nats, tmp_path) as (first, second):
        events = "events"  # a channel no other test writes to
        stream = second.subscribe(events)  # forwarded to the owner
        ids = [first.store(text, events) for text in FACTS[:2]]
        seen = [next(stream).event]  # the second event is acknowledged, not yet read
        stream.cancel()
        first.process.kill()
        second.answering()
        # Its port refused connections: the lease was broken, not waited out.
        assert "refuses connections: its lease broken" in second.process.log_tail(500)
        ids += [second.store(text, events) for text in FACTS[2:]]
        resumed = second.subscribe(events, after_seq=seen[0].seq)
        seen += [next(resumed).event for _ in range(3)]
        resumed.cancel()
    assert [event.memory_id for event in seen] == ids
    assert [event.seq for event in seen] == sorted({event.seq for event in seen})


def test_nodes_behind_a_log_trimmed_after_snapshots_start_from_the_newest_snapshot(
    nats: NatsCluster, tmp_path: Path
) -> None:
    probe = NatsConnection.open(nats.urls)
    write_log = JetStreamLog(probe, 0)
    often = ("--snapshot-entries", "4")
    try:
        with Node(nats, tmp_path / "b", "b", *often) as early:
            early.answering()
            ids = {early.store("Written before the log was trimmed."): "early"}
            early.process.stop()
        left_at = write_log.bounds()[1]  # node b's disk holds the log up to here
        with Node(nats, tmp_path / "a", "a", *often) as owner:
            owner.answering()
            for n in range(100):  # a snapshot each 4 entries; the log trimmed to the one before
                ids[owner.store(f"Fact number {n} of the trimmed log.")] = str(n)
                if write_log.bounds()[0] > left_at + 1:
                    break
                time.sleep(0.2)
            assert write_log.bounds()[0] > left_at + 1, "the log was never trimmed"
            owner.process.kill()
    finally:
        probe.close()
    with Node(nats, tmp_path / "b", "b", *often) as behind:  # its disk, behind the log's start
        behind.answering()
        assert set(ids) <= set(behind.texts())
        with Node(nats, tmp_path / "c", "c") as empty:  # follows from the snapshot
            behind.process.kill()
            empty.answering()
            assert set(ids) <= set(empty.texts())
            assert "loaded the snapshot" in empty.process.log_tail(1000)


def test_a_node_refuses_to_join_on_a_store_of_the_embedded_server(
    nats: NatsCluster, tmp_path: Path
) -> None:
    data = tmp_path / "embedded"
    embedded = CalorProcess(data, tmp_path / "embedded.log")
    embedded.start()
    with grpc.insecure_channel(embedded.target) as channel:
        request = pb.StoreRequest(channel=CHANNEL, text="Known only to the embedded store.")
        MemoryServiceStub(channel).Store(request, timeout=TIMEOUT)
    assert embedded.stop() == 0
    joining = CalorProcess(
        data, tmp_path / "joining.log", "--cluster", ",".join(nats.urls), "--node-id", "late"
    )
    with pytest.raises(AssertionError, match="exited while starting"):
        joining.start()
    assert joining.wait() == 1
    assert "holds memories that are not in the cluster's write log" in joining.log_tail()


def test_writes_go_on_with_one_nats_server_killed(nats: NatsCluster, tmp_path: Path) -> None:
    with Node(nats, tmp_path / "a", "a") as node:
        node.answering()
        try:
            nats.kill(2)  # the log keeps a quorum on the other two
            stored = {node.store(f"Entry {n} written with a log server down."): n for n in range(5)}
        finally:
            nats.start_server(2)
        node.process.kill()
    with Node(nats, tmp_path / "b", "b") as fresh:
        fresh.answering()
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


def test_a_lease_changed_since_it_was_read_is_not_broken_and_not_tried_again(
    nats: NatsCluster,
) -> None:
    probe = NatsConnection.open(nats.urls, retry_seconds=5.0)
    try:
        shard = 97  # a lease of no node's shard
        holder = Lease.open(
            probe, shard, Owner("holder", "127.0.0.1:1"), lease_seconds=3, replicas=3
        )
        other = Lease.open(probe, shard, Owner("other", "127.0.0.1:2"), lease_seconds=3, replicas=3)
        assert holder.acquire()
        assert other.owner() == holder.me  # read: its revision is what a break names
        holder.release()  # the entry changes under it (as when it lapses or is renewed)
        assert other.break_() is False  # refused as stale, not retried until NATS gives up
        assert other.acquire()  # at once: asked of the leader, which has the release
    finally:
        probe.close()


def _break_and_take(taker: Lease, start: threading.Barrier, held: dict[str, bool]) -> None:
    """A node that saw the owner gone, at the same moment as another: it breaks the
    lease (the first delete wins) and takes it."""
    start.wait()
    taker.break_()
    held[taker.me.node_id] = taker.acquire()


def test_of_two_nodes_taking_a_dead_owners_lease_at_the_same_moment_one_holds_it(
    nats: NatsCluster,
) -> None:
    connections = [NatsConnection.open(nats.urls) for _ in range(3)]
    try:
        for shard in range(200, 220):  # leases of no node's shard
            dead = Owner("dead", "127.0.0.1:1")
            assert Lease.open(connections[0], shard, dead, lease_seconds=3, replicas=3).acquire()
            takers = [
                Lease.open(
                    connections[n],
                    shard,
                    Owner(f"taker-{n}", f"127.0.0.1:{n + 10}"),
                    lease_seconds=3,
                    replicas=3,
                )
                for n in (1, 2)
            ]
            # Reads come from any server of the bucket: one may not have the write yet.
            seen = time.monotonic() + 10
            while [taker.owner() for taker in takers] != [dead, dead]:
                assert time.monotonic() < seen, f"shard {shard}: the takers never saw the owner"
                time.sleep(0.01)
            start, held = threading.Barrier(2), {}
            racing = [
                threading.Thread(target=_break_and_take, args=(taker, start, held))
                for taker in takers
            ]
            for thread in racing:
                thread.start()
            for thread in racing:
                thread.join()
            assert sorted(held.values()) == [False, True], f"shard {shard}: {held}"
    finally:
        for connection in connections:
            connection.close()


def test_a_lease_write_that_landed_without_its_answer_still_counts_as_held(
    nats: NatsCluster,
) -> None:
    probe = NatsConnection.open(nats.urls)  # waits out an election (an earlier test's)
    try:
        me = Owner("lost-answer", "127.0.0.1:3")
        lease = Lease.open(probe, 96, me, lease_seconds=3, replicas=3)
        assert lease.acquire()
        # A renewal that JetStream took but whose answer never came back (its leader
        # changed meanwhile): the entry is at a revision this node was not told of.
        bucket = probe.key_value(bucket_config(PLACEMENT, 3, ttl=3), "placement")

        async def landed() -> int:  # read again if a server behind the leader answered
            entry = await bucket.get("shard-96")
            return await bucket.update("shard-96", me.to_bytes(), last=entry.revision)

        probe.persist(landed, "renew behind the lease's back")
        assert lease.renew()  # its own entry: held, not lost
        again = Lease.open(probe, 96, me, lease_seconds=3, replicas=3)
        assert again.acquire()  # a take whose answer was lost, tried again: held too
        other = Lease.open(probe, 96, Owner("other", "127.0.0.1:4"), lease_seconds=3, replicas=3)
        assert not other.acquire()  # another node's take is refused as before
    finally:
        probe.close()


def test_an_owner_whose_lease_lapsed_while_the_bucket_elected_a_leader_keeps_the_store(
    nats: NatsCluster, tmp_path: Path
) -> None:
    probe = NatsConnection.open(nats.urls)

    async def placement_leader() -> str:
        return str((await probe.js.stream_info(f"KV_{PLACEMENT}")).cluster.leader)

    ports = [free_port(), free_port()]
    owner_gauge = 'calor_cluster_owner{shard="0"}'
    try:
        with Node(nats, tmp_path / "a", "a", "--metrics-port", str(ports[0])) as owner:
            owner.answering()
            with Node(nats, tmp_path / "b", "b", "--metrics-port", str(ports[1])) as other:
                other.answering()
                kept = other.store("Written before the placement bucket lost its leader.")
                leader = int(probe.persist(placement_leader, "find the bucket's leader")[1:])
                nats.kill(leader)  # no renewal lands until one is elected: the lease lapses
                try:
                    give_up = time.monotonic() + 60
                    while True:
                        try:
                            after = other.store("Written once the bucket had a leader again.")
                            break
                        except grpc.RpcError:
                            assert time.monotonic() < give_up, owner.process.log_tail()
                            time.sleep(0.1)
                finally:
                    nats.start_server(leader)
                # The owner took its lapsed lease back; the other node, which saw it
                # free, did not take the store from a live owner.
                assert cluster_gauges(ports[0])[owner_gauge] == 1
                assert cluster_gauges(ports[1])[owner_gauge] == 0
                assert "lost the shard's lease" not in owner.process.log_path.read_text()
                assert {kept, after} <= set(other.texts())
    finally:
        probe.close()


def test_a_node_keeps_the_placement_buckets_leader_on_the_write_streams_server(
    nats: NatsCluster, tmp_path: Path
) -> None:
    probe = NatsConnection.open(nats.urls)

    async def leaders() -> tuple[str, str]:
        streams = ("CALOR_WRITES", "KV_calor_placement")
        return tuple([(await probe.js.stream_info(name)).cluster.leader for name in streams])

    def settle(apart: bool, within: float = 60.0) -> None:
        give_up = time.monotonic() + within
        while (len(set(now := probe.persist(leaders, "read the leaders"))) == 2) != apart:
            assert time.monotonic() < give_up, f"the leaders stayed {now}"
            if apart:  # the write stream's next leader is one of its other servers

                async def step_down() -> object:
                    subject = "$JS.API.STREAM.LEADER.STEPDOWN.CALOR_WRITES"
                    return await probe.client.request(subject, b"")

                probe.persist(step_down, "step the write stream's leader down")
            time.sleep(1.0)

    # A server restarted by an earlier test may still be catching up, and a replica that
    # is not current cannot be handed a leadership: start from a whole cluster.
    nats.wait_whole(timeout=120.0)
    try:
        with Node(nats, tmp_path / "a", "a") as node:
            node.answering()
            settle(apart=False)  # the node moved the placement bucket's leader there
            settle(apart=True)  # the write stream's leader moved elsewhere...
            settle(apart=False)  # ...and the placement bucket's followed it
            node.store("Written once the leaders are on one server again.")
        # The bucket takes writes again before the next test (a leader that stepped
        # down may leave it electing for a while).
        settled = Lease.open(
            probe, 95, Owner("settled", "127.0.0.1:5"), lease_seconds=3, replicas=3
        )
        assert settled.acquire()
        settled.release()
    finally:
        probe.close()


def test_nats_servers_start_on_fresh_ports_when_one_they_were_given_is_taken(
    tmp_path: Path,
) -> None:
    """A free port picked for a NATS server can be taken before the server binds it (by
    any process on the machine): the servers start again on fresh ports instead of
    waiting a minute for a server that exited."""
    servers = NatsCluster(tmp_path / "nats")
    taken = servers.route_ports[2]
    with socket.socket() as occupant:  # bound, not listening: nats-server cannot bind it
        occupant.bind(("127.0.0.1", taken))
        started = time.monotonic()
        try:
            servers.start()
            assert taken not in servers.route_ports, "its ports were picked again"
            assert time.monotonic() - started < 30
            assert all(
                process is not None and process.poll() is None for process in servers.processes
            )
        finally:
            servers.stop()
    assert "address already in use" in (tmp_path / "nats" / "n2.log").read_text()
