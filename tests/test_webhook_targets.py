"""Webhooks cannot reach inside: URLs are parsed strictly, every spelling of an address is
seen as that address, hosts off the allow-list are refused when the trigger is created,
and at delivery only a public address, or one the allow-list names exactly, is connected
to: the one that was checked."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest

from calor.triggers.webhook import WebhookOutcome, WebhookPolicy, send_webhook
from calor.triggers.webhook_targets import (
    address_refusal,
    parse_allow_entry,
    parse_host,
    parse_url,
)
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import store

# --- a loopback receiver ----------------------------------------------------------------------


@dataclass
class Receiver:
    """An HTTP server on 127.0.0.1 answering ``status`` to each POST, recording the Host."""

    status: Callable[[int], int] = lambda n: 204
    hosts: list[str] = field(default_factory=list)
    port: int = 0


@pytest.fixture(scope="module")
def receivers() -> Iterator[Callable[..., Receiver]]:
    servers: list[ThreadingHTTPServer] = []

    def start(status: Callable[[int], int] = lambda n: 204) -> Receiver:
        receiver = Receiver(status)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.hosts.append(self.headers.get("Host", ""))
                self.send_response(receiver.status(len(receiver.hosts)))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}).start()
        servers.append(server)
        receiver.port = server.server_address[1]
        return receiver

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# --- hosts and URLs, as pure logic ------------------------------------------------------------

LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "2130706433",  # one decimal number
    "0x7f.1",  # hex, then the last part fills three bytes
    "0x7f000001",
    "0177.0.0.1",  # octal
    "017700000001",
    "127.1",
    "127.0.1",
    "0X7F.0.0.01",
    "127.0.0.1.",  # a trailing dot
]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_every_spelling_of_an_address_is_that_address(host: str) -> None:
    assert parse_host(host) == ("127.0.0.1", ipaddress.IPv4Address("127.0.0.1"))
    # The C library reads the same numbers the same way: that is what would connect.
    assert socket.inet_aton(host.rstrip(".")) == bytes([127, 0, 0, 1])


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("::ffff:127.0.0.1", "127.0.0.1"),  # IPv4-mapped IPv6 is the IPv4 address
        ("0:0:0:0:0:0:0:1", "::1"),
        ("Hooks.Example.COM.", "hooks.example.com"),
        ("10.1", "10.0.0.1"),
        ("0", "0.0.0.0"),
    ],
)
def test_hosts_have_one_canonical_form(host: str, expected: str) -> None:
    assert parse_host(host)[0] == expected


@pytest.mark.parametrize(
    "host", ["08.1", "1.2.3.4.5", "256.0.0.1", "1.16777216", "hooks.123", "a..b", "-a.b", ""]
)
def test_a_host_that_is_neither_an_address_nor_a_name_is_refused(host: str) -> None:
    with pytest.raises(ValueError):
        parse_host(host)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://hooks.example.com/x", "http or https"),
        ("http://user:pw@hooks.example.com/x", "credentials"),
        ("http://@hooks.example.com/x", "credentials"),
        ("http://hooks.example.com:0/x", "port"),
        ("http://hooks.example.com:65536/x", "port"),
        ("http://hooks.example.com:/x", "port"),
        ("http://hooks.example.com:+80/x", "port"),
        ("http:///x", "no host"),
        ("http://[fe80::1%25eth0]/x", "zone"),
        ("http://hooks.example.com\\@evil.example/x", "backslash"),
        ("http://hooks.example.com/a b", "spaces"),
        ("http://1.2.3.4.5/x", "IPv4"),
    ],
)
def test_urls_are_parsed_strictly(url: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_url(url)


def test_a_parsed_url_keeps_its_path_and_the_header_host() -> None:
    target = parse_url("HTTP://0x7f.1:8080/hook?src=calor#fragment")
    assert (target.scheme, target.host, target.port, target.path) == (
        "http",
        "127.0.0.1",
        8080,
        "/hook?src=calor",
    )
    assert target.authority == "127.0.0.1:8080"
    assert parse_url("https://[::1]/").authority == "[::1]"


def test_allow_list_entries_are_canonical_too() -> None:
    assert parse_allow_entry("0x7f.1:8080") == ("127.0.0.1", (8080,))
    assert parse_allow_entry("[::ffff:10.0.0.1]:81") == ("10.0.0.1", (81,))
    policy = WebhookPolicy(allowed_hosts=frozenset({"127.0.0.1:8080"}))
    assert policy.allows("2130706433", 8080) and policy.allows("[::ffff:127.0.0.1]", 8080)
    assert not policy.allows("localhost", 8080)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("168.63.129.16", "metadata"),  # Azure's wire server, in public space
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fd12:3456::1", "unique-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("::ffff:10.0.0.1", "private"),
        ("2002:a9fe:a9fe::1", "169.254.169.254"),  # 6to4 carrying the metadata address
        ("64:ff9b::a00:1", "10.0.0.1"),  # NAT64 carrying a private one
        ("192.0.2.1", "special-purpose"),
        ("240.0.0.1", "special-purpose"),
    ],
)
def test_addresses_that_are_not_public_are_named(address: str, kind: str) -> None:
    found = address_refusal(ipaddress.ip_address(address))
    assert found is not None and kind in found


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address)) is None


# --- delivery: the resolver is the seam -------------------------------------------------------

NAME = "hooks.example.test"  # .test never resolves for real: reaching it proves pinning


def resolving(*answers: Sequence[str]) -> tuple[Any, list[str]]:
    """A resolver giving ``answers`` in turn (the last one again after that), and the
    names it was asked for."""
    asked: list[str] = []

    async def resolve(host: str, port: int) -> Sequence[str]:
        asked.append(host)
        return answers[min(len(asked), len(answers)) - 1]

    return resolve, asked


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (["10.0.0.7"], "10.0.0.7 (a private address)"),
        (["169.254.169.254"], "(a cloud metadata address)"),
        (["fd00:ec2::254"], "(a cloud metadata address)"),
        (["::ffff:192.168.0.10"], "192.168.0.10 (a private address)"),
        (["127.0.0.1", "::1"], "127.0.0.1 (a loopback address) and ::1 (a loopback address)"),
    ],
)
def test_a_name_resolving_inside_is_refused_before_connecting(
    answer: list[str], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def never(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"connected to {args}")

    monkeypatch.setattr(asyncio, "open_connection", never)  # no packet leaves, even on a bug
    resolver, asked = resolving(answer)
    policy = WebhookPolicy(allowed_hosts=frozenset({f"{NAME}:8080"}), resolver=resolver)
    outcome = asyncio.run(send_webhook(f"http://{NAME}:8080/hook", {}, secret="", policy=policy))
    assert (outcome.delivered, outcome.status, outcome.attempts) == (False, None, 0)
    assert outcome.error.startswith(f"{NAME} resolves to ") and kind in outcome.error
    assert asked == [NAME]  # refused once, not retried


def test_an_exactly_allowed_address_is_connected_to_with_the_name_as_host(
    receivers: Callable[..., Receiver],
) -> None:
    receiver = receivers()
    resolver, asked = resolving(["10.0.0.7", "127.0.0.1"])  # only the second is allowed
    allowed = frozenset({f"{NAME}:{receiver.port}", f"127.0.0.1:{receiver.port}"})
    policy = WebhookPolicy(allowed_hosts=allowed, resolver=resolver)
    url = f"http://{NAME}:{receiver.port}/hook"
    outcome = asyncio.run(send_webhook(url, {}, secret="", policy=policy))
    assert outcome == WebhookOutcome(delivered=True, status=204, attempts=1, error="")
    assert receiver.hosts == [f"{NAME}:{receiver.port}"]
    assert asked == [NAME]


def test_an_answer_that_changes_between_attempts_is_checked_again(
    receivers: Callable[..., Receiver],
) -> None:
    """DNS rebinding: the first attempt resolves to the allowed address and fails with a
    5xx; the retry resolves to another loopback address, which is refused, not reached."""
    receiver = receivers(lambda n: 503)
    resolver, asked = resolving(["127.0.0.1"], ["127.0.0.2"])
    allowed = frozenset({f"{NAME}:{receiver.port}", f"127.0.0.1:{receiver.port}"})
    policy = WebhookPolicy(allowed_hosts=allowed, resolver=resolver, backoff_seconds=0.0)
    url = f"http://{NAME}:{receiver.port}/hook"
    outcome = asyncio.run(send_webhook(url, {}, secret="", policy=policy, retries=3))
    assert (outcome.delivered, outcome.status, outcome.attempts) == (False, 503, 1)
    assert outcome.error.startswith("attempt 2: ")
    assert "127.0.0.2 (a loopback address)" in outcome.error
    assert len(receiver.hosts) == 1 and asked == [NAME, NAME]


# --- through the server -----------------------------------------------------------------------


@dataclass
class World:
    """One server and its receivers: ``exact`` allowed by address, ``named`` by name only,
    ``both`` by name and by address."""

    server: ServerThread
    exact: Receiver
    named: Receiver
    both: Receiver


@pytest.fixture(scope="module")
def world(start_server: Callable[..., ServerThread], receivers: Callable[..., Receiver]) -> World:
    exact, named, both = receivers(), receivers(), receivers()
    allow = (
        f"127.0.0.1:{exact.port}",
        f"localhost:{named.port}",
        f"localhost:{both.port}",
        f"127.0.0.1:{both.port}",
    )
    return World(start_server(webhook_allow=allow), exact, named, both)


@pytest.fixture
def stubs(world: World) -> Iterator[tuple[TriggerServiceStub, MemoryServiceStub]]:
    with grpc.insecure_channel(world.server.target) as channel:
        yield TriggerServiceStub(channel), MemoryServiceStub(channel)


def webhook(triggers: TriggerServiceStub, channel: str, url: str) -> tpb.Trigger:
    trigger = tpb.Trigger(
        channel=channel,
        event=tpb.EVENT_KIND_ON_STORE,
        action=tpb.ACTION_KIND_WEBHOOK,
        config={"url": url, "retries": "0"},
    )
    return triggers.CreateTrigger(tpb.CreateTriggerRequest(trigger=trigger)).trigger


def outcomes(triggers: TriggerServiceStub, *ids: str) -> list[str]:
    """The outcome of each trigger's one firing, once every one has fired."""
    deadline = time.monotonic() + 20
    while True:
        found = [
            triggers.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=i)).firings for i in ids
        ]
        if all(found) or time.monotonic() > deadline:
            return [firing.outcome for firings in found for firing in firings]
        time.sleep(0.05)


