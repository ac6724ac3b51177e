"""The inspector's pages: each reads what it shows from the server through the shared
client and renders one template."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import datetime
from typing import Any, TypeVar

import grpc
from starlette.datastructures import FormData, ImmutableMultiDict
from starlette.requests import Request
from starlette.responses import Response

from calor.client._enums import EVENT_KIND_NAMES, MEMORY_TYPE_NAMES, edge_name
from calor.client.aio import AsyncCalorClient
from calor.client.errors import InvalidArgumentError, PermissionDeniedError
from calor.client.ui._pictures import curve_picture, neighbourhood
from calor.client.ui._shapes import (
    ChannelRow,
    HitRow,
    MemoryRow,
    channel_row,
    dream_row,
    histograms,
    hit_row,
    memory_row,
    sparklines,
    trigger_row,
)

__all__ = ["DONE", "calor_of", "channel", "events", "fleet", "memory", "recall"]

PAGE_SIZE = 100
"""Memories a channel page lists at a time, hottest first."""
RECENT_FIRINGS = 5
"""Latest firings a channel page shows of each trigger."""
DONE = {
    "boost": "Boosted: its heat grew.",
    "keystone": "Pinned as a keystone: its heat no longer decays.",
    "unkeystone": "Unpinned: its heat decays again.",
    "forget": "Forgotten.",
}
"""What each action's page says it did, by action."""
_BANDS = ("", "low", "mid", "high")
_RECALL_FIELDS = ("query", "as_of", "min_band", "limit", "type")
_T = TypeVar("_T")


def calor_of(request: Request) -> AsyncCalorClient:
    """The gRPC client the inspector's pages share."""
    return request.app.state.calor  # type: ignore[no-any-return]


def _render(request: Request, template: str, context: dict[str, Any]) -> Response:
    return request.app.state.templates.TemplateResponse(request, template, context)  # type: ignore[no-any-return]


async def fleet(request: Request) -> Response:
    """Every channel the key can read, with its memories by state, heat, open conflicts
    and active gates."""
    calor = calor_of(request)
    names = await calor.list_channels()
    identities = await asyncio.gather(*(calor.identity(channel=name) for name in names))
    rows = [channel_row(name, found) for name, found in zip(names, identities, strict=True)]
    return _render(request, "fleet.html", {"channels": rows})


async def channel(request: Request) -> Response:
    """One channel: a page of its memories hottest first, each with its heat sparkline;
    its memories by heat and type; its latest dreams; its triggers and their latest
    firings."""
    calor = calor_of(request)
    name = request.path_params["channel"]
    page_token = request.query_params.get("page", "")
    identity, page, triggers = await asyncio.gather(
        calor.identity(channel=name),
        calor.list_memories(
            channel=name,
            page_token=page_token,
            page_size=PAGE_SIZE,
            order="heat",
            heat_sparklines=True,
        ),
        _unless_refused(calor.list_triggers(channel=name)),
    )
    firings = await asyncio.gather(
        *(calor.trigger_history(t.id, latest=RECENT_FIRINGS) for t in triggers or ())
    )
    summary: ChannelRow = channel_row(name, identity)
    memories: list[MemoryRow] = [memory_row(m) for m in page.memories]
    return _render(
        request,
        "channel.html",
        {
            "channel": summary,
            "memories": memories,
            "sparklines": sparklines(page),
            "next_page": page.next_page_token,
            "first_page": not page_token,
            "done": _done(request),
            "histograms": histograms(identity),
            "dreams": [dream_row(record) for record in identity.recent_dreams],
            "triggers": (
                None
                if triggers is None
                else [trigger_row(t, f) for t, f in zip(triggers, firings, strict=True)]
            ),
        },
    )


async def memory(request: Request) -> Response:
    """One memory: its text, type, tags, provenance, utility, its heat curve and its
    graph neighbourhood."""
    calor = calor_of(request)
    name, memory_id = request.path_params["channel"], request.path_params["memory_id"]
    found = await calor.inspect(memory_id, channel=name, heat_curve=True)
    edges = sorted(found.edges, key=lambda edge: -edge.weight)
    graph = await neighbourhood(
        calor, name, found, lambda other: request.url_for("memory", channel=name, memory_id=other)
    )
    return _render(
        request,
        "memory.html",
        {
            "channel": name,
            "memory": memory_row(found.memory),
            "raw": found.memory,
            "edges": [
                {
                    "other": edge.to_id if edge.from_id == memory_id else edge.from_id,
                    "kind": edge_name(edge.kind),
                    "weight": edge.weight,
                }
                for edge in edges
            ],
            "utility": list(found.utility_factors),
            "curve": curve_picture(found.heat_curve),
            "graph": graph,
            "done": _done(request),
        },
    )


async def recall(request: Request) -> Response:
    """The recall playground: a query's hits with each score's parts. Asked by a link
    (GET) it peeks; posted (only an inspector that may write takes the POST, with its
    CSRF token) it recalls for real and warms what it finds."""
    calor = calor_of(request)
    names = await calor.list_channels()
    peek = request.method != "POST"
    form = request.query_params if peek else _texts(await request.form())
    query = (form.get("query") or "").strip()
    chosen = form.get("channel") or (names[0] if names else "")
    hits: list[HitRow] = []
    if query and chosen:
        answer = await calor.recall(query, channel=chosen, **_recall_options(form, peek))
        hits = [hit_row(hit) for hit in answer.hits]
    return _render(
        request,
        "recall.html",
        {
            "channels": names,
            "chosen": chosen,
            "query": query,
            "form": dict(form),
            "chosen_types": form.getlist("type"),
            "fields": [("channel", chosen)]
            + [(k, v) for k, v in form.multi_items() if k in _RECALL_FIELDS],
            "types": MEMORY_TYPE_NAMES,
            "bands": _BANDS,
            "hits": hits,
            "peek": peek,
            "asked": bool(query and chosen),
        },
    )


async def events(request: Request) -> Response:
    """The live event stream of the readable channels, filtered by kind and trigger."""
    return _render(request, "events.html", {"kinds": EVENT_KIND_NAMES})


def _done(request: Request) -> str | None:
    """What the action that led here did, as its page says it (``?done=``), if any."""
    return DONE.get(request.query_params.get("done", ""))


async def _unless_refused(call: Awaitable[_T]) -> _T | None:
    """What a call answers, or None if the key may not ask it (a channel's triggers need
    its admin permission: a reader's page goes without them)."""
    try:
        return await call
    except PermissionDeniedError:
        return None


def _texts(form: FormData) -> ImmutableMultiDict[str, str]:
    """A posted form's text fields (a file sent in one is not a recall's option)."""
    return ImmutableMultiDict([(k, v) for k, v in form.multi_items() if isinstance(v, str)])


def _recall_options(form: ImmutableMultiDict[str, str], peek: bool) -> dict[str, Any]:
    """The recall's options from the playground's form."""
    options: dict[str, Any] = {"limit": 10, "peek": peek}
    try:
        options["limit"] = max(1, min(100, int(form.get("limit") or 10)))
        if form.get("as_of"):
            options["as_of"] = datetime.fromisoformat(form["as_of"])
    except ValueError as error:
        raise InvalidArgumentError(
            grpc.StatusCode.INVALID_ARGUMENT, f"the recall form: {error}"
        ) from error
    types = form.getlist("type")
    if types:
        options["memory_types"] = types
    if form.get("min_band") in _BANDS[1:]:
        options["min_band"] = form["min_band"]
    return options
