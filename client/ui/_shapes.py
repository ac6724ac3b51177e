"""What the pages show of the server's answers: plain rows, ready for a template."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from calor.client._enums import action_name, event_name, state_name, type_name
from calor.v1 import memory_pb2, memory_service_pb2, trigger_service_pb2

__all__ = [
    "ChannelRow",
    "DreamRow",
    "FiringRow",
    "HitRow",
    "MemoryRow",
    "ScorePart",
    "TriggerRow",
    "channel_row",
    "dream_row",
    "firing_row",
    "histograms",
    "sparklines",
    "hit_row",
    "memory_row",
    "trigger_row",
]

_STATES = ("active", "cold", "archived", "merged")


@dataclass(frozen=True)
class ChannelRow:
    """A channel as the fleet page lists it."""

    name: str
    total: int
    by_state: dict[str, int]
    heat: float
    conflicts: int
    gates: list[str]
    sweeps: int
    last_dream: float | None
    """When it last dreamt or swept (epoch seconds), None if never."""


@dataclass(frozen=True)
class MemoryRow:
    """A memory as a list shows it."""

    id: str
    text: str
    type: str
    state: str
    heat: float
    recalls: int
    keystone: bool
    created: str


@dataclass(frozen=True)
class ScorePart:
    """One part of a hit's score: its value in 0..1 and what it is."""

    name: str
    value: float


@dataclass(frozen=True)
class HitRow:
    """A recall hit with its score's parts."""

    memory: MemoryRow
    score: float
    band: str
    parts: list[ScorePart]


def channel_row(name: str, identity: memory_service_pb2.IdentityResponse) -> ChannelRow:
    """The fleet's row of a channel, from its ``Identity``."""
    by_state = {s: int(identity.by_state.get(f"MEMORY_STATE_{s.upper()}", 0)) for s in _STATES}
    return ChannelRow(
        name=name,
        total=int(identity.total),
        by_state=by_state,
        heat=identity.channel_heat,
        conflicts=len(identity.conflicts),
        gates=list(identity.active_gates),
        sweeps=int(identity.consolidation_sweeps),
        last_dream=(_seconds(identity.recent_dreams[0].at) if identity.recent_dreams else None),
    )


@dataclass(frozen=True)
class DreamRow:
    """A dream or consolidation sweep as a channel page lists it."""

    at: float
    sweep: bool
    counts: dict[str, int]
    heat_before: float
    heat_after: float
    duration_ms: int


_DREAM_COUNTS = (
    "migrated",
    "merged",
    "archived",
    "keystoned",
    "promoted",
    "conflicts",
    "summarised",
    "reclassified",
    "pruned",
    "retiered",
)


def dream_row(record: memory_service_pb2.DreamRecord) -> DreamRow:
    """A channel page's row of one of its latest dreams."""
    report = record.report
    return DreamRow(
        at=_seconds(record.at),
        sweep=record.sweep,
        counts={name: int(getattr(report, name)) for name in _DREAM_COUNTS},
        heat_before=report.channel_heat_before,
        heat_after=report.channel_heat_after,
        duration_ms=int(report.duration_ms),
    )


def histograms(identity: memory_service_pb2.IdentityResponse) -> list[dict[str, Any]]:
    """Per memory type, its memories by tenth of heat (for the page's bar charts)."""
    return [
        {"type": type_name(h.memory_type), "counts": list(h.counts)}
        for h in identity.heat_histograms
    ]


def sparklines(page: memory_service_pb2.ListMemoriesResponse) -> dict[str, Any]:
    """A page's heat sparklines (for the page's charts): heats by memory id (None
    before a memory's history), the moments in days from now."""
    middle = len(page.heat_sparklines[0].heat) // 2 if page.heat_sparklines else 0
    return {
        "days": [(k - middle) / 2 for k in range(2 * middle + 1)],
        "lines": {
            memory.id: [None if math.isnan(h) else h for h in line.heat]
            for memory, line in zip(page.memories, page.heat_sparklines, strict=False)
        },
    }


def _seconds(stamp: Any) -> float:
    return float(stamp.ToNanoseconds()) / 1e9


def memory_row(memory: memory_pb2.Memory) -> MemoryRow:
    """A list's row of a memory."""
    created = ""
    if memory.HasField("created_at"):
        created = memory.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M")
    return MemoryRow(
        id=memory.id,
        text=memory.text,
        type=type_name(memory.memory_type),
        state=state_name(memory.state),
        heat=memory.heat,
        recalls=int(memory.recall_count),
        keystone=memory.keystone,
        created=created,
    )


def hit_row(hit: memory_service_pb2.RecallHit) -> HitRow:
    """A hit with the parts its score is made of (DESIGN §5's breakdown)."""
    parts = [
        ScorePart("similarity", hit.similarity),
        ScorePart("lexical", hit.lexical),
        ScorePart("heat", hit.heat),
        ScorePart("keyword", hit.keyword),
        ScorePart("temporal", hit.temporal),
        ScorePart("own channel", hit.channel_bonus),
    ]
    return HitRow(memory_row(hit.memory), hit.score, hit.band, parts)


@dataclass(frozen=True)
class TriggerRow:
    """A trigger as a channel's page lists it."""

    id: str
    event: str
    action: str
    fires: int
    recent: list[FiringRow]
    """Its latest firings, newest first (empty where they were not asked for)."""


@dataclass(frozen=True)
class FiringRow:
    """One firing of a trigger."""

    at: float
    memory_id: str
    outcome: str


def firing_row(firing: trigger_service_pb2.TriggerFiring) -> FiringRow:
    """A channel page's line of a trigger's firing."""
    return FiringRow(_seconds(firing.at), firing.memory_id, firing.outcome)


def trigger_row(
    trigger: trigger_service_pb2.Trigger, recent: list[trigger_service_pb2.TriggerFiring]
) -> TriggerRow:
    """A channel page's row of a trigger, with its latest firings."""
    return TriggerRow(
        trigger.id,
        event_name(trigger.event),
        action_name(trigger.action),
        int(trigger.fires),
        [firing_row(firing) for firing in recent],
    )
