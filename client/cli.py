"""The ``calor`` command: serve, and store, recall and tend memories from a shell.

``calor subscribe`` streams events until Ctrl-C (which exits 0). For scripts it takes
``--max-events N``, left out of ``--help``: stop after N events and exit 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from calor.client import _render
from calor.client._cli_admin import add_admin_commands
from calor.client._cli_agent import add_agent_commands
from calor.client._cli_connection import add_connection_options, connection_arguments, hint
from calor.client._cli_health import add_health_command
from calor.client._cli_keys import add_keys_commands, run_keys
from calor.client._cli_memory import (
    add_forget_command,
    add_memory_commands,
    add_recall_command,
    key_value,
    moment,
)
from calor.client._cli_serve import add_serve_commands, run_check, run_serve
from calor.client._cli_settings import add_settings_commands
from calor.client._cli_status import add_status_command
from calor.client._cli_transfer import add_transfer_commands
from calor.client._cli_triggers import add_trigger_commands
from calor.client._cli_tune import add_tune_command
from calor.client._cli_ui import add_ui_command, run_ui
from calor.client._credentials import (
    API_KEY_ENV,
    CHANNEL_ENV,
    DEFAULT_CHANNEL,
    DEFAULT_TARGET,
    TARGET_ENV,
)
from calor.client._enums import EVENT_KIND_NAMES, MEMORY_STATE_NAMES, MEMORY_TYPE_NAMES
from calor.client._subscription import Backoff
from calor.client.client import CalorClient
from calor.client.errors import CalorClientError, InvalidArgumentError
from calor.v1 import memory_service_pb2

__all__ = ["main"]

Output = tuple[Message, str]
"""What a command produced: the message for ``--json`` and the text for a person."""

Handler = Callable[[CalorClient, argparse.Namespace], Output | None]
"""A command; one that prints as it goes (``subscribe``) returns None."""


# The modules calor[server] brings (see pyproject.toml): missing, a server command says so.
_SERVER_PACKAGES = frozenset(
    {
        "cryptography",
        "faiss",
        "grpc_reflection",
        "nats",
        "numpy",
        "onnxruntime",
        "prometheus_client",
        "re2",
        "rocksdict",
        "tokenizers",
        "tomli_w",
    }
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``calor`` command line.

    Args:
        argv: The arguments after the program name; None reads ``sys.argv``.

    Returns:
        The exit status: 0 on success, 2 for a usage error or a rejected argument,
        1 for any other failure.
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # argparse exits on --help and on usage errors
        return stop.code if isinstance(stop.code, int) else 2
    server_side = {"serve": run_serve, "keys": run_keys, "check": run_check}.get(args.command)
    if server_side is not None:
        try:
            return server_side(args)
        except ImportError as err:  # a client-only install: `pip install calor`
            if (err.name or "").partition(".")[0] not in _SERVER_PACKAGES:
                raise
            print(
                f"error: calor {args.command} needs the server's packages ({err.name} is not "
                "installed): pip install 'calor[server]'",
                file=sys.stderr,
            )
            return 1
    if args.command == "mcp":
        return _mcp(args)
    if args.command == "ui":
        return run_ui(args)
    handler: Handler = args.handler
    output: Output | None = None
    try:
        client = CalorClient(
            args.target,
            channel=args.channel,
            timeout=args.call_timeout,
            **connection_arguments(args),
        )
        with client, _quiet_broken_pipe():  # `calor export | head` ends quietly
            output = handler(client, args)
    except CalorClientError as err:
        print(f"error: {err}", file=sys.stderr)
        if remedy := hint(err, args.target):
            print(remedy, file=sys.stderr)
        return 2 if isinstance(err, InvalidArgumentError) else 1
    except OSError as err:  # a file to import or export to that cannot be opened, …
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if output is not None:
        message, text = output
        with _quiet_broken_pipe():
            print(_render.to_json(message) if args.json else text)
            sys.stdout.flush()
    return 0


@contextmanager
def _quiet_broken_pipe() -> Iterator[None]:
    """Treat a closed stdout (``calor … | head``) as the end, not as an error of ours."""
    try:
        yield
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # quiet exit


# --- commands -------------------------------------------------------------------------


def _mcp(args: argparse.Namespace) -> int:
    """Serve the memory tools to an MCP host on stdin and stdout until it closes stdin."""
    # Imported here: only this command needs the MCP SDK.
    from calor.client._credentials import ChannelSecurity
    from calor.client._mcp import McpOptions, run

    if args.print_config:
        print(json.dumps(_mcp_host_config(args), indent=2))
        return 0
    logging.basicConfig(level=logging.WARNING, format="calor mcp: %(levelname)s %(message)s")
    try:
        security = ChannelSecurity.of(**connection_arguments(args))
    except (CalorClientError, OSError) as err:  # a bad key, a certificate file missing, …
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, InvalidArgumentError) else 1
    try:
        run(McpOptions(target=args.target, channel=args.channel, security=security))
    except KeyboardInterrupt:
        return 130
    return 0


def _mcp_host_config(args: argparse.Namespace) -> dict[str, object]:
    """The ``mcpServers`` entry that starts this ``calor mcp`` as it was asked for: the
    executable and any certificate by absolute path; a key by the variable that holds it,
    never its value."""
    program = shutil.which(sys.argv[0]) or sys.argv[0]
    if Path(program).name != "calor":  # run as a module or from a test: the installed script
        program = str(Path(sys.executable).with_name("calor"))
    command = ["mcp", "--target", args.target, "--channel", args.channel]
    paths = {
        "--tls-ca": args.tls_ca,
        "--tls-client-cert": args.tls_client_cert,
        "--tls-client-key": args.tls_client_key,
    }
    for option, path in paths.items():
        if path is not None:
            command += [option, str(Path(path).resolve())]
    if args.tls and args.tls_ca is None:
        command.append("--tls")
    entry: dict[str, object] = {"command": str(Path(program).resolve()), "args": command}
    if args.api_key:
        entry["env"] = {API_KEY_ENV: "<your Calor API key>"}
    return {"mcpServers": {"calor": entry}}


def _store(client: CalorClient, args: argparse.Namespace) -> Output:
    text = sys.stdin.read().strip() if args.text == "-" else args.text
    memory = client.store(
        text,
        memory_type=args.type,
        importance=args.importance,
        keystone=args.keystone,
        tags=dict(args.tag),
        created_at=args.created_at,
    )
    return memory, _render.stored(memory)


def _inspect(client: CalorClient, args: argparse.Namespace) -> Output:
    response = client.inspect(args.id)
    return response, _render.inspected(response)


def _list(client: CalorClient, args: argparse.Namespace) -> Output:
    filters: dict[str, Any] = {
        "memory_types": args.type,
        "states": args.state,
        "order": "heat" if args.by_heat else "id",
    }
    if args.all:
        memories = list(client.iter_memories(page_size=args.page_size, **filters))
        response = memory_service_pb2.ListMemoriesResponse(memories=memories)
    else:
        response = client.list_memories(
            page_size=args.page_size, page_token=args.page_token, **filters
        )
    return response, _render.listed(list(response.memories), response.next_page_token)


def _keystone(client: CalorClient, args: argparse.Namespace) -> Output:
    memory = client.keystone(args.id, on=not args.off)
    verb = "unpinned" if args.off else "pinned"
    return memory, f"{verb} {_render.memory_line(memory)}"


def _boost(client: CalorClient, args: argparse.Namespace) -> Output:
    memory = client.boost(args.id, delta=args.delta)
    return memory, f"boosted {_render.memory_line(memory)}"


def _subscribe(client: CalorClient, args: argparse.Namespace) -> None:
    """Print events as they come, one line (or JSON object) each, until Ctrl-C.

    Ctrl-C ends it with status 0, as does ``--max-events N`` after N events.
    Resubscriptions after the server cut the stream are reported on stderr; by
    default they go on for as long as the server is away (``--max-attempts``).
    """
    events = client.subscribe(
        channels=() if args.all_channels else None,
        kinds=args.kind,
        trigger_ids=args.trigger,
        after_seq=args.after_seq,
        from_oldest_retained=args.from_oldest,
        backoff=Backoff(attempts=args.max_attempts) if args.max_attempts > 0 else None,
        until_seq=args.until_seq,
    )
    notices = logging.StreamHandler(sys.stderr)
    notices.setFormatter(logging.Formatter("calor: %(message)s"))
    logger = logging.getLogger("calor.client.subscribe")
    level = logger.level
    logger.addHandler(notices)
    logger.setLevel(logging.INFO)
    try:
        with events, _quiet_broken_pipe():
            for count, event in enumerate(events, start=1):
                print(_render.json_line(event) if args.json else _render.event_line(event))
                sys.stdout.flush()
                if args.max_events and count >= args.max_events:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        logger.removeHandler(notices)
        logger.setLevel(level)


# --- argument parsing -------------------------------------------------------------------


def _global_options(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    """Add ``--target``, ``--channel`` and ``--json``.

    They are accepted both before and after the command; only the top-level parser
    holds the defaults, so an option given before the command is not reset after it.
    """

    def default(value: object) -> object:
        return value if with_defaults else argparse.SUPPRESS

    parser.add_argument(
        "--target",
        default=default(os.environ.get(TARGET_ENV, DEFAULT_TARGET)),
        help=f"server address, host:port (env {TARGET_ENV}; default {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--channel",
        default=default(os.environ.get(CHANNEL_ENV, DEFAULT_CHANNEL)),
        help=f"memory channel to work in (env {CHANNEL_ENV}; default {DEFAULT_CHANNEL!r})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print one JSON document instead of text",
    )


def _version() -> str:
    """The installed package's version ("unknown" when run from files not installed)."""
    try:
        return metadata.version("calor")
    except metadata.PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calor", description="Calor: memories with heat, for AI agents."
    )
    parser.add_argument("--version", action="version", version=f"calor {_version()}")
    _global_options(parser, with_defaults=True)
    add_connection_options(parser, with_defaults=True)
    parser.set_defaults(call_timeout=30.0)  # seconds per call; export and import set None
    local = argparse.ArgumentParser(add_help=False)  # serve's: no client key or TLS trust
    _global_options(local, with_defaults=False)
    shared = argparse.ArgumentParser(add_help=False)
    _global_options(shared, with_defaults=False)
    add_connection_options(shared, with_defaults=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_commands(commands, local)

    def command(
        name: str, handler: Handler | None, summary: str, parent: argparse.ArgumentParser = shared
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[parent], help=summary, description=summary)
        sub.set_defaults(handler=handler)
        return sub

    store = command("store", _store, "store a memory")
    store.add_argument("text", metavar="TEXT", help="what to remember; '-' reads stdin")
    store.add_argument(
        "--type", choices=MEMORY_TYPE_NAMES, help="memory type (default: classified from the text)"
    )
    store.add_argument(
        "--tag",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a tag; repeat for more",
    )
    store.add_argument("--keystone", action="store_true", help="pin it so it does not decay")
    store.add_argument("--importance", type=float, metavar="X", help="importance, 0..1")
    store.add_argument(
        "--created-at",
        type=moment,
        metavar="ISO",
        help="when it happened, to import history (default now; UTC if no zone)",
    )

    add_recall_command(commands, shared)

    command("inspect", _inspect, "show one memory and its edges").add_argument("id", metavar="ID")

    listing = command("list", _list, "list the channel's memories")
    listing.add_argument(
        "--type",
        choices=MEMORY_TYPE_NAMES,
        action="append",
        default=[],
        help="only this type; repeat for more",
    )
    listing.add_argument(
        "--state",
        choices=MEMORY_STATE_NAMES,
        action="append",
        default=[],
        help="only this state; repeat for more",
    )
    listing.add_argument("--page-size", type=int, default=100, metavar="N")
    listing.add_argument(
        "--page-token", default="", metavar="TOKEN", help="the page after a previous listing"
    )
    listing.add_argument("--all", action="store_true", help="every page")
    listing.add_argument("--by-heat", action="store_true", help="hottest first (default: oldest)")

    add_forget_command(commands, shared)

    keystone = command("keystone", _keystone, "pin a memory so it does not decay")
    keystone.add_argument("id", metavar="ID")
    keystone.add_argument("--off", action="store_true", help="unpin it instead")

    boost = command("boost", _boost, "add heat to a memory")
    boost.add_argument("id", metavar="ID")
    boost.add_argument(
        "--delta",
        type=float,
        default=0.0,
        metavar="X",
        help="heat to add, -1..1 (default: the channel's boost_delta)",
    )

    add_status_command(commands, shared)

    mcp = command(
        "mcp",
        None,
        "serve the memory tools to an agent host over the Model Context Protocol (stdio); "
        "--channel is the channel the tools use when a call names none",
    )
    mcp.add_argument(
        "--print-config",
        action="store_true",
        help="print the JSON an MCP host's config takes to start this (absolute paths) and exit",
    )

    subscribe = command(
        "subscribe", _subscribe, "print the channel's events from now on, until Ctrl-C"
    )
    subscribe.add_argument(
        "--all-channels", action="store_true", help="every channel's events, not --channel's"
    )
    subscribe.add_argument(
        "--kind",
        choices=EVENT_KIND_NAMES,
        action="append",
        default=[],
        help="only events of this kind; repeat for more",
    )
    subscribe.add_argument(
        "--trigger",
        action="append",
        default=[],
        metavar="ID",
        help="only events of this trigger; repeat for more",
    )
    subscribe.add_argument(
        "--after-seq",
        type=int,
        default=None,
        metavar="N",
        help="start after event N (0: everything the log still holds; default: from now)",
    )
    subscribe.add_argument(
        "--until-seq",
        type=int,
        default=0,
        metavar="N",
        help="end after event N (with --after-seq: a window of the log's history)",
    )
    subscribe.add_argument(
        "--from-oldest",
        action="store_true",
        help="start from the oldest event the log holds (with --after-seq: only if the "
        "log no longer holds the events after it, instead of failing)",
    )
    subscribe.add_argument(
        "--max-attempts",
        type=int,
        default=0,
        metavar="N",
        help="give up after N failed reconnections in a row (default: keep reconnecting)",
    )
    # For scripts and tests: stop after N events (left out of --help).
    subscribe.add_argument("--max-events", type=int, default=0, help=argparse.SUPPRESS)

    add_transfer_commands(commands, shared)
    add_trigger_commands(commands, shared)
    add_tune_command(commands, shared)
    add_health_command(commands, shared)
    add_agent_commands(commands, shared)
    add_admin_commands(commands, shared)
    add_memory_commands(commands, shared)
    add_settings_commands(commands, shared)
    add_keys_commands(commands)
    add_ui_command(commands, shared)
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
