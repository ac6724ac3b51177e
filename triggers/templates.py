"""Notify message templates: ``{name}`` placeholders from a fixed set, nothing else."""

from __future__ import annotations

import re
from collections.abc import Mapping

from calor.server.errors import InvalidArgumentError

__all__ = ["MAX_TEMPLATE_CHARS", "MESSAGE_FIELDS", "check_template", "render_message"]

MESSAGE_FIELDS = ("memory_id", "channel", "text", "heat", "memory_type", "event", "trigger_id")
MAX_TEMPLATE_CHARS = 1000
_TEMPLATE_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def check_template(label: str, value: str) -> None:
    """Reject a template with unknown placeholders, stray braces, or too many characters."""
    if len(value) > MAX_TEMPLATE_CHARS:
        raise InvalidArgumentError(
            f"{label}: {len(value)} characters is over the limit of {MAX_TEMPLATE_CHARS}"
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
