"""The Raft leaders a takeover waits on, kept on one NATS server.

A node taking a shard over writes its lease (the placement bucket's stream) and then
the write log (the write stream); each is a Raft group of its own, with a leader on one
of the NATS servers. When a NATS server dies, each group it led elects another leader,
which JetStream does 4 to 9 s after it last heard from the old one (fixed in
nats-server's Raft), and a takeover waits for every such election among its groups.
With both leaders on one server, a NATS server's death touches a takeover only when it
is that server (1 in 3 with three servers, rather than 5 in 9 with the leaders apart).

JetStream chooses a group's leader itself; a leader asked to step down hands over to
one of the group's other servers. So the groups led elsewhere than the write stream's
leader are asked to step down, and looked at again later, until they are there.
"""

from __future__ import annotations

import json
import logging

from nats.js.errors import NotFoundError

from calor.server.cluster.connection import NatsConnection
from calor.server.cluster.jetstream import WRITE_STREAM
from calor.server.cluster.placement import BUCKET as PLACEMENT

__all__ = ["Leaders"]

log = logging.getLogger(__name__)

_STEP_DOWN = "$JS.API.STREAM.LEADER.STEPDOWN.{stream}"
_FOLLOWERS = (f"KV_{PLACEMENT}",)
"""The streams whose leader should be the write stream's: the placement bucket's."""


class Leaders:
    """The leaders of the write stream and of the streams a takeover writes with it."""

    def __init__(self, nats: NatsConnection) -> None:
        self._nats = nats

    def align(self) -> list[str]:
        """Ask each stream of :data:`_FOLLOWERS` that another server leads than the
        write stream's leader to step down; the streams asked (none once they share
        it, or while a leader is being elected)."""

        async def align() -> list[str]:
            lead = await self._leader(WRITE_STREAM)
            if lead is None:
                return []
            asked = []
            for stream in _FOLLOWERS:
                leader = await self._leader(stream)
                if leader is None or leader == lead:
                    continue
                subject = _STEP_DOWN.format(stream=stream)
                answer = await self._nats.client.request(subject, b"", timeout=self._nats.timeout)
                if json.loads(answer.data or b"{}").get("success"):
                    asked.append(stream)
                    log.info("asked %s's leader (%s) to step down, to %s", stream, leader, lead)
            return asked

        return self._nats.run(align(), self._nats.timeout * 4)

    async def _leader(self, stream: str) -> str | None:
        """The server that leads ``stream`` now (None while it has none)."""
        try:
            info = await self._nats.js.stream_info(stream)
        except NotFoundError:
            return None
        return info.cluster.leader if info.cluster is not None else None
