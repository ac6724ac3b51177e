"""The events page's live feed: the server's ``Subscribe`` stream relayed to the browser
as server-sent events, one JSON object an event."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from calor.client._enums import EVENT_KIND_NAMES, event_name
from calor.client.aio import AsyncCalorClient
from calor.client.errors import InvalidArgumentError
from calor.v1 import trigger_service_pb2

__all__ = ["event_stream", "event_json"]


def event_json(event: trigger_service_pb2.Event) -> str:
    """An event as the page's script reads it."""
    return json.dumps(
        {
            "seq": event.seq,
            "kind": event_name(event.kind),
            "channel": event.channel,
            "memory_id": event.memory_id,
            "trigger_id": event.trigger_id,
            "at": event.at.ToDatetime().isoformat(timespec="seconds") + "Z",
            "message": event.message,
        }
    )


async def event_stream(request: Request) -> Response:
    """Every readable channel's events from now on (``?kind=``, ``?trigger=`` filter),
    until the page goes away."""
    kind = request.query_params.get("kind", "")
    trigger = request.query_params.get("trigger", "")
    if kind and kind not in EVENT_KIND_NAMES:
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, f"no event kind {kind!r}")
    calor: AsyncCalorClient = request.app.state.calor
    events = await calor.subscribe(
        channels=(), kinds=[kind] if kind else (), trigger_ids=[trigger] if trigger else ()
    )

    async def relay() -> AsyncIterator[dict[str, str]]:
        yield {"event": "ready", "data": "{}"}  # the stream is open: nothing logged is missed
        try:
            async for event in events:
                yield {"event": "memory-event", "id": str(event.seq), "data": event_json(event)}
        finally:
            await events.aclose()

    return EventSourceResponse(relay(), ping=15)
