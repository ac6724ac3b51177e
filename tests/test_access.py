"""Access control end to end: a real server with an auth file, called through the stubs."""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.client.cli import main
from calor.server.api import auth_file
from calor.server.api.access import RULES
from calor.server.api.grants import Grants, parse_grant
from calor.server.cluster.local import free_port
from calor.v1 import (
    memory_service_pb2,
    settings_service_pb2,
    settings_service_pb2_grpc,
    trigger_service_pb2,
    trigger_service_pb2_grpc,
)
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread

DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
SERVICES = (
    memory_service_pb2.DESCRIPTOR.services_by_name["MemoryService"],
    trigger_service_pb2.DESCRIPTOR.services_by_name["TriggerService"],
    settings_service_pb2.DESCRIPTOR.services_by_name["SettingsService"],
)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def add_key(path: Path, *grants: str, label: str = "") -> tuple[str, str]:
    """Add a key to an auth file (created if missing); its (id, token)."""
    keys = auth_file.load(path) if path.exists() else auth_file.KeyRing()
    key, token = auth_file.new_key(label, Grants(tuple(parse_grant(g) for g in grants)))
    auth_file.save(path, keys.with_key(key))
    return key.id, token


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()  # type: ignore[no-any-return]


@dataclass
class Keyed:
    """A server with an auth file, stubs on it, and the keys' tokens by name."""

    thread: ServerThread
    path: Path
    tokens: dict[str, str]
    ids: dict[str, str]
    channel: grpc.Channel
    memories: MemoryServiceStub = field(init=False)
    triggers: trigger_service_pb2_grpc.TriggerServiceStub = field(init=False)
    settings: settings_service_pb2_grpc.SettingsServiceStub = field(init=False)

    def __post_init__(self) -> None:
        self.memories = MemoryServiceStub(self.channel)
        self.triggers = trigger_service_pb2_grpc.TriggerServiceStub(self.channel)
        self.settings = settings_service_pb2_grpc.SettingsServiceStub(self.channel)

    def key(self, name: str) -> tuple[tuple[str, str], ...]:
        return bearer(self.tokens[name])

    def store(self, channel: str, text: str, as_key: str = "root") -> str:
        request = pb.StoreRequest(channel=channel, text=text)
        return self.memories.Store(request, metadata=self.key(as_key)).memory.id

    def total(self, channel: str) -> int:
        request = pb.IdentityRequest(channel=channel)
        return self.memories.Identity(request, metadata=self.key("root")).total

    def reload(self) -> bool:
        return bool(self.thread.call(self.thread.server.reload_auth()))


KEYS = {
    "root": ("*=admin",),
    "team_a": ("team-a/*=read,write",),
    "team_a_admin": ("team-a/*=admin",),
    "reader": ("team-a/*=read",),
}


@pytest.fixture(scope="module")
def keyed(
    start_server: Callable[..., ServerThread], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Keyed]:
    path = tmp_path_factory.mktemp("auth") / "keys.toml"
    ids, tokens = {}, {}
    for name, grants in KEYS.items():
        ids[name], tokens[name] = add_key(path, *grants, label=name)
    server = start_server(auth_file=path)
    with grpc.insecure_channel(server.target) as channel:
        yield Keyed(server, path, tokens, ids, channel)


# --- the rules ------------------------------------------------------------------------


def test_every_rpc_of_the_api_has_an_access_rule() -> None:
    methods = {f"/{s.full_name}/{m.name}" for s in SERVICES for m in s.methods}
    assert methods - set(RULES) == set()
    assert set(RULES) - methods == set()


# --- who is calling -----------------------------------------------------------------


def test_no_key_or_an_unknown_key_is_unauthenticated(keyed: Keyed) -> None:
    store = pb.StoreRequest(channel="team-a/nokey", text="The kettle is in the cupboard.")
    token = keyed.tokens["team_a"]
    wrong = token[:-1] + ("B" if token[-1] == "A" else "A")
    metadata = [
        (),
        bearer(wrong),
        bearer("calor_nosuchkey_secret"),
        bearer("not-a-calor-key"),
        (("authorization", f"Basic {token}"),),
    ]
    for sent in metadata:
        assert code_of(partial(keyed.memories.Store, store, metadata=sent)) == UNAUTHENTICATED
    # streams too, both ways
    subscribe = tpb.SubscribeRequest(channels=["team-a/nokey"])
    assert code_of(lambda: list(keyed.triggers.Subscribe(subscribe, timeout=10))) == UNAUTHENTICATED
    items = iter([pb.StoreStreamRequest(store=store)])
    assert code_of(lambda: keyed.memories.StoreStream(items)) == UNAUTHENTICATED
    assert keyed.total("team-a/nokey") == 0


