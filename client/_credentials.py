"""How a client reaches its server: TLS trust, a client certificate, and the API key it sends.

Over TLS the key rides as call credentials (``authorization: Bearer KEY``) composed into
the channel's credentials. grpc sends call credentials only on secure channels (on a
plaintext one it drops them without a word), so over plaintext an interceptor adds the
same header to every call's metadata, streams included.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import grpc.aio

from calor.client.errors import InvalidArgumentError

__all__ = [
    "API_KEY_ENV",
    "CHANNEL_ENV",
    "DEFAULT_CHANNEL",
    "DEFAULT_TARGET",
    "TARGET_ENV",
    "TLS_CA_ENV",
    "TLS_CLIENT_CERT_ENV",
    "TLS_CLIENT_KEY_ENV",
    "ChannelSecurity",
    "PemSource",
    "open_aio_channel",
    "open_channel",
    "target_and_channel",
]

# What the clients, the CLI and ``calor mcp`` read when they are not told: one place.
TARGET_ENV = "CALOR_TARGET"
CHANNEL_ENV = "CALOR_CHANNEL"
API_KEY_ENV = "CALOR_API_KEY"
TLS_CA_ENV = "CALOR_TLS_CA"
TLS_CLIENT_CERT_ENV = "CALOR_TLS_CLIENT_CERT"
TLS_CLIENT_KEY_ENV = "CALOR_TLS_CLIENT_KEY"
DEFAULT_TARGET = "localhost:50051"
DEFAULT_CHANNEL = "default"

PemSource = str | os.PathLike[str] | bytes
"""A PEM file's path, or the PEM bytes themselves."""

_AUTHORIZATION = "authorization"


