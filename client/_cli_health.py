"""The ``calor health`` command: whether a server answers SERVING, for scripts and for a
container's health check."""

from __future__ import annotations

import argparse

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from calor.client.client import CalorClient
from calor.client.errors import CalorClientError

__all__ = ["NotServingError", "add_health_command"]

_DEFAULT_TIMEOUT = 5.0


class NotServingError(CalorClientError):
    """The server answered, but not SERVING: it is loading its model and indexes, or
    stopping."""


def _health(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    status = client.health()
    if status != "SERVING":
        raise NotServingError(
            grpc.StatusCode.UNAVAILABLE,
            f"{args.target} answers {status} (it is loading, or stopping)",
        )
    serving = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
    return serving, f"{args.target}: SERVING"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def add_health_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``calor health [--timeout S]`` to the top-level commands.

    It asks the gRPC health service (``grpc.health.v1``, the server as a whole) and exits
    0 when the server is SERVING, 1 when it answers anything else or cannot be reached in
    time. ``--target`` and the TLS and key options are the global ones.

    Args:
        commands: The top-level subparsers.
        shared: The parser of the global options (a parent, so they may follow).
    """
    summary = (
        "exit 0 if the server answers SERVING on the gRPC health service, 1 if it does "
        "not (loading, stopping, unreachable): for scripts and container health checks"
    )
    health = commands.add_parser("health", parents=[shared], help=summary, description=summary)
    health.set_defaults(handler=_health)
    health.add_argument(
        "--timeout",
        dest="call_timeout",
        type=_seconds,
        default=_DEFAULT_TIMEOUT,
        metavar="S",
        help=f"give up after S seconds (default {_DEFAULT_TIMEOUT:g})",
    )
