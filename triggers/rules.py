"""Trigger rules: plain data validated when registered, evaluated by pure functions."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast

import re2  # type: ignore[import-untyped]

from calor.server.api.wire import enum_text, full_name, short_name, timestamp_message
from calor.server.errors import InvalidArgumentError
from calor.triggers.feedback import Standing
from calor.triggers.rule_config import redact_config, validate_config
from calor.v1 import memory_pb2, trigger_service_pb2

__all__ = [
    "ACTIONS",
    "EVENTS",
    "MAX_PATTERN_CHARS",
    "TriggerRule",
    "compile_pattern",
    "matches",
    "rule_from_message",
    "rule_message",
]

ACTIONS = ("notify", "boost", "pin", "tag", "deprecate", "webhook", "chain")
EVENTS = ("on_store", "on_recall", "on_boost", "on_decay")
"""The placeholders a notify ``message`` template may use, e.g. ``{memory_id}``."""

MAX_PATTERN_CHARS = 512

_EVENT_PREFIX = "EVENT_KIND_"
_ACTION_PREFIX = "ACTION_KIND_"
_TYPE_PREFIX = "MEMORY_TYPE_"
_EVENT_BY_VALUE = {
    trigger_service_pb2.EventKind.Value(full_name(_EVENT_PREFIX, name)): name for name in EVENTS
}
_ACTION_BY_VALUE = {
    trigger_service_pb2.ActionKind.Value(full_name(_ACTION_PREFIX, name)): name for name in ACTIONS
}
_TYPE_BY_VALUE = {
    value: short_name(_TYPE_PREFIX, name)
    for name, value in memory_pb2.MemoryType.items()
    if value != memory_pb2.MEMORY_TYPE_UNSPECIFIED
}
# `{{` and `}}` are literal braces; `{name}` is a placeholder; any other brace is an error.


class _Pattern(Protocol):
    def search(self, text: str) -> object | None: ...


@dataclass(frozen=True)
class TriggerRule:
    """A registered trigger: what event it listens for, its filters and the action it takes.

    Attributes:
        id: The trigger id.
        channel: The channel whose events it sees.
        event: One of :data:`EVENTS`.
        action: One of :data:`ACTIONS`.
        config: The action's settings, read-only (keys depend on the action).
        filter_memory_type: Only memories of this type (``"fact"``, ...); None means any.
        filter_pattern: An RE2 pattern searched case-insensitively in the text; "" means any.
        filter_heat_above: Only when heat is strictly above this; None means no bound.
        filter_heat_below: Only when heat is strictly below this; None means no bound.
        max_fires: How many times it may fire; 0 means unlimited.
        cooldown_seconds: The least time between two firings.
        threshold: For ``on_decay``: the heat whose downward crossing fires it; None means
            the channel's cold threshold.
        created_at: When it was registered, in seconds since the epoch.
        paused: Why it was paused (it fires no more: its rated firings were mostly
            noise), or "" while it is not.
    """

    id: str
    channel: str
    event: str
    action: str
    config: Mapping[str, str] = field(hash=False)
    filter_memory_type: str | None
    filter_pattern: str
    filter_heat_above: float | None
    filter_heat_below: float | None
    max_fires: int
    cooldown_seconds: float
    threshold: float | None
    created_at: float
    paused: str = ""

    def __post_init__(self) -> None:
        # A private copy typed read-only, so the caller's dict cannot change the rule. (A
        # plain dict, not a MappingProxyType, keeps dataclasses.asdict and deepcopy working.)
        object.__setattr__(self, "config", dict(sorted(self.config.items())))

    def config_value(self, key: str, default: str = "") -> str:
        """The config value for ``key``, or ``default`` when it is not set."""
        return self.config.get(key, default)

    def to_json(self) -> bytes:
        """The rule as compact UTF-8 JSON, for storage."""
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TriggerRule:
        """A rule from :meth:`to_json` output; unknown keys from newer versions are ignored."""
        raw: dict[str, Any] = json.loads(data)
        return cls(
            id=str(raw["id"]),
            channel=str(raw["channel"]),
            event=str(raw["event"]),
            action=str(raw["action"]),
            config={str(k): str(v) for k, v in dict(raw.get("config") or {}).items()},
            filter_memory_type=_optional_str(raw.get("filter_memory_type")),
            filter_pattern=str(raw.get("filter_pattern") or ""),
            filter_heat_above=_optional_float(raw.get("filter_heat_above")),
            filter_heat_below=_optional_float(raw.get("filter_heat_below")),
            max_fires=int(raw.get("max_fires") or 0),
            cooldown_seconds=float(raw.get("cooldown_seconds") or 0.0),
            threshold=_optional_float(raw.get("threshold")),
            created_at=float(raw.get("created_at") or 0.0),
            paused=str(raw.get("paused") or ""),
        )


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _optional_float(value: object) -> float | None:
    return None if value is None else float(cast(float, value))


# --- patterns -------------------------------------------------------------------------------


def _re2_options() -> Any:
    options = re2.Options()
    options.case_sensitive = False
    options.longest_match = False
    options.log_errors = False  # a rejected pattern is reported to the caller, not to stderr
    return options


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> _Pattern:
    return cast(_Pattern, re2.compile(pattern, _re2_options()))


def compile_pattern(pattern: str) -> _Pattern:
    """Compile a content filter with RE2 (case-insensitive), once per distinct pattern.

    RE2 matches in time linear in the text and never backtracks, so no pattern (such as
    ``(a+)+$``) can stall the server; features that need backtracking (back-references,
    look-around) are rejected when the trigger is registered.

    Args:
        pattern: At most :data:`MAX_PATTERN_CHARS` characters of RE2 syntax.

    Returns:
        The compiled pattern, shared by every rule that uses the same text.

    Raises:
        InvalidArgumentError: The pattern is too long or RE2 rejects it.
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidArgumentError(
            f"filter_pattern: {len(pattern)} characters is over the limit of {MAX_PATTERN_CHARS}"
        )
    try:
        return _compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid pattern"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", errors="replace")
        raise InvalidArgumentError(f"filter_pattern: RE2 rejected the pattern: {reason}") from None


