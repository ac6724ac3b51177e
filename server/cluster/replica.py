"""One shard on this node: its write log and snapshots, which it follows, and its lease,
which it takes when the shard is free and this node wants it, then renews while it
writes the shard's store."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from calor.server.cluster.connection import NatsConnection
from calor.server.cluster.jetstream import JetStreamLog
from calor.server.cluster.placement import Lease, Owner
from calor.server.cluster.snapshots import Snapshots
from calor.server.errors import LogBehindError, LogTrimmedError, UnavailableError
from calor.server.storage.store import MemoryStore

__all__ = ["ShardReplica"]

log = logging.getLogger(__name__)

_SNAPSHOT_CHECK_SECONDS = 1.0
_PROBE_SECONDS = 0.25
_WATCH_SECONDS = 0.25
"""How often a node that does not own the shard reads who does (other nodes' calls are
forwarded to the owner it read last)."""
_RETRY_SECONDS = 0.1
_GRACE_SECONDS = 3 * _RETRY_SECONDS
"""How long the bucket must have taken writes before a node takes a lease that lapsed:
an owner whose renewals NATS could not take (the bucket's leader being elected) is back
first to regain it."""
_ORPHAN_SECONDS = 1.5
"""How long a lease stays free before a node takes it though it owns its share already
or has not caught up with the log yet (the node that should take it is gone, and the
members do not show it yet)."""


class ShardReplica:
    """A shard's store on this node: it follows the shard's write log until this node
    takes the shard's lease (when the lease is free, the owner stopped renewing it, and
    ``wants()`` says this node should own one more shard, or nobody took it for a
    lease), then writes the store until it stops or loses the lease (``on_lost`` is
    called; the shard should stop serving here)."""

    def __init__(
        self,
        index: int,
        write_log: JetStreamLog,
        snapshots: Snapshots,
        lease: Lease,
        lease_seconds: float,
        wants: Callable[[], bool],
    ) -> None:
        self.index = index
        self.write_log = write_log
        self.snapshots = snapshots
        self.me = lease.me
        self.on_lost: Callable[[], None] = lambda: None
        self.on_taken: Callable[[], None] = lambda: None
        self._wants = wants
        self._free_since: float | None = None  # when the lease was first seen free
        self._writable_since: float | None = None  # since when the bucket takes writes
        self._dead: Owner | None = None  # the owner last seen gone, until another owns it
        self._caught_up = threading.Event()  # the log was followed to its end once
        self._lease = lease
        self._lease_seconds = lease_seconds
        self._owner: Owner | None = None
        self.free = True
        """Whether the lease was free (or not read yet) when this node last read it."""
        self._owning = threading.Event()
        self.placed = threading.Event()
        """Set once the lease was read: this node knows who owns the shard, or takes it."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="calor-lease", daemon=True)
        self._snapshotting: threading.Thread | None = None
        self._using_store = threading.Lock()  # held while the log is applied to the store
        self._store: MemoryStore | None = None  # once this node writes it
        self._losing = threading.Lock()
        self._refused: Owner | None = None  # an owner whose address refused a connection

    @classmethod
    def join(
        cls,
        nats: NatsConnection,
        index: int,
        me: Owner,
        workdir: Path,
        *,
        replicas: int = 3,
        lease_seconds: float = 3.0,
        wants: Callable[[], bool] = lambda: True,
    ) -> ShardReplica:
        """Shard ``index``'s write stream, snapshot and lease on ``nats``, made if they
        do not exist yet; ``workdir`` holds a snapshot's file while it is written or read.

        Raises:
            UnavailableError: JetStream could not make them in time.
            FailedPreconditionError: The write stream has another replica count.
        """
        write_log = JetStreamLog.open(nats, index, replicas=replicas)
        snapshots = Snapshots.open(nats, index, workdir, replicas=replicas)
        lease = Lease.open(nats, index, me, lease_seconds=lease_seconds, replicas=replicas)
        return cls(index, write_log, snapshots, lease, lease_seconds, wants)

    def start(self) -> None:
        """Begin watching the lease (and taking it when it is free)."""
        self._thread.start()

    def keep_up(self, store: MemoryStore) -> None:
        """Catch ``store`` up with the write log while another node owns the shard (a
        takeover is short then); a log NATS cannot read now is read next time."""
        try:
            with self._using_store:
                if not self._stopping.is_set():
                    self.follow(store)
                    self._caught_up.set()
        except Exception:  # NATS away for longer than a retry: try again later
            log.warning(
                "node %s could not follow shard %d's write log",
                self.me.node_id,
                self.index,
                exc_info=True,
            )

    def follow(self, store: MemoryStore) -> int:
        """Catch ``store`` up with the write log (a node that does not own the store);
        an empty store, or one behind the log's beginning, loads the newest snapshot
        first. Returns how many entries were applied.

        Raises:
            LogTrimmedError: The log is trimmed past the newest snapshot too (an owner
                that lost the store saved an older one): tried again later.
        """
        if store.log_position == 0:
            self._load_snapshot(store)
        try:
            return store.catch_up(self.write_log)
        except LogTrimmedError:
            self._load_snapshot(store)
            return store.catch_up(self.write_log)

    def take_over(self, store: MemoryStore) -> int:
        """Make ``store`` the write log's one writer (this node holds the lease): caught
        up, from the newest snapshot if the log is trimmed past it. Returns how many
        entries were caught up.

        Raises:
            UnavailableError: The node is stopping.
        """
        fenced = _Fenced(self.write_log, self._lose, self._owning.is_set)
        with self._using_store:
            if self._stopping.is_set():
                raise UnavailableError("the node is stopping")
            try:
                applied = store.take_over(fenced)
            except LogTrimmedError:
                self._load_snapshot(store)
                applied = store.take_over(fenced)
        self._store = store
        fenced.armed = True  # from now on a refused append means another node wrote
        return applied

    def _load_snapshot(self, store: MemoryStore) -> None:
        started = time.monotonic()
        position = self.snapshots.load(store)
        if position:
            log.info(
                "node %s loaded the snapshot at write-log position %d in %.2f s",
                self.me.node_id,
                position,
                time.monotonic() - started,
            )

    def keep_snapshots(self, store: MemoryStore, every: int) -> None:
        """While this node owns ``store``: save a snapshot each time the log has grown
        by ``every`` entries, then trim the log up to the snapshot before it."""
        self._snapshotting = threading.Thread(
            target=self._snapshot_loop, args=(store, every), name="calor-snapshots", daemon=True
        )
        self._snapshotting.start()

    def _snapshot_loop(self, store: MemoryStore, every: int) -> None:
        try:
            saved = self.snapshots.position()
        except Exception:
            log.warning("node %s: no snapshots (NATS away)", self.me.node_id, exc_info=True)
            return
        while not self._stopping.wait(_SNAPSHOT_CHECK_SECONDS):
            if not self._owning.is_set() or store.log_position - saved < every:
                continue
            try:
                started = time.monotonic()
                if self.snapshots.position() > saved:
                    return  # another node saves them now: this one lost the store
                position = self.snapshots.save(store)
                if saved:
                    self.write_log.trim(saved)  # the log now begins at the last snapshot
                log.info(
                    "node %s saved a snapshot at write-log position %d in %.2f s",
                    self.me.node_id,
                    position,
                    time.monotonic() - started,
                )
                saved = position
            except Exception:
                log.warning("node %s: a snapshot failed", self.me.node_id, exc_info=True)

    @property
    def owning(self) -> bool:
        """Whether this node owns the store now."""
        return self._owning.is_set()

    def owner(self) -> Owner | None:
        """The other node that owns the shard, as last seen (still while the lease reads
        free, until another takes it or this one is known gone); None while this node
        owns it or no owner is known."""
        owner = self._owner
        if self._owning.is_set() or owner is None or owner == self.me:
            return None
        return owner

    def _hold(self) -> None:
        """The lease loop: renew it while held, else watch it and take it when free."""
        renew_every = self._lease_seconds / 3
        while not self._stopping.is_set():
            pause = renew_every if self._owning.is_set() else min(_WATCH_SECONDS, renew_every)
            try:
                if self._owning.is_set():
                    if not self._lease.renew() and not self._regain():
                        self._lose(f"lost the shard's lease (shard {self.index})")
                        return
                else:
                    self._watch()
                self.placed.set()
            except Exception:  # NATS away: a held lease may lapse, a renewal then fails
                log.warning(
                    "node %s: the lease could not be read or renewed",
                    self.me.node_id,
                    exc_info=True,
                )
                self._writable_since = None
                pause = _RETRY_SECONDS  # back first when NATS is: the lease is ours to regain
            self._stopping.wait(pause)

    def _watch(self) -> None:
        """Read who owns the shard; take the lease at once if its owner is gone (this
        node saw its address refuse connections, and broke the lease or saw it lapse),
        or once the bucket has taken writes for a while if it is free and this node
        should take it."""
        owner = self._lease.owner()
        self.free = owner is None
        if owner is not None:
            self._dead = owner if self._gone(owner) else None  # else alive (again)
        if owner is not None and owner == self._dead and self._lease.break_():
            log.warning(
                "node %s: the owner %s refuses connections: its lease broken (shard %d)",
                self.me.node_id,
                owner.node_id,
                self.index,
            )
            owner, self.free = None, True
        if owner is not None:
            self._owner = owner
            self._free_since = self._writable_since = None
            return
        if self._dead is not None:  # a dead owner's, wanted or not
            self._owner = None
            self._take()
            return
        # Calls still go to the last owner seen: it may be renewing the lease right now
        # (it lapsed while NATS took no writes), or this read came from a server that
        # lags; a node that no longer owns the shard refuses them, as would this one.
        if self._may_take() and self._settled():
            self._take()

    def _take(self) -> None:
        """Take the free lease (``on_taken`` hears it)."""
        if self._lease.acquire():
            self._owner, self._dead, self.free = self.me, None, False
            self._owning.set()
            self.on_taken()

    def _may_take(self) -> bool:
        """Whether to take the free lease: this node wants one more shard and has caught
        up with the log, or the lease has been free too long for a node that does to be
        coming."""
        now = time.monotonic()
        if self._free_since is None:
            self._free_since = now
        wanted = self._wants() and self._caught_up.is_set()
        return wanted or now - self._free_since > _ORPHAN_SECONDS

    def _settled(self) -> bool:
        """Whether the bucket has taken writes for :data:`_GRACE_SECONDS` (asked of it
        once; an error while it takes none)."""
        now = time.monotonic()
        if self._writable_since is None:
            self._lease.probe()
            self._writable_since = now
        return now - self._writable_since >= _GRACE_SECONDS

    def _gone(self, owner: Owner) -> bool:
        """Whether the owner's process is gone: its address refused a connection twice,
        one look apart (a port nothing listens on; a node that hangs or cannot be
        reached is not taken for gone, its lease lapses instead). A node that has not
        caught up with the log leaves that to the others, which can take over at once."""
        if owner == self.me or not self._caught_up.is_set() or not _refuses(owner.address):
            self._refused = None
            return False
        if self._refused != owner:
            self._refused = owner  # once: look again next time
            return False
        return True

    def _regain(self) -> bool:
        """After a renewal failed: take the lease again if it lapsed only because NATS
        could not renew it in time (a KV leader being elected takes longer than a lease)
        and no other node wrote to the log since. Whether this node holds it again."""
        store = self._store
        if store is None or not self._lease.acquire():
            return False
        with store.commits_held():  # an append of this node's in flight lands first
            written_elsewhere = self.write_log.last() != store.log_position
        if written_elsewhere:
            self._lease.release()
            return False
        log.warning(
            "node %s: its lease lapsed while NATS could not renew it; no other node wrote "
            "since, so it holds the store again",
            self.me.node_id,
        )
        return True  # had another node written meanwhile, the log's fence stops this one

    def _lose(self, why: str) -> None:
        """This node no longer owns the store: say so once and stop it (``on_lost``)."""
        with self._losing:
            if not self._owning.is_set():
                return
            self._owning.clear()
        log.critical("node %s %s", self.me.node_id, why)
        self.on_lost()

    def close(self) -> None:
        """Stop the lease loop, following the log and saving snapshots (what is under way
        is finished first: the store may be closed after), and give a held lease up (the
        store must take no more commits: the next owner may take it at once)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self._snapshotting is not None:
            self._snapshotting.join()  # a snapshot being saved is finished first
        with self._using_store:  # the log's entries being applied are, too
            pass
        if self._owning.is_set():
            self._owning.clear()
            try:
                self._lease.release()
            except Exception:  # NATS away: the lease lapses on its own
                log.warning(
                    "node %s: shard %d's lease could not be given up", self.me.node_id, self.index
                )


class _Fenced:
    """The write log as the owner's store appends to it: nothing is appended once this
    node knows it lost the lease (``holding`` says no), and once ``armed``, an append the
    log refuses (it holds an entry this node has not applied: another node wrote) means
    this node lost the store, and ``lost`` hears why."""

    def __init__(
        self, write_log: JetStreamLog, lost: Callable[[str], None], holding: Callable[[], bool]
    ) -> None:
        self._log = write_log
        self._lost = lost
        self._holding = holding
        self.armed = False

    def append(self, entry: bytes, after: int) -> int:
        if not self._holding():
            raise UnavailableError("this node no longer holds the shard's lease: call again")
        try:
            return self._log.append(entry, after)
        except LogBehindError:
            if self.armed:
                self._lost("found another node's entry in the write log")
            raise

    def entries_after(self, position: int) -> Iterator[tuple[int, bytes]]:
        return self._log.entries_after(position)


def _refuses(address: str) -> bool:
    """Whether ``host:port`` refuses a TCP connection (nothing listens there)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_SECONDS):
            return False
    except ConnectionRefusedError:
        return True
    except (OSError, ValueError):  # a timeout, no route: not known to be gone
        return False
