"""Channel policy ⇄ ChannelSettings: the API view of a policy, and masked, validated updates."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf.field_mask_pb2 import FieldMask

from calor.server.api.wire import Enum, enum_text, full_name, short_name
from calor.server.errors import InvalidArgumentError
from calor.server.thermo.heat import DECAY_CURVES, TypeProfile
from calor.server.thermo.policy import BANDS, DECAY_MODES, ChannelPolicy
from calor.v1 import memory_pb2

__all__ = ["apply_settings", "settings_message"]

_TYPE_PREFIX = "MEMORY_TYPE_"

# Every real memory type, in the enum's order: (enum number, policy name).
_TYPES: tuple[tuple[memory_pb2.MemoryType.ValueType, str], ...] = tuple(
    (memory_pb2.MemoryType.Value(value.name), short_name(_TYPE_PREFIX, value.name))
    for value in memory_pb2.MemoryType.DESCRIPTOR.values
    if value.number != memory_pb2.MEMORY_TYPE_UNSPECIFIED
)
_TYPE_NAMES: dict[int, str] = dict(_TYPES)


@dataclass(frozen=True)
class _Choice:
    """A setting whose value is one of a few names, an enum on the wire."""

    enum: Enum  # the generated enum wrapper (memory_pb2.DecayMode, ...)
    prefix: str
    names: tuple[str, ...]

    def number(self, name: str) -> int:
        return int(self.enum.Value(full_name(self.prefix, name)))

    def name(self, field: str, number: int) -> str:
        """The name of a number sent for ``field``; refused unless it is one of ours."""
        for name in self.names:
            if self.number(name) == number:
                return name
        choices = ", ".join(full_name(self.prefix, name) for name in self.names)
        raise InvalidArgumentError(
            f"{field}: {enum_text(self.enum, number)} is not one of {choices}"
        )


_CHOICES: dict[str, _Choice] = {
    "decay_mode": _Choice(memory_pb2.DecayMode, "DECAY_MODE_", DECAY_MODES),
    "decay_curve": _Choice(memory_pb2.DecayCurve, "DECAY_CURVE_", DECAY_CURVES),
}


# What a server can afford: durations from a second to a century, counts that drive
# per-store or per-recall work in the hundreds or thousands, weights and gains small.
_SECOND = 1.0
_DAY = 86_400.0
_MINUTE = 60.0
_CENTURY = 36_525 * _DAY
_DURATION = "1 second to 100 years"


@dataclass(frozen=True)
class _Rule:
    """Where a scalar ChannelSettings field lives in the policy, and what it may hold.

    Attributes:
        attr: The attribute, of ChannelPolicy or (with ``group``) of one of its groups.
        kind: The Python type of the value: ``bool``, ``int``, ``float`` or ``str``.
        low: The least value a number may take.
        high: The greatest value a number may take.
        group: The ChannelPolicy attribute holding the value's group (``weights``,
            ``bands``, ``dreams``, ``ingest``, ``context``); empty for a value of the
            policy itself.
        choices: The names a ``str`` value may take.
        note: The range in words, when the numbers alone do not say it (a duration).
        off: Whether 0 is allowed too, below ``low``, meaning "off".
    """

    attr: str
    kind: type
    low: float = 0.0
    high: float = 0.0
    group: str = ""
    choices: tuple[str, ...] = ()
    note: str = ""
    off: bool = False

    def check(self, field: str, value: Any) -> Any:
        """The value if it is allowed; otherwise InvalidArgumentError naming ``field``."""
        if self.kind is bool:
            return bool(value)
        if self.kind is str:
            if value not in self.choices:
                allowed = ", ".join(repr(c) for c in self.choices)
                raise InvalidArgumentError(f"{field}: must be one of {allowed}, got {value!r}")
            return str(value)
        if self.off and value == 0:
            return self.kind(value)
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise InvalidArgumentError(f"{field}: must be {self.range()}, got {value}")
        return self.kind(value)

    def range(self) -> str:
        """The values a number may take, as a message says them."""
        note = f" ({self.note})" if self.note else ""
        off = " or 0 (off)" if self.off else ""
        return f"in [{_number(self.low)}, {_number(self.high)}]{off}{note}"


def _number(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else f"{bound:g}"


def _flag(attr: str) -> _Rule:
    return _Rule(attr, bool)


def _fraction(attr: str, group: str = "") -> _Rule:
    return _Rule(attr, float, 0.0, 1.0, group=group)


def _seconds(attr: str, group: str = "") -> _Rule:
    return _Rule(attr, float, _SECOND, _CENTURY, group=group, note=_DURATION)


def _days(attr: str, group: str = "") -> _Rule:
    return _Rule(attr, float, _SECOND / _DAY, _CENTURY / _DAY, group, note=f"{_DURATION}, in days")


def _count(attr: str, low: int, high: int, group: str = "") -> _Rule:
    return _Rule(attr, int, low, high, group=group)


def _weight(attr: str, high: float = 10.0) -> _Rule:
    return _Rule(attr, float, 0.0, high, group="weights")


def _band(attr: str) -> _Rule:
    return _fraction(attr, "bands")


def _context(attr: str) -> _Rule:
    return _fraction(attr, "context")


def _dream(attr: str) -> _Rule:
    return _fraction(attr, "dreams")


def _ingest(attr: str) -> _Rule:
    return _fraction(attr, "ingest")


# Every ChannelSettings field but the choices (``decay_mode``, ``decay_curve``), ``profiles`` and
# ``dream_archive_exempt_types``, which have their own rules.
_SCALARS: dict[str, _Rule] = {
    "gate_fidelity": _flag("gate_fidelity"),
    "gate_heat_ceiling": _flag("gate_heat_ceiling"),
    "gate_load": _flag("gate_load"),
    "heat_ceiling": _fraction("heat_ceiling"),
    "entropy_threshold": _count("entropy_threshold", 1, 1 << 30),  # bytes: 1 GiB
    "cold_threshold": _fraction("cold_threshold"),
    "cold_count_trigger": _count("cold_count_trigger", 1, 1_000_000),
    "cold_migration_days": _days("cold_migration_days"),
    "boost_delta": _fraction("boost_delta"),
    "resonance_spread": _fraction("resonance_spread"),
    "resonance_damping": _fraction("resonance_damping"),
    "resonance_depth": _count("resonance_depth", 0, 8),
    "thermal_gate": _fraction("thermal_gate"),
    "survival_gate": _fraction("survival_gate"),
    "recall_heat": _fraction("recall_heat"),
    "channel_heat_half_life_seconds": _seconds("channel_heat_half_life_seconds"),
    "interaction_unit_seconds": _seconds("interaction_unit_seconds"),
    "weight_similarity": _weight("similarity"),
    "weight_heat": _weight("heat"),
    "weight_keyword": _weight("keyword"),
    "weight_lexical": _weight("lexical"),
    "weight_source": _weight("source"),
    "weight_temporal": _weight("temporal", 1.0),
    "weight_own_channel": _weight("own_channel"),
    "temporal_fade_days": _days("temporal_fade_days", "weights"),
    "load_inflight_critical": _count("load_inflight_critical", 1, 100_000),
    "load_reduced_limit": _count("load_reduced_limit", 1, 1000),
    "semantic_link_threshold": _fraction("semantic_link_threshold"),
    "semantic_link_max": _count("semantic_link_max", 0, 100),
    "entity_link_max": _count("entity_link_max", 0, 100),
    "session_gap_seconds": _seconds("session_gap_seconds"),
    "working_promotion_seconds": _seconds("working_promotion_seconds"),
    "working_promotion_recalls": _count("working_promotion_recalls", 1, 1000),
    "default_importance": _fraction("default_importance"),
    "confidence_high": _band("high"),
    "confidence_mid": _band("mid"),
    "confidence_keyword_similarity": _band("keyword_similarity"),
    "confidence_keyword_overlap": _band("keyword_overlap"),
    "dream_conflict_similarity": _dream("conflict_similarity"),
    "dream_merge_similarity": _dream("merge_similarity"),
    "dream_keystone_recalls": _count("keystone_recalls", 0, 100_000, group="dreams"),
    "dream_keystone_heat": _dream("keystone_heat"),
    "dream_semantic_importance": _dream("semantic_importance"),
    "dream_semantic_recalls": _count("semantic_recalls", 0, 100_000, group="dreams"),
    "dream_archive_age_days": _days("archive_age_days", "dreams"),
    "dream_archive_heat": _dream("archive_heat"),
    "dream_archive_importance": _dream("archive_importance"),
    "dream_archive_recalls": _count("archive_recalls", 0, 100_000, group="dreams"),
    "dream_prune_heat": _dream("prune_heat"),
    "dream_channel_cooling": _dream("channel_cooling"),
    "dream_max_conflicts": _count("max_conflicts", 0, 10_000, group="dreams"),
    "dream_interval_seconds": _Rule(
        "interval_seconds",
        float,
        _MINUTE,
        _CENTURY,
        "dreams",
        note="a minute to 100 years",
        off=True,
    ),
    "dream_episode_min": _Rule("episode_min", int, 2, 10_000, "dreams", off=True),
    "dream_episode_cooling": _dream("episode_cooling"),
    "ingest_near_duplicate_similarity": _ingest("near_duplicate_similarity"),
    "ingest_near_duplicate_penalty": _ingest("near_duplicate_penalty"),
    "ingest_novelty_neighbours": _count("novelty_neighbours", 1, 1000, group="ingest"),
    "ingest_novelty_bonus": _ingest("novelty_bonus"),
    "ingest_familiar_similarity": _ingest("familiar_similarity"),
    "ingest_novel_similarity": _ingest("novel_similarity"),
    "ingest_entity_hub": _count("entity_hub", 1, 100_000, group="ingest"),
    "heat_min_band": _Rule("heat_min_band", str, choices=BANDS),
    "context_weight_similarity": _context("similarity"),
    "context_weight_heat": _context("heat"),
    "context_weight_recency": _context("recency"),
    "context_weight_source": _context("source"),
    "trigger_min_precision": _fraction("trigger_min_precision"),
    "trigger_auto_pause": _flag("trigger_auto_pause"),
    "context_reuse_seconds": _Rule(
        "reuse_seconds", float, 0.0, _DAY, group="context", note="0 (no reuse) to 1 day"
    ),
}

# Pairs of fields whose first must stay below (``strict``) or at most their second.
_ORDERED: tuple[tuple[str, str, bool], ...] = (
    ("confidence_mid", "confidence_high", False),
    ("ingest_novel_similarity", "ingest_familiar_similarity", True),
)
_EXEMPT_TYPES = "dream_archive_exempt_types"

_PROFILE_RULES: dict[str, _Rule] = {
    "half_life_seconds": _seconds("half_life_seconds"),
    "floor": _fraction("floor"),
    "stability_gain": _Rule("stability_gain", float, 1.0, 10.0),
}

_PATHS = frozenset({*_CHOICES, "profiles", _EXEMPT_TYPES, *_SCALARS})


def settings_message(policy: ChannelPolicy) -> memory_pb2.ChannelSettings:
    """The API view of a channel's policy: every field, and a profile for every type.

    Profiles come in the order of the ``MemoryType`` enum.
    """
    values: dict[str, Any] = {name: _value(policy, name) for name in _SCALARS}
    profiles = [_profile_message(number, policy.profile(name)) for number, name in _TYPES]
    exempt = policy.dreams.archive_exempt_types
    values[_EXEMPT_TYPES] = [number for number, name in _TYPES if name in exempt]
    for name, choice in _CHOICES.items():
        values[name] = choice.number(getattr(policy, name))
    return memory_pb2.ChannelSettings(profiles=profiles, **values)


def _value(policy: ChannelPolicy, name: str) -> Any:
    """The policy's value of the scalar ChannelSettings field ``name``."""
    rule = _SCALARS[name]
    return getattr(getattr(policy, rule.group) if rule.group else policy, rule.attr)


