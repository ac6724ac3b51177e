"""The values of the Markdown format's metadata lines: formatted for export, parsed on import."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_FLOOR, Decimal

from calor.server.ids import is_valid_id
from calor.server.thermo.graph import EDGE_KINDS, Edge
from calor.server.thermo.heat import MEMORY_TYPES, SOURCE_TRUST

__all__ = [
    "LinkTo",
    "format_edges",
    "format_number",
    "format_tags",
    "format_text",
    "format_time",
    "format_times",
    "parse_bool",
    "parse_confidence",
    "parse_count",
    "parse_edges",
    "parse_id",
    "parse_ids",
    "parse_importance",
    "parse_integer",
    "parse_signed_unit",
    "parse_source",
    "parse_stability",
    "parse_state",
    "parse_tags",
    "parse_text",
    "parse_time",
    "parse_times",
    "parse_type",
    "parse_unit",
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
# The fraction of the seconds of an ISO time (``09:00:00.25``), read apart to be exact.
_FRACTION_RE = re.compile(r"(?<=:[0-9]{2})[.,]([0-9]+)")
# The states a memory can be exported in; a forgotten one has no text to export.
_STATES = ("active", "cold", "archived", "ghost", "merged")


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
    """UTC ISO 8601 with a Z, exact: the fraction of a second has as many digits as the
    float needs to read back as itself (none for a whole second)."""
    exact = Decimal(repr(float(at)))
    whole = exact.to_integral_value(rounding=ROUND_FLOOR)
    try:
        moment = (_EPOCH + timedelta(seconds=int(whole))).replace(tzinfo=None)
    except OverflowError:  # past 9999-12-31T23:59:59 (or before year 1): the last moment
        last = datetime.max if at > 0 else datetime.min
        return last.isoformat(timespec="microseconds" if last.microsecond else "seconds") + "Z"
    fraction = exact - whole
    digits = format(fraction, "f")[2:].rstrip("0") if fraction else ""
    return moment.isoformat(timespec="seconds") + (f".{digits}" if digits else "") + "Z"


def format_times(times: Iterable[float]) -> str:
    """Times as ``format_time`` writes them, separated by commas."""
    return ", ".join(format_time(at) for at in times)


def format_number(value: float) -> str:
    """A float as the shortest text that reads back as the same float."""
    return repr(float(value))


def format_text(value: str) -> str:
    """One free-text value (a session name) escaped as a tag value is."""
    return _escape_tag(value)


def format_names(names: Iterable[str]) -> str:
    """Free-text names (entities) separated by commas, each escaped as a tag value is."""
    return ", ".join(_escape_tag(name) for name in names)


def format_edges(edges: Iterable[Edge]) -> str:
    """Edges as ``TO_ID kind weight``, separated by commas."""
    return ", ".join(f"{e.to_id} {e.kind} {format_number(e.weight)}" for e in edges)


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
    # The fraction is read apart: datetime keeps microseconds, an export writes the digits
    # its float needs (a time.time() has seven), and whole + fraction rounds once, exactly.
    fraction = _FRACTION_RE.search(text)
    whole_text = text if fraction is None else text[: fraction.start()] + text[fraction.end() :]
    try:
        moment = datetime.fromisoformat(whole_text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time such as 2026-03-01T09:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = (moment - _EPOCH) // timedelta(seconds=1)
    if fraction is None:
        return float(seconds)
    return float(Decimal(seconds) + Decimal("0." + fraction[1]))


def parse_times(value: str) -> tuple[float, ...]:
    """Times separated by commas (blank items skipped)."""
    times = []
    for item in value.split(","):
        at = parse_time(item)
        if at is not None:
            times.append(at)
    return tuple(times)


def _number(low: float, high: float, span: str) -> Callable[[str], float | None]:
    """A parser of numbers in [low, high] (``span`` says which in error messages)."""

    def parse(value: str) -> float | None:
        text = value.strip(" \t")
        if not text:
            return None
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        if not math.isfinite(number) or not low <= number <= high:
            raise ValueError(f"{text} is not a number {span}")
        return number

    return parse


parse_unit: Callable[[str], float | None] = _number(0.0, 1.0, "in [0, 1]")
"""A number in [0, 1], or None when blank."""

parse_importance = parse_unit

parse_signed_unit: Callable[[str], float | None] = _number(-1.0, 1.0, "in [-1, 1]")
"""A number in [-1, 1] (valence, an importance adjustment), or None when blank."""

parse_stability: Callable[[str], float | None] = _number(math.ulp(0.0), math.inf, "above 0")
"""A stability: a finite number above 0, or None when blank."""


def parse_integer(value: str) -> int | None:
    """A whole number (of either sign), or None when blank."""
    text = value.strip(" \t")
    if not text:
        return None
    if not re.fullmatch(r"[+-]?[0-9]{1,18}", text):
        raise ValueError(f"{text!r} is not a whole number")
    return int(text)


def parse_count(value: str) -> int | None:
    """A whole number of at least 0, or None when blank."""
    number = parse_integer(value)
    if number is not None and number < 0:
        raise ValueError(f"{number} is below 0")
    return number


def parse_ids(value: str) -> tuple[str, ...]:
    """Memory ids separated by commas (blank items skipped)."""
    return tuple(i for item in value.split(",") if (i := parse_id(item)) is not None)


def parse_state(value: str) -> str:
    """A memory state an export holds (``MEMORY_STATE_`` prefix allowed)."""
    name = value.strip(" \t").lower().removeprefix("memory_state_")
    if name not in _STATES:
        raise ValueError(
            f"{value.strip()!r} is not a state a memory is exported in ({', '.join(_STATES)})"
        )
    return name


@dataclass(frozen=True)
class LinkTo:
    """An edge as a memory section names it: the other memory, the kind, the weight."""

    to_id: str
    kind: str
    weight: float


def parse_edges(value: str) -> tuple[LinkTo, ...]:
    """Edges as ``TO_ID kind weight``, separated by commas (blank items skipped)."""
    edges = []
    for item in value.split(","):
        words = item.split()
        if not words:
            continue
        if len(words) != 3:
            raise ValueError(f"{item.strip()!r} is not an edge (write ID kind weight)")
        to_id, kind, weight = words
        if parse_id(to_id) is None:
            raise ValueError(f"{to_id!r} is not a memory id")
        if kind.lower() not in EDGE_KINDS:
            raise ValueError(f"{kind!r} is not an edge kind ({', '.join(EDGE_KINDS)})")
        number = parse_unit(weight)
        assert number is not None  # the word is not blank
        edges.append(LinkTo(to_id, kind.lower(), number))
    return tuple(edges)


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


def parse_text(value: str) -> str:
    """One free-text value, escaped as :func:`format_text` writes it."""
    return _trimmed(_unescape(value))


def parse_names(value: str) -> tuple[str, ...]:
    """Names as :func:`format_names` writes them (blank items skipped)."""
    return tuple(name for item in _split(_unescape(value), ",") if (name := _trimmed(item)))


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