# --- evaluation -----------------------------------------------------------------------------


def matches(
    rule: TriggerRule, *, event: str, channel: str, memory_type: str, text: str, heat: float
) -> bool:
    """Whether ``rule`` applies to an event on a memory; limits and cooldowns are not checked.

    Args:
        rule: A validated rule.
        event: The event kind, one of :data:`EVENTS`.
        channel: The memory's channel.
        memory_type: The memory's type name (``"fact"``, ...).
        text: The memory's text, searched with the rule's pattern.
        heat: The memory's heat at the event.

    Returns:
        True when the event kind and channel are the rule's and every filter passes.
    """
    if rule.event != event or rule.channel != channel:
        return False
    if rule.filter_memory_type is not None and rule.filter_memory_type != memory_type:
        return False
    if rule.filter_heat_above is not None and not heat > rule.filter_heat_above:
        return False
    if rule.filter_heat_below is not None and not heat < rule.filter_heat_below:
        return False
    return not rule.filter_pattern or _compiled(rule.filter_pattern).search(text) is not None


# --- validation: the message fields ---------------------------------------------------------


def rule_from_message(
    message: trigger_service_pb2.Trigger,
    *,
    trigger_id: str,
    now: float,
    validate_channel: Callable[[str], str],
) -> TriggerRule:
    """Validate a ``Trigger`` from a request and make it a rule.

    Args:
        message: The trigger as the client sent it; its ``id``, ``fires`` and
            ``created_at`` are ignored.
        trigger_id: The id the new rule gets.
        now: The registration time, in seconds since the epoch.
        validate_channel: Checks the channel (format, access) and returns it normalised;
            raises for a bad one.

    Returns:
        The validated rule.

    Raises:
        InvalidArgumentError: A field is missing, unknown, out of range or inconsistent;
            the message names the field.
    """
    event = _event(message)
    action = _action(message)
    above, below = _heat_filters(message)
    pattern = message.filter_pattern
    if pattern:
        compile_pattern(pattern)
    return TriggerRule(
        id=trigger_id,
        channel=validate_channel(message.channel),
        event=event,
        action=action,
        config=validate_config(action, message.config),
        filter_memory_type=_memory_type(message),
        filter_pattern=pattern,
        filter_heat_above=above,
        filter_heat_below=below,
        max_fires=_max_fires(message),
        cooldown_seconds=_cooldown(message),
        threshold=_threshold(message, event),
        created_at=now,
    )


def _event(message: trigger_service_pb2.Trigger) -> str:
    event = _EVENT_BY_VALUE.get(message.event)
    if event is None:
        allowed = ", ".join(full_name(_EVENT_PREFIX, name) for name in EVENTS)
        got = enum_text(trigger_service_pb2.EventKind, message.event)
        raise InvalidArgumentError(f"event: must be one of {allowed} (got {got})")
    return event