def test_health_and_reflection_stay_open(keyed: Keyed) -> None:
    health = health_pb2_grpc.HealthStub(keyed.channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


# --- channels -----------------------------------------------------------------------


def test_a_team_key_cannot_store_into_another_team(keyed: Keyed) -> None:
    request = pb.StoreRequest(channel="team-b/x", text="Team B's launch is on Friday.")
    refused = code_of(lambda: keyed.memories.Store(request, metadata=keyed.key("team_a")))
    assert refused == DENIED
    assert keyed.total("team-b/x") == 0  # nothing stored, as the admin key sees


def test_a_team_key_stores_and_recalls_in_its_own_channels(keyed: Keyed) -> None:
    stored = keyed.store("team-a/x", "The build server restarts at midnight.", as_key="team_a")
    reply = keyed.memories.Recall(
        pb.RecallRequest(channel="team-a/x", query="when does the build server restart?"),
        metadata=keyed.key("team_a"),
    )
    assert stored in [hit.memory.id for hit in reply.hits]


def test_reaching_into_another_team_is_refused_everywhere(keyed: Keyed) -> None:
    secret = keyed.store("team-b/x", "Team B's merger code name is Bluebird.")
    team_a, m = keyed.key("team_a"), keyed.memories
    recall = pb.RecallRequest(channel="team-a/x", query="code name", channels=["team-b/x"])
    assert code_of(lambda: m.Recall(recall, metadata=team_a)) == DENIED
    subscribe = tpb.SubscribeRequest(channels=["team-a/x", "team-b/x"])
    stream = keyed.triggers.Subscribe(subscribe, metadata=team_a, timeout=10)
    assert code_of(lambda: next(stream)) == DENIED
    export = pb.ExportRequest(channel="team-b/x")
    assert code_of(lambda: list(m.Export(export, metadata=team_a))) == DENIED
    inspect = pb.InspectRequest(channel="team-b/x", id=secret)
    assert code_of(lambda: m.Inspect(inspect, metadata=team_a)) == DENIED
    context = pb.ContextRequest(channel="team-b/x", message="code name?")
    assert code_of(lambda: m.Context(context, metadata=team_a)) == DENIED
    settings = settings_service_pb2.GetSettingsRequest(channel="team-b/x")
    assert code_of(lambda: keyed.settings.GetSettings(settings, metadata=team_a)) == DENIED


def test_share_needs_read_at_the_source_and_write_at_the_target(keyed: Keyed) -> None:
    own = keyed.store("team-a/share", "The office plant needs water on Mondays.")
    theirs = keyed.store("team-b/share", "Team B's budget is confidential.")
    m, team_a = keyed.memories, keyed.key("team_a")
    out = pb.ShareRequest(channel="team-a/share", id=own, target_channel="team-b/share")
    assert code_of(lambda: m.Share(out, metadata=team_a)) == DENIED
    into = pb.ShareRequest(channel="team-b/share", id=theirs, target_channel="team-a/share")
    assert code_of(lambda: m.Share(into, metadata=team_a)) == DENIED
    assert keyed.total("team-b/share") == 1 and keyed.total("team-a/share") == 1
    inside = pb.ShareRequest(channel="team-a/share", id=own, target_channel="team-a/other")
    assert m.Share(inside, metadata=team_a).memory.channel == "team-a/other"


def test_a_client_stream_with_one_foreign_message_stores_nothing(keyed: Keyed) -> None:
    items = [
        pb.StoreStreamRequest(store=pb.StoreRequest(channel="team-a/bulk", text=f"Note {i}."))
        for i in range(3)
    ]
    items.append(pb.StoreStreamRequest(store=pb.StoreRequest(channel="team-b/bulk", text="Hi.")))
    refused = code_of(lambda: keyed.memories.StoreStream(iter(items), metadata=keyed.key("team_a")))
    assert refused == DENIED
    imports = [
        pb.ImportRequest(channel="team-b/imported", markdown="- The gate code is 4711.\n"),
    ]
    refused = code_of(lambda: keyed.memories.Import(iter(imports), metadata=keyed.key("team_a")))
    assert refused == DENIED
    assert keyed.total("team-a/bulk") == 0 and keyed.total("team-b/bulk") == 0
    assert keyed.total("team-b/imported") == 0


def test_a_read_only_key_reads_but_cannot_store(keyed: Keyed) -> None:
    kept = keyed.store("team-a/ro", "The spare key is under the blue pot.")
    m, reader = keyed.memories, keyed.key("reader")
    store = pb.StoreRequest(channel="team-a/ro", text="Overwrite everything.")
    assert code_of(lambda: m.Store(store, metadata=reader)) == DENIED
    forget = pb.ForgetRequest(channel="team-a/ro", ids=[kept])
    assert code_of(lambda: m.Forget(forget, metadata=reader)) == DENIED
    inspect = pb.InspectRequest(channel="team-a/ro", id=kept)
    assert m.Inspect(inspect, metadata=reader).memory.id == kept
    assert keyed.total("team-a/ro") == 1


def test_admin_work_needs_admin(keyed: Keyed) -> None:
    team_a, team_a_admin = keyed.key("team_a"), keyed.key("team_a_admin")
    dream = pb.DreamRequest(channel="team-a/adm")
    assert code_of(lambda: keyed.memories.Dream(dream, metadata=team_a)) == DENIED
    keyed.memories.Dream(dream, metadata=team_a_admin)  # admin includes read and write, too
    keyed.store("team-a/adm", "Admins may store as well.", as_key="team_a_admin")
    update = settings_service_pb2.UpdateSettingsRequest(channel="team-a/adm")
    assert code_of(lambda: keyed.settings.UpdateSettings(update, metadata=team_a)) == DENIED
    drop = pb.DropChannelRequest(channel="team-a/adm")
    assert code_of(lambda: keyed.memories.DropChannel(drop, metadata=team_a)) == DENIED
    status = settings_service_pb2.ServerStatusRequest()
    assert code_of(lambda: keyed.settings.ServerStatus(status, metadata=team_a_admin)) == DENIED
    try:
        keyed.settings.ServerStatus(status, metadata=keyed.key("root"))
    except grpc.RpcError as error:  # not built yet is fine; refused is not
        assert error.code() not in (DENIED, UNAUTHENTICATED)


# --- triggers and subscriptions -------------------------------------------------------


def trigger(channel: str, trigger_id: str = "") -> tpb.CreateTriggerRequest:
    return tpb.CreateTriggerRequest(
        trigger=tpb.Trigger(
            id=trigger_id,
            channel=channel,
            event=tpb.EVENT_KIND_ON_STORE,
            action=tpb.ACTION_KIND_NOTIFY,
            config={"message": "noted"},
        )
    )


def test_a_trigger_belongs_to_its_channel(keyed: Keyed) -> None:
    t, root, team_a = keyed.triggers, keyed.key("root"), keyed.key("team_a_admin")
    theirs = t.CreateTrigger(trigger("team-b/trig", "b-watch"), metadata=root).trigger
    ours = t.CreateTrigger(trigger("team-a/trig"), metadata=team_a).trigger
    assert code_of(lambda: t.CreateTrigger(trigger("team-b/trig"), metadata=team_a)) == DENIED
    delete = tpb.DeleteTriggerRequest(id=theirs.id)
    assert code_of(lambda: t.DeleteTrigger(delete, metadata=team_a)) == DENIED
    history = tpb.TriggerHistoryRequest(trigger_id=theirs.id)
    assert code_of(lambda: t.TriggerHistory(history, metadata=team_a)) == DENIED
    missing = tpb.DeleteTriggerRequest(id="no-such-trigger")  # the same answer: no leak
    assert code_of(lambda: t.DeleteTrigger(missing, metadata=team_a)) == DENIED
    assert code_of(lambda: t.DeleteTrigger(missing, metadata=root)) == grpc.StatusCode.NOT_FOUND
    # Trigger ids are per channel: B's id is as free in A as any (tests/test_trigger_channels.py).
    again = t.CreateTrigger(trigger("team-a/trig", theirs.id), metadata=team_a).trigger
    assert (again.id, again.channel) == (theirs.id, "team-a/trig")
    t.DeleteTrigger(delete, metadata=team_a)  # A's own, found among A's channels
    listed = t.ListTriggers(tpb.ListTriggersRequest(), metadata=team_a).triggers
    assert ours.id in [x.id for x in listed]
    assert {x.channel for x in listed} <= {"team-a/trig"}
    listing_b = tpb.ListTriggersRequest(channel="team-b/trig")
    assert code_of(lambda: t.ListTriggers(listing_b, metadata=team_a)) == DENIED
    evaluate = tpb.EvaluateTriggersRequest(
        channel="team-b/trig", event=tpb.EVENT_KIND_ON_STORE, memory_id="x"
    )
    assert code_of(lambda: t.EvaluateTriggers(evaluate, metadata=team_a)) == DENIED
    assert theirs.id in [
        x.id for x in t.ListTriggers(tpb.ListTriggersRequest(), metadata=root).triggers
    ]
    t.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=ours.id), metadata=team_a)
    t.DeleteTrigger(tpb.DeleteTriggerRequest(id=ours.id), metadata=team_a)


