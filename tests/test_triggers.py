"""Triggers and subscriptions end to end (DESIGN §7): the event log, resume, decay timing,
chains, webhooks, and a subscriber that stops reading."""

from __future__ import annotations

import http.server
import json
import queue
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock
from calor.server.config import ServerConfig
from calor.server.events import EventRecord
from calor.triggers.webhook import verify_signature
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import EPISODIC, store, ts

ON_STORE = tpb.EVENT_KIND_ON_STORE
NOTIFY = tpb.EVENT_KIND_NOTIFY


@pytest.fixture(scope="module")
def triggers(grpc_channel: grpc.Channel) -> TriggerServiceStub:
    return TriggerServiceStub(grpc_channel)


class Listener:
    """A Subscribe stream read on a thread into a queue."""

    def __init__(self, stub: TriggerServiceStub, request: tpb.SubscribeRequest) -> None:
        self.call = stub.Subscribe(request)
        self.events: queue.Queue[tpb.Event] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for reply in self.call:
                self.events.put(reply.event)
        except grpc.RpcError as error:
            self.error = error

    def take(self, count: int, timeout: float = 10.0) -> list[tpb.Event]:
        return [self.events.get(timeout=timeout) for _ in range(count)]

    def close(self) -> None:
        self.call.cancel()
        self._thread.join(5)


def create(stub: TriggerServiceStub, **fields: object) -> tpb.Trigger:
    return stub.CreateTrigger(tpb.CreateTriggerRequest(trigger=tpb.Trigger(**fields))).trigger  # type: ignore[arg-type]


def test_subscribers_resume_after_seq_without_gap_or_duplicate(
    memories: MemoryServiceStub, triggers: TriggerServiceStub, channel_name: str
) -> None:
    wanted = tpb.SubscribeRequest(channels=[channel_name], kinds=[ON_STORE])
    first = Listener(triggers, wanted)
    time.sleep(0.2)
    stored = [store(memories, channel_name, f"First batch note {i}.").id for i in range(3)]
    events = first.take(3)
    assert [e.memory_id for e in events] == stored
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    first.close()
    missed = [store(memories, channel_name, f"While away {i}.").id for i in range(5)]
    wanted.after_seq = events[-1].seq
    second = Listener(triggers, wanted)
    replayed = second.take(5)
    assert [e.memory_id for e in replayed] == missed
    live = store(memories, channel_name, "Live again.").id
    assert second.take(1)[0].memory_id == live
    time.sleep(0.3)
    assert second.events.empty()
    second.close()


def test_notify_trigger_logs_its_event_and_history(
    memories: MemoryServiceStub, triggers: TriggerServiceStub, channel_name: str
) -> None:
    rule = create(
        triggers,
        channel=channel_name,
        event=ON_STORE,
        action=tpb.ACTION_KIND_NOTIFY,
        filter_pattern="invoice",
        config={"message": "saw {text}"},
    )
    listener = Listener(triggers, tpb.SubscribeRequest(channels=[channel_name], kinds=[NOTIFY]))
    time.sleep(0.2)
    store(memories, channel_name, "Lunch was great.")
    paid = store(memories, channel_name, "The invoice was paid.")
    event = listener.take(1)[0]
    listener.close()
    assert (event.trigger_id, event.memory_id, event.message) == (
        rule.id,
        paid.id,
        "saw The invoice was paid.",
    )
    history = triggers.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=rule.id)).firings
    assert [(f.memory_id, f.outcome) for f in history] == [(paid.id, "notified")]
    listed = triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers
    assert [(t.id, t.fires) for t in listed] == [(rule.id, 1)]
    dry = triggers.EvaluateTriggers(
        tpb.EvaluateTriggersRequest(channel=channel_name, event=ON_STORE, memory_id=paid.id)
    )
    assert [m.trigger.id for m in dry.matches] == [rule.id]
    assert dry.matches[0].would == "notify: saw The invoice was paid.", "rendered as it is sent"
    triggers.DeleteTrigger(tpb.DeleteTriggerRequest(id=rule.id))
    assert not triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers


def test_on_decay_fires_at_the_crossing(
    memories: MemoryServiceStub,
    triggers: TriggerServiceStub,
    grpc_channel: grpc.Channel,
    channel_name: str,
) -> None:
    SettingsServiceStub(grpc_channel).UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=channel_name,
            settings=memory_pb2.ChannelSettings(
                profiles=[
                    memory_pb2.TypeProfile(
                        memory_type=EPISODIC, half_life_seconds=10.0, floor=0.01, stability_gain=1.5
                    )
                ]
            ),
            update_mask=FieldMask(paths=["profiles"]),
        )
    )
    rule = create(
        triggers,
        channel=channel_name,
        event=tpb.EVENT_KIND_ON_DECAY,
        action=tpb.ACTION_KIND_NOTIFY,
        threshold=0.5,
    )
    listener = Listener(triggers, tpb.SubscribeRequest(channels=[channel_name], kinds=[NOTIFY]))
    time.sleep(0.2)
    stored_at = time.time()
    memory = store(memories, channel_name, "A fast-fading episode.", memory_type=EPISODIC)
    event = listener.take(1, timeout=20)[0]
    elapsed = time.time() - stored_at
    listener.close()
    assert (event.trigger_id, event.memory_id) == (rule.id, memory.id)
    assert 9.0 <= elapsed <= 11.0, elapsed


def test_a_chain_cycle_fires_a_bounded_number_of_times(
    memories: MemoryServiceStub, triggers: TriggerServiceStub, channel_name: str
) -> None:
    a, b = f"{channel_name}-a"[-60:], f"{channel_name}-b"[-60:]
    create(
        triggers,
        id=a,
        channel=channel_name,
        event=ON_STORE,
        action=tpb.ACTION_KIND_CHAIN,
        config={"trigger_id": b},
    )
    create(
        triggers,
        id=b,
        channel=channel_name,
        event=ON_STORE,
        action=tpb.ACTION_KIND_CHAIN,
        config={"trigger_id": a},
    )
    store(memories, channel_name, "One store to start them.")
    deadline = time.time() + 5
    while time.time() < deadline:
        fires = {
            t.id: t.fires
            for t in triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers
        }
        if fires.get(a) and fires.get(b):
            break
        time.sleep(0.1)
    time.sleep(0.5)
    fires = {
        t.id: t.fires
        for t in triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers
    }
    assert 1 <= fires[a] <= 2 and 1 <= fires[b] <= 2, fires
    reply = memories.Recall(pb.RecallRequest(channel=channel_name, query="start", peek=True))
    assert reply.hits


def test_a_boost_trigger_on_boost_does_not_loop(
    memories: MemoryServiceStub, triggers: TriggerServiceStub, channel_name: str
) -> None:
    rule = create(
        triggers,
        channel=channel_name,
        event=tpb.EVENT_KIND_ON_BOOST,
        action=tpb.ACTION_KIND_BOOST,
        config={"delta": "0.01"},
    )
    memory = store(memories, channel_name, "Boost me once.", memory_type=EPISODIC)
    memories.Boost(pb.BoostRequest(channel=channel_name, id=memory.id, delta=-0.5))
    time.sleep(1.0)
    listed = triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers
    assert [t.fires for t in listed if t.id == rule.id] == [1]
    heat = memories.Inspect(pb.InspectRequest(channel=channel_name, id=memory.id)).memory.heat
    assert heat == pytest.approx(0.51, abs=0.005)


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Hook.received = []
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def test_webhooks_reach_only_allowed_hosts_and_are_signed(
    start_server: Callable[..., ServerThread], hook_server: str
) -> None:
    server = start_server(webhook_allow=(urlsplit(hook_server).netloc,))
    with grpc.insecure_channel(server.target) as channel:
        stub, hooks = MemoryServiceStub(channel), TriggerServiceStub(channel)
        allowed = create(
            hooks,
            channel="w",
            event=ON_STORE,
            action=tpb.ACTION_KIND_WEBHOOK,
            config={"url": hook_server, "secret": "s3cret"},
        )
        with pytest.raises(grpc.RpcError) as refused:  # another host: refused at creation
            create(
                hooks,
                channel="w",
                event=ON_STORE,
                action=tpb.ACTION_KIND_WEBHOOK,
                config={"url": hook_server.replace("127.0.0.1", "localhost")},
            )
        memory = store(stub, "w", "Tell the webhook about this.")
        deadline = time.time() + 10
        while (
            time.time() < deadline
            and not hooks.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=allowed.id)).firings
        ):
            time.sleep(0.1)
        [ok] = hooks.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=allowed.id)).firings
        listed = hooks.ListTriggers(tpb.ListTriggersRequest(channel="w")).triggers
    assert ok.outcome.startswith("delivered")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "localhost" in (refused.value.details() or "")
    assert [t.id for t in listed] == [allowed.id]
    [(headers, body)] = _Hook.received
    assert verify_signature(body, "s3cret", headers["X-Calor-Signature"])
    assert json.loads(body)["memory"]["id"] == memory.id
    key = f"{allowed.id}:{json.loads(body)['event_seq']}"
    assert headers["Idempotency-Key"] == json.loads(body)["idempotency_key"] == key


