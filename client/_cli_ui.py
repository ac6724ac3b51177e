"""The ``calor ui`` command: the web inspector over a server, served on this machine."""

from __future__ import annotations

import argparse
import sys

from calor.client._cli_connection import connection_arguments
from calor.client._credentials import ChannelSecurity
from calor.client.errors import CalorClientError, InvalidArgumentError

__all__ = ["add_ui_command", "run_ui"]

_DEFAULT_PORT = 8700


def add_ui_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``calor ui [--host H] [--port N] [--allow-writes]`` to the top-level commands.

    ``--target`` and the key and TLS options are the global ones: the inspector shows
    what that key may read.
    """
    summary = (
        "serve a web inspector of the server (fleet, channels, memories' heat, a recall "
        "playground, live events) on this machine until Ctrl-C; read-only unless "
        "--allow-writes"
    )
    ui = commands.add_parser("ui", parents=[shared], help=summary, description=summary)
    ui.set_defaults(handler=None)
    ui.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    ui.add_argument(
        "--port", type=int, default=_DEFAULT_PORT, help=f"port (default {_DEFAULT_PORT})"
    )
    ui.add_argument(
        "--allow-writes",
        action="store_true",
        help=(
            "let the pages change memories: boost, pin or forget one, recall and warm "
            "the hits (each form CSRF-guarded)"
        ),
    )


def run_ui(args: argparse.Namespace) -> int:
    """Serve the inspector as ``args`` say; the exit status."""
    try:
        from calor.client.ui import UiOptions, serve
    except ImportError as err:
        print(
            f"error: calor ui needs its web packages ({err.name} is not installed): "
            "pip install 'calor[ui]'",
            file=sys.stderr,
        )
        return 1
    try:
        security = ChannelSecurity.of(**connection_arguments(args))
    except (CalorClientError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, InvalidArgumentError) else 1
    options = UiOptions(target=args.target, security=security, allow_writes=args.allow_writes)
    print(f"calor ui on http://{args.host}:{args.port}/ (server {args.target})", flush=True)
    try:
        serve(options, host=args.host, port=args.port)
    except KeyboardInterrupt:
        return 130
    return 0
