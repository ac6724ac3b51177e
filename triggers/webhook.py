"""Webhook delivery: signed JSON POSTs to allow-listed hosts and ports, with timeouts and
retries, each carrying an idempotency key so that a receiver can drop a repeat.

Every attempt resolves the host once, refuses addresses that are not public unless the
allow-list names them exactly, and connects to an address it checked (the ``Host``
header and TLS name stay the URL's), so a name that resolves differently between the
check and the connection (DNS rebinding) cannot reach inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import math
import re
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from calor.triggers.webhook_targets import (
    Address,
    AllowList,
    Target,
    address_refusal,
    canonical_address,
    parse_allow_entry,
    parse_url,
)

__all__ = [
    "IDEMPOTENCY_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "USER_AGENT",
    "Resolver",
    "WebhookOutcome",
    "WebhookPolicy",
    "parse_allow_entry",
    "send_webhook",
    "sign",
    "system_resolver",
    "verify_signature",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
SIGNATURE_HEADER = "X-Calor-Signature"
TIMESTAMP_HEADER = "X-Calor-Timestamp"
USER_AGENT = "calor-webhook/1"
_SIGNATURE_PREFIX = "sha256="
_MAX_BACKOFF_SECONDS = 60.0  # doubling stops here, so ten retries never wait for hours
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9]{2})(?:[ \r\n]|$)")
_KEY_CHARS = re.compile(r"[!-~]{1,200}")  # visible ASCII: safe in a header line


class Resolver(Protocol):
    """Looks a host name up: the seam between delivery and DNS."""

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        """The addresses ``host`` resolves to, as text, in the order to try them.

        Raises:
            OSError: The name cannot be resolved now (``socket.gaierror``).
        """
        ...


async def system_resolver(host: str, port: int) -> Sequence[str]:
    """The addresses the system resolver gives for ``host`` (TCP), without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class WebhookPolicy:
    """How webhooks may be sent; one per server, from its configuration.

    Attributes:
        allowed_hosts: The allow-list: ``host:port`` entries (``[::1]:8080`` for IPv6)
            open exactly that host and port; a bare host opens its ports 80 and 443
            only. Hosts match the URL's exactly after both are made canonical (case,
            numeric address forms); no wildcards; empty allows nothing. An entry that is
            an IP literal also lets a delivery connect to that exact address and port
            even when it is loopback, private or link-local.
        timeout_seconds: The default limit on one attempt (resolve, connect, send, read
            the status).
        retries: The default number of retries after a failed first attempt.
        backoff_seconds: The wait before the first retry; it doubles for each later one.
        max_body_bytes: The largest JSON body that will be sent.
        resolver: How host names are resolved at delivery.
    """

    allowed_hosts: frozenset[str]
    timeout_seconds: float = 5.0
    retries: int = 3
    backoff_seconds: float = 0.5
    max_body_bytes: int = 65536
    resolver: Resolver = field(default=system_resolver, repr=False, compare=False)
    _allowed: AllowList = field(
        init=False, repr=False, compare=False, default=AllowList(frozenset())
    )

    def __post_init__(self) -> None:
        if not math.isfinite(self.timeout_seconds) or self.timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be finite and > 0, not {self.timeout_seconds}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, not {self.retries}")
        if not math.isfinite(self.backoff_seconds) or self.backoff_seconds < 0:
            raise ValueError(f"backoff_seconds must be finite and >= 0, not {self.backoff_seconds}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, not {self.max_body_bytes}")
        object.__setattr__(self, "_allowed", AllowList.of(self.allowed_hosts))

    def allows(self, host: str, port: int) -> bool:
        """Whether ``host`` (any spelling of it) and ``port`` are on the allow-list."""
        return self._allowed.allows(host, port)

    def check(self, url: str) -> Target:
        """The parsed URL, if it is well formed and its host and port are on the allow-list.

        Raises:
            ValueError: Why it may not be called, naming the host and port.
        """
        try:
            target = parse_url(url)
        except ValueError as exc:
            raise ValueError(f"the webhook url: {exc}") from None
        if (target.host, target.port) not in self._allowed.pairs:
            spelled = (
                f" ({target.written_host} is {target.host})"
                if target.written_host.strip("[]") != target.host
                else ""
            )
            raise ValueError(f"{target.hostport} is not on the webhook allow-list{spelled}")
        return target

    async def addresses(self, target: Target) -> list[Address] | str:
        """The addresses a delivery to ``target`` may connect to now, in order, or why
        there are none: every address the host resolves to that is public or allowed
        exactly (an IP literal host is its own one address).

        Raises:
            OSError: The host cannot be resolved now.
        """
        if target.address is not None:
            found: list[Address] = [target.address]
        else:
            found = []
            for text in await self.resolver(target.host, target.port):
                try:
                    found.append(canonical_address(ipaddress.ip_address(text)))
                except ValueError:
                    continue  # not an address: nothing to connect to
            if not found:
                return f"{target.host} resolves to no address"
        usable: list[Address] = []
        refusals: list[str] = []
        for address in dict.fromkeys(found):
            kind = address_refusal(address)
            if kind is None or self._allowed.allows_address(address, target.port):
                usable.append(address)
            else:
                refusals.append(f"{address} ({kind})")
        if usable:
            return usable
        return (
            f"{target.host} resolves to {' and '.join(refusals)}: not a public address, "
            f"and the webhook allow-list does not name it with port {target.port}"
        )


