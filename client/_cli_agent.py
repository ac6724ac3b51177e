"""The CLI verbs of an agent's memory loop: ``context``, ``evaluate``, ``share``, ``card`` and
``feedback``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from google.protobuf.message import Message

from calor.client import _render
from calor.client._convert import RATING_NAMES
from calor.client.client import CalorClient

__all__ = ["add_agent_commands"]

_Output = tuple[Message, str]
Handler = Callable[[CalorClient, argparse.Namespace], _Output]


def _context(client: CalorClient, args: argparse.Namespace) -> _Output:
    response = client.context(
        args.message,
        token_budget=args.budget,
        heat=args.heat,
        max_nodes=args.max_nodes,
        max_chars=args.max_chars,
    )
    reused = ", reused" if response.reused else ""
    footer = f"({response.tokens_used} tokens, {len(response.items)} memories{reused}; "
    footer += f"recall id {response.recall_id or '-'})"
    return response, f"{response.block.rstrip()}\n\n{footer}" if response.block else footer


def _evaluate(client: CalorClient, args: argparse.Namespace) -> _Output:
    response = client.evaluate(args.text, store_findings=args.store_findings)
    lines = [f"{response.status} (alignment {response.alignment:.2f})"]
    for issue in response.issues:
        lines.append(f"{issue.kind} ({issue.similarity:.2f}) {issue.memory_id}: {issue.message}")
        if issue.correction:
            lines.append(f"  correction: {issue.correction}")
    if response.stored_ids:
        lines.append("stored " + " ".join(response.stored_ids))
    return response, "\n".join(lines)


def _share(client: CalorClient, args: argparse.Namespace) -> _Output:
    copy = client.share(args.id, args.target_channel)
    return copy, f"shared into {copy.channel}: {_render.memory_line(copy)}\n  {copy.text}"


def _card(client: CalorClient, args: argparse.Namespace) -> _Output:
    response = client.entity_card(args.entity)
    return response, response.card.rstrip()


def _feedback(client: CalorClient, args: argparse.Namespace) -> _Output:
    response = client.feedback(args.recall_id, args.rating, args.memory)
    kinds = sorted(
        {*response.helpful_by_type, *response.unhelpful_by_type, *response.partial_by_type}
    )
    lines = [f"rated {args.recall_id} {args.rating}; last 30 days by type:"]
    for kind in kinds:
        lines.append(
            f"  {kind.removeprefix('MEMORY_TYPE_').lower():<12} "
            f"helpful {response.helpful_by_type.get(kind, 0)}, "
            f"unhelpful {response.unhelpful_by_type.get(kind, 0)}, "
            f"partial {response.partial_by_type.get(kind, 0)}"
        )
    return response, "\n".join(lines)


def add_agent_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``context``, ``evaluate``, ``share``, ``card`` and ``feedback``.

    Args:
        commands: The top-level subparsers.
        shared: The parser of the global options (a parent, so ``--json`` may follow).
    """

    def command(name: str, handler: Handler, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[shared], help=summary, description=summary)
        sub.set_defaults(handler=handler)
        return sub

    context = command("context", _context, "the block of memories to prepend to a prompt")
    context.add_argument("message", help="what the agent is about to answer")
    context.add_argument("--budget", type=int, default=0, metavar="N", help="tokens (default 1000)")
    context.add_argument("--heat", action="store_true", help="heat what the block shows")
    context.add_argument("--max-nodes", type=int, default=0, metavar="N", help="default 200")
    context.add_argument("--max-chars", type=int, default=0, metavar="N", help="default 50000")

    evaluate = command(
        "evaluate", _evaluate, "check a text against the channel's memories before saying it"
    )
    evaluate.add_argument("text")
    evaluate.add_argument(
        "--store-findings", action="store_true", help="store each misalignment as a memory"
    )

    share = command("share", _share, "copy a memory into another channel, with provenance")
    share.add_argument("id", metavar="ID")
    share.add_argument("target_channel", metavar="TARGET_CHANNEL")

    card = command("card", _card, "what the channel knows about an entity (5+ memories)")
    card.add_argument("entity")

    feedback = command("feedback", _feedback, "say whether a recall or context helped")
    feedback.add_argument("recall_id", metavar="RECALL_ID")
    feedback.add_argument("rating", choices=RATING_NAMES)
    feedback.add_argument(
        "--memory",
        action="append",
        default=[],
        metavar="ID",
        help="a hit the rating is about; repeat for more (default: the whole recall)",
    )
