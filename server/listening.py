"""Why a port cannot be listened on, in one line naming it: gRPC's own bind error does
not say why, so plain sockets try the same bind to find out."""

from __future__ import annotations

import errno
import socket

from calor.server.errors import AddressInUseError, FailedPreconditionError

__all__ = ["bind_errors", "in_use", "listen_refused", "port_in_use"]


def listen_refused(
    host: str, port: int, option: str, cause: Exception | None
) -> FailedPreconditionError:
    """Why ``host:port`` cannot be listened on, in one line naming it. ``cause`` is the
    bind's own error; gRPC's does not say why, so plain sockets then try the bind.

    Args:
        host: The host the server binds.
        port: The port it could not bind.
        option: The command-line option that sets the port, for the remedy.
        cause: What the bind raised (None: it returned no port).
    """
    errors = [cause] if isinstance(cause, OSError) else bind_errors(host, port)
    if any(error.errno == errno.EADDRINUSE for error in errors):
        return port_in_use(host, port, option)
    address = f"{host}:{port}"
    if errors:
        return FailedPreconditionError(
            f"cannot listen on {address}: {errors[0].strerror or errors[0]}"
        )
    said = f": {cause}" if cause is not None else ""
    return FailedPreconditionError(f"cannot listen on {address}{said}")


def in_use(host: str, port: int) -> bool:
    """Whether another process listens on ``port`` of any address ``host`` resolves to."""
    return any(error.errno == errno.EADDRINUSE for error in bind_errors(host, port))


def port_in_use(host: str, port: int, option: str) -> AddressInUseError:
    """The error of a port another process listens on; ``option`` sets the port."""
    return AddressInUseError(
        f"port {port} is in use: another process listens on {host}:{port} (another "
        f"`calor serve`?); stop it, or give this server another {option}"
    )


def bind_errors(host: str, port: int) -> list[OSError]:
    """What binding ``host:port`` raises now, tried with plain sockets as gRPC binds
    (SO_REUSEADDR, each address the host resolves to); empty if every bind works."""
    try:
        found = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as error:  # socket.gaierror: the host does not resolve
        return [error]
    errors: list[OSError] = []
    for family, kind, proto, _, address in found:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as error:
            errors.append(error)
    return errors
