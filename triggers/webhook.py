"""Webhook delivery: signed JSON POSTs to allow-listed hosts and ports, with timeouts and
retries, each carrying an idempotency key so that a receiver can drop a repeat."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import math
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

__all__ = [
    "IDEMPOTENCY_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "USER_AGENT",
    "WebhookOutcome",
    "WebhookPolicy",
    "parse_allow_entry",
    "send_webhook",
    "sign",
    "verify_signature",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
SIGNATURE_HEADER = "X-Calor-Signature"
TIMESTAMP_HEADER = "X-Calor-Timestamp"
USER_AGENT = "calor-webhook/1"
_SIGNATURE_PREFIX = "sha256="
_MAX_BACKOFF_SECONDS = 60.0  # doubling stops here, so ten retries never wait for hours
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9]{2})(?:[ \r\n]|$)")
_DEFAULT_PORTS = (80, 443)  # what a bare host on the allow-list opens
_KEY_CHARS = re.compile(r"[!-~]{1,200}")  # visible ASCII: safe in a header line


def parse_allow_entry(entry: str) -> tuple[str, tuple[int, ...]]:
    """The host and ports one allow-list entry opens.

    ``host:port`` and ``[v6 address]:port`` open exactly that port; a bare host (or a
    bare IPv6 address, bracketed or not) opens only the default ports 80 and 443.

    Raises:
        ValueError: the entry is empty or its port is not a number from 1 to 65535.
    """
    text = entry.strip()
    host, port = text, ""
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"allow-list entry {entry!r}: write IPv6 as [address]:port")
        host, port = inside, rest[1:] if rest else ""
        if rest and not port:
            raise ValueError(f"allow-list entry {entry!r}: the port is missing after ':'")
    elif text.count(":") == 1:
        host, port = text.split(":")
        if not port:
            raise ValueError(f"allow-list entry {entry!r}: the port is missing after ':'")
    elif ":" in text:  # more than one: a bare IPv6 address, or nothing valid
        try:
            ipaddress.IPv6Address(text)
        except ValueError:
            raise ValueError(
                f"allow-list entry {entry!r}: write IPv6 as [address] or [address]:port"
            ) from None
    host = _normal_host(host)
    if not host or any(ch <= " " or ch in "/@[]" for ch in host):
        raise ValueError(f"allow-list entry {entry!r}: no valid host")
    if not port:
        return host, _DEFAULT_PORTS
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"allow-list entry {entry!r}: the port must be a number from 1 to 65535")
    return host, (int(port),)


@dataclass(frozen=True)
class WebhookPolicy:
    """How webhooks may be sent; one per server, from its configuration.

    Attributes:
        allowed_hosts: The allow-list: ``host:port`` entries (``[::1]:8080`` for IPv6)
            open exactly that host and port; a bare host opens its ports 80 and 443
            only. Hosts match the URL's exactly and case-insensitively (no wildcards,
            no name resolution); empty allows nothing.
        timeout_seconds: The default limit on one attempt (connect, send, read the status).
        retries: The default number of retries after a failed first attempt.
        backoff_seconds: The wait before the first retry; it doubles for each later one.
        max_body_bytes: The largest JSON body that will be sent.
    """

    allowed_hosts: frozenset[str]
    timeout_seconds: float = 5.0
    retries: int = 3
    backoff_seconds: float = 0.5
    max_body_bytes: int = 65536
    _allowed: frozenset[tuple[str, int]] = field(
        init=False, repr=False, compare=False, default=frozenset()
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
        pairs: set[tuple[str, int]] = set()
        for entry in self.allowed_hosts:
            host, ports = parse_allow_entry(entry)
            pairs.update((host, port) for port in ports)
        object.__setattr__(self, "_allowed", frozenset(pairs))

    def allows(self, host: str, port: int) -> bool:
        """Whether ``host`` (case-insensitive) and ``port`` are on the allow-list."""
        return (_normal_host(host), port) in self._allowed


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


def _normal_host(host: str) -> str:
    return host.strip().removeprefix("[").removesuffix("]").lower()


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


def _check_url(url: str, policy: WebhookPolicy) -> tuple[SplitResult, str] | str:
    """The parsed URL and its host, or why it may not be called."""
    if not url.isascii() or any(ch <= " " or ch == "\x7f" for ch in url):
        return "the webhook url must be ASCII with no spaces or control characters"
    try:
        parts = urlsplit(url)
        _ = parts.port  # parsing the port rejects a malformed one
    except ValueError as exc:
        return f"the webhook url is not valid ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "the webhook url must be http or https with a host"
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not policy.allows(host, port):
        authority = f"[{host}]" if ":" in host else host
        return f"{authority}:{port} is not on the webhook allow-list"
    return parts, host


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


def _request(parts: SplitResult, host: str, data: bytes, secret: str, key: str) -> bytes:
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    authority = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        authority += f":{parts.port}"
    headers = [
        f"POST {target} HTTP/1.1",
        f"Host: {authority}",
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


async def _attempt(parts: SplitResult, host: str, request: bytes, timeout: float) -> int | str:
    """Send one request: the response status, or why another attempt may fare better.

    Only the status line is read; redirects are not followed.
    """
    tls = ssl.create_default_context() if parts.scheme == "https" else None
    port = parts.port or (443 if tls else 80)
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=tls, server_hostname=host if tls else None
            )
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
    checked = _check_url(url, policy)
    if isinstance(checked, str):
        return _refused(checked)
    parts, host = checked
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
        request = _request(parts, host, data, secret, idempotency_key)
        answer = await _attempt(parts, host, request, per_attempt)
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
