"""Where a call goes in a cluster: answered here while this node serves the shard of its
channel, forwarded to the shard's owner otherwise, asked of every shard's owner when it
names no channel, or answered here with other shards' hits (a recall naming their
channels) or memory (a share from one of them).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import numpy as np

from calor.server.api.forwarding import Fanout, Gather
from calor.server.api.routing import (
    FANNED_OUT,
    QUERY_VECTOR,
    channels_of,
    merge,
    method_name,
    shard_of,
)
from calor.server.cluster.placement import Owner
from calor.server.cluster.replica import ShardReplica
from calor.server.errors import FailedPreconditionError, UnavailableError
from calor.server.shard import Shard
from calor.server.storage.store import MemoryStore
from calor.v1 import memory_service_pb2 as pb

__all__ = ["Routes", "Slot"]

_INSPECT = "/calor.v1.MemoryService/Inspect"


class Slot:
    """One shard on this node: its replica (following or owning) and, while this node
    serves it, the shard's engine and servicers."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.replica: ShardReplica | None = None
        self.store: MemoryStore | None = None
        self.shard: Shard | None = None
        self.calls = 0  # calls being answered here
        self.published = 0  # the last of the shard's events in the events stream
        self.leave = asyncio.Event()  # set: the lease was lost, or the shard handed over
        self.woken = asyncio.Event()  # set: the lease was taken, or the node stops

    @property
    def owning(self) -> bool:
        replica = self.replica
        return replica is not None and replica.owning

    @property
    def position(self) -> int:
        """The last write-log entry this node's store of the shard holds."""
        store = self.store
        return store.log_position if store is not None else 0


