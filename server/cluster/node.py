"""This node's part in a cluster: its connection, the write log, the store's lease, and
where a call goes while another node owns the store."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from calor.server.cluster.connection import NatsConnection
from calor.server.cluster.jetstream import JetStreamLog
from calor.server.cluster.placement import Lease, Owner

__all__ = ["ClusterNode"]

log = logging.getLogger(__name__)


class ClusterNode:
    """One node: it forwards calls to the owner of the store until it takes the lease
    itself (when the lease is free: the owner stopped renewing it), then owns the store
    until it stops or loses the lease (``on_lost`` is called; the node should stop)."""

    def __init__(
        self, nats: NatsConnection, write_log: JetStreamLog, lease: Lease, lease_seconds: float
    ) -> None:
        self.write_log = write_log
        self.me = lease.me
        self.on_lost: Callable[[], None] = lambda: None
        self._nats = nats
        self._lease = lease
        self._lease_seconds = lease_seconds
        self._owner: Owner | None = None
        self._owning = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="calor-lease", daemon=True)

    @classmethod
    def join(
        cls,
        servers: list[str],
        me: Owner,
        *,
        replicas: int = 3,
        lease_seconds: float = 3.0,
    ) -> ClusterNode:
        """Connect to the NATS servers, with the write stream and the lease bucket made if
        they do not exist yet.

        Raises:
            UnavailableError: No NATS server answered, or JetStream could not make them.
            FailedPreconditionError: The write stream has another replica count.
        """
        nats = NatsConnection.open(servers)
        try:
            write_log = JetStreamLog.open(nats, replicas=replicas)
            lease = Lease.open(nats, me, lease_seconds=lease_seconds, replicas=replicas)
        except Exception:
            nats.close()
            raise
        return cls(nats, write_log, lease, lease_seconds)

    def start(self) -> None:
        """Begin watching the lease (and taking it when it is free)."""
        self._thread.start()

    def wait_for_lease(self, meanwhile: Callable[[], object]) -> bool:
        """Block until this node holds the lease (True) or stops (False), calling
        ``meanwhile`` (catching the store up with the log) about twice a second."""
        while not self._stopping.is_set():
            try:
                meanwhile()
            except Exception:  # NATS away for longer than a retry: try again later
                log.warning(
                    "node %s could not follow the write log", self.me.node_id, exc_info=True
                )
            if self._owning.wait(0.5):
                return True
        return False

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
            try:
                if self._owning.is_set():
                    if not self._lease.renew():
                        log.critical("node %s lost the store's lease", self.me.node_id)
                        self._owning.clear()
                        self.on_lost()
                        return
                else:
                    owner = self._lease.owner()
                    if owner is None and self._lease.acquire():
                        owner = self.me
                        self._owning.set()
                    self._owner = owner
            except Exception:  # NATS away: a held lease may lapse, a renewal then fails
                log.warning(
                    "node %s: the lease could not be read or renewed",
                    self.me.node_id,
                    exc_info=True,
                )
            self._stopping.wait(renew_every if self._owning.is_set() else min(0.5, renew_every))

    def close(self) -> None:
        """Stop the lease loop, give a held lease up, and close the connection."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self._owning.is_set():
            try:
                self._lease.release()
            except Exception:  # NATS away: the lease lapses on its own
                log.warning("node %s: the lease could not be given up", self.me.node_id)
        self._nats.close()
