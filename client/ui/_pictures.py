"""What the memory page draws, as the data its chart and graph libraries take: the heat
curve (for uPlot) and the graph neighbourhood two hops out (for Cytoscape.js)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Literal

from calor.client._enums import edge_name
from calor.client.aio import AsyncCalorClient
from calor.client.errors import NotFoundError
from calor.v1 import memory_pb2, memory_service_pb2

__all__ = ["FIRST_HOP", "SECOND_HOP", "curve_picture", "neighbourhood"]

FIRST_HOP = 12
"""The strongest edges of the memory the graph follows."""
SECOND_HOP = 5
"""The strongest edges of each neighbour the graph follows from there."""
_LABEL = 48
_Moment = Literal["floor_at", "cold_at", "migration_at"]
_CAUSES = {
    memory_service_pb2.HEAT_STEP_CAUSE_RECALL: "recall",
    memory_service_pb2.HEAT_STEP_CAUSE_BOOST: "boost",
    memory_service_pb2.HEAT_STEP_CAUSE_RESONANCE: "resonance",
    memory_service_pb2.HEAT_STEP_CAUSE_SETTLED: "settled",
    memory_service_pb2.HEAT_STEP_CAUSE_COOLED: "cooled",
}


def _seconds(stamp: Any) -> float:
    return float(stamp.ToNanoseconds()) / 1e9


def _moment(curve: memory_service_pb2.HeatCurve, field: _Moment) -> float | None:
    return _seconds(getattr(curve, field)) if curve.HasField(field) else None


def curve_picture(curve: memory_service_pb2.HeatCurve) -> dict[str, Any]:
    """A heat curve as the page's chart takes it: times in epoch seconds."""
    return {
        "past": [[_seconds(p.at), p.heat] for p in curve.past],
        "projected": [[_seconds(p.at), p.heat] for p in curve.projected],
        "steps": [
            {
                "at": _seconds(s.at),
                "before": s.before,
                "after": s.after,
                "cause": _CAUSES.get(s.cause, "earlier"),
            }
            for s in curve.steps
        ],
        "floor": curve.floor,
        "cold_threshold": curve.cold_threshold,
        "floor_at": _moment(curve, "floor_at"),
        "cold_at": _moment(curve, "cold_at"),
        "migration_at": _moment(curve, "migration_at"),
        "now": _seconds(curve.now),
    }


async def neighbourhood(
    calor: AsyncCalorClient,
    channel: str,
    found: memory_service_pb2.InspectResponse,
    url_of: Callable[[str], object],
) -> dict[str, Any]:
    """The memory's graph two hops out: its :data:`FIRST_HOP` strongest edges, and each
    neighbour's :data:`SECOND_HOP` strongest, as Cytoscape.js elements (each node with
    its text, heat, hop and page; each edge with its kind and weight). ``url_of(id)`` is
    a memory's page."""
    center = found.memory
    first = _strongest(center.id, found.edges, FIRST_HOP)
    hop_one = list(dict.fromkeys(other for other, _ in first))
    answers = await _inspect_all(calor, channel, hop_one)
    edges = [(center.id, edge) for _, edge in first]
    hop_two: list[str] = []
    for memory_id, answer in answers.items():
        for other, edge in _strongest(memory_id, answer.edges, SECOND_HOP):
            edges.append((memory_id, edge))
            if other != center.id and other not in answers:
                hop_two.append(other)
    answers.update(await _inspect_all(calor, channel, list(dict.fromkeys(hop_two))))
    hops = {center.id: 0, **dict.fromkeys(hop_one, 1)}
    nodes = [_node(center, 0, url_of)]
    nodes += [_node(a.memory, hops.get(i, 2), url_of) for i, a in answers.items()]
    shown = {node["data"]["id"] for node in nodes}
    links: dict[tuple[str, str, str], dict[str, Any]] = {}
    for _, edge in edges:
        if edge.from_id not in shown or edge.to_id not in shown:
            continue  # a neighbour the key may not read, or one forgotten since
        kind = edge_name(edge.kind)
        pair = tuple(sorted((edge.from_id, edge.to_id)))
        links.setdefault(
            (pair[0], pair[1], kind),
            {
                "data": {
                    "id": f"{pair[0]}-{pair[1]}-{kind}",
                    "source": edge.from_id,
                    "target": edge.to_id,
                    "kind": kind,
                    "weight": edge.weight,
                }
            },
        )
    return {"nodes": nodes, "edges": list(links.values())}


def _strongest(memory_id: str, edges: Iterable[Any], count: int) -> list[tuple[str, Any]]:
    ranked = sorted(edges, key=lambda edge: -edge.weight)[:count]
    return [(e.to_id if e.from_id == memory_id else e.from_id, e) for e in ranked]


async def _inspect_all(
    calor: AsyncCalorClient, channel: str, ids: list[str]
) -> dict[str, memory_service_pb2.InspectResponse]:
    answers = await asyncio.gather(*(_inspected(calor, channel, i) for i in ids))
    return {i: answer for i, answer in zip(ids, answers, strict=True) if answer is not None}


async def _inspected(
    calor: AsyncCalorClient, channel: str, memory_id: str
) -> memory_service_pb2.InspectResponse | None:
    try:
        return await calor.inspect(memory_id, channel=channel)
    except NotFoundError:
        return None  # forgotten between the two reads: drawn without it


def _node(memory: memory_pb2.Memory, hop: int, url_of: Callable[[str], object]) -> dict[str, Any]:
    text = memory.text if len(memory.text) <= _LABEL else memory.text[: _LABEL - 1] + "…"
    return {
        "data": {
            "id": memory.id,
            "label": text,
            "heat": memory.heat,
            "hop": hop,
            "url": str(url_of(memory.id)),
        }
    }
