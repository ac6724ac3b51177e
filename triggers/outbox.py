"""The webhook outbox: deliveries made durable before they are sent, until they finish.

A webhook firing writes its delivery here in the same batch as the dispatcher's cursor
advance, then sends it; the record is dropped in the batch that logs the final outcome
(delivered or given up). Whatever is still here at start was cut short by a crash and
is sent again, under the same idempotency key: webhooks are at-least-once, and the key
lets a receiver make them exactly-once.

Stored under :meth:`calor.server.storage.store.Keys.delivery` as Delivery JSON. A delivery
carries its memory's text, so it is written as a quote of that memory: forgetting the
memory rewrites a delivery still waiting here without the text (its tags go too), and it
is sent that way if it is sent again. One already under way is not called back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from calor.server.storage.ops import DeleteKey, Quote
from calor.server.storage.store import Keys, MemoryStore

__all__ = ["Delivery", "drop_delivery", "pending_deliveries", "put_delivery"]


@dataclass(frozen=True)
class Delivery:
    """One webhook to send, and what to log when it is done.

    Attributes:
        key: The idempotency key: ``<trigger id>:<cause seq>`` (the chain of triggers,
            joined by ``>``, for a chained firing; a decay crossing names its memory
            and trajectory instead of a sequence number).
        url: Where to POST.
        body: The JSON body; it holds ``idempotency_key`` too, so the key is signed.
        secret: The trigger's signing secret ("" for none).
        timeout: The trigger's limit on one attempt, or None for the server's.
        retries: The trigger's retries, or None for the server's.
        trigger_id: The trigger that fired.
        channel: The memory's channel.
        memory_id: The memory it fired on.
        cause_seq: The sequence number of the event that set it off (0 for decay).
        at: When it fired.
        payload: The cause fields for the logged ``webhook`` event.
    """

    key: str
    url: str
    body: dict[str, Any]
    secret: str
    timeout: float | None
    retries: int | None
    trigger_id: str
    channel: str
    memory_id: str
    cause_seq: int
    at: float
    payload: dict[str, str] = field(default_factory=dict)

    @property
    def late(self) -> bool:
        """Whether it fired for a decay crossing that fell while the server was down."""
        return self.payload.get("late") == "true"

    def to_json(self) -> bytes:
        """The delivery as JSON, for the outbox."""
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Delivery:
        """A delivery from :meth:`to_json`."""
        raw: dict[str, Any] = json.loads(data)
        return cls(**raw)

    def scrubbed(self) -> Delivery:
        """The delivery once its memory is forgotten: the body's memory without its text
        and tags, marked ``forgotten``."""
        memory = {**self.body.get("memory", {}), "text": "", "tags": {}, "forgotten": True}
        return replace(self, body={**self.body, "memory": memory})


def put_delivery(delivery: Delivery) -> Quote:
    """The write that adds a delivery to the outbox (a quote of its memory's text)."""
    return Quote(
        delivery.channel,
        delivery.memory_id,
        Keys.delivery(delivery.key),
        delivery.to_json(),
        delivery.scrubbed().to_json(),
    )


def drop_delivery(delivery: Delivery) -> list[DeleteKey]:
    """The writes that remove a finished delivery from the outbox, and its quote index entry."""
    key = Keys.delivery(delivery.key)
    return [DeleteKey(key), DeleteKey(Keys.quote(delivery.channel, delivery.memory_id, key))]


def pending_deliveries(store: MemoryStore) -> list[Delivery]:
    """Every delivery not finished yet, in key order."""
    return [Delivery.from_json(value) for value in store.deliveries()]
