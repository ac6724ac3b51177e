"""The command line's connection options (API key, TLS) and what to tell a person refused."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TypedDict

from calor.client._credentials import (
    API_KEY_ENV,
    TLS_CA_ENV,
    TLS_CLIENT_CERT_ENV,
    TLS_CLIENT_KEY_ENV,
)
from calor.client.errors import (
    CalorClientError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = ["ConnectionArguments", "add_connection_options", "connection_arguments", "hint"]


class ConnectionArguments(TypedDict):
    """The clients' keyword arguments that say how to reach the server."""

    api_key: str | None
    tls: bool
    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None


def add_connection_options(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    """Add ``--api-key``, ``--tls``, ``--tls-ca``, ``--tls-client-cert`` and ``--tls-client-key``.

    As the other global options, they are accepted before and after the command, and
    only the top-level parser (``with_defaults``) holds the defaults, read from the
    environment.
    """

    def default(value: object) -> object:
        return value if with_defaults else argparse.SUPPRESS

    def env_path(name: str) -> object:
        value = os.environ.get(name)
        return default(Path(value) if value else None)

    parser.add_argument(
        "--api-key",
        metavar="KEY",
        default=default(os.environ.get(API_KEY_ENV) or None),
        help=f"API key sent with every call (env {API_KEY_ENV}, which keeps it out of the "
        "process list)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=default(False),
        help="speak TLS, trusting the system's root certificates",
    )
    parser.add_argument(
        "--tls-ca",
        type=Path,
        metavar="FILE",
        default=env_path(TLS_CA_ENV),
        help=f"speak TLS, trusting the CA certificates in this PEM file (env {TLS_CA_ENV})",
    )
    parser.add_argument(
        "--tls-client-cert",
        type=Path,
        metavar="FILE",
        default=env_path(TLS_CLIENT_CERT_ENV),
        help="client certificate (PEM) for a server that requires one: mutual TLS "
        f"(env {TLS_CLIENT_CERT_ENV})",
    )
    parser.add_argument(
        "--tls-client-key",
        type=Path,
        metavar="FILE",
        default=env_path(TLS_CLIENT_KEY_ENV),
        help=f"the client certificate's private key (PEM) (env {TLS_CLIENT_KEY_ENV})",
    )


def connection_arguments(args: argparse.Namespace) -> ConnectionArguments:
    """The clients' connection keywords from parsed options."""
    return ConnectionArguments(
        api_key=args.api_key,
        tls=args.tls,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_client_cert,
        tls_key=args.tls_client_key,
    )


def hint(err: CalorClientError, target: str) -> str:
    """What a person might do about a failed call; "" when there is nothing to say."""
    if isinstance(err, UnauthenticatedError):
        return f"(set {API_KEY_ENV} or pass --api-key with a key the server knows)"
    if isinstance(err, PermissionDeniedError):
        return "(the API key is not granted this; `calor keys list` shows each key's grants)"
    if isinstance(err, UnavailableError):
        if "handshake" in err.details.lower():
            return (
                f"(TLS with {target} failed: pass --tls-ca with the CA that signed its "
                "certificate, and --tls-client-cert/--tls-client-key if it requires one)"
            )
        return (
            f"(is a Calor server running at {target}? `calor serve` starts one; "
            "if it serves TLS, pass --tls-ca)"
        )
    return ""
