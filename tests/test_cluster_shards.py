"""Cluster mode with several shards: each channel belongs to one shard (a stable hash of
its name), each shard to one node at a time; the nodes share the shards out evenly, a
dead node's shards move to the others and it takes its share back when it returns.
Three real ``nats-server`` processes and real ``calor serve --cluster`` nodes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from calor.server.api.routing import shard_of
from calor.server.cluster.local import NatsServers, free_port
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.calor_process import CalorProcess
from tests.cluster_nodes import TIMEOUT, Node, nats_cluster

SHARDS = 6
CHANNELS = [f"agent-{n}" for n in range(12)]
_T = TypeVar("_T")


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServers]:
    yield from nats_cluster(tmp_path_factory)


class ShardNode(Node):
    """A node of the sharded cluster, with its metrics served."""

    def __init__(self, nats: NatsServers, data_dir: Path, name: str) -> None:
        self.metrics_port = free_port()
        options = ("--shards", str(SHARDS), "--metrics-port", str(self.metrics_port))
        super().__init__(nats, data_dir, name, *options)

    def metrics(self) -> list[str]:
        """This node's metrics, line by line, as it serves them now."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return list(answer.read().decode().splitlines())

    def subscribers(self) -> float:
        """The open subscriptions this node's metrics count."""
        return next(
            float(line.split()[-1])
            for line in self.metrics()
            if line.startswith("calor_subscribers ")
        )

    def owned(self) -> set[int]:
        """The shards this node's metrics say it owns."""
        lines = self.metrics()
        prefix = 'calor_cluster_owner{shard="'
        return {
            int(line[len(prefix) :].split('"')[0])
            for line in lines
            if line.startswith(prefix) and float(line.split()[-1]) == 1
        }

    def store_in(self, channel: str, text: str) -> str:
        request = pb.StoreRequest(channel=channel, text=text, idempotency_key=text)
        return retrying(lambda: str(self.stub.Store(request, timeout=TIMEOUT).memory.id))

    def texts_of(self, channel: str) -> set[str]:
        request = pb.ListMemoriesRequest(channel=channel, page_size=1000)
        page = retrying(lambda: self.stub.ListMemories(request, timeout=TIMEOUT))
        return {memory.text for memory in page.memories}


def retrying(call: Callable[[], _T], within: float = 20.0) -> _T:
    """``call``, again while no node serves the shard (a handover or a takeover)."""
    give_up = time.monotonic() + within
    while True:
        try:
            return call()
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > give_up:
                raise
            time.sleep(0.1)