def _read_until_error(call: Iterator[tpb.SubscribeResponse]) -> tuple[list[int], grpc.RpcError]:
    seqs: list[int] = []
    try:
        for reply in call:
            seqs.append(reply.event.seq)
    except grpc.RpcError as error:
        return seqs, error
    raise AssertionError("the stream ended without a status")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stalled_subscriber_is_cut_off_bounded_and_resumes_with_everything(
    start_server: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = start_server(sync_writes=False, subscriber_queue=1024)
    engine = server.server.runtime.engine
    # Fifty queues' worth: held in memory they would take well over the 4 MB bound.
    total = 50_000
    with grpc.insecure_channel(server.target) as channel:
        stub = TriggerServiceStub(channel)
        call = stub.Subscribe(tpb.SubscribeRequest(channels=["stress"]))
        engine.log(EventRecord(kind="notify", channel="stress", at=time.time(), message="start"))
        first = next(call).event.seq
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for start in range(0, total, 1000):  # the subscriber reads nothing meanwhile
            engine.log(
                *(
                    EventRecord(kind="notify", channel="stress", at=time.time(), message=str(n))
                    for n in range(start, start + 1000)
                )
            )
        hub = server.server._shard.triggers.hub  # type: ignore[union-attr]
        deadline = time.time() + 120
        while hub.published_seq < first + total and time.time() < deadline:
            time.sleep(0.1)  # the dispatcher publishes everything (slowly, under load)
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
        tracemalloc.stop()
        assert grown < 4 * 1024 * 1024, f"server heap grew {grown} bytes"
        seqs, error = _read_until_error(call)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        last = seqs[-1]
        assert f"after_seq={last}" in (error.details() or "")
        trailing = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
        assert trailing["calor-last-seq"] == str(last)
        rest = stub.Subscribe(tpb.SubscribeRequest(channels=["stress"], after_seq=last))
        for reply in rest:
            seqs.append(reply.event.seq)
            if reply.event.message == str(total - 1):
                break
        rest.cancel()
    assert seqs == list(range(first + 1, first + 1 + total))


def test_decay_crossings_missed_while_down_fire_late_after_restart(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    clock = ManualClock(1_780_000_000.0)
    config = ServerConfig(data_dir=tmp_path, port=0)
    first = ServerThread(config, clock, lambda: embedder)
    with grpc.insecure_channel(first.target) as channel:
        rule = create(
            TriggerServiceStub(channel),
            channel="late",
            event=tpb.EVENT_KIND_ON_DECAY,
            action=tpb.ACTION_KIND_NOTIFY,
            threshold=0.5,
        )
        memory = store(
            MemoryServiceStub(channel), "late", "Fades while we are away.", memory_type=EPISODIC
        )
        time.sleep(1.5)  # the scheduler notes how far it has looked
    first.stop()
    clock.advance(2 * 86_400.0)  # the crossing (one half-life) falls while the server is down
    second = ServerThread(config, clock, lambda: embedder)
    try:
        with grpc.insecure_channel(second.target) as channel:
            stub = TriggerServiceStub(channel)
            listener = Listener(stub, tpb.SubscribeRequest(channels=["late"], kinds=[NOTIFY]))
            event = listener.take(1)[0]
            listener.close()
            history = stub.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=rule.id)).firings
    finally:
        second.stop()
    assert (event.trigger_id, event.memory_id, event.payload["late"]) == (
        rule.id,
        memory.id,
        "true",
    )
    assert [(f.memory_id, f.late) for f in history] == [(memory.id, True)]


