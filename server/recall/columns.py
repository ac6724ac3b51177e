"""The fields of an indexed memory that its heat, state and score are computed from, as
packed arrays by index label, so recall scores its candidates in bulk (numpy) instead
of one record object at a time.

The columns hold stored values only (``heat0``, ``t0``, stability, ...): what depends on
the channel's settings (half-lives, floors, thresholds) is applied when a batch is
scored (:func:`heats_and_states`), so new settings need no rewrite of the columns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from calor.server.records import ACTIVE, ARCHIVED, COLD, GHOST, MemoryRecord
from calor.server.thermo.heat import (
    EXTRACTED_DECAY_FACTOR,
    MEMORY_TYPES,
    SOURCE_TRUST,
    decayed_array,
    half_lives_until_array,
)
from calor.server.thermo.lifecycle import DAY, Clocks
from calor.server.thermo.policy import ChannelPolicy

__all__ = [
    "ACTIVE_CODE",
    "ARCHIVED_CODE",
    "COLD_CODE",
    "GHOST_CODE",
    "SOURCES",
    "STATES",
    "TYPES",
    "Batch",
    "RecordColumns",
    "among",
    "heats_and_states",
    "needs_record",
    "state_code",
    "type_code",
]

TYPES: tuple[str, ...] = MEMORY_TYPES
"""Memory types by their code in the columns."""
SOURCES: tuple[str, ...] = (*SOURCE_TRUST, "other")
"""Sources by their code; a source the trust table does not name is ``other``."""
STATES: tuple[str, ...] = (ACTIVE, COLD, ARCHIVED, GHOST, "other")
"""States by their code."""

_TYPE_CODE = {name: code for code, name in enumerate(TYPES)}
_SOURCE_CODE = {name: code for code, name in enumerate(SOURCES)}
_STATE_CODE = {name: code for code, name in enumerate(STATES)}
_WORKING = _TYPE_CODE["working"]
_CORE = _TYPE_CODE["core"]
_EXTRACTED = _SOURCE_CODE["extracted"]
ACTIVE_CODE, COLD_CODE, ARCHIVED_CODE, GHOST_CODE = (_STATE_CODE[s] for s in STATES[:4])

_F64 = npt.NDArray[np.float64]
_I8 = npt.NDArray[np.int8]
_BOOL = npt.NDArray[np.bool_]


def type_code(memory_type: str) -> int:
    """The column code of a memory type (-1 for one the server does not know)."""
    return _TYPE_CODE.get(memory_type, -1)


def state_code(state: str) -> int:
    """The column code of a state."""
    return _STATE_CODE.get(state, _STATE_CODE["other"])


class RecordColumns:
    """Per-label arrays of the stored fields heat and scoring read; grown as labels are
    handed out (a label's row is meaningful while the label is indexed)."""

    _FLOATS = ("heat0", "t0", "stability", "interactions0", "utility", "created_at")
    _CODES = ("memory_type", "source", "state")
    _FLAGS = ("keystone", "superseded")

    def __init__(self) -> None:
        self.heat0: _F64 = np.zeros(0)
        self.t0: _F64 = np.zeros(0)
        self.stability: _F64 = np.zeros(0)
        self.interactions0: _F64 = np.zeros(0)
        self.utility: _F64 = np.zeros(0)
        self.created_at: _F64 = np.zeros(0)
        self.memory_type: _I8 = np.zeros(0, dtype=np.int8)
        self.source: _I8 = np.zeros(0, dtype=np.int8)
        self.state: _I8 = np.zeros(0, dtype=np.int8)
        self.keystone: _BOOL = np.zeros(0, dtype=np.bool_)
        self.superseded: _BOOL = np.zeros(0, dtype=np.bool_)

    def __len__(self) -> int:
        return int(self.heat0.shape[0])

    def set(self, label: int, record: MemoryRecord) -> None:
        """Hold a record's fields at its label."""
        if label >= len(self):
            self._grow(label + 1)
        self.heat0[label] = record.heat0
        self.t0[label] = record.t0
        self.stability[label] = record.stability
        self.interactions0[label] = record.interactions0
        self.utility[label] = record.utility
        self.created_at[label] = record.created_at
        self.memory_type[label] = type_code(record.memory_type)
        self.source[label] = _SOURCE_CODE.get(record.source, _SOURCE_CODE["other"])
        self.state[label] = state_code(record.state)
        self.keystone[label] = record.keystone
        self.superseded[label] = record.superseded

    def set_heats(
        self, labels: npt.NDArray[np.int64], heat0: _F64, at: float, interactions: int
    ) -> None:
        """Heat materialised at ``at`` for the given labels (nothing else changes)."""
        self.heat0[labels] = heat0
        self.t0[labels] = at
        self.interactions0[labels] = interactions

    def batch(self, labels: npt.NDArray[np.int64]) -> Batch:
        """The rows of the given labels, gathered."""
        return Batch(
            heat0=self.heat0[labels],
            t0=self.t0[labels],
            stability=self.stability[labels],
            interactions0=self.interactions0[labels],
            utility=self.utility[labels],
            created_at=self.created_at[labels],
            memory_type=self.memory_type[labels],
            source=self.source[labels],
            state=self.state[labels],
            keystone=self.keystone[labels],
            superseded=self.superseded[labels],
        )

    def _grow(self, least: int) -> None:
        size = max(least, 2 * len(self), 64)
        for name in (*self._FLOATS, *self._CODES, *self._FLAGS):
            old = getattr(self, name)
            new = np.zeros(size, dtype=old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)


@dataclass(frozen=True)
class Batch:
    """The column values of some candidates, one entry per candidate."""

    heat0: _F64
    t0: _F64
    stability: _F64
    interactions0: _F64
    utility: _F64
    created_at: _F64
    memory_type: _I8
    source: _I8
    state: _I8
    keystone: _BOOL
    superseded: _BOOL

    def select(self, rows: _BOOL) -> Batch:
        """The candidates of the chosen rows."""
        return Batch(**{name: getattr(self, name)[rows] for name in Batch.__dataclass_fields__})


def among(codes: npt.NDArray[np.int8], wanted: Iterable[int]) -> _BOOL:
    """Which of ``codes`` (a column of states or types) are one of ``wanted``: a compare
    per wanted code, far cheaper than ``np.isin`` for the few codes there are."""
    found = np.zeros(codes.shape, dtype=bool)
    for code in wanted:
        found |= codes == code
    return found


def needs_record(batch: Batch) -> _BOOL:
    """Candidates whose heat or state the bulk formula does not cover, to be computed
    from their record: working memories (promotion), unknown types, odd states."""
    odd: _BOOL = (
        (batch.memory_type == _WORKING)
        | (batch.memory_type < 0)
        | ~among(batch.state, (ACTIVE_CODE, COLD_CODE, ARCHIVED_CODE))
    )
    return odd


def heats_and_states(
    batch: Batch, policy: ChannelPolicy, clocks: Clocks
) -> tuple[_F64, npt.NDArray[np.int8]]:
    """Heat now and state now of each candidate: ``current_heat`` and ``evolve`` of
    :mod:`calor.server.thermo.lifecycle`, in bulk. Rows :func:`needs_record` flags are
    meaningless here."""
    profiles = [policy.profile(name) for name in TYPES]
    codes = np.clip(batch.memory_type, 0, len(TYPES) - 1)
    floor = np.array([p.floor for p in profiles])[codes]
    floor = np.where(batch.superseded, np.minimum(floor, policy.cold_threshold * 0.5), floor)
    half_life = np.array([p.half_life_seconds for p in profiles])[codes] * batch.stability
    half_life = np.where(batch.source == _EXTRACTED, half_life / EXTRACTED_DECAY_FACTOR, half_life)
    by_time = clocks.now - batch.t0
    by_interactions = (clocks.interactions - batch.interactions0) * policy.interaction_unit_seconds
    if policy.decay_mode == "time":
        elapsed = by_time
    elif policy.decay_mode == "interaction":
        elapsed = by_interactions
    else:
        elapsed = np.maximum(by_time, by_interactions)
        half_life = half_life * (1.0 + batch.utility)
    held = np.maximum(floor, batch.heat0)
    decays = ~batch.keystone & (elapsed > 0.0) & np.isfinite(half_life)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        later = decayed_array(batch.heat0, np.maximum(elapsed / half_life, 0.0), policy.decay_curve)
        heat = np.where(decays, np.maximum(floor, later), held)
        state = _states(batch, policy, clocks, floor, half_life, heat)
    return heat, state


def _states(
    batch: Batch,
    policy: ChannelPolicy,
    clocks: Clocks,
    floor: _F64,
    half_life: _F64,
    heat: _F64,
) -> npt.NDArray[np.int8]:
    """``evolve``'s state: ghost, archived, cold or active for live memories; any other
    state sticks."""
    migrates = (
        ~batch.keystone
        & (batch.memory_type != _CORE)
        & (floor > 0.0)
        & (floor < policy.cold_threshold)
    )
    # The floor moment on the wall clock (hybrid's half-life already carries utility).
    level = np.where(floor > 0, floor, 1.0)
    solved = half_life * half_lives_until_array(level, batch.heat0, policy.decay_curve)
    until = np.where(batch.heat0 <= floor, 0.0, solved)
    migrate_at = np.where(migrates, batch.t0 + until + policy.cold_migration_days * DAY, np.inf)
    live = (batch.state == ACTIVE_CODE) | (batch.state == COLD_CODE)
    ghost = (floor == 0.0) & ~batch.keystone & (heat < policy.survival_gate)
    state = np.where(heat < policy.cold_threshold, COLD_CODE, ACTIVE_CODE).astype(np.int8)
    state = np.where(clocks.now >= migrate_at, ARCHIVED_CODE, state).astype(np.int8)
    state = np.where(ghost, GHOST_CODE, state).astype(np.int8)
    return np.where(live, state, batch.state).astype(np.int8)
