"""Cluster mode: the API keys every node serves, kept in the cluster's shared settings
(``calor.server.cluster.settings``) and read again every second."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from calor.server.api import auth_file
from calor.server.api.access import AccessControl
from calor.server.errors import CalorError

__all__ = ["ClusterKeys"]

log = logging.getLogger(__name__)

_FOLLOW_SECONDS = 1.0

Found = tuple[int, bytes] | None
"""The keys in force as an auth file's content, with their revision; None: none."""


class ClusterKeys:
    """Serves the cluster's API keys through ``access``: ``read`` answers them (blocking),
    ``publish`` makes an auth file's content the cluster's keys (blocking)."""

    def __init__(
        self,
        access: AccessControl,
        read: Callable[[], Found],
        publish: Callable[[bytes], int],
    ) -> None:
        self._access = access
        self._read = read
        self._publish = publish
        self._serving = 0
        self._following: asyncio.Task[None] | None = None

    async def start(self, path: Path | None) -> None:
        """Serve the cluster's keys from now on (a node started with the auth file
        ``path`` publishes it when the cluster has none yet), and follow them.

        Raises:
            FailedPreconditionError: ``path`` cannot be read or is malformed.
            UnavailableError: NATS did not answer.
        """
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, self._read)
        if found is None and path is not None:
            content = await loop.run_in_executor(None, auth_file.read, path)
            auth_file.parse(content, f"auth file {path}")
            found = await loop.run_in_executor(None, self._publish, content), content
        self._serve(found)  # before the node answers its first call
        self._following = asyncio.create_task(self._follow(), name="calor-keys")

    async def publish(self, content: bytes) -> None:
        """Make ``content`` (a checked auth file) the keys of every node; this one serves
        them when it next reads them, as the others do.

        Raises:
            UnavailableError: NATS did not answer.
        """
        await asyncio.get_running_loop().run_in_executor(None, self._publish, content)

    def close(self) -> None:
        """Stop following the keys."""
        if self._following is not None:
            self._following.cancel()

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_FOLLOW_SECONDS)
            try:
                found = await loop.run_in_executor(None, self._read)
            except CalorError as error:
                log.warning("the cluster's API keys could not be read: %s", error.message)
                continue
            self._serve(found)

    def _serve(self, found: Found) -> None:
        """Serve the keys ``found`` unless they are the revision served already."""
        if found is None or found[0] == self._serving:
            return
        self._serving = found[0]
        try:
            keys = auth_file.parse(found[1], "the cluster's API keys")
        except CalorError as error:
            log.error("the keys in force stay: %s", error.message)
            return
        self._access.reload(keys)
        log.info("access control: %d API keys of the cluster", len(keys.keys))
