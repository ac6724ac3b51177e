"""Limits: message sizes, items per stream, subscriptions and requests per caller, deadlines,
and settings bounded to what a server can afford."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from calor.client import CalorClient
from calor.client._cli_limits import limit_settings
from calor.client.cli import _parser
from calor.client.errors import ResourceExhaustedError
from calor.models.embedder import OnnxEmbedder
from calor.server.api import auth_file
from calor.server.api.grants import Grants, parse_grant
from calor.server.api.limits import TokenBuckets, caller_name
from calor.server.clock import SystemClock
from calor.server.config import Limits, ServerConfig
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import store, total

# --- token buckets ------------------------------------------------------------------------


class Ticks:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_lets_a_burst_through_then_says_when_to_retry() -> None:
    clock = Ticks()
    buckets = TokenBuckets(rate=2.0, burst=3.0, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [None, None, None]
    assert buckets.take("a") == pytest.approx(0.5)
    clock.now += 0.25
    assert buckets.take("a") == pytest.approx(0.25)
    clock.now += 0.25
    assert buckets.take("a") is None
    assert buckets.take("b") is None  # every caller has a bucket of its own
    clock.now += 3600  # a bucket never holds more than a burst
    assert [buckets.take("a") for _ in range(4)][-1] == pytest.approx(0.5)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (math.inf, 1.0), (1.0, 0.5), (-1, 2)])
def test_a_bucket_needs_a_positive_rate_and_a_burst_of_one(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBuckets(rate, burst)


class _Peer:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


@pytest.mark.parametrize(
    ("peer", "name"),
    [
        ("ipv4:127.0.0.1:53122", "peer 127.0.0.1"),
        ("ipv6:[::1]:53122", "peer [::1]"),
        ("unix:/tmp/calor.sock", "peer unix:/tmp/calor.sock"),
    ],
)
def test_on_an_open_server_a_caller_is_its_host(peer: str, name: str) -> None:
    assert caller_name(_Peer(peer)) == name  # type: ignore[arg-type]


# --- rates over the wire ------------------------------------------------------------------


@pytest.fixture(scope="module")
def rated(start_server: Callable[..., ServerThread]) -> ServerThread:
    """A server that lets a caller make 3 requests and then one every 1,000 seconds."""
    return start_server(rate_per_key=0.001, rate_burst=3)


def _retry_delay(error: grpc.RpcError) -> float:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    [detail] = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    return float(info.retry_delay.ToTimedelta().total_seconds())


def test_over_its_rate_a_caller_is_told_when_to_retry(rated: ServerThread) -> None:
    with grpc.insecure_channel(rated.target) as channel:
        stub = MemoryServiceStub(channel)
        for _ in range(3):
            stub.Identity(pb.IdentityRequest(channel="rated"))
        with pytest.raises(grpc.RpcError) as caught:
            stub.Identity(pb.IdentityRequest(channel="rated"))
        error = caught.value
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "peer 127.0.0.1 is over its rate of 0.001 requests a second" in error.details()
        assert 900 < _retry_delay(error) <= 1000
        # Health is never limited: an orchestrator still sees the server SERVING.
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # The Python client hands the delay on; it does not retry by itself.
        with CalorClient(rated.target, channel="rated") as client:
            with pytest.raises(ResourceExhaustedError) as refused:
                client.identity()
        assert refused.value.retry_after is not None and refused.value.retry_after > 900


# --- caps ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def capped(start_server: Callable[..., ServerThread]) -> ServerThread:
    """A server with small caps: 64 KiB messages, 3 items a stream, 2 subscriptions."""
    return start_server(
        max_message_bytes=64 * 1024,
        max_subscriptions_per_key=2,
        limits=Limits(max_stream_items=3),
    )


@pytest.fixture
def capped_stub(capped: ServerThread) -> Iterator[MemoryServiceStub]:
    with grpc.insecure_channel(capped.target) as channel:
        yield MemoryServiceStub(channel)


def test_a_message_over_the_size_cap_is_refused(
    capped_stub: MemoryServiceStub, channel_name: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        store(capped_stub, channel_name, "x" * 100_000)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert total(capped_stub, channel_name) == 0


def test_a_page_over_the_size_cap_comes_back_in_pieces(
    capped_stub: MemoryServiceStub, channel_name: str
) -> None:
    for n in range(3):
        store(capped_stub, channel_name, f"chapter {n}: " + "lorem ipsum dolor " * 1500)
    pages = []
    request = pb.ListMemoriesRequest(channel=channel_name)
    while True:
        page = capped_stub.ListMemories(request)
        pages.append(page)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert len(pages) > 1 and all(p.truncated for p in pages[:-1])
    texts = [m.text for p in pages for m in p.memories]
    assert sorted(t.split(":")[0] for t in texts) == ["chapter 0", "chapter 1", "chapter 2"]
    assert all(p.ByteSize() <= 64 * 1024 for p in pages)


def _items(channel: str, count: int) -> Iterator[pb.StoreStreamRequest]:
    for n in range(count):
        yield pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel, text=f"item {n}"))


def test_store_stream_and_import_hold_to_the_same_item_cap(
    capped_stub: MemoryServiceStub, channel_name: str
) -> None:
    assert len(capped_stub.StoreStream(_items(channel_name, 3)).ids) == 3
    with pytest.raises(grpc.RpcError) as caught:
        capped_stub.StoreStream(_items(channel_name, 4))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than 3 items in one stream" in caught.value.details()
    notes = "".join(f"- imported note {n}\n" for n in range(4))
    for chunks in ([notes], [notes[:40], notes[40:]]):  # over the cap at the end, or midway
        with pytest.raises(grpc.RpcError) as caught:
            capped_stub.Import(pb.ImportRequest(channel=channel_name, markdown=c) for c in chunks)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "more than 3 memories in one import" in caught.value.details()
    assert total(capped_stub, channel_name) == 3


def test_a_caller_holds_at_most_its_cap_of_subscriptions(
    capped: ServerThread, capped_stub: MemoryServiceStub, channel_name: str
) -> None:
    store(capped_stub, channel_name, "something happened")
    with grpc.insecure_channel(capped.target) as channel:
        triggers = TriggerServiceStub(channel)
        request = tpb.SubscribeRequest(channels=[channel_name])
        first, second = triggers.Subscribe(request), triggers.Subscribe(request)
        for stream in (first, second):  # both are open on the server: each had an event
            assert next(stream).event.channel == channel_name
        with pytest.raises(grpc.RpcError) as caught:
            next(triggers.Subscribe(request))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "holds 2 open subscriptions, the most allowed" in caught.value.details()
        first.cancel()
        deadline = time.monotonic() + 30  # the server notices the cancel soon after
        while True:
            try:
                third = triggers.Subscribe(request)
                assert next(third).event.channel == channel_name
                break
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert time.monotonic() < deadline, "a cancelled subscription stayed counted"
                time.sleep(0.05)
        second.cancel()
        third.cancel()


# --- deadlines ----------------------------------------------------------------------------


class GatedEmbedder:
    """The real model, except that passages holding ``hold`` wait for the gate."""

    def __init__(self, embedder: OnnxEmbedder) -> None:
        self._embedder = embedder
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()
        self.seen: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._embedder, name)

    def embed_passages(self, texts: list[str]) -> np.ndarray:
        self.seen.extend(texts)
        if any("hold" in text for text in texts):
            self.waiting.set()
            self.gate.wait(timeout=60)
        return self._embedder.embed_passages(texts)


@pytest.fixture(scope="module")
def gated(embedder: OnnxEmbedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server of one worker thread (so work runs in the order it is queued) and one
    ingest run at a time (so a held chunk holds the model) whose model the test can hold."""
    model = GatedEmbedder(embedder)
    config = ServerConfig(
        data_dir=tmp_path_factory.mktemp("calor-deadlines"),
        host="127.0.0.1",
        port=0,
        workers=1,
        model_threads=1,
    )
    server = ServerThread(config, SystemClock(), lambda: model)  # type: ignore[arg-type, return-value]
    server.model = model  # type: ignore[attr-defined]
    yield server
    model.gate.set()
    server.stop()


