"""This process as a node of a Calor cluster (cluster mode): its NATS connection, the
cluster's members, and one slot per shard, which follows the shard's write log until
this node takes the shard's lease, then serves the shard until the lease is lost or
handed to a node that owns fewer.

A call reaches the shard of its channel (:mod:`calor.server.cluster_routes`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from calor.server.api.forwarding import Fanout, Gather
from calor.server.cluster.connection import NatsConnection
from calor.server.cluster.events import ClusterEvents
from calor.server.cluster.leaders import Leaders
from calor.server.cluster.members import Members, share
from calor.server.cluster.placement import Owner
from calor.server.cluster.replica import ShardReplica
from calor.server.cluster.settings import SharedSettings
from calor.server.cluster_routes import Routes, Slot
from calor.server.config import ServerConfig
from calor.server.errors import ResourceExhaustedError
from calor.server.metrics import ClusterCounts, ServerCounts, sum_counts
from calor.server.shard import Shard
from calor.server.storage.store import MemoryStore
from calor.triggers.subscriptions import EventFilter

OpenStore = Callable[[Path], MemoryStore]
"""Opens (or makes) a shard's store in a directory (blocking)."""
ServeShard = Callable[[MemoryStore, Path], Awaitable[Shard]]
"""Loads the engine and triggers of a shard this node now owns, over its store."""

__all__ = ["ClusterHost"]

log = logging.getLogger("calor.server")

_BALANCE_SECONDS = 1.0
_HANDOVER_SECONDS = 1.0
"""How long a node waits after handing a shard over before it hands over another."""
_FOLLOW_SECONDS = 0.5
"""How often a node reads the log of a shard another node owns (and at once when it
takes the shard's lease)."""
_ALIGN_SECONDS = 5.0
"""How often the first member looks at where the takeover's Raft leaders are."""


