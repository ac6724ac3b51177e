"""The ``calor status`` command: how the server is doing, then the channel's own counts."""

from __future__ import annotations

import argparse
import json
import sys

from calor.client import _render
from calor.client.client import CalorClient
from calor.client.errors import PermissionDeniedError, UnauthenticatedError, UnimplementedError
from calor.v1 import settings_service_pb2

__all__ = ["add_status_command", "server_summary"]

_STATE_ORDER = ("active", "cold", "archived", "ghost", "merged", "deleted")


def _status(client: CalorClient, args: argparse.Namespace) -> None:
    """Print the server's status (when the key may read it) and the channel's counts.

    With ``--json``: the channel's ``Identity`` document, plus ``server`` holding the
    ``ServerStatus`` document when the server gave it.
    """
    server: settings_service_pb2.ServerStatusResponse | None = None
    refused = ""
    try:
        server = client.status()
    except UnauthenticatedError:
        raise
    except (PermissionDeniedError, UnimplementedError) as err:  # no admin grant; older server
        refused = str(err)
    identity = client.identity()
    if args.json:
        document = json.loads(_render.to_json(identity))
        if server is not None:
            document["server"] = json.loads(_render.to_json(server))
        print(json.dumps(document, indent=2, ensure_ascii=False))
        return
    head = server_summary(server) if server is not None else f"server     not shown: {refused}"
    print(f"{head}\n\n{_render.identity(identity, client.channel)}")
    sys.stdout.flush()


def server_summary(status: settings_service_pb2.ServerStatusResponse) -> str:
    """A server's status for a person: one labelled line per aspect."""
    states = dict(status.memories_by_state)
    live = sum(count for state, count in states.items() if state != "deleted")
    order = sorted(states, key=lambda s: (_STATE_ORDER.index(s) if s in _STATE_ORDER else 99, s))
    by_state = ", ".join(f"{state} {states[state]}" for state in order if states[state])
    access = "API keys required" if status.auth_required else "open (no API keys)"
    rows = [
        ("server", f"calor {status.version}, up {_duration(status.uptime_seconds)}"),
        ("model", f"{status.model_id} ({status.dim} dimensions)"),
        ("channels", str(status.channels)),
        ("memories", f"{live}" + (f" ({by_state})" if by_state else "")),
        ("events", f"last #{status.last_seq}, {_plural(status.subscribers, 'subscriber')}"),
        ("disk", f"{_bytes(status.data_bytes)} in the data directory"),
        ("memory", f"{_bytes(status.rss_bytes)} resident"),
        ("access", f"{access}, {'TLS' if status.tls else 'plaintext'}"),
    ]
    return "\n".join(f"{label:<11}{value}" for label, value in rows)


def _plural(n: int, one: str) -> str:
    return f"{n} {one}{'' if n == 1 else 's'}"


def _duration(seconds: float) -> str:
    """``45s``, ``12m 05s``, ``3h 04m``, ``2d 01h``."""
    whole = int(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def _bytes(count: int) -> str:
    """A size in bytes, KiB, MiB or GiB, to one decimal."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # not reached


def add_status_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``calor status`` to the top-level commands."""
    summary = "how the server is doing, then the channel's counts, heat, gates and conflicts"
    status = commands.add_parser(
        "status",
        parents=[shared],
        help=summary,
        description=f"Show {summary}. The server part needs a key with an admin grant "
        "under access control; without one, only the channel's part is shown. With "
        "--json: the channel's Identity document, with the server's status under 'server'.",
    )
    status.set_defaults(handler=_status)