def apply_settings(
    current: ChannelPolicy, update: memory_pb2.ChannelSettings, mask: FieldMask
) -> ChannelPolicy:
    """The policy that results from applying the masked fields of ``update`` to ``current``.

    Only the fields named in ``mask.paths`` change; a listed profile replaces the
    profile of its type and leaves the others. Everything named is validated first,
    so a rejected update changes nothing.

    Args:
        current: The policy in force.
        update: The new values; fields not named in ``mask`` are ignored.
        mask: ChannelSettings field names to apply.

    Returns:
        A new policy; ``current`` is not modified.

    Raises:
        InvalidArgumentError: The mask is empty or names an unknown field, or a named
            value is out of range or out of order with a related field (the message
            names the field).
    """
    changes: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for path in _paths(mask):
        if path in _CHOICES:
            changes[path] = _CHOICES[path].name(path, getattr(update, path))
        elif path == "profiles":
            changes["profiles"] = _merge_profiles(current.profiles, update.profiles)
        elif path == _EXEMPT_TYPES:
            exempt = _memory_types(path, update.dream_archive_exempt_types)
            groups.setdefault("dreams", {})["archive_exempt_types"] = exempt
        else:
            rule = _SCALARS[path]
            value = rule.check(path, getattr(update, path))
            target = groups.setdefault(rule.group, {}) if rule.group else changes
            target[rule.attr] = value
    for group, values in groups.items():
        changes[group] = replace(getattr(current, group), **values)
    policy = replace(current, **changes)
    _check_order(policy)
    return policy


