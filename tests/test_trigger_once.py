"""Trigger actions happen once across crashes (issue 18): an internal action commits in
the same batch as the dispatcher's cursor advance and its fire count; a webhook goes
through a durable outbox, at least once, always under its idempotency key."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.commands import NewMemory
from calor.server.engine.changes import Changes, commit
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.storage.ops import PutKey
from calor.server.storage.store import Keys, MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from calor.triggers.engine import TriggerEngine
from calor.triggers.outbox import pending_deliveries
from calor.triggers.registry import Firing, TriggerRegistry
from calor.triggers.rules import TriggerRule
from calor.triggers.webhook import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, WebhookPolicy
from calor.triggers.webhook import verify_signature as verify
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.helpers import CrashAfter, trigger_rule

CHANNEL = "once"
SECRET = "s3cret"


# --- a webhook receiver ---------------------------------------------------------------


@dataclass
class Receiver:
    """A loopback HTTP server that answers 204 and keeps every request it got."""

    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def keys(self) -> list[str]:
        with self.lock:
            return [headers.get(IDEMPOTENCY_HEADER, "") for headers, _ in self.requests]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with found.lock:
                found.requests.append((dict(self.headers.items()), body))
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    found.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield found
    server.shutdown()
    server.server_close()
    thread.join(5)


def check_requests(receiver: Receiver) -> Counter[str]:
    """Every request carries its idempotency key, in the header and in the signed body;
    returns how many requests each key got."""
    with receiver.lock:
        requests = list(receiver.requests)
    for headers, body in requests:
        key = headers.get(IDEMPOTENCY_HEADER)
        assert key, f"a webhook request without {IDEMPOTENCY_HEADER}: {headers}"
        assert json.loads(body)["idempotency_key"] == key
        assert verify(body, SECRET, headers[SIGNATURE_HEADER])
    return Counter(headers[IDEMPOTENCY_HEADER] for headers, _ in requests)


# --- in process, with a crash injected at the storage seam ------------------------------


def rule(name: str, action: str, **config: str) -> TriggerRule:
    return trigger_rule(id=name, channel=CHANNEL, action=action, config=config)


async def _to_thread(function: Callable[..., Any], *args: object) -> Any:
    return await asyncio.to_thread(function, *args)


def run_triggers(
    store: Any, memories: MemoryEngine, policy: WebhookPolicy, done: Callable[[], bool]
) -> None:
    """Run a trigger engine over ``store`` until ``done()`` (or 10 s), then stop it."""

    async def main() -> None:
        engine = TriggerEngine(store, memories, SystemClock(), _to_thread, policy)
        # The decay scheduler's watermark is no part of the experiment: it goes around the
        # crash, so that the budget counts the dispatcher's batches alone.
        engine.registry._store = getattr(store, "_store", store)
        await engine.start()
        try:
            deadline = time.monotonic() + 10
            while not done() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)  # let a wrong second firing show itself
        finally:
            await engine.stop()

    asyncio.run(main())


@dataclass
class Setup:
    path: Path
    embedder: OnnxEmbedder
    store: MemoryStore
    memories: MemoryEngine
    memory_id: str
    seq: int

    def reopen(self) -> None:
        self.store.close()
        self.store = MemoryStore.open(
            self.path, model_id=self.embedder.model_id, dim=self.embedder.dim
        )
        self.memories = MemoryEngine.open(self.store, SystemClock(), ChannelPolicy())

    def crashing(self, budget: int) -> CrashAfter:
        wrapped = CrashAfter(self.store, budget)
        # Every batch a trigger's action writes: a notify's (the engine's own) and a
        # boost's or a tag's (its edits').
        self.memories._store = wrapped  # type: ignore[assignment,unused-ignore]
        self.memories.edits._store = wrapped  # type: ignore[assignment,unused-ignore]
        return wrapped

    def events(self, trigger_id: str) -> list[tuple[str, int]]:
        """(kind, cause seq) of every logged event the trigger caused."""
        return [
            (e.kind, int(e.payload["cause_seq"]))
            for e in self.store.events_after(0, 10_000)
            if e.trigger_id == trigger_id
        ]

    def cursor(self) -> Any:
        raw = self.store.get(Keys.CURSOR)
        return None if raw is None else json.loads(raw)

    def fires(self, trigger_id: str) -> int:
        raw = self.store.get(Keys.fire_counter(CHANNEL, trigger_id))
        return 0 if raw is None else int(json.loads(raw)["fires"])


def keep(store: MemoryStore, write: PutKey) -> None:
    """Commit one bookkeeping write."""
    change = Changes("")
    change.keep([write])
    commit(store, [change])


@pytest.fixture
def setup(embedder: OnnxEmbedder, tmp_path: Path) -> Iterator[Callable[..., Setup]]:
    """A store with triggers registered, one memory stored, and the cursor before it."""

    def make(*rules: TriggerRule) -> Setup:
        store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
        registry = TriggerRegistry(store)
        for each in rules:
            registry.add(each)
        keep(store, PutKey(Keys.CURSOR, b'{"seq": 0, "done": []}'))  # nothing handled yet
        memories = MemoryEngine.open(store, SystemClock(), ChannelPolicy())
        text = "The invoice for March was paid."
        vectors = np.asarray(embedder.embed_passages([text]))
        [stored] = memories.store([NewMemory(channel=CHANNEL, text=text)], vectors)
        made.append(Setup(tmp_path, embedder, store, memories, stored.record.id, store.last_seq))
        return made[-1]

    made: list[Setup] = []
    yield make
    for each in made:
        each.store.close()


INTERNAL = (
    rule("a-boost", "boost", delta="-0.2"),
    rule("b-tag", "tag", key="k", value="v"),
    rule("c-notify", "notify", message="saw {text}"),
)
KINDS = {"a-boost": "on_boost", "b-tag": "tag", "c-notify": "notify"}


@pytest.mark.parametrize("budget", [0, 1, 2, 3])
def test_an_internal_action_and_its_cursor_advance_are_durable_together(
    setup: Callable[..., Setup], budget: int
) -> None:
    """Three rules on one event; the process dies after ``budget`` commits of the
    dispatcher. What reached the disk is whole firings, each with the cursor moved past
    it; after the restart the rest fire, and nothing fires twice."""
    world = setup(*INTERNAL)
    before = world.memories.inspect(CHANNEL, world.memory_id)[0].record
    policy = WebhookPolicy(allowed_hosts=frozenset())
    crash = world.crashing(budget)
    run_triggers(crash, world.memories, policy, lambda: crash.refused > 0)
    world.reopen()

    fired = [r.id for r in INTERNAL][:budget]
    record = world.memories.inspect(CHANNEL, world.memory_id)[0].record
    assert (record.heat0 < before.heat0 - 0.1) == ("a-boost" in fired)
    assert (record.tags.get("k") == "v") == ("b-tag" in fired)
    for each in INTERNAL:  # each action is there with its count, or neither is
        expected = [(KINDS[each.id], world.seq)] if each.id in fired else []
        assert world.events(each.id) == expected
        assert world.fires(each.id) == len(expected)
        assert len(list(TriggerRegistry(world.store).history(CHANNEL, each.id))) == len(expected)
    assert world.cursor() == (
        {"seq": world.seq - 1, "done": fired} if fired else {"seq": 0, "done": []}
    )
    boosted = record.heat0

    registry = TriggerRegistry(world.store)
    run_triggers(
        world.store,
        world.memories,
        policy,
        lambda: (
            all(world.fires(r.id) for r in INTERNAL)
            and (world.cursor() or {"seq": 0})["seq"] >= world.seq
        ),
    )
    for each in INTERNAL:
        assert world.events(each.id) == [(KINDS[each.id], world.seq)]
        assert world.fires(each.id) == 1
        [firing] = registry.history(CHANNEL, each.id)
        assert firing.seq == world.seq
    record = world.memories.inspect(CHANNEL, world.memory_id)[0].record
    assert record.tags.get("k") == "v"
    assert record.heat0 == pytest.approx(before.heat0 - 0.2, abs=0.01)  # boosted once
    if budget:  # before the crash, and not again
        assert record.heat0 == boosted


def test_a_chain_commits_its_event_with_the_cursor_and_its_target_fires_once(
    setup: Callable[..., Setup],
) -> None:
    chain = rule("a-chain", "chain", trigger_id="z-pin")
    target = replace(rule("z-pin", "pin"), event="on_recall")  # fires through the chain only
    world = setup(chain, target)
    crash = world.crashing(1)  # the chain's batch commits, then the process dies
    policy = WebhookPolicy(allowed_hosts=frozenset())
    run_triggers(crash, world.memories, policy, lambda: crash.refused > 0)
    world.reopen()
    assert [kind for kind, _ in world.events("a-chain")] == ["chain"]
    assert world.events("z-pin") == []
    assert world.cursor() == {"seq": world.seq - 1, "done": ["a-chain"]}

    run_triggers(world.store, world.memories, policy, lambda: world.fires("z-pin") > 0)
    assert world.events("a-chain") == [("chain", world.seq)]
    assert world.events("z-pin") == [("pin", world.seq)]  # the cause is the store
    assert (world.fires("a-chain"), world.fires("z-pin")) == (1, 1)
    assert world.memories.inspect(CHANNEL, world.memory_id)[0].record.keystone


@pytest.mark.parametrize("budget", [0, 1])
def test_a_webhook_is_in_the_outbox_with_the_cursor_and_sent_again_after_a_crash(
    setup: Callable[..., Setup], receiver: Receiver, budget: int
) -> None:
    """0: the process dies before the delivery is durable: nothing was sent, nothing
    counted, the cursor did not move. 1: it dies after sending but before logging the
    outcome: the delivery is still in the outbox and goes again, under the same key."""
    world = setup(rule("w-hook", "webhook", url=receiver.url, secret=SECRET))
    key = f"w-hook:{world.seq}"
    policy = WebhookPolicy(allowed_hosts=frozenset({f"127.0.0.1:{receiver.port}"}))
    crash = world.crashing(budget)
    run_triggers(
        crash,
        world.memories,
        policy,
        lambda: crash.refused >= 2 and (budget == 0 or len(receiver.keys()) > 0),
    )
    world.reopen()
    pending = pending_deliveries(world.store)
    if budget == 0:
        assert (pending, receiver.keys(), world.cursor(), world.fires("w-hook")) == (
            [],
            [],
            {"seq": 0, "done": []},
            0,
        )
    else:
        assert [d.key for d in pending] == [key]
        assert receiver.keys() == [key]
        assert world.cursor() == {"seq": world.seq - 1, "done": ["w-hook"]}
        assert world.fires("w-hook") == 1
    assert world.events("w-hook") == []  # no outcome logged yet

    run_triggers(world.store, world.memories, policy, lambda: not pending_deliveries(world.store))
    assert receiver.keys() == [key] * (budget + 1)
    assert check_requests(receiver) == {key: budget + 1}
    assert world.events("w-hook") == [("webhook", world.seq)]
    assert world.fires("w-hook") == 1
    [firing] = TriggerRegistry(world.store).history(CHANNEL, "w-hook")
    assert firing.outcome.startswith("delivered")


def test_the_history_goes_on_after_a_restart_without_overwriting(tmp_path: Path) -> None:
    store = MemoryStore.open(tmp_path, model_id="test", dim=4)
    registry = TriggerRegistry(store)
    registry.add(rule("h-notify", "notify"))
    for seq in (5, 5, 6):  # two firings for one cause move the next one's key on
        keep(
            store,
            registry.history_entry(CHANNEL, Firing("h-notify", "m", 0.0, f"before {seq}", seq)),
        )
    store.close()
    store = MemoryStore.open(tmp_path, model_id="test", dim=4)
    registry = TriggerRegistry(store)
    registry.load()
    keep(store, registry.history_entry(CHANNEL, Firing("h-notify", "m", 0.0, "after 7", 7)))
    outcomes = [f.outcome for f in registry.history(CHANNEL, "h-notify")]
    store.close()
    assert outcomes == ["before 5", "before 5", "before 6", "after 7"]


# --- the real thing: kill -9 under trigger load ---------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CalorProcess:
    """``calor serve`` as a child process on one port, killed and restarted at will."""

    def __init__(self, data_dir: Path, allow: list[str]) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.command = [str(Path(sys.executable).with_name("calor")), "serve"]
        self.command += ["--data-dir", str(data_dir / "data"), "--port", str(self.port)]
        for entry in allow:
            self.command += ["--webhook-allow", entry]
        self.log_path = data_dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it and wait until it is SERVING; returns the seconds that took."""
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
        request = health_pb2.HealthCheckRequest(service="")
        with grpc.insecure_channel(self.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.process.poll() is not None:
                    raise AssertionError(f"server exited:\n{self.log_tail()}")
                try:
                    if health.Check(request, timeout=1).status == SERVING:
                        return time.monotonic() - started
                except grpc.RpcError:
                    pass
                assert time.monotonic() - started < 60, "not SERVING after 60 s"
                time.sleep(0.05)

    def kill(self) -> None:
        """kill -9, and reap it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])


SERVING = health_pb2.HealthCheckResponse.SERVING


def drive(target: str, stop: threading.Event, prefix: str, acked: list[str]) -> None:
    """Store notes until the server goes away (or ``stop``); the acked ids go to ``acked``."""
    with grpc.insecure_channel(target) as channel:
        stub = MemoryServiceStub(channel)
        while not stop.is_set():
            text = f"{prefix} note {len(acked)}: the heron came back to the pond at dawn."
            try:
                reply = stub.Store(pb.StoreRequest(channel=CHANNEL, text=text), timeout=5)
            except grpc.RpcError:
                return
            acked.append(reply.memory.id)


BOOSTED, TAGGED, NOTIFIED = tpb.EVENT_KIND_ON_BOOST, tpb.EVENT_KIND_TAG, tpb.EVENT_KIND_NOTIFY
CHAINED, DEPRECATED, SENT = tpb.EVENT_KIND_CHAIN, tpb.EVENT_KIND_DEPRECATE, tpb.EVENT_KIND_WEBHOOK
STORED = tpb.EVENT_KIND_ON_STORE


def history(triggers: TriggerServiceStub, trigger_id: str) -> list[tpb.TriggerFiring]:
    """Every firing of a trigger, page by page."""
    firings: list[tpb.TriggerFiring] = []
    token = ""
    while True:
        page = triggers.TriggerHistory(
            tpb.TriggerHistoryRequest(trigger_id=trigger_id, page_token=token)
        )
        firings.extend(page.firings)
        token = page.next_page_token
        if not token:
            return firings


def read_log(triggers: TriggerServiceStub) -> list[tpb.Event]:
    """Every event of the channel, read through Subscribe from the start of the log."""
    events: list[tpb.Event] = []
    call = triggers.Subscribe(tpb.SubscribeRequest(channels=[CHANNEL], after_seq=0), timeout=3)
    try:
        for reply in call:
            events.append(reply.event)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
    return events


@pytest.mark.timeout(300)
def test_kill_9_under_trigger_load_repeats_no_firing(tmp_path: Path, receiver: Receiver) -> None:
    """20 random kill -9 while stores fire boost, tag, notify, chain (→ deprecate) and
    webhook triggers: afterwards every internal firing happened exactly once per cause,
    and every webhook request carried its idempotency key."""
    began = time.monotonic()
    refused_port = free_port()
    # localhost is allowed by name, but not the loopback address it resolves to: the
    # refused webhook is created, fires, and is refused at delivery.
    server = CalorProcess(tmp_path, [f"127.0.0.1:{receiver.port}", f"localhost:{refused_port}"])
    server.start()
    with grpc.insecure_channel(server.target) as channel:
        triggers = TriggerServiceStub(channel)

        def create(name: str, action: int, event: int = tpb.EVENT_KIND_ON_STORE, **kw: Any) -> str:
            trigger = tpb.Trigger(id=name, channel=CHANNEL, event=event, action=action, **kw)
            triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=trigger))
            return name

        internal = {
            create("t1-boost", tpb.ACTION_KIND_BOOST, config={"delta": "0.01"}): BOOSTED,
            create("t2-tag", tpb.ACTION_KIND_TAG, config={"key": "seen", "value": "y"}): TAGGED,
            create("t3-notify", tpb.ACTION_KIND_NOTIFY, config={"message": "saw {text}"}): NOTIFIED,
            create("t4-chain", tpb.ACTION_KIND_CHAIN, config={"trigger_id": "t5-deprecate"}): (
                CHAINED
            ),
            # Fires only through the chain: the channel sees no recall.
            create(
                "t5-deprecate", tpb.ACTION_KIND_DEPRECATE, event=tpb.EVENT_KIND_ON_RECALL
            ): DEPRECATED,
        }
        hook = create(
            "t6-hook", tpb.ACTION_KIND_WEBHOOK, config={"url": receiver.url, "secret": SECRET}
        )
        refused = create(
            "t7-refused",
            tpb.ACTION_KIND_WEBHOOK,
            config={"url": f"http://localhost:{refused_port}/hook"},
            max_fires=1,
        )

    rng = random.Random(18)
    kills, restarts, acked = 0, list[float](), list[str]()
    for round_ in range(20):
        stop = threading.Event()
        driver = threading.Thread(target=drive, args=(server.target, stop, f"r{round_}", acked))
        driver.start()
        time.sleep(rng.uniform(0.2, 0.9))
        server.kill()
        kills += 1
        stop.set()
        driver.join(10)
        restarts.append(server.start())

    killing = time.monotonic() - began
    with grpc.insecure_channel(server.target) as channel:
        triggers, memories = TriggerServiceStub(channel), MemoryServiceStub(channel)
        stored = memories.Identity(pb.IdentityRequest(channel=CHANNEL)).total
        wanted = [*internal, hook]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the restarted server catches up on the log
            listed = triggers.ListTriggers(tpb.ListTriggersRequest(channel=CHANNEL)).triggers
            fires = {t.id: t.fires for t in listed}
            if all(fires[t] >= stored for t in wanted) and len(history(triggers, hook)) >= stored:
                break
            time.sleep(0.2)
        settling = time.monotonic() - began - killing
        events = read_log(triggers)
        histories = {t: sorted(f.seq for f in history(triggers, t)) for t in wanted}
        [refusal] = history(triggers, refused)
    server.kill()

    causes = sorted(e.seq for e in events if e.kind == STORED)
    assert kills == 20 and len(causes) == stored
    assert set(acked) <= {e.memory_id for e in events if e.kind == STORED}
    assert len(causes) > 100, "too little load to mean anything"
    for trigger_id, kind in {**internal, hook: SENT}.items():
        fired = [int(e.payload["cause_seq"]) for e in events if e.trigger_id == trigger_id]
        repeats = [seq for seq, n in Counter(fired).items() if n > 1]
        assert not repeats, f"{trigger_id} fired twice for causes {repeats[:10]}"
        assert sorted(fired) == causes, f"{trigger_id} missed causes"
        assert {e.kind for e in events if e.trigger_id == trigger_id} == {kind}
    assert fires == {**dict.fromkeys(wanted, len(causes)), refused: 1}
    assert histories == dict.fromkeys(wanted, causes)  # TriggerHistory: once per cause
    keys = check_requests(receiver)
    assert set(keys) == {f"{hook}:{seq}" for seq in causes}
    assert "(a loopback address)" in refusal.outcome
    elapsed = time.monotonic() - began
    print(
        f"\n{kills} kills, {len(causes)} stores ({len(acked)} acked), "
        f"{sum(keys.values()) - len(keys)} webhook repeats (same key), "
        f"restart {max(restarts):.2f}s max; kills {killing:.1f}s, catching up {settling:.1f}s, "
        f"total {elapsed:.1f}s"
    )
