"""Keys that expire: refused UNAUTHENTICATED from their ``expires`` on, by the server's
clock (moved by the test, never waited for), their open streams ended likewise."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest

from calor.server.api import auth_file
from calor.server.api.grants import Grants, parse_grant
from calor.server.clock import ManualClock
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread

START = 1_780_000_000.0
EXPIRES = datetime.fromtimestamp(START + 3600, UTC)  # an hour into the test's time
WHEN = f"{EXPIRES:%Y-%m-%dT%H:%M:%SZ}"  # as the refusal names it
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@dataclass
class Expiring:
    """A server on a manual clock with a lasting admin key and a team key that expires."""

    thread: ServerThread
    clock: ManualClock
    path: Path
    tokens: dict[str, str]
    memories: MemoryServiceStub
    triggers: TriggerServiceStub

    def store(self, as_key: str, channel: str, text: str) -> str:
        request = pb.StoreRequest(channel=channel, text=text)
        return self.memories.Store(request, metadata=bearer(self.tokens[as_key])).memory.id

    def total(self, channel: str) -> int:
        request = pb.IdentityRequest(channel=channel)
        return self.memories.Identity(request, metadata=bearer(self.tokens["root"])).total

    def expire(self) -> None:
        """Move the server's clock to the team key's expiry."""
        self.clock.set(EXPIRES.timestamp())


def refusal(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


@pytest.fixture
def expiring(start_server: Callable[..., ServerThread], tmp_path: Path) -> Iterator[Expiring]:
    path = tmp_path / "keys.toml"
    root, root_token = auth_file.new_key("ops", Grants((parse_grant("*=admin"),)))
    team, team_token = auth_file.new_key(
        "contractor", Grants((parse_grant("team/*=read,write"),)), expires=EXPIRES
    )
    auth_file.save(path, auth_file.KeyRing().with_key(root).with_key(team))
    clock = ManualClock(START)
    server = start_server(clock=clock, auth_file=path)
    with grpc.insecure_channel(server.target) as channel:
        yield Expiring(
            server,
            clock,
            path,
            {"root": root_token, "team": team_token},
            MemoryServiceStub(channel),
            TriggerServiceStub(channel),
        )


def test_a_key_past_its_expiry_is_unauthenticated_and_says_when(expiring: Expiring) -> None:
    assert expiring.store("team", "team/notes", "Written before the key expired.")
    expiring.clock.set(EXPIRES.timestamp() - 1)
    assert expiring.store("team", "team/notes", "Written a second before it expired.")

    expiring.expire()
    refused = refusal(lambda: expiring.store("team", "team/notes", "Written after."))
    assert refused.code() == UNAUTHENTICATED  # type: ignore[attr-defined]
    assert f"expired at {WHEN}" in refused.details()  # type: ignore[attr-defined]
    reading = pb.IdentityRequest(channel="team/notes")
    refused = refusal(
        lambda: expiring.memories.Identity(reading, metadata=bearer(expiring.tokens["team"]))
    )
    assert refused.code() == UNAUTHENTICATED  # type: ignore[attr-defined]

    assert expiring.store("root", "team/notes", "The lasting key goes on.")
    assert expiring.total("team/notes") == 3


def test_an_open_subscription_ends_when_its_key_expires(expiring: Expiring) -> None:
    request = tpb.SubscribeRequest(channels=["team/feed"], kinds=[tpb.EVENT_KIND_ON_STORE])
    stream = expiring.triggers.Subscribe(
        request, metadata=bearer(expiring.tokens["team"]), timeout=60
    )
    seen: queue.Queue[tpb.Event | grpc.RpcError] = queue.Queue()

    def read() -> None:
        try:
            for reply in stream:
                seen.put(reply.event)
        except grpc.RpcError as error:
            seen.put(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        before = expiring.store("root", "team/feed", "Delivered while the key is valid.")
        first = seen.get(timeout=30)
        assert isinstance(first, tpb.Event) and first.memory_id == before

        expiring.expire()
        expiring.store("root", "team/feed", "Due after the key expired: not delivered.")
        ended = seen.get(timeout=30)
        assert isinstance(ended, grpc.RpcError)
        assert ended.code() == UNAUTHENTICATED  # type: ignore[attr-defined]
        assert f"expired at {WHEN}" in ended.details()  # type: ignore[attr-defined]
    finally:
        stream.cancel()
        reader.join(10)


def test_a_client_stream_stores_nothing_once_its_key_expires(expiring: Expiring) -> None:
    def notes() -> Iterator[pb.StoreStreamRequest]:
        yield pb.StoreStreamRequest(store=pb.StoreRequest(channel="team/bulk", text="One."))
        expiring.expire()  # before the second message is sent
        yield pb.StoreStreamRequest(store=pb.StoreRequest(channel="team/bulk", text="Two."))

    refused = refusal(
        lambda: expiring.memories.StoreStream(notes(), metadata=bearer(expiring.tokens["team"]))
    )
    assert refused.code() == UNAUTHENTICATED  # type: ignore[attr-defined]
    assert "expired" in refused.details()  # type: ignore[attr-defined]
    assert expiring.total("team/bulk") == 0


def test_a_reload_may_move_the_expiry(expiring: Expiring) -> None:
    keys = auth_file.load(expiring.path)
    [team] = [key for key in keys.keys.values() if key.label == "contractor"]
    later = datetime.fromtimestamp(START + 7200, UTC)
    auth_file.save(expiring.path, keys.with_key(replace(team, expires=later)))
    assert expiring.thread.call(expiring.thread.server.reload_auth())
    expiring.expire()  # the old expiry has passed, the new one has not
    assert expiring.store("team", "team/notes", "Still valid: the expiry moved on.")
    expiring.clock.set(later.timestamp())
    refused = refusal(lambda: expiring.store("team", "team/notes", "Now too late."))
    assert refused.code() == UNAUTHENTICATED  # type: ignore[attr-defined]