REFUSED_AT_CREATION = [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254:80"),
    ("http://10.0.0.1/hook", "10.0.0.1:80"),
    ("http://localhost/hook", "localhost:80"),
    ("http://2130706433/hook", "127.0.0.1:80"),
    ("http://0x7f.1/hook", "127.0.0.1:80"),
    ("http://0177.0.0.1:8080/hook", "127.0.0.1:8080"),
    ("http://[::1]/hook", "[::1]:80"),
    ("http://[::ffff:169.254.169.254]/hook", "169.254.169.254:80"),
    ("http://[fd00:ec2::254]/latest", "[fd00:ec2::254]:80"),
    ("https://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal:443"),
]


@pytest.mark.parametrize(("url", "named"), REFUSED_AT_CREATION)
def test_a_webhook_off_the_allow_list_is_refused_at_creation(
    stubs: tuple[TriggerServiceStub, MemoryServiceStub], channel_name: str, url: str, named: str
) -> None:
    triggers, _ = stubs
    with pytest.raises(grpc.RpcError) as refused:
        webhook(triggers, channel_name, url)
    details = refused.value.details() or ""
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details
    assert f"config.url: {named} is not on the webhook allow-list" in details
    assert "--webhook-allow" in details
    assert not triggers.ListTriggers(tpb.ListTriggersRequest(channel=channel_name)).triggers


