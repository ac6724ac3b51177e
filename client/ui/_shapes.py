"""What the pages show of the server's answers: plain rows, ready for a template."""

from __future__ import annotations

from dataclasses import dataclass

from calor.client._enums import action_name, event_name, state_name, type_name
from calor.v1 import memory_pb2, memory_service_pb2, trigger_service_pb2

__all__ = [
    "ChannelRow",
    "HitRow",
    "MemoryRow",
    "ScorePart",
    "TriggerRow",
    "channel_row",
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
    )


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


def trigger_row(trigger: trigger_service_pb2.Trigger) -> TriggerRow:
    """A channel page's row of a trigger."""
    return TriggerRow(
        trigger.id, event_name(trigger.event), action_name(trigger.action), int(trigger.fires)
    )
