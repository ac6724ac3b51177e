"""Cluster mode: the channels a call concerns, read from its request, so that it reaches
the node that owns their shard."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, TypeVar

import numpy as np

from calor.server.api.wire import encode_page_token
from calor.server.errors import NotFoundError
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb

_Item = TypeVar("_Item")

__all__ = [
    "FANNED_OUT",
    "GATHERED",
    "QUERY_VECTOR",
    "channels_of",
    "merge",
    "method_name",
    "query_vector",
    "shard_of",
]

QUERY_VECTOR = "calor-query-vector-bin"
"""Metadata of a recall asked of other shards' owners: the query's embedding (float32),
so that each does not embed the query again."""

GATHERED: ContextVar[tuple[bytes, ...]] = ContextVar("calor_gathered", default=())
"""What other shards answered, serialized, to the call this node answers with them (a
recall naming channels of several shards, answered by its own channel's shard); empty
for any other call."""


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
    if request is None or name in ("ServerStatus", "ListChannels"):
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
    if name in ("ListTriggers", "TriggerHistory", "DeleteTrigger"):
        return (request.channel,) if request.channel else None
    return (str(request.channel),)


FANNED_OUT = frozenset({"DeleteTrigger", "ListChannels", "ListTriggers", "TriggerHistory"})
"""Calls that, naming no channel, every shard answers (a trigger named by its id alone,
every channel's triggers, the channels), their answers merged by :func:`merge`."""


def merge(name: str, request: Any, answers: list[bytes]) -> Any:
    """One reply from the answers of every shard to a call of :data:`FANNED_OUT` (those
    that did not answer NOT_FOUND).

    Raises:
        NotFoundError: No shard holds the trigger ``DeleteTrigger`` names.
    """
    if name == "DeleteTrigger":
        if not any(tpb.DeleteTriggerResponse.FromString(a).deleted for a in answers):
            raise NotFoundError(f"no trigger {request.id}")
        return tpb.DeleteTriggerResponse(deleted=True)
    if name == "TriggerHistory":  # one shard holds the trigger: the others have no firings
        histories = [tpb.TriggerHistoryResponse.FromString(a) for a in answers]
        held = [h for h in histories if h.firings] or [tpb.TriggerHistoryResponse()]
        return held[0]
    if name == "ListChannels":
        channels = [pb.ListChannelsResponse.FromString(a) for a in answers]
        names, token = _merged_pages(
            [(list(page.channels), bool(page.next_page_token)) for page in channels],
            lambda channel: channel,
            request.page_size,
        )
        return pb.ListChannelsResponse(channels=names, next_page_token=token)
    triggers = [tpb.ListTriggersResponse.FromString(a) for a in answers]
    rules, token = _merged_pages(
        [(list(page.triggers), bool(page.next_page_token)) for page in triggers],
        lambda trigger: trigger.id,
        request.page_size,
    )
    return tpb.ListTriggersResponse(triggers=rules, next_page_token=token)


def _merged_pages(
    pages: list[tuple[list[_Item], bool]], key: Callable[[_Item], str], size: int
) -> tuple[list[_Item], str]:
    """One page of at most ``size`` (0: 100) items, in ``key`` order, from every shard's
    page (its items in that order, and whether it has more), and its page token."""
    every = sorted((item for items, _ in pages for item in items), key=key)
    # A shard with more to list may hold items past its page's last: the page stops there.
    bounds = [key(items[-1]) for items, more in pages if more and items]
    bound = min(bounds, default=None)
    shown = [item for item in every if bound is None or key(item) <= bound][: size or 100]
    more = len(shown) < len(every) or bound is not None
    return shown, encode_page_token(key(shown[-1])) if more and shown else ""


def query_vector(metadata: Iterable[tuple[str, Any]], dim: int) -> np.ndarray | None:
    """The query's embedding a recall was asked with by another node (:data:`QUERY_VECTOR`),
    if it is one of ``dim`` finite numbers; None otherwise."""
    raw = dict(metadata).get(QUERY_VECTOR)
    if not isinstance(raw, bytes) or len(raw) != dim * 4:
        return None
    vector = np.frombuffer(raw, dtype=np.float32).copy()
    return vector if bool(np.isfinite(vector).all()) else None
