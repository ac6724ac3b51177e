"""Who owns a shard: a lease in a replicated JetStream key-value bucket.

The owner's entry (its node id and the address other nodes forward calls to) lives in
the bucket ``calor_placement`` under ``shard-K``. The bucket's entries expire
``lease_seconds`` after they were last written, so an owner renews its entry well
within that (a compare-and-set on the entry's revision: a renewal after someone else
took the lease fails). A node takes a free lease with a create, which fails while an
entry exists: at most one node holds it at a time. The write log's fence
(``MemoryStore.take_over``) makes sure an owner that lost its lease without knowing
cannot append after the next one took over.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from nats.js.errors import (
    APIError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from calor.server.cluster.connection import NatsConnection, bucket_config

__all__ = ["BUCKET", "Lease", "Owner"]

log = logging.getLogger(__name__)

BUCKET = "calor_placement"
_KEY = "shard-{shard}"
_OPERATION = "KV-Operation"
_REMOVED = ("DEL", "PURGE")
"""How a KV entry's headers mark a deleted key."""
_PROBE_KEY = "probe"
_NO_REVISION = 2**63 - 1
"""A revision no key reaches: a write naming it is refused whenever the bucket answers."""
_WRONG_LAST_SEQUENCE = 10071
"""JetStream's refusal of a write that names another revision than the key's last (a
delete's refusal comes as it is; the KV client turns an update's into
``KeyWrongLastSequenceError``)."""


@dataclass(frozen=True)
class Owner:
    """A node that owns a shard (or is a member), and where other nodes reach it."""

    node_id: str
    address: str

    def to_bytes(self) -> bytes:
        return json.dumps({"node_id": self.node_id, "address": self.address}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Owner:
        fields = json.loads(raw)
        return cls(str(fields["node_id"]), str(fields["address"]))


class Lease:
    """A shard's lease, as one node sees and holds it."""

    def __init__(self, nats: NatsConnection, bucket: KeyValue, shard: int, me: Owner) -> None:
        self._nats = nats
        self._bucket = bucket
        self._key = _KEY.format(shard=shard)
        self._stream = f"KV_{BUCKET}"
        self._subject = f"$KV.{BUCKET}.{self._key}"
        self.me = me
        self._revision = 0  # of our entry while we hold the lease; 0 while we do not
        self._seen = 0  # the revision of the owner's entry last read

    @classmethod
    def open(
        cls, nats: NatsConnection, shard: int, me: Owner, *, lease_seconds: float, replicas: int
    ) -> Lease:
        """Shard ``shard``'s lease in the bucket on ``nats`` (made if missing), for node
        ``me``."""
        config = bucket_config(BUCKET, replicas, ttl=lease_seconds)
        return cls(nats, nats.key_value(config, "placement"), shard, me)

    @property
    def held(self) -> bool:
        """Whether this node holds the lease (as of its last acquire or renew)."""
        return self._revision > 0

    def owner(self) -> Owner | None:
        """The current owner, or None while the lease is free."""

        async def read() -> Owner | None:
            try:
                entry = await self._bucket.get(self._key)
            except (KeyNotFoundError, KeyDeletedError):
                return None
            self._seen = int(entry.revision or 0)
            return Owner.from_bytes(entry.value) if entry.value else None

        return self._nats.persist(read, "read the store's owner")

    def break_(self) -> bool:
        """Delete the owner's entry as :meth:`owner` last read it, before it lapses (its
        node is known to be gone); not if it was written since. Whether it was deleted."""

        async def delete() -> bool:
            try:
                await self._bucket.delete(self._key, last=self._seen)
            except APIError as error:  # renewed, taken or lapsed since it was read
                if _written_since(error):
                    return False
                raise
            return True

        return bool(self._seen) and self._nats.persist(delete, "break a dead owner's lease")

    def probe(self) -> None:
        """Make sure the bucket takes writes now (its leader answers), by a write it
        refuses: one that names a revision no key reaches.

        Raises:
            nats.errors.Error: It takes none now (one try).
        """

        async def refused() -> None:
            try:
                await self._bucket.update(_PROBE_KEY, b"", last=_NO_REVISION)
            except KeyWrongLastSequenceError:
                return
            raise RuntimeError("the bucket took a write naming a revision it cannot have")

        self._nats.run(refused())

    def acquire(self) -> bool:
        """Take the lease if it is free; whether this node holds it now."""

        async def create() -> int:
            revision, value = await self._latest()
            if value is not None:  # held: by this node if an earlier try's answer was lost
                return revision if value == self.me.to_bytes() else 0
            try:
                return await self._bucket.update(self._key, self.me.to_bytes(), last=revision)
            except KeyWrongLastSequenceError:
                return 0  # another node took it first

        self._revision = self._nats.persist(create, "take the store's lease")
        if self._revision:
            log.info("node %s took the store's lease (%s)", self.me.node_id, self._key)
        return self.held

    def renew(self) -> bool:
        """Write our entry again, only if it is still ours; whether we still hold it."""

        async def update() -> int:
            try:
                return await self._bucket.update(self._key, self.me.to_bytes(), last=self._revision)
            except KeyWrongLastSequenceError:
                return await self._ours()  # an earlier try's answer may have been lost

        if self._revision:
            self._revision = self._nats.run(update())
        return self.held

    async def _ours(self) -> int:
        """The revision of the entry if it is this node's (a write whose answer was lost
        while the bucket changed leaders landed: no other node writes this node's
        entry); 0 if it is another's or there is none."""
        revision, value = await self._latest()
        return revision if value == self.me.to_bytes() else 0

    async def _latest(self) -> tuple[int, bytes | None]:
        """The key's last revision and its value (None if it was deleted, or lapsed:
        then the revision is 0), as the bucket's leader has them (a server that lags it
        may not have the last write yet)."""
        try:
            message = await self._nats.js.get_last_msg(self._stream, self._subject)
        except NotFoundError:
            return 0, None
        deleted = (message.headers or {}).get(_OPERATION) in _REMOVED
        return int(message.seq or 0), None if deleted else (message.data or b"")

    def release(self) -> None:
        """Give the lease up now, if this node still holds it (a node stopping cleanly:
        the next owner need not wait for it to lapse)."""

        async def delete() -> None:
            try:
                await self._bucket.delete(self._key, last=self._revision)
            except APIError as error:
                if not _written_since(error):
                    raise  # else not ours any more

        if self._revision:
            self._nats.run(delete())
            self._revision = 0


def _written_since(error: APIError) -> bool:
    """Whether JetStream refused a write because the key is no longer at the revision it
    named (written again, deleted, or lapsed)."""
    return isinstance(error, KeyWrongLastSequenceError) or error.err_code == _WRONG_LAST_SEQUENCE
