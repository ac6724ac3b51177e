"""The CLI verbs that find and tend memories: ``recall``, ``forget``, ``update``, ``connect``,
``dream``, ``offer`` and ``evaluate-triggers``; and the argument types they share with
``store``."""

from __future__ import annotations

import argparse
import secrets
import sys
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime
from typing import BinaryIO, TypeAlias

from google.protobuf.message import Message

from calor.client import _render
from calor.client._enums import MEMORY_STATE_NAMES, MEMORY_TYPE_NAMES, TRIGGER_EVENT_NAMES
from calor.client._progress import Progress, following, polled
from calor.client.client import CalorClient
from calor.v1 import memory_service_pb2, trigger_service_pb2

__all__ = [
    "add_forget_command",
    "add_memory_commands",
    "add_recall_command",
    "key_value",
    "moment",
]

_Output = tuple[Message, str]
_Handler = Callable[[CalorClient, argparse.Namespace], _Output]
_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

OFFER_CHUNK_BYTES = 256 * 1024
"""Bytes ``calor offer`` sends per call, well under what a server takes in one offer."""


# --- argument types -----------------------------------------------------------------


def key_value(text: str) -> tuple[str, str]:
    """A ``--tag KEY=VALUE`` argument as a pair."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def moment(text: str) -> datetime:
    """An ISO 8601 time or date argument (``2026-03-01``, ``2026-03-01T09:00Z``); without
    a zone it is UTC."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None


def _names(text: str) -> list[str]:
    """A comma-separated list argument (``--channels a,b``), without empty names."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _text(value: str | None) -> str | None:
    """A text argument; ``-`` reads it from stdin."""
    return sys.stdin.read().strip() if value == "-" else value


# --- handlers -----------------------------------------------------------------------


def _recall(client: CalorClient, args: argparse.Namespace) -> _Output:
    response = client.recall(
        args.query,
        limit=args.limit,
        peek=args.peek,
        memory_types=args.type,
        include_archived=args.include_archived,
        channels=args.channels,
        time_from=args.time_from,
        time_to=args.time_to,
        as_of=args.as_of,
        min_band=args.min_band,
    )
    return response, _render.recalled(response, client.channel)


def _forget(client: CalorClient, args: argparse.Namespace) -> _Output:
    count = client.forget(
        args.ids,
        memory_types=args.type,
        states=args.state,
        tags=dict(args.tag),
        created_before=args.before,
        reject=args.reject,
    )
    plural = "memory" if count == 1 else "memories"
    return memory_service_pb2.ForgetResponse(forgotten=count), f"forgot {count} {plural}"


def _update(client: CalorClient, args: argparse.Namespace) -> _Output:
    memory = client.update(
        args.id,
        text=_text(args.text),
        memory_type=args.type,
        tags=dict(args.tag) if args.tag else None,
        importance=args.importance,
        supersedes=args.supersedes,
        clear_merge=args.clear_merge,
    )
    return memory, f"updated {_render.memory_line(memory)}"


def _connect(client: CalorClient, args: argparse.Namespace) -> _Output:
    edge = client.connect(args.from_id, args.to_id, weight=args.weight)
    return edge, f"linked {_render.edge_line(edge)}"


def _dream(client: CalorClient, args: argparse.Namespace) -> _Output:
    """Dream now; on a terminal, a line follows the server's word of the step under way."""
    token = secrets.token_urlsafe(12)
    read = polled(lambda: client.progress(token), lambda p: (p.step, p.steps, p.phase))
    with Progress(label="dream", steps=True) as bar:
        with following(bar, read):
            report = client.dream(progress_token=token)
        if bar.enabled:  # the poller has stopped: nothing older is drawn over this
            bar.show(*(read() or (bar.count, bar.total or 0, "done")))
    return report, _render.dreamed(report)


def _offer(client: CalorClient, args: argparse.Namespace) -> _Output:
    """Offer a file's bytes (or stdin's) a chunk at a time; report the last answer, with
    the dream one of them set off."""
    stdin = args.path == "-"
    with nullcontext(sys.stdin.buffer) if stdin else open(args.path, "rb") as source:
        offered, answer, report = _offer_all(client, source)
    if report is not None:
        answer.dreamed = True
        answer.report.CopyFrom(report)
    text = f"offered {offered} bytes; {answer.accumulated} accumulated toward the next dream"
    if answer.dreamed:
        text += f"\nthe channel dreamed: {_render.dreamed(answer.report)}"
    return answer, text


def _offer_all(
    client: CalorClient, source: BinaryIO
) -> tuple[int, memory_service_pb2.OfferResponse, memory_service_pb2.DreamResponse | None]:
    """Bytes offered, the last answer, and the report of the last dream an offer set off."""
    offered, report = 0, None
    while True:
        chunk = source.read(OFFER_CHUNK_BYTES)
        if chunk or not offered:  # an empty input is offered once, as nothing
            answer = client.offer(chunk)
            offered += len(chunk)
            if answer.dreamed:
                report = answer.report
        if not chunk:
            return offered, answer, report


def _evaluate_triggers(client: CalorClient, args: argparse.Namespace) -> _Output:
    matches = client.evaluate_triggers(args.event, args.id)
    response = trigger_service_pb2.EvaluateTriggersResponse(matches=matches)
    return response, _render.matches(matches)