@pytest.fixture
def gated_stub(gated: ServerThread) -> Iterator[MemoryServiceStub]:
    with grpc.insecure_channel(gated.target) as channel:
        yield MemoryServiceStub(channel)


def _events(target: str, channel: str, until: str) -> list[tuple[str, str]]:
    """The channel's logged events, (kind, memory id), up to the first of memory ``until``."""
    seen: list[tuple[str, str]] = []
    with grpc.insecure_channel(target) as grpc_channel:
        stream = TriggerServiceStub(grpc_channel).Subscribe(
            tpb.SubscribeRequest(channels=[channel]), timeout=60
        )
        for answer in stream:
            event = answer.event
            seen.append((tpb.EventKind.Name(event.kind), event.memory_id))
            if event.memory_id == until:
                stream.cancel()
                return seen
    raise AssertionError("the stream ended early")


def test_a_store_whose_deadline_passes_while_it_waits_for_the_model_stores_nothing(
    gated: Any, gated_stub: MemoryServiceStub, channel_name: str
) -> None:
    model: GatedEmbedder = gated.model
    model.gate.clear()
    holder = threading.Thread(target=store, args=(gated_stub, channel_name, "hold the model"))
    holder.start()
    try:
        assert model.waiting.wait(timeout=30)
        with pytest.raises(grpc.RpcError) as caught:
            gated_stub.Store(pb.StoreRequest(channel=channel_name, text="too late"), timeout=0.5)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        model.gate.set()
        holder.join(timeout=60)
    # Work is done in the order it was queued: once this store is answered, whatever the
    # late one was going to do is done.
    marker = store(gated_stub, channel_name, "a later note")
    stored = [
        m.text
        for m in gated_stub.ListMemories(pb.ListMemoriesRequest(channel=channel_name)).memories
    ]
    assert sorted(stored) == ["a later note", "hold the model"]
    kinds = [kind for kind, _ in _events(gated.target, channel_name, marker.id)]
    assert kinds == ["EVENT_KIND_ON_STORE", "EVENT_KIND_ON_STORE"]


