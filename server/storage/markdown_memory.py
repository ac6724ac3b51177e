"""What a memory section's metadata says: the keys the Markdown format knows, and the
``ParsedMemory`` (with its ``CarriedState``, when it carries one) they make.

Which fields are carried, and why, is told in :mod:`calor.server.storage.markdown`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from calor.server.errors import InvalidArgumentError
from calor.server.storage.markdown_values import (
    LinkTo,
    parse_bool,
    parse_confidence,
    parse_count,
    parse_edges,
    parse_id,
    parse_ids,
    parse_importance,
    parse_integer,
    parse_names,
    parse_signed_unit,
    parse_source,
    parse_stability,
    parse_state,
    parse_tags,
    parse_text,
    parse_time,
    parse_times,
    parse_type,
    parse_unit,
)

__all__ = ["MEMORY_KEYS", "CarriedState", "LinkTo", "ParsedMemory", "read_fields"]


@dataclass(frozen=True)
class CarriedState:
    """A memory's thermodynamic and lifecycle state as an export carries it: with it, an
    import reproduces the memory instead of storing it anew.

    Attributes:
        heat0: Heat as of its last materialisation.
        t0: When that was (epoch seconds).
        stability: The multiplier of its half-life that recalls grew.
        utility: Its utility when exported, or None to compute it from the evidence.
        recall_count: How often it was recalled.
        last_recalled_at: When it was last recalled, if ever.
        recall_times: Its latest recall times (utility's evidence).
        confirmations: Near-duplicates stored after it (corroboration).
        valence: Its emotional valence, read from its text when it was stored.
        surprise: How new it was when stored.
        importance_adjustment: What novelty did to its importance.
        interactions: The channel's interactions since ``t0`` when exported (the
            interaction clock, rebased on the channel it is imported into).
        state: Its state: active, cold, archived, ghost or merged.
        session: The session stream it belongs to ("" for none).
        merged_into: The memory a dream merged it into.
        merged_from: The memories a dream merged into it.
        updated_at: When it last changed, or None for the moment of import.
        entities: The entities it names, when they are not what its text alone reads
            (names its channel knew from elsewhere); None to read them from the text.
        classifier_version: The classifier version that inferred its type; 0 when the
            type was given.
    """

    heat0: float
    t0: float
    stability: float = 1.0
    utility: float | None = None
    recall_count: int = 0
    last_recalled_at: float | None = None
    recall_times: tuple[float, ...] = ()
    confirmations: int = 0
    valence: float = 0.0
    surprise: float = 0.0
    importance_adjustment: float = 0.0
    interactions: int = 0
    state: str = "active"
    session: str = ""
    merged_into: str = ""
    merged_from: tuple[str, ...] = ()
    updated_at: float | None = None
    entities: tuple[str, ...] | None = None
    classifier_version: int = 0


@dataclass(frozen=True)
class ParsedMemory:
    """One memory read from Markdown; None fields take the server's defaults on import.

    Attributes:
        text: The memory's text, verbatim.
        memory_type: A type name, or None to classify it.
        keystone: Whether the memory is pinned.
        tags: Tags, keys and values unescaped.
        created_at: Epoch seconds, or None for now.
        source: A source name, or None for ``agent``.
        confidence: A confidence name, or None for ``observed``.
        importance: In [0, 1], or None for the default.
        original_id: The id the memory had where it was exported.
        provenance: Where the memory came from (a free map).
        edges: Its edges to other memories of the document.
        state: Its whole state, when the section carries it (it names ``heat0`` and ``t0``);
            None for a memory to store anew.
        line: The line the memory starts on (not compared).
    """

    text: str
    memory_type: str | None = None
    keystone: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    created_at: float | None = None
    source: str | None = None
    confidence: str | None = None
    importance: float | None = None
    original_id: str | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    edges: tuple[LinkTo, ...] = ()
    state: CarriedState | None = None
    line: int = field(default=0, compare=False)


_Key = tuple[str, Callable[[str], Any]]

# The keys of a memory: any of them (or ``heat`` and ``state``, which older exports wrote
# to be read by people) makes a ``##`` section a memory rather than a heading over notes.
_MEMORY: dict[str, _Key] = {
    "id": ("original_id", parse_id),
    "type": ("memory_type", parse_type),
    "memory_type": ("memory_type", parse_type),
    "keystone": ("keystone", parse_bool),
    "created": ("created_at", parse_time),
    "created_at": ("created_at", parse_time),
    "tags": ("tags", parse_tags),
    "source": ("source", parse_source),
    "confidence": ("confidence", parse_confidence),
    "importance": ("importance", parse_importance),
}
MEMORY_KEYS = frozenset(_MEMORY) | {"heat", "state"}
"""The keys that make a ``##`` section a memory."""