def test_an_empty_subscription_delivers_only_granted_channels(keyed: Keyed) -> None:
    foreign = keyed.store("team-b/feed", "Team B's roadmap moved to March.")
    outside = keyed.store("elsewhere", "A channel no team prefix covers.")
    mine = keyed.store("team-a/feed", "Team A's standup moved to ten.")
    request = tpb.SubscribeRequest(kinds=[tpb.EVENT_KIND_ON_STORE])  # no channels: granted ones
    stream = keyed.triggers.Subscribe(request, metadata=keyed.key("reader"), timeout=30)
    seen = []
    for reply in stream:
        seen.append(reply.event)
        if reply.event.memory_id == mine:
            break
    stream.cancel()
    assert {e.channel for e in seen} and all(e.channel.startswith("team-a/") for e in seen)
    assert foreign not in [e.memory_id for e in seen] and outside not in [e.memory_id for e in seen]


def test_a_key_lists_only_the_channels_it_may_read(keyed: Keyed) -> None:
    keyed.store("team-b/listed", "Team B keeps this to itself.")
    keyed.store("team-a/listed", "Team A can see this one.")
    as_reader = keyed.memories.ListChannels(pb.ListChannelsRequest(), metadata=keyed.key("reader"))
    assert "team-a/listed" in as_reader.channels
    assert all(name.startswith("team-a/") for name in as_reader.channels)
    as_root = keyed.memories.ListChannels(pb.ListChannelsRequest(), metadata=keyed.key("root"))
    assert {"team-a/listed", "team-b/listed"} <= set(as_root.channels)