def balanced(nodes: list[ShardNode], within: float = 60.0) -> list[set[int]]:
    """Wait until the nodes own every shard between them, each its even share."""
    give_up = time.monotonic() + within
    while True:
        owned = [node.owned() for node in nodes]
        every = sorted(shard for shards in owned for shard in shards)
        even = {len(shards) for shards in owned} == {SHARDS // len(nodes)}
        if every == list(range(SHARDS)) and even:
            return owned
        assert time.monotonic() < give_up, f"the shards were never shared out: {owned}"
        time.sleep(0.2)


def test_nodes_share_the_shards_out_answer_for_every_channel_and_take_a_dead_ones_share(
    nats: NatsServers, tmp_path: Path
) -> None:
    assert len({shard_of(channel, SHARDS) for channel in CHANNELS}) > 3  # they do spread
    with (
        ShardNode(nats, tmp_path / "a", "a") as a,
        ShardNode(nats, tmp_path / "b", "b") as b,
    ):
        with ShardNode(nats, tmp_path / "c", "c") as c:
            nodes = [a, b, c]
            balanced(nodes)
            for n, channel in enumerate(CHANNELS):
                nodes[n % 3].store_in(channel, f"{channel} before c died")
            for node in nodes:
                for channel in CHANNELS:
                    assert f"{channel} before c died" in node.texts_of(channel)
            # A node that does not own a channel's shard names the owner it forwarded to.
            channel = CHANNELS[0]
            owner = next(n for n in nodes if shard_of(channel, SHARDS) in n.owned())
            other = next(n for n in nodes if n is not owner)
            request = pb.ListMemoriesRequest(channel=channel, page_size=10)
            _, call = other.stub.ListMemories.with_call(request, timeout=TIMEOUT)
            assert dict(call.trailing_metadata() or ())["calor-owner"] == owner.process.target
            c.process.kill()  # kill -9: its leases are not given up
        started = time.monotonic()
        for channel in CHANNELS:  # every channel answers again, through the survivors
            a.store_in(channel, f"{channel} while c was away")
        recovered = time.monotonic() - started
        assert recovered < 10, f"the shards took {recovered:.1f} s to move"
        balanced([a, b])
        with ShardNode(nats, tmp_path / "c", "c") as back:  # its disk, behind the logs
            owned = balanced([a, b, back])
            assert len(owned[2]) == SHARDS // 3  # its share, taken back
            for channel in CHANNELS:
                expected = {f"{channel} before c died", f"{channel} while c was away"}
                assert expected <= back.texts_of(channel)


def test_a_stream_across_shards_is_refused_and_a_node_of_another_shard_count_cannot_join(
    nats: NatsServers, tmp_path: Path
) -> None:
    first = CHANNELS[0]
    second = next(c for c in CHANNELS if shard_of(c, SHARDS) != shard_of(first, SHARDS))
    with ShardNode(nats, tmp_path / "a", "a") as a:
        balanced([a])  # the only node: it owns every shard
        mixed = [
            pb.StoreStreamRequest(
                store=pb.StoreRequest(channel=channel, text=f"Mixed into {channel}.")
            )
            for channel in (first, second)
        ]
        with pytest.raises(grpc.RpcError) as cut:
            a.stub.StoreStream(iter(mixed), timeout=TIMEOUT)
        assert cut.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "one shard" in (cut.value.details() or "")
        assert f"Mixed into {second}." not in a.texts_of(second)  # not in the first's store
    other = CalorProcess(
        tmp_path / "odd",
        tmp_path / "odd.log",
        "--cluster",
        ",".join(nats.urls),
        "--node-id",
        "odd",
        "--shards",
        str(SHARDS + 1),
    )
    with pytest.raises(AssertionError, match="exited while starting"):
        other.start()
    assert other.wait() == 1
    assert f"the cluster has {SHARDS} shards" in other.log_tail()


FACTS = {
    "ops": [
        "The deploy pipeline fails when the build cache volume is full.",
        "Rotate the deploy keys for the staging cluster every ninety days.",
        "Maria runs the Friday deploy review at four.",
    ],
    "infra": [
        "The cache volume of the build runners holds forty gigabytes.",
        "A full disk on the build runners stops every deploy pipeline.",
        "The staging cluster lives in Frankfurt.",
    ],
    "people": [
        "Tom prefers short status reports.",
        "The deploy pipeline owner is the platform team.",
        "Lunch is at noon on Tuesdays.",
    ],
}
QUERY = "why does the deploy pipeline fail when the cache is full"


def ranked_alone(tmp_path: Path, channels: dict[str, str], request: pb.RecallRequest) -> Any:
    """How one embedded node answers ``request`` with the same memories (``channels``:
    FACTS' group → its channel)."""
    embedded = CalorProcess(tmp_path / "embedded", tmp_path / "embedded.log")
    embedded.start()
    try:
        with grpc.insecure_channel(embedded.target) as connection:
            alone = MemoryServiceStub(connection)
            for group, channel in channels.items():
                for text in FACTS[group]:
                    alone.Store(pb.StoreRequest(channel=channel, text=text), timeout=TIMEOUT)
            return alone.Recall(request, timeout=TIMEOUT)
    finally:
        embedded.close()


def queries_embedded(nodes: list[ShardNode]) -> float:
    """Model runs for queries so far, over every node."""
    total = 0.0
    for node in nodes:
        url = f"http://127.0.0.1:{node.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            lines = answer.read().decode().splitlines()
        prefix = 'calor_embedding_batch_size_count{kind="query"}'
        total += sum(float(line.split()[-1]) for line in lines if line.startswith(prefix))
    return total


def test_recalls_and_shares_across_shards_answer_as_one_node_would(
    nats: NatsServers, tmp_path: Path
) -> None:
    teams = [f"team-{n}" for n in range(12)]  # channels of this test alone
    own = teams[0]
    with (
        ShardNode(nats, tmp_path / "a", "a") as a,
        ShardNode(nats, tmp_path / "b", "b") as b,
        ShardNode(nats, tmp_path / "c", "c") as c,
    ):
        nodes = [a, b, c]
        owned = balanced(nodes)
        owner_of = {shard: n for n, shards in enumerate(owned) for shard in shards}
        # Two further channels of two other shards, whose owners are other nodes.
        further: list[str] = []
        for channel in teams:
            shard = shard_of(channel, SHARDS)
            taken = {shard_of(c, SHARDS) for c in [own, *further]}
            if shard not in taken and owner_of[shard] != owner_of[shard_of(own, SHARDS)]:
                further.append(channel)
        further = further[:2]
        channels = dict(zip(FACTS, [own, *further], strict=True))
        peek = pb.RecallRequest(channel=own, channels=further, query=QUERY, limit=5, peek=True)
        expected = ranked_alone(tmp_path, channels, peek)
        for n, (group, channel) in enumerate(channels.items()):
            for text in FACTS[group]:
                nodes[n % 3].store_in(channel, text)
        # Asked of a node that does not own the recalling channel's shard: forwarded to
        # its owner, which asks the owners of the further channels' shards.
        asking = next(n for n in nodes if shard_of(own, SHARDS) not in n.owned())
        request = pb.RecallRequest(channel=own, channels=further, query=QUERY, limit=5)
        embedded_before = queries_embedded(nodes)
        answer = retrying(lambda: asking.stub.Recall(request, timeout=TIMEOUT))
        # The query was embedded once, by the recalling channel's owner, which asked the
        # other owners with its embedding.
        assert queries_embedded(nodes) - embedded_before == 1
        assert [(h.memory.text, h.memory.channel, h.band) for h in answer.hits] == [
            (h.memory.text, h.memory.channel, h.band) for h in expected.hits
        ]
        assert [h.score for h in answer.hits] == pytest.approx(
            [h.score for h in expected.hits], abs=1e-4
        )
        assert {h.memory.channel for h in answer.hits} > {own}  # other shards' hits among them
        assert answer.recall_id
        # The recalling channel's best hit was recalled; the other shards' only ranked.
        counts = {
            hit.memory.text: asking.stub.Inspect(
                pb.InspectRequest(channel=hit.memory.channel, id=hit.memory.id), timeout=TIMEOUT
            ).memory.recall_count
            for hit in answer.hits
        }
        best_own = next(h.memory.text for h in answer.hits if h.memory.channel == own)
        assert counts[best_own] == 1
        assert all(counts[h.memory.text] == 0 for h in answer.hits if h.memory.channel != own)
        # The recall was logged with every hit: feedback may name another shard's.
        foreign = next(h.memory.id for h in answer.hits if h.memory.channel != own)
        feedback = pb.FeedbackRequest(
            channel=own,
            recall_id=answer.recall_id,
            rating=pb.FEEDBACK_RATING_HELPFUL,
            memory_ids=[foreign],
        )
        rated = asking.stub.Feedback(feedback, timeout=TIMEOUT)
        assert sum(rated.helpful_by_type.values()) == 1
        # A memory shared into a channel of another shard: a copy of its own there.
        best = answer.hits[0].memory
        target = next(c for c in further if c != best.channel)
        share = pb.ShareRequest(channel=best.channel, id=best.id, target_channel=target)
        copy = asking.stub.Share(share, timeout=TIMEOUT).memory
        assert (copy.channel, copy.text) == (target, f"[Shared by {best.channel}] {best.text}")
        assert dict(copy.provenance)["shared_from_id"] == best.id
        again = pb.RecallRequest(channel=target, query=QUERY, limit=1, peek=True)
        assert asking.stub.Recall(again, timeout=TIMEOUT).hits[0].memory.id == copy.id
        forgotten = pb.ForgetRequest(channel=best.channel, ids=[best.id])
        assert asking.stub.Forget(forgotten, timeout=TIMEOUT).forgotten == 1
        with pytest.raises(grpc.RpcError) as gone:
            asking.stub.Share(share, timeout=TIMEOUT)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def test_one_subscription_follows_every_shard_and_resumes_on_another_node(
    nats: NatsServers, tmp_path: Path
) -> None:
    stored, notified = tpb.EVENT_KIND_ON_STORE, tpb.EVENT_KIND_NOTIFY
    quoted = CHANNELS[0]
    with (
        ShardNode(nats, tmp_path / "a", "a") as a,
        ShardNode(nats, tmp_path / "b", "b") as b,
    ):
        balanced([a, b])
        trigger = tpb.Trigger(
            channel=quoted,
            event=stored,
            action=tpb.ACTION_KIND_NOTIFY,
            config={"message": "stored: {text}"},
        )
        retrying(lambda: b.triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=trigger)))
        # Every channel, every shard: one stream, numbered by the cluster's events stream.
        start = tpb.SubscribeRequest(kinds=[stored, notified])
        ids = {
            b.store_in(channel, f"A secret of {channel}, told once."): channel
            for channel in CHANNELS
        }
        # Each node relays its shards' events to the stream: no subscriber of its own.
        assert (a.subscribers(), b.subscribers()) == (0, 0)
        stream = a.triggers.Subscribe(start, timeout=TIMEOUT)
        seen = []
        for response in stream:
            seen.append(response.event)
            got = {e.memory_id for e in seen if e.kind == stored}
            if set(ids) <= got and any(e.kind == notified for e in seen):
                break
        assert (a.subscribers(), b.subscribers()) == (1, 0)  # counted where it is open
        stream.cancel()
        seqs = [event.seq for event in seen]
        assert seqs == sorted(set(seqs))  # in order, once each
        assert {e.channel for e in seen if e.kind == stored} >= set(CHANNELS)
        secret = next(i for i, channel in ids.items() if channel == quoted)
        assert any(e.kind == notified and "told once" in e.message for e in seen)
        # Resumed on the other node after the last event seen: the next ones, nothing again.
        more = {b.store_in(channel, f"{channel} later on."): channel for channel in CHANNELS[:3]}
        resumed = b.triggers.Subscribe(
            tpb.SubscribeRequest(kinds=[stored], after_seq=seqs[-1]), timeout=TIMEOUT
        )
        after = []
        for response in resumed:
            after.append(response.event)
            if set(more) <= {e.memory_id for e in after}:
                break
        resumed.cancel()
        assert all(event.seq > seqs[-1] for event in after)
        # A window of the stream's history ends by itself at until_seq.
        window = tpb.SubscribeRequest(kinds=[stored], after_seq=seqs[0], until_seq=seqs[-1])
        windowed = [r.event.seq for r in b.triggers.Subscribe(window, timeout=TIMEOUT)]
        assert windowed == [e.seq for e in seen if e.kind == stored and e.seq > seqs[0]]
        # Forgotten: the events that quoted its text leave the events stream.
        forget = pb.ForgetRequest(channel=quoted, ids=[secret])
        assert retrying(lambda: b.stub.Forget(forget, timeout=TIMEOUT)).forgotten == 1
        give_up = time.monotonic() + 10
        while True:
            replay = a.triggers.Subscribe(
                tpb.SubscribeRequest(kinds=[notified], channels=[quoted]), timeout=2.0
            )
            messages: list[str] = []
            try:
                for response in replay:
                    messages.append(response.event.message)
            except grpc.RpcError as error:  # the deadline: the replay is all there is
                assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if not any("told once" in message for message in messages):
                break
            assert time.monotonic() < give_up, "the quoting event stayed in the events stream"
            time.sleep(0.2)


