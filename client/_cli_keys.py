"""The ``calor keys`` commands: add, list and revoke the API keys of an auth file.

They work on the file alone (no server): ``add`` prints the new key once, on stdout by
itself, and stores only its SHA-256; a running server picks changes up on SIGHUP.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # server code is imported only when a keys command runs
    from calor.server.api.auth_file import ApiKey
    from calor.server.api.grants import Grant

__all__ = ["add_keys_commands", "run_keys"]

_RELOAD = "a running server applies it on SIGHUP (kill -HUP <pid>)"


def run_keys(args: argparse.Namespace) -> int:
    """Run ``calor keys add|list|revoke``.

    Returns:
        0 on success; 1 when the file cannot be read or written or names no such key;
        2 when no file is given.
    """
    from calor.server.errors import CalorError

    if args.file is None:
        print("error: name the auth file with --file or CALOR_AUTH_FILE", file=sys.stderr)
        return 2
    try:
        result: int = args.keys_run(args)
        return result
    except CalorError as err:  # a malformed or unreadable auth file
        print(f"error: {err.message}", file=sys.stderr)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
    return 1


def _add(args: argparse.Namespace) -> int:
    from calor.server.api import auth_file
    from calor.server.api.grants import Grants

    path: Path = args.file
    keys = auth_file.load(path) if path.exists() else auth_file.KeyRing()
    key, token = auth_file.new_key(args.label, Grants(tuple(args.grant)), expires=args.expires)
    auth_file.save(path, keys.with_key(key))
    print(token)
    until = f", expires {key.expires.isoformat()}" if key.expires else ""
    print(
        f"added key {key.id} ({', '.join(key.grants.describe())}{until}) to {path}; "
        f"{_RELOAD}.\nThis is the only time the key is shown: only its SHA-256 is stored.",
        file=sys.stderr,
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    from calor.server.api import auth_file

    keys = sorted(auth_file.load(args.file).keys.values(), key=lambda k: k.id)
    now = datetime.now(UTC).timestamp()
    if args.json:
        print(json.dumps([_record(k, now) for k in keys], indent=2))
        return 0
    if not keys:
        print(f"no keys in {args.file}")
        return 0
    rows = [("ID", "LABEL", "CREATED", "EXPIRES", "GRANTS")]
    rows += [
        (k.id, k.label or "-", _created(k), _expires(k, now), " ".join(k.grants.describe()))
        for k in keys
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)]
        print("  ".join([*cells, row[4]]))
    return 0


def _created(key: ApiKey) -> str:
    return key.created.isoformat() if key.created else "-"


def _expires(key: ApiKey, now: float) -> str:
    """The EXPIRES cell: never (-), when, and whether that is past."""
    if key.expires is None:
        return "-"
    return key.expires.isoformat() + (" (expired)" if key.expired(now) else "")


def _record(key: ApiKey, now: float) -> dict[str, Any]:
    return {
        "id": key.id,
        "label": key.label,
        "created": key.created.isoformat() if key.created else None,
        "expires": key.expires.isoformat() if key.expires else None,
        "expired": key.expired(now),
        "grants": key.grants.describe(),
    }


def _revoke(args: argparse.Namespace) -> int:
    from calor.server.api import auth_file

    keys = auth_file.load(args.file)
    key = keys.keys.get(args.id)
    if key is None:
        print(f"error: no key {args.id} in {args.file}", file=sys.stderr)
        return 1
    auth_file.save(args.file, keys.without(args.id))
    label = f" ({key.label})" if key.label else ""
    print(f"revoked key {key.id}{label}; {_RELOAD}")
    return 0


def _grant(text: str) -> Grant:
    """A ``--grant PATTERN=PERMS`` argument, checked when the command line is read."""
    from calor.server.api.grants import parse_grant

    try:
        return parse_grant(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _expiry(text: str) -> datetime:
    """An ``--expires`` argument, checked when the command line is read: a future
    date-time with its offset, or a date (midnight UTC)."""
    from calor.server.api.auth_file import parse_expiry

    try:
        return parse_expiry(text, datetime.now(UTC))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_keys_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calor keys add|list|revoke`` to the top-level commands.

    Args:
        commands: The top-level subparsers.
    """
    summary = "manage the API keys of an auth file (calor serve --auth-file)"
    keys = commands.add_parser("keys", help=summary, description=summary)
    verbs = keys.add_subparsers(dest="keys_command", required=True, metavar="VERB")
    default_file = os.environ.get("CALOR_AUTH_FILE")

    def verb(name: str, run: Any, text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--file",
            type=Path,
            default=Path(default_file) if default_file else None,
            metavar="FILE",
            help="the auth file (env CALOR_AUTH_FILE)",
        )
        sub.set_defaults(keys_run=run)
        return sub

    add = verb(
        "add",
        _add,
        "create a key: prints it once (stdout), stores only its SHA-256 (the file is "
        "created, mode 0600, if missing)",
    )
    add.add_argument("--label", default="", help="who or what the key is for")
    add.add_argument(
        "--grant",
        type=_grant,
        action="append",
        required=True,
        metavar="PATTERN=PERMS",
        help="a channel, a prefix ending in '*' (team-a/*) or '*' for all, with read, write "
        "and/or admin (admin includes read and write), e.g. 'team-a/*=read,write'; repeatable",
    )
    add.add_argument(
        "--expires",
        type=_expiry,
        metavar="WHEN",
        help="when the server starts refusing the key: an ISO 8601 date-time with its offset "
        "(2027-01-01T00:00:00Z) or a date (2027-01-01, midnight UTC); default: never",
    )
    listing = verb(
        "list", _list, "list the keys: ids, labels, created, expiry, grants (never secrets)"
    )
    listing.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print a JSON array"
    )
    verb("revoke", _revoke, "remove a key from the file").add_argument("id", metavar="ID")