@dataclass(frozen=True)
class WebhookOutcome:
    """What happened to one webhook.

    Attributes:
        delivered: The receiver answered 2xx.
        status: The last HTTP status received, or None if none was.
        attempts: How many requests were attempted (0 when refused before sending).
        error: Why it was not delivered; "" when it was.
    """

    delivered: bool
    status: int | None
    attempts: int
    error: str


def sign(body: bytes, secret: str) -> str:
    """The ``X-Calor-Signature`` value for ``body``: ``sha256=`` and the hex HMAC-SHA256."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return _SIGNATURE_PREFIX + digest


def verify_signature(body: bytes, secret: str, header: str) -> bool:
    """Whether ``header`` is the signature of exactly ``body`` under ``secret``.

    For receivers and tests. The comparison takes the same time wherever the first
    difference is, so it leaks nothing about the expected value.

    Args:
        body: The raw request body, as received.
        secret: The shared secret; an empty one verifies nothing.
        header: The ``X-Calor-Signature`` header value.

    Returns:
        True when the signature is valid.
    """
    if not secret:
        return False
    return hmac.compare_digest(sign(body, secret).encode(), header.strip().encode())


def _refused(error: str) -> WebhookOutcome:
    return WebhookOutcome(delivered=False, status=None, attempts=0, error=error)


def _encode(body: Mapping[str, object], limit: int) -> bytes | str:
    """The exact bytes to send and sign, or why the body cannot be sent."""
    try:
        data = json.dumps(
            dict(body), separators=(",", ":"), sort_keys=True, ensure_ascii=False
        ).encode()
    except (TypeError, ValueError) as exc:
        return f"the webhook body is not JSON ({exc})"
    if len(data) > limit:
        return f"the webhook body is {len(data)} bytes, over the limit of {limit}"
    return data


def _request(target: Target, data: bytes, secret: str, key: str) -> bytes:
    headers = [
        f"POST {target.path} HTTP/1.1",
        f"Host: {target.authority}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        f"User-Agent: {USER_AGENT}",
        f"{TIMESTAMP_HEADER}: {int(time.time())}",
        "Connection: close",
    ]
    if key:
        headers.append(f"{IDEMPOTENCY_HEADER}: {key}")
    if secret:
        headers.append(f"{SIGNATURE_HEADER}: {sign(data, secret)}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode("ascii") + data


@dataclass(frozen=True)
class _Refusal:
    """No address of the host may be reached: the delivery ends without a request."""

    reason: str


async def _connect(
    target: Target, addresses: list[Address], tls: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of ``addresses`` that answers; TLS verifies the URL's host."""
    failure: OSError | None = None
    for address in addresses:
        try:
            return await asyncio.open_connection(
                str(address), target.port, ssl=tls, server_hostname=target.host if tls else None
            )
        except OSError as exc:
            failure = exc
    assert failure is not None  # addresses is never empty
    raise failure