def test_triggers_named_by_id_or_listed_without_a_channel_are_asked_of_every_shard(
    nats: NatsServers, tmp_path: Path
) -> None:
    watched = CHANNELS[1:5]
    assert len({shard_of(channel, SHARDS) for channel in watched}) > 1
    with (
        ShardNode(nats, tmp_path / "a", "a") as a,
        ShardNode(nats, tmp_path / "b", "b") as b,
    ):
        balanced([a, b])
        for channel in watched:
            trigger = tpb.Trigger(
                id=f"watch-{channel}",
                channel=channel,
                event=tpb.EVENT_KIND_ON_STORE,
                action=tpb.ACTION_KIND_NOTIFY,
                config={"message": "seen"},
            )
            request = tpb.CreateTriggerRequest(trigger=trigger)
            retrying(lambda request=request: b.triggers.CreateTrigger(request, timeout=TIMEOUT))
        for channel in watched:
            a.store_in(channel, f"A note kept in {channel}.")
        names: list[str] = []
        token = ""
        while True:  # pages of 2 over every shard's channels, in name order, none twice
            channels = pb.ListChannelsRequest(page_size=2, page_token=token)
            pages = retrying(lambda ask=channels: b.stub.ListChannels(ask, timeout=TIMEOUT))
            assert len(pages.channels) <= 2
            names += pages.channels
            token = pages.next_page_token
            if not token:
                break
        assert set(watched) <= set(names) and names == sorted(set(names))
        listed: list[str] = []
        while True:  # pages of 2 over every shard's triggers, in id order, none twice
            ask = tpb.ListTriggersRequest(page_size=2, page_token=token)
            page = retrying(lambda ask=ask: a.triggers.ListTriggers(ask, timeout=TIMEOUT))
            assert len(page.triggers) <= 2
            listed += [trigger.id for trigger in page.triggers]
            token = page.next_page_token
            if not token:
                break
        assert {f"watch-{channel}" for channel in watched} <= set(listed)
        assert listed == sorted(set(listed))
        a.store_in(watched[0], "Something the watch sees.")
        history = tpb.TriggerHistoryRequest(trigger_id=f"watch-{watched[0]}")
        give_up = time.monotonic() + 10
        while not retrying(lambda: b.triggers.TriggerHistory(history, timeout=TIMEOUT)).firings:
            assert time.monotonic() < give_up, "the trigger's firing was not found"
            time.sleep(0.1)
        delete = tpb.DeleteTriggerRequest(id=f"watch-{watched[1]}")
        assert retrying(lambda: a.triggers.DeleteTrigger(delete, timeout=TIMEOUT)).deleted
        with pytest.raises(grpc.RpcError) as gone:
            a.triggers.DeleteTrigger(delete, timeout=TIMEOUT)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        remaining = a.triggers.ListTriggers(tpb.ListTriggersRequest(), timeout=TIMEOUT)
        assert f"watch-{watched[1]}" not in {t.id for t in remaining.triggers}
