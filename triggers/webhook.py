"""Webhook delivery: signed JSON POSTs to allow-listed hosts, with timeouts and retries."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import math
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "USER_AGENT",
    "WebhookOutcome",
    "WebhookPolicy",
    "send_webhook",
    "sign",
    "verify_signature",
]

SIGNATURE_HEADER = "X-Calor-Signature"
TIMESTAMP_HEADER = "X-Calor-Timestamp"
USER_AGENT = "calor-webhook/1"
_SIGNATURE_PREFIX = "sha256="
_MAX_BACKOFF_SECONDS = 60.0  # doubling stops here, so ten retries never wait for hours
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9]{2})(?:[ \r\n]|$)")


@dataclass(frozen=True)
class WebhookPolicy:
    """How webhooks may be sent; one per server, from its configuration.

    Attributes:
        allowed_hosts: Host names or IP addresses that may be called, matched exactly and
            case-insensitively against the URL's host; empty allows nothing.
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

    def __post_init__(self) -> None:
        if not math.isfinite(self.timeout_seconds) or self.timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be finite and > 0, not {self.timeout_seconds}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, not {self.retries}")
        if not math.isfinite(self.backoff_seconds) or self.backoff_seconds < 0:
            raise ValueError(f"backoff_seconds must be finite and >= 0, not {self.backoff_seconds}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, not {self.max_body_bytes}")
        hosts = frozenset(_normal_host(host) for host in self.allowed_hosts)
        object.__setattr__(self, "allowed_hosts", hosts)

    def allows(self, host: str) -> bool:
        """Whether ``host`` is on the allow-list (exact, case-insensitive)."""
        return _normal_host(host) in self.allowed_hosts


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
    if not policy.allows(host):
        return f"host {host} is not on the webhook allow-list"
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


def _request(parts: SplitResult, host: str, data: bytes, secret: str) -> bytes:
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
) -> WebhookOutcome:
    """POST ``body`` as JSON to ``url`` if its host is allowed, retrying transient failures.

    Connection errors, timeouts, malformed responses and 5xx answers are retried with a
    doubling backoff; 2xx is delivered; any other status (4xx, a redirect) ends it at
    once. With a ``secret`` the request carries ``X-Calor-Signature: sha256=<hex>``, the
    HMAC-SHA256 of the exact body bytes. Cancelling the caller cancels the delivery.

    Args:
        url: An ``http`` or ``https`` URL.
        body: A JSON-serialisable mapping; sent with sorted keys.
        secret: The shared signing secret; "" sends no signature.
        policy: The allow-list and defaults.
        timeout: The limit on each attempt, in seconds; None uses the policy's.
        retries: Retries after the first attempt; None uses the policy's.

    Returns:
        The outcome; a refused URL or body has ``attempts`` 0.

    Raises:
        ValueError: ``timeout`` or ``retries`` is out of range (a caller bug).
    """
    per_attempt = policy.timeout_seconds if timeout is None else timeout
    extra = policy.retries if retries is None else retries
    if not math.isfinite(per_attempt) or per_attempt <= 0 or extra < 0:
        raise ValueError(f"invalid webhook timeout {per_attempt} or retries {extra}")
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
        answer = await _attempt(parts, host, _request(parts, host, data, secret), per_attempt)
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
