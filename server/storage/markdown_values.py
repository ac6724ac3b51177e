"""The values of the Markdown format's metadata lines: formatted for export, parsed on import."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from calor.server.ids import is_valid_id
from calor.server.thermo.heat import MEMORY_TYPES, SOURCE_TRUST

__all__ = [
    "format_tags",
    "format_time",
    "parse_bool",
    "parse_confidence",
    "parse_id",
    "parse_importance",
    "parse_source",
    "parse_tags",
    "parse_time",
    "parse_type",
    "title",
]

_CONFIDENCES = ("observed", "inferred", "asserted")
_TITLE_CHARS = 60
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BOOLS = {
    "yes": True, "true": True, "on": True, "1": True,
    "no": False, "false": False, "off": False, "0": False,
}  # fmt: skip
_ESCAPES = {"\\": "\\\\", ",": "\\,", "=": "\\=", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNESCAPES = {"n": "\n", "r": "\r", "t": "\t"}


# ---------------------------------------------------------------------------- formatting


def title(text: str) -> str:
    """The first non-blank line, whitespace collapsed, cut to about 60 characters."""
    for line in text.split("\n"):
        words = line.split()
        if words:
            collapsed = " ".join(words)
            if len(collapsed) <= _TITLE_CHARS:
                return collapsed
            return collapsed[: _TITLE_CHARS - 1] + "…"
    return "(blank)"


def format_time(at: float) -> str:
    """UTC ISO 8601 with a Z; microseconds only when the time has a fraction of a second."""
    try:
        moment = (_EPOCH + timedelta(seconds=at)).replace(tzinfo=None)
    except OverflowError:  # a hair past 9999-12-31T23:59:59 once rounded to microseconds
        moment = datetime.max if at > 0 else datetime.min
    return moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds") + "Z"


def _escape_tag(value: str) -> str:
    body = value.strip(" ")
    if not body:
        return "\\ " * len(value)
    # Unescaped spaces at either end are trimmed on reading, so those are escaped.
    lead = len(value) - len(value.lstrip(" "))
    trail = len(value) - len(value.rstrip(" "))
    return "\\ " * lead + "".join(_ESCAPES.get(char, char) for char in body) + "\\ " * trail


def format_tags(tags: dict[str, str]) -> str:
    """Tags as ``key=value, key=value``, with ``\\ , = `` and line breaks escaped."""
    return ", ".join(f"{_escape_tag(key)}={_escape_tag(value)}" for key, value in tags.items())


# ---------------------------------------------------------------------------- parsing


def parse_id(value: str) -> str | None:
    """A memory id, or None when blank; raises ValueError for anything else."""
    text = value.strip(" \t")
    if text and not is_valid_id(text):
        raise ValueError(f"{text!r} is not a memory id")
    return text or None


def parse_type(value: str) -> str | None:
    """A memory type name (``MEMORY_TYPE_`` prefix allowed), or None when blank/unspecified."""
    name = value.strip(" \t").lower().removeprefix("memory_type_")
    if name in ("", "unspecified"):
        return None
    if name not in MEMORY_TYPES:
        raise ValueError(f"{value.strip()!r} is not a memory type ({', '.join(MEMORY_TYPES)})")
    return name


def parse_bool(value: str) -> bool:
    """yes/no, true/false, on/off or 1/0, in any case."""
    word = value.strip(" \t").lower()
    if word not in _BOOLS:
        raise ValueError(f"{value.strip()!r} is not yes or no")
    return _BOOLS[word]


def parse_time(value: str) -> float | None:
    """An ISO 8601 time as epoch seconds (UTC when it names no zone), or None when blank."""
    text = value.strip(" \t")
    if not text:
        return None
    if text.endswith("z"):
        text = text[:-1] + "Z"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time such as 2026-03-01T09:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    # Exact: timedelta division is integer microseconds over 10**6, correctly rounded.
    return (moment - _EPOCH) / timedelta(seconds=1)


def parse_importance(value: str) -> float | None:
    """A number in [0, 1], or None when blank."""
    text = value.strip(" \t")
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise ValueError(f"{text} is not a number in [0, 1]")
    return number


def _choice(names: tuple[str, ...], prefix: str) -> Callable[[str], str | None]:
    def parse(value: str) -> str | None:
        name = value.strip(" \t").lower().removeprefix(prefix)
        if name in ("", "unspecified"):
            return None
        if name not in names:
            raise ValueError(f"{value.strip()!r} is not one of {', '.join(names)}")
        return name

    return parse


parse_source: Callable[[str], str | None] = _choice(tuple(SOURCE_TRUST), "source_")
"""A source name (``SOURCE_`` prefix allowed), or None when blank/unspecified."""

parse_confidence: Callable[[str], str | None] = _choice(_CONFIDENCES, "confidence_")
"""A confidence name (``CONFIDENCE_`` prefix allowed), or None when blank/unspecified."""


def _unescape(text: str) -> list[tuple[str, bool]]:
    """Characters of a tags value, each marked True when it was escaped with a backslash."""
    chars: list[tuple[str, bool]] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\":
            chars.append((char, False))
        elif index + 1 == len(text):
            raise ValueError("a backslash at the end escapes nothing")
        else:
            index += 1
            chars.append((_UNESCAPES.get(text[index], text[index]), True))
        index += 1
    return chars


def _split(chars: list[tuple[str, bool]], sep: str) -> list[list[tuple[str, bool]]]:
    parts: list[list[tuple[str, bool]]] = [[]]
    for char, escaped in chars:
        if char == sep and not escaped:
            parts.append([])
        else:
            parts[-1].append((char, escaped))
    return parts


def _trimmed(chars: list[tuple[str, bool]]) -> str:
    """The characters joined, unescaped spaces and tabs at either end dropped."""
    start, end = 0, len(chars)
    while start < end and chars[start][0] in " \t" and not chars[start][1]:
        start += 1
    while end > start and chars[end - 1][0] in " \t" and not chars[end - 1][1]:
        end -= 1
    return "".join(char for char, _ in chars[start:end])


def parse_tags(value: str) -> dict[str, str]:
    """``key=value, key=value`` with backslash escapes; empty items are skipped."""
    tags: dict[str, str] = {}
    for item in _split(_unescape(value), ","):
        if not _trimmed(item) and not any(escaped for _, escaped in item):
            continue  # an empty item, e.g. after a trailing comma
        equals = next((i for i, (c, escaped) in enumerate(item) if c == "=" and not escaped), -1)
        if equals < 0:
            raise ValueError(
                f"{_trimmed(item)!r} has no '=' (write key=value; escape , = \\ with \\)"
            )
        key = _trimmed(item[:equals])
        if not key.strip():
            raise ValueError("a tag key is empty")
        tags[key] = _trimmed(item[equals + 1 :])
    return tags