@dataclass(frozen=True, repr=False)
class ChannelSecurity:
    """What a client's gRPC channel carries: TLS material and the API key.

    Attributes:
        api_key: The key sent as ``authorization: Bearer KEY`` on every call; None
            sends none.
        tls: Whether the channel speaks TLS.
        root_certificates: PEM certificates of the CAs trusted to sign the server's
            certificate; None trusts the system's roots.
        certificate_chain: PEM client certificate, for servers that require one.
        private_key: Its PEM private key.
    """

    api_key: str | None = None
    tls: bool = False
    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None

    @classmethod
    def of(
        cls,
        *,
        api_key: str | None = None,
        tls: bool = False,
        tls_ca: PemSource | None = None,
        tls_cert: PemSource | None = None,
        tls_key: PemSource | None = None,
    ) -> ChannelSecurity:
        """Read the files named and check what was given.

        Args:
            api_key: The key to send; None reads ``$CALOR_API_KEY`` (unset or empty:
                no key); "" sends none whatever the environment says.
            tls: Speak TLS trusting the system's roots; implied by any ``tls_*``.
            tls_ca: The CA certificates to trust instead, as a path or PEM bytes; None
                reads the path in ``$CALOR_TLS_CA`` (unset or empty: none); "" is none.
            tls_cert: A client certificate (path or PEM bytes), for mutual TLS; with
                ``tls_key``, None for both reads ``$CALOR_TLS_CLIENT_CERT`` and
                ``$CALOR_TLS_CLIENT_KEY``.
            tls_key: Its private key (path or PEM bytes); goes with ``tls_cert``.

        Raises:
            InvalidArgumentError: The key holds characters no header may carry, a file
                holds no PEM, or only one of ``tls_cert`` and ``tls_key`` is given.
            OSError: A file cannot be read.
        """
        if api_key is None:
            api_key = os.environ.get(API_KEY_ENV, "")
        key = _checked_key(api_key) if api_key else None
        tls_ca = _or_environment(tls_ca, TLS_CA_ENV) or None
        if tls_cert is None and tls_key is None:
            tls_cert = _or_environment(None, TLS_CLIENT_CERT_ENV)
            tls_key = _or_environment(None, TLS_CLIENT_KEY_ENV)
        tls_cert, tls_key = tls_cert or None, tls_key or None
        if (tls_cert is None) != (tls_key is None):
            raise _invalid("tls_cert and tls_key go together: give both or neither")
        return cls(
            api_key=key,
            tls=tls or tls_ca is not None or tls_cert is not None,
            root_certificates=_pem("tls_ca", tls_ca),
            certificate_chain=_pem("tls_cert", tls_cert),
            private_key=_pem("tls_key", tls_key),
        )

    def __repr__(self) -> str:
        # Never the key: a repr ends up in logs and tracebacks.
        key = "set" if self.api_key else "none"
        return f"ChannelSecurity(tls={self.tls}, api_key={key})"

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The header every call carries: the API key, or nothing."""
        if self.api_key is None:
            return ()
        return ((_AUTHORIZATION, f"Bearer {self.api_key}"),)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """The TLS credentials, the API key composed in; None for plaintext."""
        if not self.tls:
            return None
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )
        if self.api_key is None:
            return credentials
        return grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(self.api_key)
        )


def target_and_channel(target: str | None, channel: str | None) -> tuple[str, str]:
    """The server and channel a client uses: those given, else ``$CALOR_TARGET`` and
    ``$CALOR_CHANNEL``, else ``localhost:50051`` and ``default``."""
    return (
        target or os.environ.get(TARGET_ENV) or DEFAULT_TARGET,
        channel or os.environ.get(CHANNEL_ENV) or DEFAULT_CHANNEL,
    )


def _or_environment(value: PemSource | None, name: str) -> PemSource | None:
    """``value``; when None, the path in environment variable ``name`` (unset or empty:
    None)."""
    if value is None:
        return os.environ.get(name) or None
    return value


_OPTIONS = [("grpc.max_receive_message_length", -1)]
"""A client takes any answer its server sends: the server bounds them (its
``--max-message-bytes``, 16 MiB by default, against gRPC's 4 MiB default for clients)
and cuts long pages and recalls to fit."""


def open_channel(target: str, security: ChannelSecurity) -> grpc.Channel:
    """A blocking gRPC channel to ``target`` that carries ``security``."""
    credentials = security.channel_credentials()
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=_OPTIONS)
    channel = grpc.insecure_channel(target, options=_OPTIONS)
    if not security.metadata:
        return channel
    return grpc.intercept_channel(channel, _HeaderInterceptor(security.metadata))


def open_aio_channel(target: str, security: ChannelSecurity) -> grpc.aio.Channel:
    """An asyncio gRPC channel to ``target`` that carries ``security``."""
    credentials = security.channel_credentials()
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=_OPTIONS)
    if not security.metadata:
        return grpc.aio.insecure_channel(target, options=_OPTIONS)
    return grpc.aio.insecure_channel(
        target, options=_OPTIONS, interceptors=_aio_interceptors(security.metadata)
    )


def _checked_key(key: str) -> str:
    """An API key that fits in a header: printable ASCII, no spaces."""
    key = key.strip()
    if not key or not key.isascii() or not key.isprintable() or " " in key:
        raise _invalid("api_key: not an API key (printable ASCII without spaces)")
    return key


def _pem(name: str, source: PemSource | None) -> bytes | None:
    """PEM bytes from bytes or a path; None stays None."""
    if source is None:
        return None
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    if b"-----BEGIN " not in data:
        where = "" if isinstance(source, bytes) else f" {os.fspath(source)}"
        raise _invalid(f"{name}{where}: not PEM")
    return data


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, message)


# --- plaintext: the header as per-call metadata -----------------------------------------


class _CallDetails(NamedTuple):
    """A call's details with the header added (``grpc.ClientCallDetails`` is abstract)."""

    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _HeaderInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds fixed metadata to every call of a blocking channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        added = _CallDetails(
            details.method,
            details.timeout,
            (*(details.metadata or ()), *self._metadata),
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )
        return added  # type: ignore[return-value]  # duck-typed, as grpc's own examples

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request_iterator)


class _AioHeaders:
    """Adds fixed metadata to a call of an asyncio channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _AioUnaryUnaryHeaders(_AioHeaders, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class _AioUnaryStreamHeaders(_AioHeaders, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class _AioStreamUnaryHeaders(_AioHeaders, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _AioStreamStreamHeaders(_AioHeaders, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def _aio_interceptors(metadata: tuple[tuple[str, str], ...]) -> list[grpc.aio.ClientInterceptor]:
    """One interceptor per kind of call: an asyncio channel files each interceptor under
    the first kind it implements only, so one object for all four would miss streams."""
    return [
        _AioUnaryUnaryHeaders(metadata),
        _AioUnaryStreamHeaders(metadata),
        _AioStreamUnaryHeaders(metadata),
        _AioStreamStreamHeaders(metadata),
    ]