def _late_store(stub: MemoryServiceStub, channel: str, memory_id: str) -> None:
    stub.Store(pb.StoreRequest(channel=channel, text="a late store"), timeout=0.5)


def _late_stream(stub: MemoryServiceStub, channel: str, memory_id: str) -> None:
    stub.StoreStream(_items(channel, 3), timeout=0.5)


def _late_import(stub: MemoryServiceStub, channel: str, memory_id: str) -> None:
    notes = pb.ImportRequest(channel=channel, markdown="- a late import\n- and another\n")
    stub.Import(iter([notes]), timeout=0.5)


def _late_forget(stub: MemoryServiceStub, channel: str, memory_id: str) -> None:
    stub.Forget(pb.ForgetRequest(channel=channel, ids=[memory_id]), timeout=0.5)


def _late_update(stub: MemoryServiceStub, channel: str, memory_id: str) -> None:
    change = pb.UpdateRequest(channel=channel, id=memory_id, text="a late correction")
    stub.Update(change, timeout=0.5)


def _late_boost(stub: MemoryServiceStub, channel: str, memory_id: str) -> None:
    stub.Boost(pb.BoostRequest(channel=channel, id=memory_id, delta=0.5), timeout=0.5)


def _late_dream(stub: MemoryServiceStub, channel: str, memory_id: str) -> None:
    stub.Dream(pb.DreamRequest(channel=channel), timeout=0.5)


LATE = {
    "Store": _late_store,
    "StoreStream": _late_stream,
    "Import": _late_import,
    "Forget": _late_forget,
    "Update": _late_update,
    "Boost": _late_boost,
    "Dream": _late_dream,
}