def test_the_log_keeps_what_retention_allows(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server(event_retention=5)
    with grpc.insecure_channel(server.target) as channel:
        MemoryServiceStub(channel).StoreStream(
            iter(
                pb.StoreStreamRequest(store=pb.StoreRequest(channel="keep", text=f"Row {n}."))
                for n in range(12)
            )
        )
        # Retention trims once the dispatcher has handled the events, just after the
        # store is acknowledged: replay from the start until the trim shows.
        deadline = time.time() + 10
        while True:
            listener = Listener(TriggerServiceStub(channel), tpb.SubscribeRequest(after_seq=0))
            replayed = listener.take(5)
            time.sleep(0.3)
            listener.close()
            if replayed[0].seq != 1 or time.time() > deadline:
                break
    assert [e.seq for e in replayed] == list(range(8, 13))
    assert listener.events.empty()


def wait_for_fires(stub: TriggerServiceStub, trigger_id: str, count: int) -> None:
    deadline = time.time() + 10
    while time.time() < deadline:
        if (
            len(stub.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=trigger_id)).firings)
            >= count
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"trigger {trigger_id} did not fire {count} time(s)")


def test_pin_tag_deprecate_and_neighbour_boost_act_on_memories(
    memories: MemoryServiceStub, triggers: TriggerServiceStub, channel_name: str
) -> None:
    ch = channel_name
    pin = create(
        triggers, channel=ch, event=ON_STORE, action=tpb.ACTION_KIND_PIN, filter_pattern="^always"
    )
    tag = create(
        triggers,
        channel=ch,
        event=ON_STORE,
        action=tpb.ACTION_KIND_TAG,
        filter_memory_type=memory_pb2.MEMORY_TYPE_FACT,
        config={"key": "reviewed", "value": "no"},
    )
    old = create(
        triggers,
        channel=ch,
        event=tpb.EVENT_KIND_ON_RECALL,
        action=tpb.ACTION_KIND_DEPRECATE,
        filter_pattern="legacy",
    )
    near = create(
        triggers,
        channel=ch,
        event=tpb.EVENT_KIND_ON_RECALL,
        action=tpb.ACTION_KIND_BOOST,
        filter_pattern="hub",
        config={"target": "neighbours", "delta": "0.1"},
    )
    pinned = store(
        memories, ch, "Always wear the badge.", memory_type=EPISODIC, tags={"session": "a"}
    )
    fact = store(
        memories, ch, "The badge office is on floor 2.", memory_type=memory_pb2.MEMORY_TYPE_FACT
    )
    legacy = store(
        memories,
        ch,
        "The legacy badge system used magnetic strips.",
        memory_type=EPISODIC,
        tags={"session": "b"},
    )
    hub = store(
        memories, ch, "The hub of the badge network.", memory_type=EPISODIC, tags={"session": "c"}
    )
    neighbour = store(
        memories,
        ch,
        "Quarterly revenue rose.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - 86_400.0),
        tags={"session": "d"},
    )
    memories.Connect(pb.ConnectRequest(channel=ch, from_id=hub.id, to_id=neighbour.id))
    wait_for_fires(triggers, pin.id, 1)
    wait_for_fires(triggers, tag.id, 1)
    memories.Recall(pb.RecallRequest(channel=ch, query="legacy badge magnetic strips", limit=1))
    memories.Recall(pb.RecallRequest(channel=ch, query="hub of the badge network", limit=1))
    wait_for_fires(triggers, old.id, 1)
    wait_for_fires(triggers, near.id, 1)

    def read(memory_id: str) -> memory_pb2.Memory:
        return memories.Inspect(pb.InspectRequest(channel=ch, id=memory_id)).memory

    assert read(pinned.id).keystone
    assert read(fact.id).tags["reviewed"] == "no"
    assert read(legacy.id).tags["deprecated"] == "true"
    assert read(legacy.id).heat <= 0.05, "a deprecated memory is cooled"
    recalled = memories.Recall(
        pb.RecallRequest(channel=ch, query="legacy badge magnetic strips", peek=True)
    )
    assert legacy.id not in [h.memory.id for h in recalled.hits], "out of default recall"
    # 0.5, + resonance from the recalled hub (0.3 · its heat 1.0), + the trigger's 0.1
    assert read(neighbour.id).heat == pytest.approx(0.9, abs=0.01)
