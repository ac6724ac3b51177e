"""Channel-wide commands of ``calor``: ``calor channels`` lists the readable channels,
``calor drop-channel CHANNEL --yes`` removes one."""

from __future__ import annotations

import argparse

from google.protobuf.message import Message

from calor.client.client import CalorClient
from calor.v1 import memory_service_pb2

__all__ = ["add_admin_commands"]


def _drop_channel(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    dropped = client.drop_channel(args.drop_channel)
    response = memory_service_pb2.DropChannelResponse(dropped=dropped)
    if not dropped:
        return response, f"channel {args.drop_channel} held nothing: nothing dropped"
    noun = "memory" if dropped == 1 else "memories"
    return response, f"dropped channel {args.drop_channel} ({dropped} {noun})"


def _channels(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    names = client.list_channels(args.prefix)
    response = memory_service_pb2.ListChannelsResponse(channels=names)
    return response, "\n".join(names) if names else "no channel this key may read holds anything"


def add_admin_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``calor channels`` and ``calor drop-channel CHANNEL --yes`` to the top-level
    commands.

    Args:
        commands: The top-level subparsers.
        shared: The parser of the global options (a parent, so ``--json`` may follow).
    """
    listing = "list the channels this key may read that hold anything, by name"
    channels = commands.add_parser("channels", parents=[shared], help=listing, description=listing)
    channels.set_defaults(handler=_channels)
    channels.add_argument("--prefix", default="", help="only channels whose names start with it")
    summary = (
        "remove a whole channel for good: its memories, triggers, settings and logs, and "
        "the text its events quoted (an admin call; the bytes leave the disk within seconds)"
    )
    drop = commands.add_parser("drop-channel", parents=[shared], help=summary, description=summary)
    drop.set_defaults(handler=_drop_channel)
    drop.add_argument("drop_channel", metavar="CHANNEL", help="the channel to remove")
    drop.add_argument(
        "--yes", action="store_true", required=True, help="confirm: nothing of it can come back"
    )
