"""Per-action trigger config: which keys each action takes, and what each value may be."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from calor.server.errors import InvalidArgumentError
from calor.triggers.templates import check_template
from calor.triggers.webhook_targets import parse_url

__all__ = ["REDACTED", "TRIGGER_ID", "redact_config", "validate_config"]

REDACTED = "[redacted]"
"""What the API shows in place of a write-only config value."""
_WRITE_ONLY = frozenset({"secret"})  # a webhook's signing key: given once, never shown
TRIGGER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
"""What a trigger id is: 1-64 letters, digits or ``_.:-``, starting with a letter or digit."""

_MAX_CONFIG_KEY_BYTES = 256
_MAX_CONFIG_VALUE_BYTES = 2048
_MAX_TAG_BYTES = 256
_MAX_WEBHOOK_TIMEOUT = 60.0
_MAX_WEBHOOK_RETRIES = 10
_BOOST_TARGETS = ("memory", "neighbours")


# --- validation: per-action config ----------------------------------------------------------

_Check = Callable[[str, str], None]
"""Validates one config value; called with the field label (``config.url``) and the value."""


@dataclass(frozen=True)
class _Key:
    check: _Check
    required: bool = False


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
    # Well formed only: whether the host may be reached is the server's allow-list,
    # checked when the trigger is created (TriggerService) and again at delivery.
    try:
        parse_url(value)
    except ValueError as exc:
        raise InvalidArgumentError(f"{label}: {exc}") from None


def _check_secret(label: str, value: str) -> None:
    # Any value within the shared size limits, except the placeholder a listing shows:
    # a trigger copied from a listing would otherwise sign with a well-known key.
    if value == REDACTED:
        raise InvalidArgumentError(f"{label}: give the secret itself, not {REDACTED}")


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
    if TRIGGER_ID.fullmatch(value) is None:
        raise InvalidArgumentError(
            f"{label}: {value[:40]!r} is not a trigger id (1-64 letters, digits or _.:-, "
            "starting with a letter or digit): the id of a trigger of this channel"
        )


def _check_chain_channel(label: str, value: str) -> None:
    # Only that it is there: that it is the trigger's own channel is checked where the
    # caller's grants are known (TriggerService).
    if not value:
        raise InvalidArgumentError(f"{label}: must not be empty (leave it out: the trigger's own)")


_ACTION_CONFIG: Mapping[str, Mapping[str, _Key]] = {
    "notify": {"message": _Key(check_template)},
    "boost": {"delta": _Key(_check_delta), "target": _Key(_check_target)},
    "pin": {},
    "tag": {
        "key": _Key(_check_tag_key, required=True),
        "value": _Key(_check_tag_value, required=True),
    },
    "deprecate": {},
    "webhook": {
        "url": _Key(_check_url, required=True),
        "secret": _Key(_check_secret),
        "timeout_seconds": _Key(_check_timeout),
        "retries": _Key(_check_retries),
    },
    # The target is a trigger of the chain's own channel; ``channel`` may say so.
    "chain": {
        "trigger_id": _Key(_check_trigger_id, required=True),
        "channel": _Key(_check_chain_channel),
    },
}


def validate_config(action: str, config: Mapping[str, str]) -> dict[str, str]:
    """The config of a rule of this action, checked key by key (INVALID_ARGUMENT if not)."""
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


def redact_config(config: Mapping[str, str]) -> dict[str, str]:
    """A rule's config as the API shows it: write-only values (a webhook's ``secret``) are
    replaced by :data:`REDACTED`, so that no reply ever carries them."""
    return {key: REDACTED if key in _WRITE_ONLY else value for key, value in config.items()}