def _check_order(policy: ChannelPolicy) -> None:
    """Refuse a policy in which a pair of related fields is out of order."""
    for low, high, strict in _ORDERED:
        below, above = _value(policy, low), _value(policy, high)
        if below > above or (strict and below == above):
            relation = "below" if strict else "at most"
            raise InvalidArgumentError(f"{low}: must be {relation} {high} ({above}), got {below}")


def _memory_types(field: str, numbers: Iterable[int]) -> tuple[str, ...]:
    """Memory type names for a list of MemoryType numbers, each once, in the enum's order."""
    names: set[str] = set()
    for number in numbers:
        name = _TYPE_NAMES.get(number)
        if name is None:
            given = enum_text(memory_pb2.MemoryType, number)
            raise InvalidArgumentError(f"{field}: {given} is not a memory type")
        names.add(name)
    return tuple(name for _, name in _TYPES if name in names)


def _paths(mask: FieldMask) -> list[str]:
    if not mask.paths:
        raise InvalidArgumentError("update_mask: name the fields to change")
    unknown = [path for path in mask.paths if path not in _PATHS]
    if unknown:
        raise InvalidArgumentError(f"update_mask: {unknown[0]!r} is not a ChannelSettings field")
    return list(dict.fromkeys(mask.paths))


def _merge_profiles(
    current: dict[str, TypeProfile], listed: Iterable[memory_pb2.TypeProfile]
) -> dict[str, TypeProfile]:
    profiles = dict(current)
    seen: set[int] = set()
    for message in listed:
        name = _TYPE_NAMES.get(message.memory_type)
        if name is None:
            given = enum_text(memory_pb2.MemoryType, message.memory_type)
            raise InvalidArgumentError(f"profiles.memory_type: {given} is not a memory type")
        if message.memory_type in seen:
            raise InvalidArgumentError(f"profiles: {name} is listed more than once")
        seen.add(message.memory_type)
        profiles[name] = TypeProfile(
            **{
                attr: rule.check(f"profiles[{name}].{attr}", getattr(message, attr))
                for attr, rule in _PROFILE_RULES.items()
            }
        )
    if not seen:
        raise InvalidArgumentError("profiles: named in update_mask, but no profile given")
    return profiles


def _profile_message(
    number: memory_pb2.MemoryType.ValueType, profile: TypeProfile
) -> memory_pb2.TypeProfile:
    return memory_pb2.TypeProfile(
        memory_type=number,
        half_life_seconds=profile.half_life_seconds,
        floor=profile.floor,
        stability_gain=profile.stability_gain,
    )
