"""Webhooks against a real loopback HTTP server: signing, the allow-list, retries, timeouts."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from calor.triggers.webhook import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    USER_AGENT,
    WebhookOutcome,
    WebhookPolicy,
    parse_allow_entry,
    send_webhook,
    verify_signature,
)

SECRET = "s3cret"
BODY = {"trigger_id": "trg_1", "memory": {"id": "m1", "text": "héllo"}, "heat": 0.5}


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A loopback server whose answer to the n-th request (from 1) is ``respond(n)``."""

    respond: Callable[[int], int | None]
    requests: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.requests.append(Seen(self.path, dict(self.headers.items()), body))
                n = len(receiver.requests)
            status = receiver.respond(n)
            if status is None:  # never answer: hold the connection until the test ends
                receiver.release.wait(5)
                return
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[int], int | None]], Receiver]]:
    servers: list[tuple[ThreadingHTTPServer, Receiver, threading.Thread]] = []

    def start(respond: Callable[[int], int | None]) -> Receiver:
        receiver = Receiver(respond)
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook?src=calor"
        servers.append((server, receiver, thread))
        return receiver

    yield start
    for server, receiver, thread in servers:
        receiver.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


POLICY = WebhookPolicy(
    allowed_hosts=frozenset(), timeout_seconds=2.0, retries=3, backoff_seconds=0.01
)


def allowing(url: str, policy: WebhookPolicy = POLICY) -> WebhookPolicy:
    """``policy`` with exactly the host and port of ``url`` on its allow-list."""
    return replace(policy, allowed_hosts=frozenset({urlsplit(url).netloc}))


def send(url: str, **options: object) -> WebhookOutcome:
    kwargs: dict[str, object] = {"secret": SECRET, "policy": allowing(url), **options}
    return asyncio.run(send_webhook(url, BODY, **kwargs))  # type: ignore[arg-type]


def test_delivered_with_a_valid_signature(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: 204)
    outcome = send(receiver.url)
    assert outcome == WebhookOutcome(delivered=True, status=204, attempts=1, error="")
    (seen,) = receiver.requests
    assert seen.path == "/hook?src=calor"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["User-Agent"] == USER_AGENT
    assert abs(int(seen.headers[TIMESTAMP_HEADER]) - time.time()) < 60
    assert json.loads(seen.body) == BODY
    signature = seen.headers[SIGNATURE_HEADER]
    assert signature.startswith("sha256=")
    assert verify_signature(seen.body, SECRET, signature)
    assert not verify_signature(seen.body + b" ", SECRET, signature)
    assert not verify_signature(seen.body, "other", signature)
    assert not verify_signature(seen.body, SECRET, "sha256=00")


def test_no_signature_without_a_secret(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: 200)
    assert send(receiver.url, secret="").delivered
    assert SIGNATURE_HEADER not in receiver.requests[0].headers
    assert not verify_signature(receiver.requests[0].body, "", "sha256=")


def test_a_host_off_the_allow_list_is_refused_without_a_request(
    serve: Callable[..., Receiver],
) -> None:
    receiver = serve(lambda n: 200)
    url = receiver.url.replace("127.0.0.1", "localhost")
    port = urlsplit(url).port
    outcome = send(url, policy=allowing(receiver.url))
    assert outcome == WebhookOutcome(
        delivered=False,
        status=None,
        attempts=0,
        error=f"localhost:{port} is not on the webhook allow-list",
    )
    nothing_allowed = WebhookPolicy(allowed_hosts=frozenset())
    assert send(receiver.url, policy=nothing_allowed).attempts == 0
    assert receiver.requests == []


def test_the_allow_list_ignores_case() -> None:
    policy = WebhookPolicy(allowed_hosts=frozenset({"Hooks.Example.COM:8443", "[::1]:8080"}))
    assert policy.allows("hooks.example.com", 8443)
    assert policy.allows("::1", 8080)
    assert not policy.allows("example.com", 8443)


def test_5xx_is_retried_until_delivered(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: 500 if n <= 2 else 200)
    outcome = send(receiver.url)
    assert outcome == WebhookOutcome(delivered=True, status=200, attempts=3, error="")
    assert len(receiver.requests) == 3
    bodies = {seen.body for seen in receiver.requests}
    assert len(bodies) == 1  # every attempt sends the same signed bytes


def test_retries_run_out(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: 503)
    outcome = send(receiver.url, retries=2)
    assert not outcome.delivered
    assert (outcome.status, outcome.attempts) == (503, 3)
    assert "HTTP 503" in outcome.error
    assert len(receiver.requests) == 3


def test_4xx_is_not_retried(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: 400)
    outcome = send(receiver.url)
    assert outcome == WebhookOutcome(
        delivered=False, status=400, attempts=1, error="attempt 1: the receiver answered HTTP 400"
    )
    assert len(receiver.requests) == 1


def test_a_redirect_is_not_followed(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: 302)
    outcome = send(receiver.url)
    assert (outcome.delivered, outcome.status, outcome.attempts) == (False, 302, 1)


def test_a_silent_server_times_out_on_each_attempt(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: None)
    started = time.monotonic()
    outcome = send(receiver.url, timeout=0.2, retries=1)
    elapsed = time.monotonic() - started
    assert not outcome.delivered
    assert (outcome.status, outcome.attempts) == (None, 2)
    assert "timed out" in outcome.error
    assert 0.4 <= elapsed < 2.0
    assert len(receiver.requests) == 2