class Routes:
    """The way to each shard from this node (``me``), as its ``slots`` stand."""

    def __init__(self, slots: list[Slot], me: Owner) -> None:
        self._slots = slots
        self.me = me

    def place(
        self, method: str, request: Any, forwarded: bool, shard: int | None = None
    ) -> Callable[..., Any] | str | Fanout | Gather:
        """Where the call goes: the behaviour that answers it here, the address of the
        node that owns its shard, every shard's owner (a call naming no channel that
        every shard answers; ``shard``: the one such a call was asked of), or, for a
        recall naming channels of other shards, this node with their owners' hits.

        Raises:
            FailedPreconditionError: The call names channels of several shards (other
                than a recall).
            UnavailableError: No node serves the shard right now, or the call was
                forwarded here and this node no longer serves it.
        """
        name = method_name(method)
        channels = channels_of(name, request)
        if shard is not None and 0 <= shard < len(self._slots):
            index = shard
        elif channels is None and name in FANNED_OUT and len(self._slots) > 1:
            return Fanout(
                tuple((slot.index, self._address(slot)) for slot in self._slots),
                partial(merge, name, request),
            )
        elif name == "Recall" and len(self._slots) > 1:
            return self._recall(method, request, forwarded)
        elif name == "Share" and len(self._slots) > 1:
            return self._share(method, request, forwarded)
        else:
            index = self._shard_for(name, channels)
        return self._served_here(index, method, forwarded)

    def _recall(
        self, method: str, request: Any, forwarded: bool
    ) -> Callable[..., Any] | str | Gather:
        """A recall goes to its own channel's shard; the further channels it names that
        other shards hold are ranked by their owners (a peek: only the own channel's
        hits are recalled), and their hits take their place among the shard's."""
        count = len(self._slots)
        index = shard_of(request.channel, count)
        local = self._served_here(index, method, forwarded)
        others = sorted({shard_of(channel, count) for channel in request.channels} - {index})
        if isinstance(local, str) or not others:
            return local
        asked = pb.RecallRequest()
        asked.CopyFrom(request)
        asked.peek = True
        targets = tuple((other, self._address(self._slots[other])) for other in others)
        embed = self._slots[index].shard
        assert embed is not None  # served here: local is its behaviour
        vector = partial(_query_vector, embed.runtime.embeddings.query, request.query)
        return Gather(targets, asked, local, metadata=vector)

    def _share(
        self, method: str, request: Any, forwarded: bool
    ) -> Callable[..., Any] | str | Gather:
        """A share goes to its target channel's shard, which stores the copy; a memory
        another shard holds is read from its owner (``Inspect``)."""
        count = len(self._slots)
        source, index = shard_of(request.channel, count), shard_of(request.target_channel, count)
        local = self._served_here(index, method, forwarded)
        if isinstance(local, str) or source == index:
            return local
        asked = pb.InspectRequest(channel=request.channel, id=request.id)
        targets = ((source, self._address(self._slots[source])),)
        return Gather(targets, asked, local, _INSPECT)

    def _served_here(self, index: int, method: str, forwarded: bool) -> Callable[..., Any] | str:
        """The behaviour that answers ``method`` for shard ``index`` here, or the address
        of the node that serves it.

        Raises:
            UnavailableError: No node serves it right now, or the call was forwarded here
                and this node no longer serves it.
        """
        slot = self._slots[index]
        served = slot.shard
        if served is not None:
            return self._answer(slot, served, method, method_name(method))
        if forwarded:  # here as to the owner, which this node is no longer
            raise _no_owner(index)
        return self._owner_address(slot)

    def shard_of(self, method: str, request: Any) -> int:
        """The shard a call goes to, from its (first) request.

        Raises:
            FailedPreconditionError: It names channels of several shards.
        """
        name = method_name(method)
        return self._shard_for(name, channels_of(name, request))

    def _address(self, slot: Slot) -> str:
        """Where the shard is served: this node, or its owner.

        Raises:
            UnavailableError: No node serves it right now.
        """
        return self.me.address if slot.shard is not None else self._owner_address(slot)

    @staticmethod
    def _owner_address(slot: Slot) -> str:
        """The address of the other node that owns the shard.

        Raises:
            UnavailableError: No node owns it right now.
        """
        owner = slot.replica.owner() if slot.replica is not None else None
        if owner is None:
            raise _no_owner(slot.index)
        return owner.address

    def _shard_for(self, name: str, channels: tuple[str, ...] | None) -> int:
        count = len(self._slots)
        if count == 1:
            return 0
        if channels is None:
            if name == "ServerStatus":  # this node's own status
                return next((s.index for s in self._slots if s.shard is not None), 0)
            raise FailedPreconditionError(
                f"{name} needs a channel in a cluster of {count} shards: name the channel "
                "(each shard answers for its own)"
            )
        shards = {shard_of(channel, count) for channel in channels}
        if len(shards) > 1:
            raise FailedPreconditionError(
                f"{name} names channels of different shards ({', '.join(channels)}): in a "
                f"cluster of {count} shards a call reaches one shard"
            )
        return shards.pop()

    def _answer(self, slot: Slot, shard: Shard, method: str, name: str) -> Callable[..., Any]:
        """The shard's servicer method for ``method``, counted among the slot's calls."""
        service = method.split("/")[1].rsplit(".", 1)[-1]
        api = {
            "MemoryService": shard.memory_api,
            "TriggerService": shard.trigger_api,
            "SettingsService": shard.settings_api,
        }[service]
        behaviour = getattr(api, name)
        if inspect.isasyncgenfunction(behaviour):

            async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
                slot.calls += 1
                try:
                    async for response in behaviour(request, context):
                        yield response
                finally:
                    slot.calls -= 1

            return streaming

        async def answering(request: Any, context: Any) -> Any:
            slot.calls += 1
            try:
                return await behaviour(request, context)
            finally:
                slot.calls -= 1

        return answering


def _no_owner(index: int) -> UnavailableError:
    return UnavailableError(
        f"shard {index} has no owner right now (a node is taking it over): call again"
    )


async def _query_vector(
    embed: Callable[[str], Awaitable[np.ndarray]], query: str
) -> list[tuple[str, bytes]]:
    """A recall's query embedded once here, as metadata for the other shards' owners."""
    vector = await embed(query)
    return [(QUERY_VECTOR, np.asarray(vector, dtype=np.float32).tobytes())]
