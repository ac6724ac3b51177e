"""The ``calor tune`` command: fit a channel's recall weights to its feedback."""

from __future__ import annotations

import argparse
import textwrap

from google.protobuf.message import Message

from calor.client.client import CalorClient
from calor.v1 import memory_service_pb2

__all__ = ["add_tune_command", "tuned"]


def _tune(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    response = client.tune(channel=args.tune_channel or None, dry_run=args.dry_run)
    return response, tuned(response, args.tune_channel or client.channel)


_WEIGHTS = (
    "weight_similarity",
    "weight_heat",
    "weight_keyword",
    "weight_lexical",
    "weight_source",
    "weight_temporal",
    "weight_own_channel",
)


def _order(name: str) -> tuple[int, str]:
    """Weights in the order the settings list them; any other after, by name."""
    return (_WEIGHTS.index(name) if name in _WEIGHTS else len(_WEIGHTS), name)


def tuned(response: memory_service_pb2.TuneResponse, channel: str) -> str:
    """A fit's report: the verdict, agreement before and after, each weight, the why."""
    verdict = "applied" if response.applied else "not applied"
    lines = [
        f"tune {channel}: {verdict}",
        f"fitted on {response.fitted} recalls with feedback, judged on {response.held_back} "
        f"held back: agreement {response.held_back_before:.0%} -> "
        f"{response.held_back_after:.0%}",
        "",
        f"{'weight':<22}{'before':>8}{'after':>8}",
    ]
    for name in sorted(response.before, key=_order):
        before, after = response.before[name], response.after.get(name, 0.0)
        moved = "  *" if after != before else ""
        lines.append(f"{name:<22}{before:>8.2f}{after:>8.2f}{moved}")
    lines.append("")
    lines.extend(textwrap.wrap(response.explanation, width=88))
    return "\n".join(lines)


def add_tune_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``calor tune [CHANNEL] [--dry-run]`` to the top-level commands.

    Args:
        commands: The top-level subparsers.
        shared: The parser of the global options (a parent, so ``--json`` may follow).
    """
    summary = (
        "fit the channel's recall weights to its feedback (20 rated recalls or more) and "
        "apply them if they rank the held-back feedback better"
    )
    tune = commands.add_parser("tune", parents=[shared], help=summary, description=summary)
    tune.set_defaults(handler=_tune)
    tune.add_argument(
        "tune_channel",
        nargs="?",
        default="",
        metavar="CHANNEL",
        help="the channel to tune (default: --channel)",
    )
    tune.add_argument("--dry-run", action="store_true", help="report the fit without applying it")
