"""The ``calor trigger`` commands: add, list, rm, history and feedback."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from google.protobuf.message import Message

from calor.client import _render
from calor.client._enums import (
    ACTION_KIND_NAMES,
    MEMORY_TYPE_NAMES,
    TRIGGER_EVENT_NAMES,
    TRIGGER_RATING_NAMES,
)
from calor.client.client import CalorClient
from calor.v1 import trigger_service_pb2

__all__ = ["add_trigger_commands"]

_Handler = Callable[[CalorClient, argparse.Namespace], tuple[Message, str]]


def _add(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    trigger = client.create_trigger(
        event=args.event,
        action=args.action,
        trigger_id=args.id,
        config=dict(args.config),
        filter_memory_type=args.type,
        filter_pattern=args.pattern,
        filter_heat_above=args.heat_above,
        filter_heat_below=args.heat_below,
        max_fires=args.max_fires,
        cooldown_seconds=args.cooldown,
        threshold=args.threshold,
    )
    return trigger, f"created {_render.trigger_line(trigger)}"


def _list(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    items = client.list_triggers(channel="" if args.all_channels else None)
    response = trigger_service_pb2.ListTriggersResponse(triggers=items)
    return response, _render.triggers(items)


def _rm(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    client.delete_trigger(args.id)
    return trigger_service_pb2.DeleteTriggerResponse(deleted=True), f"deleted trigger {args.id}"


def _history(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    items = client.trigger_history(args.id)
    response = trigger_service_pb2.TriggerHistoryResponse(firings=items)
    return response, _render.firings(items)


def _feedback(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    trigger = client.trigger_feedback(args.id, args.seq, args.rating)
    response = trigger_service_pb2.TriggerFeedbackResponse(trigger=trigger)
    precision = f"{trigger.precision:.2f}" if trigger.HasField("precision") else "-"
    text = f"rated {args.rating}: precision {precision} over {trigger.rated} rated firings"
    if trigger.flagged:
        text += ", flagged"
    if trigger.paused:
        text += f"; paused: {trigger.paused}"
    return response, text


def _config(text: str) -> tuple[str, str]:
    """A ``--config KEY=VALUE`` argument as a pair."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_trigger_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``calor trigger {add,list,rm,history,feedback}`` to the top-level commands.

    Args:
        commands: The top-level subparsers.
        shared: The parser of the global options, a parent of every command so that
            ``--json`` and the others may follow the command too.
    """
    summary = "manage the triggers that react to memory events"
    trigger = commands.add_parser("trigger", parents=[shared], help=summary, description=summary)
    actions = trigger.add_subparsers(dest="trigger_command", required=True, metavar="ACTION")

    def action(name: str, handler: _Handler, text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, parents=[shared], help=text, description=text)
        sub.set_defaults(handler=handler)
        return sub

    add = action("add", _add, "register a trigger in the channel")
    add.add_argument(
        "--event", required=True, choices=TRIGGER_EVENT_NAMES, help="what it reacts to"
    )
    add.add_argument("--action", required=True, choices=ACTION_KIND_NAMES, help="what it does")
    add.add_argument(
        "--config",
        type=_config,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an action setting (message=…, delta=…, url=…, trigger_id=…); repeat for more",
    )
    add.add_argument("--id", default="", help="its id, 1-64 of A-Z a-z 0-9 _.:- (default: new)")
    # Named as the clients' and the protos' arguments are (filter_pattern, …); the
    # shorter names are kept as aliases.
    add.add_argument(
        "--filter-memory-type",
        "--type",
        dest="type",
        choices=MEMORY_TYPE_NAMES,
        help="only memories of this type",
    )
    add.add_argument(
        "--filter-pattern",
        "--pattern",
        dest="pattern",
        default="",
        metavar="REGEX",
        help="only texts matching this",
    )
    add.add_argument(
        "--filter-heat-above",
        "--heat-above",
        dest="heat_above",
        type=float,
        metavar="X",
        help="only memories hotter than X",
    )
    add.add_argument(
        "--filter-heat-below",
        "--heat-below",
        dest="heat_below",
        type=float,
        metavar="X",
        help="only memories colder than X",
    )
    add.add_argument(
        "--max-fires", type=int, default=0, metavar="N", help="fire at most N times (0: no limit)"
    )
    add.add_argument(
        "--cooldown-seconds",
        "--cooldown",
        dest="cooldown",
        type=float,
        default=0.0,
        metavar="S",
        help="at least S seconds between fires",
    )
    add.add_argument(
        "--threshold",
        type=float,
        metavar="X",
        help="on_decay: the heat whose crossing fires it (default: the cold threshold)",
    )

    listing = action("list", _list, "list the channel's triggers")
    listing.add_argument("--all-channels", action="store_true", help="every channel's triggers")

    action("rm", _rm, "delete a trigger").add_argument("id", metavar="ID")
    action("history", _history, "show when a trigger fired").add_argument("id", metavar="ID")
    feedback = action("feedback", _feedback, "rate a firing of a trigger: useful or noise")
    feedback.add_argument("id", metavar="ID")
    feedback.add_argument("seq", type=int, metavar="SEQ", help="the firing's seq (see history)")
    feedback.add_argument("rating", choices=TRIGGER_RATING_NAMES)