def test_connection_refused_is_retried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome = send(f"http://127.0.0.1:{port}/", retries=2)
    assert (outcome.delivered, outcome.status, outcome.attempts) == (False, None, 3)
    assert "connection failed" in outcome.error


def test_an_oversized_or_invalid_body_is_refused() -> None:
    small = WebhookPolicy(allowed_hosts=frozenset({"127.0.0.1:9"}), max_body_bytes=10)
    outcome = asyncio.run(send_webhook("http://127.0.0.1:9/", BODY, secret="", policy=small))
    assert (outcome.attempts, outcome.delivered) == (0, False)
    assert "over the limit" in outcome.error
    policy = allowing("http://127.0.0.1:9/")
    bad = asyncio.run(
        send_webhook("http://127.0.0.1:9/", {"x": object()}, secret="", policy=policy)
    )
    assert bad.attempts == 0 and "JSON" in bad.error


def test_cancellation_propagates(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: None)

    async def main() -> None:
        task = asyncio.create_task(
            send_webhook(receiver.url, BODY, secret="", policy=allowing(receiver.url), timeout=5.0)
        )
        while not receiver.requests:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    started = time.monotonic()
    asyncio.run(asyncio.wait_for(main(), 5))
    assert time.monotonic() - started < 2.0


def test_a_bad_policy_is_rejected() -> None:
    with pytest.raises(ValueError):
        WebhookPolicy(allowed_hosts=frozenset(), timeout_seconds=0)
    with pytest.raises(ValueError):
        WebhookPolicy(allowed_hosts=frozenset(), retries=-1)


def test_an_allow_list_entry_names_host_and_port_exactly() -> None:
    policy = WebhookPolicy(allowed_hosts=frozenset({"127.0.0.1:8080", "[::1]:9000"}))
    assert policy.allows("127.0.0.1", 8080)
    assert not policy.allows("127.0.0.1", 8081)
    assert not policy.allows("127.0.0.1", 80)
    assert policy.allows("::1", 9000)
    assert not policy.allows("::1", 443)


def test_a_bare_host_allows_only_ports_80_and_443() -> None:
    policy = WebhookPolicy(allowed_hosts=frozenset({"127.0.0.1", "[::1]"}))
    assert policy.allows("127.0.0.1", 80) and policy.allows("127.0.0.1", 443)
    assert policy.allows("::1", 80) and policy.allows("::1", 443)
    assert not policy.allows("127.0.0.1", 8080)
    assert not policy.allows("127.0.0.1", 22)


def test_a_port_off_the_allow_list_is_refused_without_a_request(
    serve: Callable[..., Receiver],
) -> None:
    receiver = serve(lambda n: 200)
    port = urlsplit(receiver.url).port
    bare = replace(POLICY, allowed_hosts=frozenset({"127.0.0.1"}))
    other = replace(POLICY, allowed_hosts=frozenset({f"127.0.0.1:{port + 1}"}))
    for policy in (bare, other):
        outcome = send(receiver.url, policy=policy)
        assert (outcome.delivered, outcome.attempts) == (False, 0)
        assert outcome.error == f"127.0.0.1:{port} is not on the webhook allow-list"
    assert receiver.requests == []
    assert send(receiver.url).delivered  # its own host:port is allowed


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("hooks.example.com", ("hooks.example.com", (80, 443))),
        ("Hooks.Example.com:8443", ("hooks.example.com", (8443,))),
        ("[::1]:8080", ("::1", (8080,))),
        ("[::1]", ("::1", (80, 443))),
        ("::1", ("::1", (80, 443))),
    ],
)
def test_allow_list_entries_parse(entry: str, expected: tuple[str, tuple[int, ...]]) -> None:
    assert parse_allow_entry(entry) == expected


@pytest.mark.parametrize(
    "entry", ["", "host:", "host:0", "host:65536", "host:http", "[::1", "a:b:c"]
)
def test_a_bad_allow_list_entry_is_rejected(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_allow_entry(entry)
    with pytest.raises(ValueError):
        WebhookPolicy(allowed_hosts=frozenset({entry}))


def test_every_attempt_carries_the_idempotency_key(serve: Callable[..., Receiver]) -> None:
    receiver = serve(lambda n: 500 if n == 1 else 200)
    body = {**BODY, "idempotency_key": "trg_1:42"}
    policy = allowing(receiver.url)
    outcome = asyncio.run(
        send_webhook(receiver.url, body, secret=SECRET, policy=policy, idempotency_key="trg_1:42")
    )
    assert (outcome.delivered, outcome.attempts) == (True, 2)
    assert [seen.headers[IDEMPOTENCY_HEADER] for seen in receiver.requests] == ["trg_1:42"] * 2
    for seen in receiver.requests:  # the key is in the signed body too
        assert json.loads(seen.body)["idempotency_key"] == "trg_1:42"
        assert verify_signature(seen.body, SECRET, seen.headers[SIGNATURE_HEADER])
    with pytest.raises(ValueError):
        asyncio.run(
            send_webhook(receiver.url, body, secret="", policy=policy, idempotency_key="a b")
        )
