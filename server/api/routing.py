"""Cluster mode: the channels a call concerns, read from its request, so that it reaches
the node that owns their shard."""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["channels_of", "method_name", "shard_of"]


def shard_of(channel: str, shards: int) -> int:
    """The shard that holds ``channel`` among ``shards``: a stable hash of its name
    (the same on every node and in every release)."""
    digest = hashlib.blake2b(channel.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def method_name(method: str) -> str:
    """The RPC's name from its full path (``/calor.v1.MemoryService/Store``: ``Store``)."""
    return method.rsplit("/", 1)[-1]


def channels_of(name: str, request: Any) -> tuple[str, ...] | None:
    """The channels the call ``name`` reads or writes, from its (first) request; None
    for a call about no channel in particular or about every one: the server's status,
    a trigger named by its id alone, a subscription or trigger list without channels."""
    if request is None or name == "ServerStatus" or name == "DeleteTrigger":
        return None
    if name == "Recall":
        return (request.channel, *request.channels)
    if name == "Share":
        return (request.channel, request.target_channel)
    if name == "Subscribe":
        return tuple(request.channels) or None
    if name == "CreateTrigger":
        return (request.trigger.channel,)
    if name == "StoreStream":
        return (request.store.channel,)
    if name in ("ListTriggers", "TriggerHistory"):
        return (request.channel,) if request.channel else None
    return (str(request.channel),)
