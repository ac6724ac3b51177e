"""Nothing about other channels leaks through triggers: a trigger id is its channel's own,
so a key learns nothing from the ids it names, and a chain reaches only a trigger of its
own channel. End to end, with an auth file and two keys that administer one team each;
and a store of the layout before (schema version 3) loading its triggers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
import numpy as np
import pytest
import rocksdict

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.commands import NewMemory
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.storage.store import MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from calor.triggers.registry import Firing, TriggerRegistry
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import trigger_rule
from tests.test_access import add_key, bearer

A, B = "team-a/ops", "team-b/ops"
KEYS = {"root": ("*=admin",), "a": ("team-a/*=admin",), "b": ("team-b/*=admin",)}
Metadata = tuple[tuple[str, str], ...]


@dataclass
class Teams:
    """A server with an auth file: ``root`` administers every channel, ``a`` team A's,
    ``b`` team B's."""

    target: str
    tokens: dict[str, str]
    channel: grpc.Channel = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.target)
        self.triggers = TriggerServiceStub(self.channel)
        self.memories = MemoryServiceStub(self.channel)

    def key(self, name: str) -> Metadata:
        return bearer(self.tokens[name])

    def create(self, key: str, channel: str, trigger_id: str, **fields: object) -> tpb.Trigger:
        fields.setdefault("action", tpb.ACTION_KIND_NOTIFY)
        fields.setdefault("event", tpb.EVENT_KIND_ON_STORE)
        made = tpb.Trigger(id=trigger_id, channel=channel, **fields)  # type: ignore[arg-type]
        request = tpb.CreateTriggerRequest(trigger=made)
        return self.triggers.CreateTrigger(request, metadata=self.key(key)).trigger

    def chain(
        self, key: str, channel: str, name: str, target: str, target_channel: str = ""
    ) -> tpb.Trigger:
        """A chain on store from ``name`` to ``target`` (and ``config.channel``, if given)."""
        config = {"trigger_id": target, **({"channel": target_channel} if target_channel else {})}
        return self.create(key, channel, name, action=tpb.ACTION_KIND_CHAIN, config=config)

    def store(self, key: str, channel: str, text: str) -> str:
        request = pb.StoreRequest(channel=channel, text=text)
        return self.memories.Store(request, metadata=self.key(key)).memory.id

    def fires(self, channel: str, trigger_id: str) -> int:
        listed = self.triggers.ListTriggers(
            tpb.ListTriggersRequest(channel=channel), metadata=self.key("root")
        ).triggers
        [found] = [t for t in listed if t.id == trigger_id]
        return found.fires

    def first_notify(self, key: str, channel: str, trigger_id: str) -> tpb.Event:
        """The first NOTIFY event of the trigger, replayed from the log or waited for."""
        request = tpb.SubscribeRequest(
            channels=[channel], kinds=[tpb.EVENT_KIND_NOTIFY], trigger_ids=[trigger_id]
        )
        stream = self.triggers.Subscribe(request, metadata=self.key(key), timeout=60)
        try:
            return next(iter(stream)).event
        finally:
            stream.cancel()

    def history(self, key: str, trigger_id: str, channel: str = "") -> list[tpb.TriggerFiring]:
        request = tpb.TriggerHistoryRequest(trigger_id=trigger_id, channel=channel)
        return list(self.triggers.TriggerHistory(request, metadata=self.key(key)).firings)


@pytest.fixture(scope="module")
def teams(
    start_server: Callable[..., ServerThread], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Teams]:
    path = tmp_path_factory.mktemp("auth") / "keys.toml"
    tokens = {name: add_key(path, *grants, label=name)[1] for name, grants in KEYS.items()}
    found = Teams(start_server(auth_file=path).target, tokens)
    yield found
    found.channel.close()


def refusal(call: Callable[[], object], trigger_id: str = "") -> tuple[grpc.StatusCode, str]:
    """The code and message a call is refused with, the id it names written as ID."""
    with pytest.raises(grpc.RpcError) as refused:
        call()
    message = refused.value.details() or ""
    return refused.value.code(), message.replace(trigger_id, "ID") if trigger_id else message


# --- ids ------------------------------------------------------------------------------


def test_an_id_another_channel_uses_is_to_a_key_just_like_a_free_one(teams: Teams) -> None:
    theirs = teams.create("b", B, "weekly-digest", config={"message": "B's"})

    # CreateTrigger: the id is free in A whatever B holds; each channel has its own.
    ours = teams.create("a", A, "weekly-digest", config={"message": "A's"})
    fresh = teams.create("a", A, "never-used-anywhere")
    assert (ours.id, ours.channel, fresh.channel) == ("weekly-digest", A, A)
    code, message = refusal(lambda: teams.create("a", A, "weekly-digest"))
    assert code == grpc.StatusCode.ALREADY_EXISTS and A in message  # A's own, seen by A
    assert B not in message

    # DeleteTrigger and TriggerHistory: B's id and an id nobody uses, the same words.
    only_b = teams.create("b", B, "only-in-b")
    t, key = teams.triggers, teams.key("a")
    for trigger_id in (only_b.id, "nobody-has-this"):
        delete = tpb.DeleteTriggerRequest(id=trigger_id)
        history = tpb.TriggerHistoryRequest(trigger_id=trigger_id)
        for call in (
            partial(t.DeleteTrigger, delete, metadata=key),
            partial(t.TriggerHistory, history, metadata=key),
        ):
            assert refusal(call, trigger_id) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "trigger ID: not a trigger of a channel this key administers",
            )
    assert teams.fires(B, only_b.id) == 0  # still there, untouched

    # Each fires in its own channel, counted and kept apart.
    memory = teams.store("a", A, "The weekly digest goes out on Mondays.")
    event = teams.first_notify("a", A, "weekly-digest")
    assert (event.channel, event.memory_id, event.message) == (A, memory, "A's")
    assert [f.memory_id for f in teams.history("a", "weekly-digest")] == [memory]
    assert teams.history("b", "weekly-digest") == []
    assert teams.fires(B, theirs.id) == 0

    # A key that administers both channels names the one it means.
    both = tpb.DeleteTriggerRequest(id="weekly-digest")
    code, message = refusal(lambda: teams.triggers.DeleteTrigger(both, metadata=teams.key("root")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert A in message and B in message and "name one" in message
    in_b = tpb.DeleteTriggerRequest(id="weekly-digest", channel=B)
    assert teams.triggers.DeleteTrigger(in_b, metadata=teams.key("root")).deleted
    listed = teams.triggers.ListTriggers(tpb.ListTriggersRequest(), metadata=teams.key("root"))
    assert ("weekly-digest", A) in {(t.id, t.channel) for t in listed.triggers}
    assert ("weekly-digest", B) not in {(t.id, t.channel) for t in listed.triggers}
    # Naming the channel, a key reads the history of its trigger deleted since.
    teams.triggers.DeleteTrigger(both, metadata=teams.key("a"))  # A's: the one A may see
    assert [f.memory_id for f in teams.history("a", "weekly-digest", A)] == [memory]
    denied = tpb.DeleteTriggerRequest(id="only-in-b", channel=B)
    code, _ = refusal(lambda: teams.triggers.DeleteTrigger(denied, metadata=teams.key("a")))
    assert code == grpc.StatusCode.PERMISSION_DENIED


def test_a_listing_pages_through_one_id_in_several_channels(teams: Teams) -> None:
    channels = [f"team-{c}/paged" for c in "ab"] + ["team-c/paged"]
    for channel in channels:
        teams.create("root", channel, "paged-1")
        teams.create("root", channel, "paged-2")
    seen: list[tuple[str, str]] = []
    token = ""
    while True:
        request = tpb.ListTriggersRequest(page_size=1, page_token=token)
        page = teams.triggers.ListTriggers(request, metadata=teams.key("root"))
        seen += [(t.id, t.channel) for t in page.triggers if t.id.startswith("paged-")]
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted((i, c) for i in ("paged-1", "paged-2") for c in channels)


# --- chains ---------------------------------------------------------------------------


def test_a_chain_to_another_channel_is_refused_at_creation_whether_its_target_exists(
    teams: Teams,
) -> None:
    teams.create("b", B, "b-target")
    answers = {
        target: refusal(lambda t=target: teams.chain("a", A, "", t, B))
        for target in ("b-target", "no-such-target")
    }
    assert answers["b-target"] == answers["no-such-target"]
    code, message = answers["b-target"]
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "config.channel" in message and "administers" in message
    # One the key administers, but not the chain's own: a chain fires in its channel.
    code, message = refusal(lambda: teams.chain("a", A, "", "x", "team-a/x"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "own channel" in message
    code, message = refusal(lambda: teams.chain("a", A, "", "team-b/ops/b-target"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "config.trigger_id" in message
    assert teams.fires(B, "b-target") == 0


def test_a_bare_target_id_names_a_trigger_of_the_chains_channel_only(teams: Teams) -> None:
    """A chain in A to the id of B's trigger is accepted exactly like one to an id
    nobody uses (nothing to tell them apart), and fires nothing in B: it names A's."""
    channel = "team-a/bare"
    teams.create("b", B, "b-only-target")
    to_b = teams.chain("a", channel, "c1-chain", "b-only-target")
    to_none = teams.chain("a", channel, "c2-chain", "no-trigger-at-all")
    assert (to_b.channel, dict(to_b.config)) == (channel, {"trigger_id": "b-only-target"})
    assert to_none.channel == channel
    teams.create("a", channel, "z-marker")  # fires after both chains, for the same store
    memory = teams.store("a", channel, "Something for the chains.")
    teams.first_notify("a", channel, "z-marker")
    outcomes = {
        trigger_id: [f.outcome.replace(target, "ID") for f in teams.history("a", trigger_id)]
        for trigger_id, target in (("c1-chain", "b-only-target"), ("c2-chain", "no-trigger-at-all"))
    }
    assert outcomes["c1-chain"] == outcomes["c2-chain"]
    assert outcomes["c1-chain"] == [f"chain target ID is not a trigger of channel {channel}"]
    assert [f.memory_id for f in teams.history("a", "c1-chain")] == [memory]
    assert teams.fires(B, "b-only-target") == 0


def test_a_chain_within_the_keys_channel_fires_its_target(teams: Teams) -> None:
    channel = "team-a/chained"
    teams.create("b", B, "shared-target")  # B's trigger of the same id stays out of it
    teams.create(
        "a",
        channel,
        "shared-target",
        event=tpb.EVENT_KIND_ON_RECALL,  # fires through the chain only
        config={"message": "reached {memory_id}"},
    )
    teams.chain("a", channel, "a-chain", "shared-target")
    teams.chain("a", channel, "a-chain-named", "shared-target", channel)
    memory = teams.store("a", channel, "A store that starts the chains.")
    event = teams.first_notify("a", channel, "shared-target")
    assert (event.channel, event.memory_id, event.message) == (channel, memory, f"reached {memory}")
    assert {f.outcome for f in teams.history("a", "a-chain")} == {"chained to shared-target"}
    assert teams.fires(B, "shared-target") == 0


# --- a store of the layout before -----------------------------------------------------


def _firing(trigger_id: str, memory_id: str, seq: int) -> bytes:
    return json.dumps(Firing(trigger_id, memory_id, 1.0, f"fired {seq}", seq).__dict__).encode()


def test_triggers_stored_before_ids_were_per_channel_load_under_their_channel(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    memories = MemoryEngine.open(store, SystemClock(), ChannelPolicy())
    vectors = np.asarray(embedder.embed_passages(["An old memory."]))
    [stored] = memories.store([NewMemory(channel="team-x", text="An old memory.")], vectors)
    memory = stored.record.id
    store.close()

    # The keys as schema version 3 wrote them: no channel in them.
    rule = trigger_rule(id="old-watch", channel="team-x", event="on_decay")
    order = (256).to_bytes(8, "big")  # order bytes may hold NUL
    options = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(str(tmp_path / "rocksdb"), options, column_families={"default": options})
    meta = json.loads(db[b"meta:schema"])
    db[b"meta:schema"] = json.dumps({**meta, "schema_version": 3}).encode()
    db[b"t:old-watch"] = rule.to_json()
    db[b"f:old-watch"] = b'{"fires": 2, "last_fired_at": 3.0}'
    db[b"h:old-watch\x00" + order] = _firing("old-watch", memory, 256)
    db[b"d:old-watch\x00" + memory.encode()] = b"1.5"
    # Left by triggers deleted before: one fired on a memory of team-x, one on nothing.
    db[b"f:deleted"] = b'{"fires": 1, "last_fired_at": 2.0}'
    db[b"h:deleted\x00" + order] = _firing("deleted", memory, 256)
    db[b"f:lost"] = b'{"fires": 1, "last_fired_at": 2.0}'
    db[b"h:lost\x00" + order] = _firing("lost", "not-a-memory", 256)
    db[b"d:lost\x00not-a-memory"] = b"1.0"
    db.close()

    store = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    try:
        assert store.migrations()[-1] == "triggers_by_channel"
        registry = TriggerRegistry(store)
        registry.load()
        assert registry.get("team-x", "old-watch") == rule
        assert [r.channel for r in registry.named("old-watch")] == ["team-x"]
        assert registry.fires(rule) == 2
        assert [f.outcome for f in registry.history("team-x", "old-watch")] == ["fired 256"]
        assert registry.decay_fired(rule, memory, 1.5)
        assert [f.memory_id for f in registry.history("team-x", "deleted")] == [memory]
        assert list(registry.history("team-x", "lost")) == []
    finally:
        store.close()
    db = rocksdict.Rdict(str(tmp_path / "rocksdb"), options, column_families={"default": options})
    try:
        trigger_keys = [bytes(k) for k in db.keys() if bytes(k)[:2] in (b"t:", b"f:", b"h:", b"d:")]
    finally:
        db.close()
    assert all(k[2:].startswith(b"team-x\x00") for k in trigger_keys), trigger_keys
    assert len(trigger_keys) == 6  # old-watch's four, and what "deleted" left (counter, history)
