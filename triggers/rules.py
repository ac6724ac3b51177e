"""Trigger rules: plain data validated when registered, evaluated by pure functions."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import re2  # type: ignore[import-untyped]
from google.protobuf.timestamp_pb2 import Timestamp

from calor.server.errors import InvalidArgumentError
from calor.v1 import memory_pb2, trigger_service_pb2

__all__ = [
    "ACTIONS",
    "EVENTS",
    "MAX_PATTERN_CHARS",
    "MESSAGE_FIELDS",
    "TriggerRule",
    "compile_pattern",
    "matches",
    "render_message",
    "rule_from_message",
    "rule_message",
]

ACTIONS = ("notify", "boost", "pin", "tag", "deprecate", "webhook", "chain")
EVENTS = ("on_store", "on_recall", "on_boost", "on_decay")
MESSAGE_FIELDS = ("memory_id", "channel", "text", "heat", "memory_type", "event", "trigger_id")
"""The placeholders a notify ``message`` template may use, e.g. ``{memory_id}``."""

MAX_PATTERN_CHARS = 512
_MAX_TEMPLATE_CHARS = 1000
_MAX_CONFIG_KEY_BYTES = 256
_MAX_CONFIG_VALUE_BYTES = 2048
_MAX_TAG_BYTES = 256
_MAX_WEBHOOK_TIMEOUT = 60.0
_MAX_WEBHOOK_RETRIES = 10
_BOOST_TARGETS = ("memory", "neighbours")

_EVENT_PREFIX = "EVENT_KIND_"
_ACTION_PREFIX = "ACTION_KIND_"
_TYPE_PREFIX = "MEMORY_TYPE_"
_EVENT_BY_VALUE = {
    trigger_service_pb2.EventKind.Value(_EVENT_PREFIX + name.upper()): name for name in EVENTS
}
_ACTION_BY_VALUE = {
    trigger_service_pb2.ActionKind.Value(_ACTION_PREFIX + name.upper()): name for name in ACTIONS
}
_TYPE_BY_VALUE = {
    value: name.removeprefix(_TYPE_PREFIX).lower()
    for name, value in memory_pb2.MemoryType.items()
    if value != memory_pb2.MEMORY_TYPE_UNSPECIFIED
}
# `{{` and `}}` are literal braces; `{name}` is a placeholder; any other brace is an error.
_TEMPLATE_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


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


def render_message(template: str, fields: Mapping[str, str]) -> str:
    """Fill a notify template's ``{name}`` placeholders from ``fields``.

    Only plain names are substituted (no attribute, index or format-spec access, unlike
    ``str.format``); ``{{`` and ``}}`` stand for literal braces. A placeholder with no value
    in ``fields`` is left as written.

    Args:
        template: A template accepted by validation (placeholders from :data:`MESSAGE_FIELDS`).
        fields: The values to substitute.

    Returns:
        The rendered text.
    """

    def substitute(match: re.Match[str]) -> str:
        token = match.group(0)
        name = match.group(1)
        if name is not None:
            return fields.get(name, token)
        return token[0] if token in ("{{", "}}") else token

    return _TEMPLATE_TOKEN.sub(substitute, template)


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
        config=_config(action, message.config),
        filter_memory_type=_memory_type(message),
        filter_pattern=pattern,
        filter_heat_above=above,
        filter_heat_below=below,
        max_fires=_max_fires(message),
        cooldown_seconds=_cooldown(message),
        threshold=_threshold(message, event),
        created_at=now,
    )


def _enum_label(enum: Any, value: int) -> str:
    try:
        return str(enum.Name(value))
    except ValueError:
        return str(value)


def _event(message: trigger_service_pb2.Trigger) -> str:
    event = _EVENT_BY_VALUE.get(message.event)
    if event is None:
        allowed = ", ".join(_EVENT_PREFIX + name.upper() for name in EVENTS)
        got = _enum_label(trigger_service_pb2.EventKind, message.event)
        raise InvalidArgumentError(f"event: must be one of {allowed} (got {got})")
    return event


def _action(message: trigger_service_pb2.Trigger) -> str:
    action = _ACTION_BY_VALUE.get(message.action)
    if action is None:
        allowed = ", ".join(_ACTION_PREFIX + name.upper() for name in ACTIONS)
        got = _enum_label(trigger_service_pb2.ActionKind, message.action)
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


# --- validation: per-action config ----------------------------------------------------------

_Check = Callable[[str, str], None]
"""Validates one config value; called with the field label (``config.url``) and the value."""


@dataclass(frozen=True)
class _Key:
    check: _Check
    required: bool = False


def _check_template(label: str, value: str) -> None:
    if len(value) > _MAX_TEMPLATE_CHARS:
        raise InvalidArgumentError(
            f"{label}: {len(value)} characters is over the limit of {_MAX_TEMPLATE_CHARS}"
        )
    for match in _TEMPLATE_TOKEN.finditer(value):
        token, name = match.group(0), match.group(1)
        if name is None and token not in ("{{", "}}"):
            raise InvalidArgumentError(
                f"{label}: unmatched {token!r} at {match.start()} (write {token * 2} for a brace)"
            )
        if name is not None and name not in MESSAGE_FIELDS:
            raise InvalidArgumentError(
                f"{label}: unknown placeholder {token[:60]!r}; "
                f"allowed: {', '.join('{' + f + '}' for f in MESSAGE_FIELDS)}"
            )


def _parse_float(label: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise InvalidArgumentError(f"{label}: {value[:40]!r} is not a number") from None
    if not math.isfinite(number):
        raise InvalidArgumentError(f"{label}: must be finite, not {value[:40]!r}")
    return number


def _check_delta(label: str, value: str) -> None:
    if not -1.0 <= _parse_float(label, value) <= 1.0:
        raise InvalidArgumentError(f"{label}: must be in [-1, 1], not {value[:40]}")


def _check_target(label: str, value: str) -> None:
    if value not in _BOOST_TARGETS:
        raise InvalidArgumentError(
            f"{label}: must be one of {', '.join(_BOOST_TARGETS)}, not {value[:40]!r}"
        )


def _check_tag_key(label: str, value: str) -> None:
    if not value:
        raise InvalidArgumentError(f"{label}: must not be empty")
    _check_tag_value(label, value)


def _check_tag_value(label: str, value: str) -> None:
    if len(value.encode()) > _MAX_TAG_BYTES:
        raise InvalidArgumentError(f"{label}: over the limit of {_MAX_TAG_BYTES} bytes")


def _check_url(label: str, value: str) -> None:
    if not value.isascii() or any(ch <= " " or ch == "\x7f" for ch in value):
        raise InvalidArgumentError(f"{label}: must be ASCII with no spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port  # parsing it rejects a malformed port
    except ValueError as exc:
        raise InvalidArgumentError(f"{label}: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidArgumentError(f"{label}: the scheme must be http or https")
    if not parts.hostname:
        raise InvalidArgumentError(f"{label}: the URL has no host")
    if parts.username is not None or parts.password is not None:
        # Credentials in a URL leak into logs; use config.secret to authenticate instead.
        raise InvalidArgumentError(f"{label}: must not carry user credentials")
    if port == 0:
        raise InvalidArgumentError(f"{label}: port 0 is not valid")


def _check_any(label: str, value: str) -> None:
    del label, value  # the shared key/value size limits are enough


def _check_timeout(label: str, value: str) -> None:
    if not 0.0 < _parse_float(label, value) <= _MAX_WEBHOOK_TIMEOUT:
        raise InvalidArgumentError(
            f"{label}: must be in (0, {_MAX_WEBHOOK_TIMEOUT:g}] seconds, not {value[:40]}"
        )


def _check_retries(label: str, value: str) -> None:
    if not value.isdigit() or not value.isascii() or int(value) > _MAX_WEBHOOK_RETRIES:
        raise InvalidArgumentError(
            f"{label}: must be a whole number from 0 to {_MAX_WEBHOOK_RETRIES}, not {value[:40]!r}"
        )


def _check_trigger_id(label: str, value: str) -> None:
    if not value.strip():
        raise InvalidArgumentError(f"{label}: must not be empty")


_ACTION_CONFIG: Mapping[str, Mapping[str, _Key]] = {
    "notify": {"message": _Key(_check_template)},
    "boost": {"delta": _Key(_check_delta), "target": _Key(_check_target)},
    "pin": {},
    "tag": {
        "key": _Key(_check_tag_key, required=True),
        "value": _Key(_check_tag_value, required=True),
    },
    "deprecate": {},
    "webhook": {
        "url": _Key(_check_url, required=True),
        "secret": _Key(_check_any),
        "timeout_seconds": _Key(_check_timeout),
        "retries": _Key(_check_retries),
    },
    "chain": {"trigger_id": _Key(_check_trigger_id, required=True)},
}


def _config(action: str, config: Mapping[str, str]) -> dict[str, str]:
    spec = _ACTION_CONFIG[action]
    for key, value in config.items():
        if len(key.encode()) > _MAX_CONFIG_KEY_BYTES:
            raise InvalidArgumentError(
                f"config: key {key[:40]!r}... is over the limit of {_MAX_CONFIG_KEY_BYTES} bytes"
            )
        if len(value.encode()) > _MAX_CONFIG_VALUE_BYTES:
            raise InvalidArgumentError(
                f"config.{key}: value is over the limit of {_MAX_CONFIG_VALUE_BYTES} bytes"
            )
        if key not in spec:
            allowed = ", ".join(spec) or "none"
            raise InvalidArgumentError(
                f"config: unknown key {key[:40]!r} for action {action} (allowed: {allowed})"
            )
        spec[key].check(f"config.{key}", value)
    for key, rule in spec.items():
        if rule.required and key not in config:
            raise InvalidArgumentError(f"config.{key}: required for action {action}")
    return dict(config)


# --- back to the API ------------------------------------------------------------------------


def rule_message(rule: TriggerRule, fires: int) -> trigger_service_pb2.Trigger:
    """The API view of a rule, with how many times it has fired.

    Args:
        rule: The rule.
        fires: Its fire count so far.

    Returns:
        A ``Trigger`` that :func:`rule_from_message` turns back into the same rule.
    """
    created_at = Timestamp()
    created_at.FromNanoseconds(round(rule.created_at * 1e9))
    message = trigger_service_pb2.Trigger(
        id=rule.id,
        channel=rule.channel,
        event=trigger_service_pb2.EventKind.Value(_EVENT_PREFIX + rule.event.upper()),
        action=trigger_service_pb2.ActionKind.Value(_ACTION_PREFIX + rule.action.upper()),
        config=dict(rule.config),
        filter_pattern=rule.filter_pattern,
        max_fires=rule.max_fires,
        cooldown_seconds=rule.cooldown_seconds,
        fires=fires,
        created_at=created_at,
    )
    if rule.filter_memory_type is not None:
        message.filter_memory_type = memory_pb2.MemoryType.Value(
            _TYPE_PREFIX + rule.filter_memory_type.upper()
        )
    if rule.filter_heat_above is not None:
        message.filter_heat_above = rule.filter_heat_above
    if rule.filter_heat_below is not None:
        message.filter_heat_below = rule.filter_heat_below
    if rule.threshold is not None:
        message.threshold = rule.threshold
    return message