def _action(message: trigger_service_pb2.Trigger) -> str:
    action = _ACTION_BY_VALUE.get(message.action)
    if action is None:
        allowed = ", ".join(full_name(_ACTION_PREFIX, name) for name in ACTIONS)
        got = enum_text(trigger_service_pb2.ActionKind, message.action)
        raise InvalidArgumentError(f"action: must be one of {allowed} (got {got})")
    return action


def _memory_type(message: trigger_service_pb2.Trigger) -> str | None:
    value = message.filter_memory_type
    if value == memory_pb2.MEMORY_TYPE_UNSPECIFIED:
        return None
    name = _TYPE_BY_VALUE.get(value)
    if name is None:
        raise InvalidArgumentError(f"filter_memory_type: unknown value {value}")
    return name


def _heat(field_name: str, value: float) -> float:
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidArgumentError(f"{field_name}: must be a finite number in [0, 1], not {value}")
    return value


def _heat_filters(message: trigger_service_pb2.Trigger) -> tuple[float | None, float | None]:
    above = below = None
    if message.HasField("filter_heat_above"):
        above = _heat("filter_heat_above", message.filter_heat_above)
    if message.HasField("filter_heat_below"):
        below = _heat("filter_heat_below", message.filter_heat_below)
    if above is not None and below is not None and not above < below:
        raise InvalidArgumentError(
            f"filter_heat_above ({above}) must be less than filter_heat_below ({below})"
        )
    return above, below


def _max_fires(message: trigger_service_pb2.Trigger) -> int:
    if message.max_fires < 0:
        raise InvalidArgumentError(
            f"max_fires: must be 0 (unlimited) or more, not {message.max_fires}"
        )
    return message.max_fires


def _cooldown(message: trigger_service_pb2.Trigger) -> float:
    value = message.cooldown_seconds
    if not math.isfinite(value) or value < 0.0:
        raise InvalidArgumentError(f"cooldown_seconds: must be a finite number >= 0, not {value}")
    return value


def _threshold(message: trigger_service_pb2.Trigger, event: str) -> float | None:
    if not message.HasField("threshold"):
        return None
    value = message.threshold
    if event != "on_decay":
        raise InvalidArgumentError(
            f"threshold: only meaningful for EVENT_KIND_ON_DECAY triggers, not {event}"
        )
    if not math.isfinite(value) or not 0.0 < value < 1.0:
        raise InvalidArgumentError(f"threshold: must be a finite number in (0, 1), not {value}")
    return value


# --- back to the API ------------------------------------------------------------------------


def rule_message(
    rule: TriggerRule, fires: int, standing: Standing | None = None
) -> trigger_service_pb2.Trigger:
    """The API view of a rule, with how many times it has fired.

    Write-only config values (a webhook's ``secret``) show as ``[redacted]``: every
    reply that carries a trigger is built here, so none ever returns one.

    Args:
        rule: The rule.
        fires: Its fire count so far.
        standing: Its precision over rated firings, when the reply shows it.

    Returns:
        A ``Trigger`` that :func:`rule_from_message` turns back into the same rule
        (one whose secret is redacted it refuses instead).
    """
    message = trigger_service_pb2.Trigger(
        id=rule.id,
        channel=rule.channel,
        event=trigger_service_pb2.EventKind.Value(full_name(_EVENT_PREFIX, rule.event)),
        action=trigger_service_pb2.ActionKind.Value(full_name(_ACTION_PREFIX, rule.action)),
        config=redact_config(rule.config),
        filter_pattern=rule.filter_pattern,
        max_fires=rule.max_fires,
        cooldown_seconds=rule.cooldown_seconds,
        fires=fires,
        created_at=timestamp_message(rule.created_at),
    )
    if rule.filter_memory_type is not None:
        message.filter_memory_type = memory_pb2.MemoryType.Value(
            full_name(_TYPE_PREFIX, rule.filter_memory_type)
        )
    if rule.filter_heat_above is not None:
        message.filter_heat_above = rule.filter_heat_above
    if rule.filter_heat_below is not None:
        message.filter_heat_below = rule.filter_heat_below
    if rule.threshold is not None:
        message.threshold = rule.threshold
    message.paused = rule.paused
    if standing is not None:
        if standing.precision is not None:
            message.precision = standing.precision
        message.rated, message.flagged = standing.rated, standing.flagged
    return message