@pytest.mark.parametrize("rpc", list(LATE))
def test_work_past_the_call_deadline_commits_nothing(
    gated: Any, gated_stub: MemoryServiceStub, channel_name: str, rpc: str
) -> None:
    first = store(gated_stub, channel_name, "the first note of the channel")
    runtime = gated.server.runtime
    lock = runtime.engine.channels.channel(channel_name).lock
    with lock:  # the call's work waits for the channel past its deadline
        with pytest.raises(grpc.RpcError) as caught:
            LATE[rpc](gated_stub, channel_name, first.id)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server gives up on the call at its own deadline (a hair after the
        # client's); the work, blocked, goes on.
        given_up = time.monotonic() + 30
        while gated.server.limits.open_calls:
            assert time.monotonic() < given_up, "the server never gave up on the call"
            time.sleep(0.01)
    runtime.executor.submit(lambda: None).result(timeout=60)  # the late work has run
    memories = gated_stub.ListMemories(pb.ListMemoriesRequest(channel=channel_name)).memories
    [now] = memories
    assert (now.id, now.text, now.updated_at, now.state) == (
        first.id,
        first.text,
        first.updated_at,
        first.state,
    )
    assert now.heat <= first.heat  # cooled a little since, never boosted
    marker = store(gated_stub, channel_name, "a later note")
    events = _events(gated.target, channel_name, marker.id)
    assert events == [("EVENT_KIND_ON_STORE", first.id), ("EVENT_KIND_ON_STORE", marker.id)]


# --- settings a server can afford ---------------------------------------------------------


HUGE = {"TYPE_DOUBLE": 1e308, "TYPE_INT64": 2**62, "TYPE_INT32": 2**31 - 1}


def _numeric_fields() -> list[tuple[str, str]]:
    """Every numeric ChannelSettings and TypeProfile field: (mask path, field name)."""
    found = []
    for field in memory_pb2.ChannelSettings.DESCRIPTOR.fields:
        if _kind(field) in HUGE:
            found.append((field.name, field.name))
    for field in memory_pb2.TypeProfile.DESCRIPTOR.fields:
        if _kind(field) in HUGE:
            found.append(("profiles", field.name))
    return found


def _kind(field: Any) -> str:
    names = {1: "TYPE_DOUBLE", 3: "TYPE_INT64", 5: "TYPE_INT32"}
    return names.get(field.type, "")


def _settings(path: str, name: str, value: float) -> memory_pb2.ChannelSettings:
    if path != "profiles":
        return memory_pb2.ChannelSettings(**{name: value})
    profile = {"half_life_seconds": 86_400.0, "floor": 0.01, "stability_gain": 1.5}
    profile[name] = value
    episodic = memory_pb2.MEMORY_TYPE_EPISODIC
    return memory_pb2.ChannelSettings(
        profiles=[memory_pb2.TypeProfile(memory_type=episodic, **profile)]
    )


def _bad_values(path: str, name: str) -> list[float]:
    field = (
        memory_pb2.TypeProfile.DESCRIPTOR.fields_by_name[name]
        if path == "profiles"
        else memory_pb2.ChannelSettings.DESCRIPTOR.fields_by_name[name]
    )
    huge = HUGE[_kind(field)]
    values: list[float] = [huge, -huge]
    if _kind(field) == "TYPE_DOUBLE":
        values += [math.nan, math.inf, -math.inf]
        if name.endswith(("_seconds", "_days")) and name != "context_reuse_seconds":
            values.append(1e-300)  # a duration shorter than a second
    return values


NUMERIC = _numeric_fields()


def test_the_sweep_covers_every_numeric_setting() -> None:
    assert len(NUMERIC) > 50
    assert ("entity_link_max", "entity_link_max") in NUMERIC
    assert ("profiles", "half_life_seconds") in NUMERIC
    assert ("profiles", "stability_gain") in NUMERIC


@pytest.mark.parametrize(("path", "name"), NUMERIC, ids=[name for _, name in NUMERIC])
def test_every_numeric_setting_refuses_huge_tiny_and_non_finite_values(
    settings: SettingsServiceStub, channel_name: str, path: str, name: str
) -> None:
    before = settings.GetSettings(spb.GetSettingsRequest(channel=channel_name)).settings
    for value in _bad_values(path, name):
        with pytest.raises(grpc.RpcError) as caught:
            settings.UpdateSettings(
                spb.UpdateSettingsRequest(
                    channel=channel_name,
                    settings=_settings(path, name, value),
                    update_mask=FieldMask(paths=[path]),
                )
            )
        error = caught.value
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, value)
        details = error.details() or ""
        assert name in details and "must be in [" in details, details
    after = settings.GetSettings(spb.GetSettingsRequest(channel=channel_name)).settings
    assert after == before


