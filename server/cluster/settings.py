"""Settings every node of a cluster serves alike, in a replicated JetStream KV bucket
(``calor_settings``): the API keys, as the content of an auth file (key ``auth``), and
the number of shards (key ``shards``, written once by the first node).

A channel's own settings are not here: they are part of the store, in the write log.
"""

from __future__ import annotations

from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from calor.server.cluster.connection import NatsConnection, bucket_config
from calor.server.errors import FailedPreconditionError

__all__ = ["BUCKET", "SharedSettings"]

BUCKET = "calor_settings"
_AUTH = "auth"
_SHARDS = "shards"


class SharedSettings:
    """The cluster's shared settings, as one node reads and writes them."""

    def __init__(self, nats: NatsConnection, bucket: KeyValue) -> None:
        self._nats = nats
        self._bucket = bucket

    @classmethod
    def open(cls, nats: NatsConnection, *, replicas: int) -> SharedSettings:
        """The settings bucket on ``nats``, made if missing."""
        return cls(nats, nats.key_value(bucket_config(BUCKET, replicas), "settings"))

    def auth(self) -> tuple[int, bytes] | None:
        """The API keys in force (an auth file's content) and their revision; None while
        no node published any (the cluster runs open)."""

        async def read() -> tuple[int, bytes] | None:
            try:
                entry = await self._bucket.get(_AUTH)
            except (KeyNotFoundError, KeyDeletedError):
                return None
            return (int(entry.revision or 0), entry.value) if entry.value else None

        return self._nats.persist(read, "read the cluster's API keys")

    def publish_auth(self, content: bytes) -> int:
        """Make ``content`` (a checked auth file) the API keys of every node; its revision."""
        return self._nats.persist(
            lambda: self._bucket.put(_AUTH, content), "publish the cluster's API keys"
        )

    def agree_on_shards(self, shards: int) -> None:
        """Record ``shards`` as the cluster's shard count if none is yet.

        Raises:
            FailedPreconditionError: The cluster was started with another count.
        """

        async def agree() -> int:
            try:
                await self._bucket.create(_SHARDS, str(shards).encode())
            except KeyWrongLastSequenceError:
                entry = await self._bucket.get(_SHARDS)
                return int(entry.value or b"0")
            return shards

        recorded = self._nats.persist(agree, "agree on the shard count")
        if recorded != shards:
            raise FailedPreconditionError(
                f"the cluster has {recorded} shards, this node was started with --shards "
                f"{shards}: start it with --shards {recorded}"
            )