# --- commands -----------------------------------------------------------------------


def _adder(
    commands: _Commands, shared: argparse.ArgumentParser
) -> Callable[..., argparse.ArgumentParser]:
    def command(name: str, handler: _Handler, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[shared], help=summary, description=summary)
        sub.set_defaults(handler=handler)
        return sub

    return command


def _types(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--type",
        choices=MEMORY_TYPE_NAMES,
        action="append",
        default=[],
        help=f"{what} of this type; repeat for more",
    )


def _tags(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--tag", type=key_value, action="append", default=[], metavar="KEY=VALUE", help=what
    )


def add_recall_command(commands: _Commands, shared: argparse.ArgumentParser) -> None:
    """Add ``calor recall QUERY`` and its filters.

    Args:
        commands: The top-level subparsers.
        shared: The parser of the global options (a parent, so ``--json`` may follow).
    """
    recall = _adder(commands, shared)("recall", _recall, "find the memories that answer a query")
    recall.add_argument("query", metavar="QUERY")
    recall.add_argument("--limit", type=int, default=10, metavar="N", help="at most N hits")
    recall.add_argument("--peek", action="store_true", help="change nothing (no warming)")
    _types(recall, "only memories")
    recall.add_argument("--include-archived", action="store_true", help="search cold storage")
    recall.add_argument(
        "--min-band",
        choices=("low", "mid", "high"),
        default="",
        help="leave out hits whose confidence band is below this one (default: keep all)",
    )
    recall.add_argument(
        "--channels",
        type=_names,
        action="extend",
        default=[],
        metavar="A,B",
        help="search these channels too (comma-separated, or repeat); hits name their channel",
    )
    recall.add_argument(
        "--from",
        dest="time_from",
        type=moment,
        metavar="ISO",
        help="boost memories created at or after this time (UTC if no zone)",
    )
    recall.add_argument(
        "--to",
        dest="time_to",
        type=moment,
        metavar="ISO",
        help="boost memories created at or before this time (UTC if no zone)",
    )
    recall.add_argument(
        "--as-of",
        type=moment,
        metavar="ISO",
        help="read 'yesterday', 'last week', … as if it were this time (default now)",
    )


def add_forget_command(commands: _Commands, shared: argparse.ArgumentParser) -> None:
    """Add ``calor forget [ID …] [--type|--state|--tag|--before] [--reject]``."""
    forget = _adder(commands, shared)(
        "forget",
        _forget,
        "forget memories for good: these ids, and every memory matching all the filters given",
    )
    forget.add_argument("ids", nargs="*", metavar="ID")
    _types(forget, "every memory")
    forget.add_argument(
        "--state",
        choices=MEMORY_STATE_NAMES,
        action="append",
        default=[],
        help="every memory in this state; repeat for more",
    )
    _tags(forget, "every memory with this tag; repeat for more (all must match)")
    forget.add_argument(
        "--before",
        type=moment,
        metavar="DATE",
        help="every memory created at or before this time (ISO 8601; UTC if no zone)",
    )
    forget.add_argument(
        "--reject",
        action="store_true",
        help="and do not learn them again: keep each one's embedding (not its text), so a "
        "later store close to it is marked resembles_rejected and loses importance",
    )


def add_memory_commands(commands: _Commands, shared: argparse.ArgumentParser) -> None:
    """Add ``update``, ``connect``, ``dream``, ``offer`` and ``evaluate-triggers``."""
    command = _adder(commands, shared)

    update = command("update", _update, "correct a memory: only the fields given change")
    update.add_argument("id", metavar="ID")
    update.add_argument("--text", help="the corrected text (re-embedded); '-' reads stdin")
    update.add_argument("--type", choices=MEMORY_TYPE_NAMES, help="the corrected type")
    _tags(update, "its tags become these (replacing the old ones); repeat for more")
    update.add_argument("--importance", type=float, metavar="X", help="importance, 0..1")
    update.add_argument(
        "--supersedes",
        default="",
        metavar="ID",
        help="an older memory this one replaces: it is deprecated and cooled",
    )
    update.add_argument(
        "--clear-merge",
        action="store_true",
        help="restore a merged memory to its own life; dreams never merge the pair again",
    )

    connect = command("connect", _connect, "link two memories by hand (a manual edge)")
    connect.add_argument("from_id", metavar="FROM")
    connect.add_argument("to_id", metavar="TO")
    connect.add_argument(
        "--weight", type=float, default=0.0, metavar="X", help="0..1 (default 1.0)"
    )

    command("dream", _dream, "consolidate the channel now: migrate, merge, promote, archive")

    offer = command(
        "offer",
        _offer,
        "offer what the channel took in (only its size counts); it dreams when the bytes "
        "offered since its last dream reach its entropy_threshold",
    )
    offer.add_argument(
        "path",
        nargs="?",
        default="-",
        metavar="FILE",
        help="the bytes to offer (default '-': stdin)",
    )

    evaluate = command(
        "evaluate-triggers",
        _evaluate_triggers,
        "a dry run: which triggers would fire for an event on a memory, and what they would "
        "do (nothing fires)",
    )
    evaluate.add_argument("event", choices=TRIGGER_EVENT_NAMES)
    evaluate.add_argument("id", metavar="ID")