class ClusterHost:
    """This node's shards: which it serves, where the others are, and how many it
    should own. Build it with :meth:`join` (blocking), then ``await start()``."""

    def __init__(
        self,
        config: ServerConfig,
        me: Owner,
        nats: NatsConnection,
        settings: SharedSettings,
        members: Members,
        events: ClusterEvents,
        target: int,
    ) -> None:
        self.config = config
        self.me = me
        self.settings = settings
        self.events = events
        self._nats = nats
        self._members = members
        self._slots = [Slot(index) for index in range(config.shards)]
        self._routes = Routes(self._slots, me)
        self._target = target  # shards this node should own; kept by the balancer
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._handed_over_at = 0.0
        self._over_since: float | None = None  # since when it owns more than its share
        self._listed: list[str] = []  # the members' ids, as last listed
        self._purges: set[asyncio.Future[None]] = set()  # of events quoting forgotten memories
        # Its own threads for what waits on NATS (a shard's follower waits as long as an
        # election lasts): the loop's default pool, a few threads, is not held up by it.
        self._blocking = ThreadPoolExecutor(
            max_workers=2 * config.shards + 4, thread_name_prefix="calor-cluster"
        )

    @classmethod
    def join(cls, config: ServerConfig, me: Owner) -> ClusterHost:
        """Connect to the cluster's NATS servers and list this node among its members
        (blocking).

        Raises:
            UnavailableError: No NATS server answered, or JetStream could not make the
                buckets.
        """
        nats = NatsConnection.open(list(config.cluster))
        try:
            replicas = config.log_replicas
            settings = SharedSettings.open(nats, replicas=replicas)
            settings.agree_on_shards(config.shards)
            members = Members(nats, me, lease_seconds=config.lease_seconds, replicas=replicas)
            target = share(me.node_id, members.renew(), config.shards)
            events = ClusterEvents.open(
                nats,
                replicas=replicas,
                keep_events=config.event_retention,
                keep_seconds=config.event_retention_seconds,
                queue_size=config.subscriber_queue,
            )
        except Exception:
            nats.close()
            raise
        return cls(config, me, nats, settings, members, events, target)

    async def start(self, open_store: OpenStore, serve: ServeShard) -> None:
        """Follow every shard's write log, take the shards this node should own, and keep
        the balance as nodes come and go."""
        for slot in self._slots:
            name = f"calor-shard-{slot.index}"
            self._tasks.append(asyncio.create_task(self._keep(slot, open_store, serve), name=name))
        self._tasks.append(asyncio.create_task(self._balance(), name="calor-balance"))
        self._tasks.append(asyncio.create_task(self._align_leaders(), name="calor-leaders"))

    async def placed(self) -> None:
        """Wait until this node knows who owns each shard (it read every lease once)."""
        while not all(
            slot.replica is not None and slot.replica.placed.is_set() for slot in self._slots
        ):
            await asyncio.sleep(0.02)

    async def _keep(self, slot: Slot, open_store: OpenStore, serve: ServeShard) -> None:
        """Hold one shard on this node, again and again: follow it, serve it while
        owning it, and start over when it is lost or handed over."""
        while not self._stopping.is_set():
            try:
                await self._hold(slot, open_store, serve)
            except Exception:
                log.exception(
                    "node %s: shard %d failed; starting it again", self.me.node_id, slot.index
                )
                await _wait(self._stopping, 1.0)

    async def _hold(self, slot: Slot, open_store: OpenStore, serve: ServeShard) -> None:
        """Follow the shard until this node takes its lease, then serve it until the
        lease is lost, the shard handed over, or the node stops."""
        loop, config, index = asyncio.get_running_loop(), self.config, slot.index
        directory = config.data_dir / "shards" / str(index)
        store = slot.store = await loop.run_in_executor(self._blocking, open_store, directory)
        shard: Shard | None = None
        publishing: asyncio.Task[None] | None = None
        slot.leave = leave = asyncio.Event()
        slot.woken = woken = asyncio.Event()
        try:
            join = partial(
                ShardReplica.join,
                self._nats,
                index,
                self.me,
                config.data_dir / "snapshots" / str(index),
                replicas=config.log_replicas,
                lease_seconds=config.lease_seconds,
                wants=self._wants,
            )
            replica = slot.replica = await loop.run_in_executor(self._blocking, join)

            def lost() -> None:  # heard on the replica's lease thread
                loop.call_soon_threadsafe(leave.set)

            def taken() -> None:  # heard on the replica's lease thread
                loop.call_soon_threadsafe(woken.set)

            replica.on_lost, replica.on_taken = lost, taken
            replica.start()
            while not replica.owning:  # follow the log meanwhile: a takeover is short
                await loop.run_in_executor(self._blocking, replica.keep_up, store)
                if self._stopping.is_set():
                    return
                await _wait(woken, _FOLLOW_SECONDS)
            started = time.monotonic()
            applied = await loop.run_in_executor(self._blocking, replica.take_over, store)
            shard = await serve(store, directory)
            replica.keep_snapshots(store, config.snapshot_entries)
            publishing = asyncio.create_task(
                self._publish_events(slot, shard), name=f"calor-events-{index}"
            )
            store.on_forget(partial(self._forgot, slot, loop))
            slot.shard = shard
            log.info(
                "node %s serves shard %d: %d write-log entries caught up and loaded in "
                "%.2f s, at position %d",
                self.me.node_id,
                index,
                applied,
                time.monotonic() - started,
                store.log_position,
            )
            await leave.wait()
        finally:
            slot.shard = None  # calls go elsewhere from now on
            if publishing is not None:  # the next owner publishes from where it stopped
                publishing.cancel()
                await asyncio.gather(publishing, return_exceptions=True)
            if shard is not None:
                await shard.stop_serving()
                await self._drained(slot)
            if slot.replica is not None:
                await loop.run_in_executor(self._blocking, slot.replica.close)
                slot.replica = None
            slot.store = None
            if shard is not None:
                shard.close()
            else:
                store.close()

    async def _publish_events(self, slot: Slot, shard: Shard) -> None:
        """Append the shard's events to the cluster's events stream, in order, from the
        last one recorded as published (a new owner may offer a few again: the stream
        keeps each once)."""
        assert shard.triggers is not None
        loop, index, events = asyncio.get_running_loop(), slot.index, self.events
        recording: asyncio.Task[None] | None = None
        while True:
            slot.published = await loop.run_in_executor(self._blocking, events.published, index)
            try:
                hub = shard.triggers.hub.subscribe(
                    EventFilter(), slot.published, from_oldest=True, relay=True
                )
                async for event in hub:
                    await events.publish(index, event)
                    slot.published = event.seq
                    if recording is None or recording.done():
                        recording = asyncio.create_task(events.record(index, event.seq))
            except ResourceExhaustedError:  # fell behind the hub: read from the store again
                continue

    def _forgot(
        self,
        slot: Slot,
        loop: asyncio.AbstractEventLoop,
        memories: set[tuple[str, str]],
        channels: set[str],
        seq: int,
    ) -> None:
        """A commit forgot memories or dropped channels (heard on the committing thread):
        once the events up to it are published, the events that quote them go."""

        async def purge() -> None:
            while slot.published < seq and slot.shard is not None:
                await asyncio.sleep(0.05)
            try:
                await self.events.forget(slot.index, memories, channels)
            except Exception:
                log.warning("events quoting forgotten memories stay in the stream", exc_info=True)

        def start() -> None:
            task = asyncio.ensure_future(purge())
            self._purges.add(task)
            task.add_done_callback(self._purges.discard)

        loop.call_soon_threadsafe(start)

    async def _drained(self, slot: Slot) -> None:
        """Wait until the calls this node was answering for the shard are done (at most
        the grace period)."""
        deadline = time.monotonic() + self.config.grace_seconds
        while slot.calls and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _wants(self) -> bool:
        """Whether this node should take a free lease: it owns fewer shards than its
        share (asked from the replicas' lease threads)."""
        return sum(other.owning for other in self._slots) < self._target

    async def _balance(self) -> None:
        """Keep this node's entry among the members, its share up to date, and hand a
        shard over (one at a time) while it owns more than its share."""
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            try:
                members = await loop.run_in_executor(self._blocking, self._members.renew)
                self._listed = members
                self._target = share(self.me.node_id, members, len(self._slots))
                owned = [slot for slot in self._slots if slot.shard is not None]
                now = time.monotonic()
                if len(owned) <= self._target:
                    self._over_since = None
                elif self._over_since is None:
                    self._over_since = now
                # Over its share for longer than a dead node stays among the members, and
                # not just after handing one over: hand one on.
                settled = now - (self._over_since or now) > self.config.lease_seconds + 1
                if settled and now - self._handed_over_at > _HANDOVER_SECONDS:
                    slot = owned[-1]
                    log.info(
                        "node %s hands shard %d over: it owns %d, its share of %d nodes is %d",
                        self.me.node_id,
                        slot.index,
                        len(owned),
                        len(members),
                        self._target,
                    )
                    self._handed_over_at = time.monotonic()
                    slot.leave.set()
            except Exception:
                log.warning(
                    "node %s: the members could not be read", self.me.node_id, exc_info=True
                )
            await _wait(self._stopping, _BALANCE_SECONDS)

    async def _align_leaders(self) -> None:
        """Keep the placement bucket's Raft leader on the write stream's NATS server
        (:mod:`calor.server.cluster.leaders`); one node does it, the first member, and
        only while every shard has an owner (a leader stepping down holds writes to its
        group up for a moment: not while a shard is being taken over)."""
        loop, leaders = asyncio.get_running_loop(), Leaders(self._nats)
        while not self._stopping.is_set():
            await _wait(self._stopping, _ALIGN_SECONDS)
            first = min(self._listed, default="") == self.me.node_id
            if self._stopping.is_set() or not first or not self._every_shard_owned():
                continue
            try:
                await loop.run_in_executor(self._blocking, leaders.align)
            except Exception:
                log.debug("node %s: the leaders were not aligned", self.me.node_id, exc_info=True)

    def _every_shard_owned(self) -> bool:
        """Whether each shard is served here or has an owner elsewhere, as last seen."""
        return all(
            slot.shard is not None or (slot.replica is not None and not slot.replica.free)
            for slot in self._slots
        )

    def place(
        self, method: str, request: Any, forwarded: bool, shard: int | None = None
    ) -> Callable[..., Any] | str | Fanout | Gather:
        """Where the call goes (:meth:`calor.server.cluster_routes.Routes.place`)."""
        return self._routes.place(method, request, forwarded, shard)

    def shard_of(self, method: str, request: Any) -> int:
        """The shard a call goes to (:meth:`calor.server.cluster_routes.Routes.shard_of`)."""
        return self._routes.shard_of(method, request)

    def counts(self) -> ServerCounts:
        """What the shards this node serves hold now, and the subscriptions open through
        it (blocking)."""
        held = [shard.counts() for slot in self._slots if (shard := slot.shard) is not None]
        counts = sum_counts([counts for counts in held if counts is not None])
        return replace(
            counts,
            subscribers=counts.subscribers + self.events.subscribers,
            dropped_subscribers=counts.dropped_subscribers + self.events.dropped,
        )

    def cluster_counts(self) -> ClusterCounts:
        """Which shards this node owns and serves, and the log position of each it
        holds."""
        return ClusterCounts(
            owned={slot.index: slot.shard is not None for slot in self._slots},
            log_positions={slot.index: slot.position for slot in self._slots},
        )

    async def stop(self) -> None:
        """Stop serving and following every shard (calls drained, leases given up), leave
        the members, and close the connection."""
        self._stopping.set()
        for slot in self._slots:
            slot.leave.set()
            slot.woken.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._blocking, self._members.leave)
        except Exception:
            log.warning("node %s could not leave the members", self.me.node_id)
        await loop.run_in_executor(self._blocking, self._nats.close)
        self._blocking.shutdown(wait=False)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` have passed."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass
