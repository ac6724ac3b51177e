"""Snapshots of a shard's store in a replicated JetStream object store, so its write log
can be trimmed (cluster mode).

The shard's owner saves a snapshot (:mod:`calor.server.storage.snapshot`) every so many
log entries as the object ``shard-K`` of the bucket ``calor_snapshots`` (its write-log
position in the object's description), then trims the log up to the snapshot before it:
a node that follows the log within one snapshot's distance never needs more than the
tail. A node whose store is empty, or behind the log's beginning, loads the snapshot and
follows the tail from there.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nats.js.api import ObjectMeta, ObjectStoreConfig, StorageType
from nats.js.errors import BucketNotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from calor.server.cluster.connection import JOIN_SECONDS, NatsConnection
from calor.server.storage import snapshot
from calor.server.storage.store import MemoryStore

__all__ = ["BUCKET", "Snapshots"]

log = logging.getLogger(__name__)

BUCKET = "calor_snapshots"
_OBJECT = "shard-{shard}"
_TRANSFER_SECONDS = 600.0
"""How long one upload or download of a snapshot may take."""


class Snapshots:
    """The store's newest snapshot in the bucket; ``workdir`` holds a snapshot's file
    while it is written or read."""

    def __init__(
        self, nats: NatsConnection, bucket: ObjectStore, shard: int, workdir: Path
    ) -> None:
        self._nats = nats
        self._bucket = bucket
        self._object = _OBJECT.format(shard=shard)
        self._workdir = workdir

    @classmethod
    def open(cls, nats: NatsConnection, shard: int, workdir: Path, *, replicas: int) -> Snapshots:
        """Shard ``shard``'s snapshots in the bucket on ``nats``, made if missing."""

        async def bucket() -> ObjectStore:
            try:
                return await nats.js.object_store(BUCKET)
            except BucketNotFoundError:
                config = ObjectStoreConfig(replicas=replicas, storage=StorageType.FILE)
                return await nats.js.create_object_store(BUCKET, config)

        workdir.mkdir(parents=True, exist_ok=True)
        opened = nats.persist(bucket, "open the snapshot bucket", JOIN_SECONDS)
        return cls(nats, opened, shard, workdir)

    def position(self) -> int:
        """The write-log position of the newest snapshot; 0 while there is none."""

        async def read() -> int:
            try:
                info = await self._bucket.get_info(self._object)
            except ObjectNotFoundError:
                return 0
            return int(info.description or 0)

        return self._nats.persist(read, "read the newest snapshot's position")

    def save(self, store: MemoryStore) -> int:
        """Save the store as the newest snapshot; returns its write-log position."""
        path = self._workdir / "snapshot.out"
        with path.open("wb") as out:
            position = snapshot.save(store, out)

        async def upload() -> None:
            with path.open("rb") as source:
                meta = ObjectMeta(description=str(position))
                await self._bucket.put(self._object, source, meta=meta)

        try:
            self._nats.persist(upload, "save a snapshot", attempt_seconds=_TRANSFER_SECONDS)
        finally:
            path.unlink()
        return position

    def load(self, store: MemoryStore) -> int:
        """Replace the store's keys with the newest snapshot's; returns its position (0:
        there is none, and the store is left as it was)."""
        path = self._workdir / "snapshot.in"

        async def download() -> bool:
            with path.open("wb") as into:
                try:
                    await self._bucket.get(self._object, writeinto=into)
                except ObjectNotFoundError:
                    return False
            return True

        try:
            found = self._nats.persist(
                download, "load a snapshot", attempt_seconds=_TRANSFER_SECONDS
            )
            if not found:
                return 0
            with path.open("rb") as source:
                return snapshot.load(store, source)
        finally:
            path.unlink(missing_ok=True)
