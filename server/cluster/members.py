"""Which nodes are in the cluster now, and how many shards each should own.

Every node writes its entry (its id and address) in the replicated JetStream KV bucket
``calor_members`` a few times per lease; entries expire ``lease_seconds`` after they
were last written, so a node that died leaves the list within a lease. The shards are
shared out evenly by the sorted list: each of ``n`` nodes owns ``shards // n`` of them,
and the first ``shards % n`` one more.
"""

from __future__ import annotations

import binascii
import re

from nats.js.errors import NoKeysError

from calor.server.cluster.connection import NatsConnection, bucket_config
from calor.server.cluster.placement import Owner

__all__ = ["BUCKET", "Members", "share"]

BUCKET = "calor_members"
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")


def share(me: str, members: list[str], shards: int) -> int:
    """How many of ``shards`` node ``me`` should own among ``members`` (itself counted
    whether listed yet or not)."""
    everyone = sorted({*members, me})
    base, extra = divmod(shards, len(everyone))
    return base + (1 if everyone.index(me) < extra else 0)


class Members:
    """This node's entry among the cluster's members, and the list of them."""

    def __init__(self, nats: NatsConnection, me: Owner, *, lease_seconds: float, replicas: int):
        self._nats = nats
        self._bucket = nats.key_value(bucket_config(BUCKET, replicas, ttl=lease_seconds), "members")
        self._me = me

    def renew(self) -> list[str]:
        """Write this node's entry again; the ids of every node listed now."""

        async def renew() -> list[str]:
            await self._bucket.put(_key(self._me.node_id), self._me.to_bytes())
            try:
                keys = await self._bucket.keys()
            except NoKeysError:
                return [self._me.node_id]
            return [_node_id(key) for key in keys]

        return self._nats.persist(renew, "list the cluster's members")

    def leave(self) -> None:
        """Take this node's entry out (a node stopping cleanly)."""
        self._nats.run(self._bucket.delete(_key(self._me.node_id)))


def _key(node_id: str) -> str:
    """A node id as a key (keys take letters, digits, ``-`` and ``_``; other ids are
    written in hex)."""
    return node_id if _PLAIN.fullmatch(node_id) else "x." + node_id.encode().hex()


def _node_id(key: str) -> str:
    return binascii.unhexlify(key[2:]).decode() if key.startswith("x.") else key