async def _attempt(
    target: Target, policy: WebhookPolicy, request: bytes, timeout: float
) -> int | str | _Refusal:
    """Resolve and check the host, then send one request: the response status, why
    another attempt may fare better, or the refusal that ends the delivery.

    Only the status line is read; redirects are not followed.
    """
    tls = ssl.create_default_context() if target.scheme == "https" else None
    try:
        async with asyncio.timeout(timeout):
            try:
                addresses = await policy.addresses(target)
            except OSError as exc:
                return f"could not resolve {target.host}: {exc or type(exc).__name__}"
            if isinstance(addresses, str):
                return _Refusal(addresses)
            reader, writer = await _connect(target, addresses, tls)
            try:
                writer.write(request)
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:  # before OSError, its base class
        return f"timed out after {timeout:g}s"
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        return f"connection failed: {exc or type(exc).__name__}"
    match = _STATUS_LINE.match(line)
    if match is None:
        return f"not an HTTP/1.x response: {line[:60]!r}"
    return int(match.group(1))


async def send_webhook(
    url: str,
    body: Mapping[str, object],
    *,
    secret: str,
    policy: WebhookPolicy,
    timeout: float | None = None,
    retries: int | None = None,
    idempotency_key: str = "",
) -> WebhookOutcome:
    """POST ``body`` as JSON to ``url`` if its host and port are allowed, retrying transient
    failures.

    Connection errors, timeouts, malformed responses and 5xx answers are retried with a
    doubling backoff; 2xx is delivered; any other status (4xx, a redirect) ends it at
    once. With a ``secret`` the request carries ``X-Calor-Signature: sha256=<hex>``, the
    HMAC-SHA256 of the exact body bytes. With an ``idempotency_key`` every attempt carries
    ``Idempotency-Key: <key>`` (the caller puts the key in the body too, so it is signed):
    a receiver that has seen the key already can drop the request. Cancelling the caller
    cancels the delivery.

    Each attempt resolves the host through ``policy.resolver`` and connects only to an
    address that is public or named exactly on the allow-list; when none is, the delivery
    ends there, refused, without a request (see :meth:`WebhookPolicy.addresses`).

    Args:
        url: An ``http`` or ``https`` URL.
        body: A JSON-serialisable mapping; sent with sorted keys.
        secret: The shared signing secret; "" sends no signature.
        policy: The allow-list and defaults.
        timeout: The limit on each attempt, in seconds; None uses the policy's.
        retries: Retries after the first attempt; None uses the policy's.
        idempotency_key: Visible ASCII naming this delivery; "" sends no such header.

    Returns:
        The outcome; a refused URL or body has ``attempts`` 0.

    Raises:
        ValueError: ``timeout`` or ``retries`` is out of range, or the key is not visible
            ASCII (a caller bug).
    """
    per_attempt = policy.timeout_seconds if timeout is None else timeout
    extra = policy.retries if retries is None else retries
    if not math.isfinite(per_attempt) or per_attempt <= 0 or extra < 0:
        raise ValueError(f"invalid webhook timeout {per_attempt} or retries {extra}")
    if idempotency_key and not _KEY_CHARS.fullmatch(idempotency_key):
        raise ValueError(f"invalid idempotency key {idempotency_key[:40]!r}")
    try:
        target = policy.check(url)
    except ValueError as exc:
        return _refused(str(exc))
    data = _encode(body, policy.max_body_bytes)
    if isinstance(data, str):
        return _refused(data)
    status: int | None = None
    error = ""
    for attempt in range(1, extra + 2):
        if attempt > 1:
            await asyncio.sleep(
                min(policy.backoff_seconds * 2 ** (attempt - 2), _MAX_BACKOFF_SECONDS)
            )
        request = _request(target, data, secret, idempotency_key)
        answer = await _attempt(target, policy, request, per_attempt)
        if isinstance(answer, _Refusal):  # final: what the host resolves to is off limits
            reason = answer.reason if attempt == 1 else f"attempt {attempt}: {answer.reason}"
            return WebhookOutcome(
                delivered=False, status=status, attempts=attempt - 1, error=reason
            )
        if isinstance(answer, str):
            error = f"attempt {attempt}: {answer}"
            continue
        status = answer
        if 200 <= status < 300:
            return WebhookOutcome(delivered=True, status=status, attempts=attempt, error="")
        error = f"attempt {attempt}: the receiver answered HTTP {status}"
        if status < 500:
            return WebhookOutcome(delivered=False, status=status, attempts=attempt, error=error)
    return WebhookOutcome(delivered=False, status=status, attempts=extra + 1, error=error)
