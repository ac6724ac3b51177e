"""This node's part in a cluster: its connection, the write log and its snapshots, the
shared settings, the store's lease, and where a call goes while another node owns the
store."""

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
from calor.server.cluster.settings import SharedSettings
from calor.server.cluster.snapshots import Snapshots
from calor.server.errors import LogBehindError, LogTrimmedError, UnavailableError
from calor.server.storage.store import MemoryStore

__all__ = ["ClusterNode"]

log = logging.getLogger(__name__)

_SNAPSHOT_CHECK_SECONDS = 1.0
_PROBE_SECONDS = 0.25
_RETRY_SECONDS = 0.1
_GRACE_SECONDS = 3 * _RETRY_SECONDS
"""How long a node that found the lease free waits before taking it: an owner whose
renewals NATS could not take (a KV leader being elected) is back first to regain it."""


class ClusterNode:
    """One node: it forwards calls to the owner of the store until it takes the lease
    itself (when the lease is free: the owner stopped renewing it), then owns the store
    until it stops or loses the lease (``on_lost`` is called; the node should stop)."""

    def __init__(
        self,
        nats: NatsConnection,
        write_log: JetStreamLog,
        snapshots: Snapshots,
        settings: SharedSettings,
        lease: Lease,
        lease_seconds: float,
    ) -> None:
        self.write_log = write_log
        self.snapshots = snapshots
        self.settings = settings
        self.me = lease.me
        self.on_lost: Callable[[], None] = lambda: None
        self._nats = nats
        self._lease = lease
        self._lease_seconds = lease_seconds
        self._owner: Owner | None = None
        self._owning = threading.Event()
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
        servers: list[str],
        me: Owner,
        workdir: Path,
        *,
        replicas: int = 3,
        lease_seconds: float = 3.0,
    ) -> ClusterNode:
        """Connect to the NATS servers, with the write stream, the snapshot, settings and
        lease buckets made if they do not exist yet; ``workdir`` holds a snapshot's file
        while it is written or read.

        Raises:
            UnavailableError: No NATS server answered, or JetStream could not make them.
            FailedPreconditionError: The write stream has another replica count.
        """
        nats = NatsConnection.open(servers)
        try:
            write_log = JetStreamLog.open(nats, replicas=replicas)
            snapshots = Snapshots.open(nats, workdir, replicas=replicas)
            settings = SharedSettings.open(nats, replicas=replicas)
            lease = Lease.open(nats, me, lease_seconds=lease_seconds, replicas=replicas)
        except Exception:
            nats.close()
            raise
        return cls(nats, write_log, snapshots, settings, lease, lease_seconds)

    def start(self) -> None:
        """Begin watching the lease (and taking it when it is free)."""
        self._thread.start()

    def wait_for_lease(self, meanwhile: Callable[[], object]) -> bool:
        """Block until this node holds the lease (True) or stops (False), calling
        ``meanwhile`` (catching the store up with the log) about twice a second."""
        while not self._stopping.is_set():
            try:
                with self._using_store:
                    if not self._stopping.is_set():
                        meanwhile()
            except Exception:  # NATS away for longer than a retry: try again later
                log.warning(
                    "node %s could not follow the write log", self.me.node_id, exc_info=True
                )
            if self._owning.wait(0.5):
                return True
        return False

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
        fenced = _Fenced(self.write_log, self._lose)
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

    def forward_to(self) -> str | None:
        """The owner's address while another node owns the store; None when this one does
        or no owner is known (the call is answered here)."""
        owner = self._owner
        if self._owning.is_set() or owner is None or owner == self.me:
            return None
        return owner.address

    def _hold(self) -> None:
        """The lease loop: renew it while held, else watch it and take it when free."""
        renew_every = self._lease_seconds / 3
        while not self._stopping.is_set():
            pause = renew_every if self._owning.is_set() else min(0.5, renew_every)
            try:
                if self._owning.is_set():
                    if not self._lease.renew() and not self._regain():
                        self._lose("lost the store's lease")
                        return
                else:
                    owner = self._lease.owner()
                    if owner is not None and self._gone(owner) and self._lease.break_():
                        log.warning(
                            "node %s: the owner %s refuses connections: its lease broken",
                            self.me.node_id,
                            owner.node_id,
                        )
                        owner = None
                    if owner is None and self._stopping.wait(_GRACE_SECONDS):
                        break
                    if owner is None and self._lease.owner() is None and self._lease.acquire():
                        owner = self.me
                        self._owning.set()
                    self._owner = owner
            except Exception:  # NATS away: a held lease may lapse, a renewal then fails
                log.warning(
                    "node %s: the lease could not be read or renewed",
                    self.me.node_id,
                    exc_info=True,
                )
                pause = _RETRY_SECONDS  # back first when NATS is: the lease is ours to regain
            self._stopping.wait(pause)

    def _gone(self, owner: Owner) -> bool:
        """Whether the owner's process is gone: its address refused a connection twice,
        one look apart (a port nothing listens on; a node that hangs or cannot be
        reached is not taken for gone, its lease lapses instead)."""
        if owner == self.me or not _refuses(owner.address):
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
            written_elsewhere = self.write_log.bounds()[1] != store.log_position
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
        is finished first: the store may be closed after), give a held lease up, and
        close the connection."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self._snapshotting is not None:
            self._snapshotting.join()  # a snapshot being saved is finished first
        with self._using_store:  # the log's entries being applied are, too
            pass
        if self._owning.is_set():
            try:
                self._lease.release()
            except Exception:  # NATS away: the lease lapses on its own
                log.warning("node %s: the lease could not be given up", self.me.node_id)
        self._nats.close()


class _Fenced:
    """The write log as the owner's store appends to it: once ``armed``, an append the
    log refuses (it holds an entry this node has not applied: another node wrote) means
    this node lost the store, and ``lost`` hears why."""

    def __init__(self, write_log: JetStreamLog, lost: Callable[[str], None]) -> None:
        self._log = write_log
        self._lost = lost
        self.armed = False

    def append(self, entry: bytes, after: int) -> int:
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