def test_an_allowed_port_under_another_name_is_refused_at_creation(
    world: World, stubs: tuple[TriggerServiceStub, MemoryServiceStub], channel_name: str
) -> None:
    triggers, _ = stubs
    for url in (
        f"http://localhost:{world.exact.port}/hook",  # the address is allowed, not the name
        f"http://127.0.0.1:{world.named.port}/hook",  # the name is allowed, not the address
        f"http://user@127.0.0.1:{world.exact.port}/hook",  # well placed, but credentials
    ):
        with pytest.raises(grpc.RpcError) as refused:
            webhook(triggers, channel_name, url)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "config.url" in (refused.value.details() or "")


def test_an_allowed_receiver_is_reached_however_its_address_is_written(
    world: World, stubs: tuple[TriggerServiceStub, MemoryServiceStub], channel_name: str
) -> None:
    triggers, memories = stubs
    port = world.exact.port
    plain = webhook(triggers, channel_name, f"http://127.0.0.1:{port}/hook")
    numeric = webhook(triggers, channel_name, f"http://2130706433:{port}/hook")
    assert numeric.config["url"] == f"http://2130706433:{port}/hook"  # stored as given
    before = len(world.exact.hosts)
    store(memories, channel_name, "The ferry leaves at nine.")
    assert all(o.startswith("delivered") for o in outcomes(triggers, plain.id, numeric.id))
    assert world.exact.hosts[before:] == [f"127.0.0.1:{port}"] * 2


def test_a_name_allowed_but_resolving_to_loopback_is_refused_at_delivery(
    world: World, stubs: tuple[TriggerServiceStub, MemoryServiceStub], channel_name: str
) -> None:
    """``localhost`` is on the allow-list by name; the loopback address it resolves to is
    not, so the firing is refused without a request and its history says why. With its
    address allowed too, the same name is delivered to that address."""
    triggers, memories = stubs
    named = webhook(triggers, channel_name, f"http://localhost:{world.named.port}/hook")
    both = webhook(triggers, channel_name, f"http://localhost:{world.both.port}/hook")
    store(memories, channel_name, "The lighthouse keeper logs the storm.")
    refused, delivered = outcomes(triggers, named.id, both.id)
    assert refused.startswith("not delivered: localhost resolves to ")
    assert "127.0.0.1 (a loopback address)" in refused
    assert f"does not name it with port {world.named.port}" in refused
    assert world.named.hosts == []
    assert delivered.startswith("delivered")
    assert world.both.hosts == [f"localhost:{world.both.port}"]
