"""Settings every node of a cluster serves alike, in a replicated JetStream KV bucket
(``calor_settings``): the API keys, as the content of an auth file (key ``auth``).

A channel's own settings are not here: they are part of the store, in the write log.
"""

from __future__ import annotations

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue

from calor.server.cluster.connection import JOIN_SECONDS, NatsConnection

__all__ = ["BUCKET", "SharedSettings"]

BUCKET = "calor_settings"
_AUTH = "auth"


class SharedSettings:
    """The cluster's shared settings, as one node reads and writes them."""

    def __init__(self, nats: NatsConnection, bucket: KeyValue) -> None:
        self._nats = nats
        self._bucket = bucket

    @classmethod
    def open(cls, nats: NatsConnection, *, replicas: int) -> SharedSettings:
        """The settings bucket on ``nats``, made if missing."""

        async def bucket() -> KeyValue:
            try:
                return await nats.js.key_value(BUCKET)
            except BucketNotFoundError:
                config = KeyValueConfig(
                    bucket=BUCKET, history=1, replicas=replicas, storage=StorageType.FILE
                )
                return await nats.js.create_key_value(config)

        return cls(nats, nats.persist(bucket, "open the settings bucket", JOIN_SECONDS))

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
