"""What the engine's operations answer: stored memories, ranked hits, channel counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from calor.server.engine.ingest import Ingested
from calor.server.engine.recall_log import ForeignHit
from calor.server.recall.ranking import Hit
from calor.server.recall.temporal import TimeWindow
from calor.server.records import MemoryRecord
from calor.server.thermo.channel_state import ChannelState

__all__ = ["ChannelStatus", "Current", "ListedPage", "Prepared", "RecallResult", "Stored"]


@dataclass(frozen=True)
class Current:
    """A memory as it stands at the moment of reply: its evolved record (a copy) and
    its heat then."""

    record: MemoryRecord
    heat: float


@dataclass(frozen=True)
class ListedPage:
    """A page of a listing: its memories, where to resume after each of them (a page
    cut short resumes after its last one sent), and where the next page starts ('' at
    the end)."""

    memories: list[Current]
    resume_after: list[str]
    next: str
    at: float = 0.0
    sparklines: list[list[float]] = field(default_factory=list)
    """With the query's ``sparklines``: each memory's heat sparkline as of ``at``."""


@dataclass(frozen=True)
class Prepared:
    """A channel's part of a store batch: new records, its next state, confirmed elders,
    and the moment it was made."""

    ingested: list[Ingested]
    state: ChannelState
    confirmed: list[MemoryRecord]
    at: float


@dataclass(frozen=True)
class Stored:
    """The outcome of one store: the memory as it stands, its heat, and whether this call
    created it."""

    record: MemoryRecord
    created: bool
    heat: float = 1.0


@dataclass(frozen=True)
class RecallResult:
    """Ranked hits, the time window the query named (if any), each hit's memory as it
    stands after the recall (None for a foreign hit: its reply holds it), the id the
    recall was logged under ("" if it was not), and whether hits were left out because
    one answer could not carry them."""

    hits: list[Hit | ForeignHit]
    window: TimeWindow | None
    memories: list[Current | None] = field(default_factory=list)  # each hit's memory now
    recall_id: str = ""
    truncated: bool = False


@dataclass(frozen=True)
class ChannelStatus:
    """Counts of a channel's memories by state and type, and its heat."""

    total: int
    by_state: dict[str, int]
    by_type: dict[str, int]
    channel_heat: float
    sweeps: int = 0
    interactions: int = 0
    hottest: list[Current] = field(default_factory=list)
    """The hottest live memories (at most five), hottest first."""
    recent_dreams: list[dict[str, float]] = field(default_factory=list)
    """The latest dreams' counts, newest first (see ``ChannelState.recent_dreams``)."""
    heat_histograms: dict[str, list[int]] = field(default_factory=dict)
    """Per memory type, its indexed memories by tenth of heat."""