# Read within a memory section only, so a hand-written heading whose bullets happen to
# start with one of these words stays a heading over notes.
_EXTRA: dict[str, _Key] = {
    "provenance": ("provenance", parse_tags),
    "edges": ("edges", parse_edges),
}
# The carried state: read only when the section names heat0 (with t0); without it these
# keys are, like ``heat``, for people and ignored, as in hand-written notes.
_STATE: dict[str, _Key] = {
    "heat0": ("heat0", parse_unit),
    "t0": ("t0", parse_time),
    "stability": ("stability", parse_stability),
    "utility": ("utility", parse_unit),
    "recalls": ("recall_count", parse_count),
    "recall_count": ("recall_count", parse_count),
    "last_recalled": ("last_recalled_at", parse_time),
    "last_recalled_at": ("last_recalled_at", parse_time),
    "recall_times": ("recall_times", parse_times),
    "confirmations": ("confirmations", parse_count),
    "valence": ("valence", parse_signed_unit),
    "surprise": ("surprise", parse_unit),
    "importance_adjustment": ("importance_adjustment", parse_signed_unit),
    "interactions_since_t0": ("interactions", parse_integer),
    "state": ("state", parse_state),
    "session": ("session", parse_text),
    "merged_into": ("merged_into", parse_id),
    "merged_from": ("merged_from", parse_ids),
    "updated": ("updated_at", parse_time),
    "updated_at": ("updated_at", parse_time),
    "entities": ("entities", parse_names),
    "classifier": ("classifier_version", parse_count),
}


def _parse(key: str, spec: _Key, number: int, value: str) -> tuple[str, Any]:
    name, parse = spec
    try:
        return name, parse(value)
    except ValueError as exc:
        raise InvalidArgumentError(f"line {number}: {key}: {exc}") from None


def read_fields(entries: Iterable[tuple[int, str, str]]) -> dict[str, Any]:
    """The ``ParsedMemory`` fields (all but text and line) a memory section's metadata
    gives, from its ``(line, key, value)`` entries; unknown keys are ignored.

    Raises:
        InvalidArgumentError: A value is malformed, or only one of heat0 and t0 is
            named; the message names the line.
    """
    fields: dict[str, Any] = {}
    state: dict[str, Any] = {}
    lines: dict[str, int] = {}
    held: list[tuple[int, str, str]] = []
    for number, key, value in entries:
        spec = _MEMORY.get(key) or _EXTRA.get(key)
        if spec is not None:
            name, parsed = _parse(key, spec, number, value)
            fields[name] = parsed
        elif key in _STATE:
            held.append((number, key, value))
            lines.setdefault(key, number)
    if "heat0" not in lines and "t0" not in lines:
        return fields
    for needed, other in (("heat0", "t0"), ("t0", "heat0")):
        if needed not in lines:
            raise InvalidArgumentError(
                f"line {lines[other]}: {other}: a memory that carries its state names"
                f" both heat0 and t0 ({needed} is missing)"
            )
    for number, key, value in held:
        name, parsed = _parse(key, _STATE[key], number, value)
        if parsed is not None:
            state[name] = parsed
    for needed in ("heat0", "t0"):
        if needed not in state:
            raise InvalidArgumentError(f"line {lines[needed]}: {needed}: a value is needed")
    fields["state"] = CarriedState(**state)
    return fields