@pytest.fixture(scope="module")
def settings(grpc_channel: grpc.Channel) -> SettingsServiceStub:
    return SettingsServiceStub(grpc_channel)


def test_the_largest_settings_a_server_affords_are_taken(
    settings: SettingsServiceStub, channel_name: str
) -> None:
    century = 36_525 * 86_400.0
    answer = settings.UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=channel_name,
            settings=memory_pb2.ChannelSettings(
                entity_link_max=100,
                channel_heat_half_life_seconds=century,
                dream_archive_age_days=36_525,
                weight_heat=10.0,
                profiles=[
                    memory_pb2.TypeProfile(
                        memory_type=memory_pb2.MEMORY_TYPE_FACT,
                        half_life_seconds=1.0,
                        floor=0.15,
                        stability_gain=10.0,
                    )
                ],
            ),
            update_mask=FieldMask(
                paths=[
                    "entity_link_max",
                    "channel_heat_half_life_seconds",
                    "dream_archive_age_days",
                    "weight_heat",
                    "profiles",
                ]
            ),
        )
    ).settings
    assert (answer.entity_link_max, answer.channel_heat_half_life_seconds) == (100, century)
    assert answer.weight_heat == 10.0
    fact = next(p for p in answer.profiles if p.memory_type == memory_pb2.MEMORY_TYPE_FACT)
    assert (fact.half_life_seconds, fact.stability_gain) == (1.0, 10.0)


# --- calor serve flags --------------------------------------------------------------------


def test_serve_flags_set_the_limits() -> None:
    args = _parser().parse_args(
        [
            "serve",
            "--max-message-bytes",
            "65536",
            "--max-stream-items",
            "500",
            "--max-subscriptions-per-key",
            "0",
            "--rate-per-key",
            "2.5",
            "--rate-burst",
            "10",
        ]
    )
    config = ServerConfig(**limit_settings(args))
    assert (config.max_message_bytes, config.limits.max_stream_items) == (65536, 500)
    assert (config.max_subscriptions_per_key, config.rate_per_key, config.rate_burst) == (
        0,
        2.5,
        10.0,
    )
    assert limit_settings(_parser().parse_args(["serve"])) == {}  # the defaults stand


@pytest.mark.parametrize(
    "flags",
    [
        ["--rate-per-key", "-1"],
        ["--rate-per-key", "inf"],
        ["--rate-burst", "0.5"],
        ["--max-stream-items", "0"],
        ["--max-message-bytes", "12"],
        ["--max-subscriptions-per-key", "many"],
    ],
)
def test_serve_refuses_limits_that_make_no_sense(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", *flags])
    assert flags[0] in capsys.readouterr().err


# --- under access control -----------------------------------------------------------------


def add_key(path: Path, grant: str) -> tuple[str, str]:
    """A new key in an auth file (made if missing): its (id, token)."""
    keys = auth_file.load(path) if path.exists() else auth_file.KeyRing()
    key, token = auth_file.new_key("limits", Grants((parse_grant(grant),)))
    auth_file.save(path, keys.with_key(key))
    return key.id, token


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


def test_under_access_control_each_key_has_its_own_budget(
    start_server: Callable[..., ServerThread], tmp_path: Path
) -> None:
    path = tmp_path / "auth.toml"
    first_id, first = add_key(path, "lim/*=read,write")
    _, second = add_key(path, "lim/*=read,write")
    server = start_server(auth_file=path, rate_per_key=0.001, rate_burst=2)
    identity = pb.IdentityRequest(channel="lim/x")
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        for _ in range(2):
            stub.Identity(identity, metadata=bearer(first))
        with pytest.raises(grpc.RpcError) as caught:
            stub.Identity(identity, metadata=bearer(first))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"key {first_id} is over its rate" in (caught.value.details() or "")
        stub.Identity(identity, metadata=bearer(second))  # a budget of its own
        store = channel.unary_unary("/calor.v1.MemoryService/Store")
        with pytest.raises(grpc.RpcError) as caught:
            store(b"\xff" * 11, metadata=bearer(second))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as caught:  # no key: refused before any of it
            store(b"\xff" * 11)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