def test_a_stream_the_servicer_ends_keeps_its_status_and_trailers(keyed: Keyed) -> None:
    request = tpb.SubscribeRequest(channels=["team-a/x"], after_seq=10**12)
    stream = keyed.triggers.Subscribe(request, metadata=keyed.key("reader"), timeout=10)
    with pytest.raises(grpc.RpcError) as ended:
        next(stream)
    assert ended.value.code() == grpc.StatusCode.OUT_OF_RANGE
    trailing = dict(ended.value.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert "calor-log-last-seq" in trailing


# --- reloading --------------------------------------------------------------------------


class Listener:
    """A Subscribe stream read on a thread: its events, then how it ended."""

    def __init__(self, keyed: Keyed, token: str, channel: str) -> None:
        request = tpb.SubscribeRequest(channels=[channel], kinds=[tpb.EVENT_KIND_ON_STORE])
        self.call = keyed.triggers.Subscribe(request, metadata=bearer(token), timeout=60)
        self.events: queue.Queue[tpb.Event | grpc.StatusCode] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for reply in self.call:
                self.events.put(reply.event)
        except grpc.RpcError as error:
            self.events.put(error.code())

    def next(self) -> tpb.Event | grpc.StatusCode:
        return self.events.get(timeout=30)

    def close(self) -> None:
        self.call.cancel()
        self._thread.join(10)


def test_reload_adds_and_revokes_keys_and_ends_only_the_revoked_streams(keyed: Keyed) -> None:
    stays_id, stays = add_key(keyed.path, "team-a/reload=read", label="stays")
    goes_id, goes = add_key(keyed.path, "team-a/reload=read", label="goes")
    changed_id, changed = add_key(keyed.path, "team-a/reload=read", label="changed")
    assert keyed.reload()
    listeners = {
        name: Listener(keyed, token, "team-a/reload")
        for name, token in (("stays", stays), ("goes", goes), ("changed", changed))
    }
    try:
        first = keyed.store("team-a/reload", "The first note after the reload.")
        for listener in listeners.values():
            event = listener.next()
            assert isinstance(event, tpb.Event) and event.memory_id == first
        keys = auth_file.load(keyed.path).without(goes_id)
        key = keys.keys[changed_id]
        keys = keys.with_key(
            auth_file.ApiKey(
                key.id,
                key.sha256,
                Grants((parse_grant("team-a/reload=read,write"),)),
                key.label,
                key.created,
            )
        )
        auth_file.save(keyed.path, keys)
        new_id, new = add_key(keyed.path, "team-a/reload=write", label="new")
        assert keyed.reload()
        assert listeners["goes"].next() == UNAUTHENTICATED  # ended at once, while idle
        assert listeners["changed"].next() == grpc.StatusCode.UNAVAILABLE
        identity = pb.IdentityRequest(channel="team-a/reload")
        assert (
            code_of(lambda: keyed.memories.Identity(identity, metadata=bearer(goes)))
            == UNAUTHENTICATED
        )
        second = keyed.store("team-a/reload", "The second note, by the new key.", as_key="root")
        keyed.memories.Store(
            pb.StoreRequest(channel="team-a/reload", text="By the new key."), metadata=bearer(new)
        )
        event = listeners["stays"].next()
        assert isinstance(event, tpb.Event) and event.memory_id == second
    finally:
        for listener in listeners.values():
            listener.close()
    _ = (stays_id, new_id)


def test_a_broken_file_on_reload_keeps_the_keys_in_force(
    keyed: Keyed, caplog: pytest.LogCaptureFixture
) -> None:
    saved = keyed.path.read_bytes()
    try:
        keyed.path.write_text("[keys.broken\nsha256 = 1\n")
        with caplog.at_level(logging.ERROR, logger="calor.server"):
            assert not keyed.reload()
        assert "auth file not reloaded" in caplog.text
        identity = pb.IdentityRequest(channel="team-a/x")
        keyed.memories.Identity(identity, metadata=keyed.key("team_a"))
    finally:
        keyed.path.write_bytes(saved)
        os.chmod(keyed.path, 0o600)
    assert keyed.reload()


# --- open servers -----------------------------------------------------------------------


def test_an_open_server_refuses_a_reachable_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["serve", "--data-dir", str(tmp_path), "--host", "0.0.0.0", "--port", "0"])
    assert status == 1
    assert "--host 0.0.0.0 needs --auth-file" in capsys.readouterr().err


