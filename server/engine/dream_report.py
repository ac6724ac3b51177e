"""What a dream does and what it did: its steps in order, and its report (see
:mod:`calor.server.engine.dream`)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DREAM_STEPS", "DreamReport"]

DREAM_STEPS = (
    "materialising",
    "pairing",
    "conflicts",
    "merging",
    "promoting",
    "reclassifying",
    "summarising",
    "archiving",
)
"""A dream's steps, in the order it takes them (a consolidation sweep skips
reclassifying and summarising)."""


@dataclass
class DreamReport:
    """What a dream changed, step by step."""

    migrated: int = 0
    merged: int = 0
    keystoned: int = 0
    promoted: int = 0
    echoed: int = 0
    pruned: int = 0
    archived: int = 0
    conflicts: int = 0
    conflicts_unopened: int = 0
    channel_heat_before: float = 0.0
    channel_heat_after: float = 0.0
    duration_ms: int = 0
    swept: int = 0
    """Of ``archived``: the coldest that a consolidation sweep moved to cold storage so the
    channel holds fewer cold memories than its ``cold_count_trigger``."""
    archived_ids: list[str] = field(default_factory=list)
    merged_ids: list[str] = field(default_factory=list)
    """The memories merged into another (each cluster's survivor is not among them)."""
    reclassified: int = 0
    """Memories whose inferred type a newer classifier changed."""
    summarised: int = 0
    summary_ids: list[str] = field(default_factory=list)
    """The episode summaries the dream made (each a new semantic memory)."""
    retiered: int = 0
    """Memories moved to the vector tier their heat now calls for."""

    def counts(self) -> dict[str, float]:
        """The report's numbers (its lists of ids left out)."""
        return {k: float(v) for k, v in self.__dict__.items() if not isinstance(v, list)}

    def payload(self) -> dict[str, str]:
        """The report as event payload fields (lists of ids comma-joined)."""
        return {k: ",".join(v) if isinstance(v, list) else str(v) for k, v in self.__dict__.items()}