def test_an_open_server_on_loopback_warns_that_it_runs_open(
    start_server: Callable[..., ServerThread], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="calor.server"):
        server = start_server()
    assert "runs open" in caplog.text
    with grpc.insecure_channel(server.target) as channel:  # no key needed
        MemoryServiceStub(channel).Store(pb.StoreRequest(channel="open", text="Open for all."))


# --- SIGHUP -------------------------------------------------------------------------------


def test_sighup_picks_up_a_new_key_and_a_revocation_while_a_stream_stays_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = tmp_path / "keys.toml"
    _, root = add_key(auth, "*=admin")
    doomed_id, doomed = add_key(auth, "ops=read,write")
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("calor")),
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
    ]
    command += ["--port", str(port), "--auth-file", str(auth)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    target = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(target) as channel:
            wait_serving(channel, process)
            memories = MemoryServiceStub(channel)
            triggers = trigger_service_pb2_grpc.TriggerServiceStub(channel)
            stream = triggers.Subscribe(
                tpb.SubscribeRequest(channels=["ops"], kinds=[tpb.EVENT_KIND_ON_STORE]),
                metadata=bearer(root),
                timeout=120,
            )
            first = memories.Store(
                pb.StoreRequest(channel="ops", text="Rotate the logs weekly."),
                metadata=bearer(doomed),
            ).memory.id
            assert next(stream).event.memory_id == first
            assert main(["keys", "revoke", "--file", str(auth), doomed_id]) == 0
            assert main(["keys", "add", "--file", str(auth), "--grant", "ops=write"]) == 0
            fresh = capsys.readouterr().out.strip().splitlines()[-1]
            process.send_signal(signal.SIGHUP)
            request = pb.StoreRequest(channel="ops", text="Renew the certificate in May.")
            stored = until_accepted(lambda: memories.Store(request, metadata=bearer(fresh)))
            again = pb.StoreRequest(channel="ops", text="Doomed key's last try.")
            assert (
                code_of(lambda: memories.Store(again, metadata=bearer(doomed))) == UNAUTHENTICATED
            )
            assert next(stream).event.memory_id == stored.memory.id  # the stream stayed open
            stream.cancel()
    finally:
        process.terminate()
        process.wait(30)
        assert process.stderr is not None
        process.stderr.close()


def wait_serving(channel: grpc.Channel, process: subprocess.Popen[bytes]) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise AssertionError(f"server exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "server did not become SERVING in 60 s"
        time.sleep(0.1)


def until_accepted(call: Callable[[], pb.StoreResponse]) -> pb.StoreResponse:
    """Retry a call refused as UNAUTHENTICATED until the reload has landed (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return call()
        except grpc.RpcError as error:
            if error.code() != UNAUTHENTICATED or time.monotonic() > deadline:
                raise
        time.sleep(0.05)
