"""Natural time references in a recall query, turned into a UTC window and a fading boost."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from calor.server.errors import InvalidArgumentError

__all__ = ["TimeWindow", "detect_window", "temporal_boost"]

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
# Longest words first so that alternation never settles on a prefix ("a" before "an").
_NUMBER = "[0-9]{1,3}|" + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))

# One pattern, so re.search finds the reference that comes first in the text. Every
# alternative is a fixed sequence of words; the only repetitions (\s+, [0-9]{1,3}) are
# bounded by distinct neighbours, so matching stays linear. A trailing "s"/"'s" is
# allowed ("yesterday's notes", "todays"), anything else glued on is not ("weekend").
_REFERENCE = re.compile(
    r"\b(?:"
    r"(?P<day>today|yesterday)"
    r"|(?P<which>this|last)\s+(?P<span>week|month|year)"
    rf"|last\s+(?P<weekday>{'|'.join(_WEEKDAYS)})"
    rf"|(?P<count>{_NUMBER})\s+(?P<unit>day|week|month)s?\s+ago"
    r")(?:['\u2019]?s)?\b"
    r"|(?<![0-9])(?P<year>[0-9]{4})(?P<sep>[-/])(?P<month>[0-9]{1,2})(?P=sep)"
    r"(?P<dom>[0-9]{1,2})(?![0-9])",
    re.IGNORECASE,
)

_Days = tuple[date, date]


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """A closed time window that recall boosts memories from.

    Attributes:
        start: First instant of the window, timezone-aware (UTC for detected windows).
        end: Last instant of the window, inclusive (23:59:59 of the last day).
        phrase: The words of the query the window came from, as written; empty when
            the window was given explicitly.
    """

    start: datetime
    end: datetime
    phrase: str

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise InvalidArgumentError("time window bounds must be timezone-aware")
        if self.start > self.end:
            raise InvalidArgumentError("time window starts after it ends")


def detect_window(query: str, now: datetime) -> TimeWindow | None:
    """Find the first natural time reference in ``query`` and resolve it against ``now``.

    Understood: today, yesterday, this/last week, this/last month, this/last year,
    last monday…sunday, N days/weeks/months ago (N in digits, "a", or one…twelve),
    and dates written YYYY-MM-DD or YYYY/MM/DD. Weeks run Monday to Sunday; "N weeks
    ago" is the whole week N weeks before this one, "N months ago" the calendar month.
    A date that does not exist (2026-02-30) is not a reference.

    Args:
        query: The recall query, in any case.
        now: The current instant, timezone-aware; the calendar is read in UTC.

    Returns:
        The window in UTC, or None when the query names no time.

    Raises:
        InvalidArgumentError: If ``now`` is naive.
    """
    if now.tzinfo is None:
        raise InvalidArgumentError("now must be timezone-aware")
    today = now.astimezone(UTC).date()
    for match in _REFERENCE.finditer(query):
        try:
            days = _resolve(match, today)
        except (ValueError, OverflowError):
            continue  # a date that does not exist, or arithmetic past year 1..9999
        first, last = days
        return TimeWindow(
            start=datetime.combine(first, time.min, tzinfo=UTC),
            end=datetime.combine(last, time(23, 59, 59), tzinfo=UTC),
            phrase=match.group(0),
        )
    return None


def temporal_boost(
    created_at: datetime,
    window: TimeWindow,
    max_boost: float = 0.40,
    fade_days: float = 7.0,
) -> float:
    """Score how close a memory's creation time is to the window the query named.

    Memories made inside the window get the full boost; outside it the boost fades
    linearly with the distance to the nearest edge and is gone ``fade_days`` away, so
    a reference that is off by a day or two still helps.

    Args:
        created_at: When the memory was made, timezone-aware.
        window: The window from ``detect_window`` or from an explicit time range.
        max_boost: The boost inside the window.
        fade_days: How many days outside the window the boost takes to reach zero.

    Returns:
        A boost between 0 and ``max_boost``.

    Raises:
        InvalidArgumentError: If ``created_at`` is naive or a parameter is negative.
    """
    if created_at.tzinfo is None:
        raise InvalidArgumentError("created_at must be timezone-aware")
    if max_boost < 0 or fade_days < 0:
        raise InvalidArgumentError("max_boost and fade_days must not be negative")
    if window.start <= created_at <= window.end:
        return max_boost
    edge = window.start if created_at < window.start else window.end
    distance_days = abs((created_at - edge).total_seconds()) / 86400.0
    if distance_days >= fade_days:
        return 0.0
    return max_boost * (1.0 - distance_days / fade_days)


def _resolve(match: re.Match[str], today: date) -> _Days:
    """Turn one matched reference into its first and last day."""
    groups = match.groupdict()
    for name, resolver in _RESOLVERS:
        if groups[name] is not None:
            return resolver(groups, today)
    raise AssertionError("the reference pattern matched no named alternative")


def _day(groups: dict[str, str | None], today: date) -> _Days:
    word = (groups["day"] or "").lower()
    day = today if word == "today" else today - timedelta(days=1)
    return day, day


def _this_or_last(groups: dict[str, str | None], today: date) -> _Days:
    back = 1 if (groups["which"] or "").lower() == "last" else 0
    span = (groups["span"] or "").lower()
    if span == "week":
        return _week(today, back)
    if span == "month":
        return _month(today, back)
    year = today.year - back
    return date(year, 1, 1), date(year, 12, 31)


def _last_weekday(groups: dict[str, str | None], today: date) -> _Days:
    wanted = _WEEKDAYS.index((groups["weekday"] or "").lower())
    back = (today.weekday() - wanted) % 7 or 7
    day = today - timedelta(days=back)
    return day, day


def _ago(groups: dict[str, str | None], today: date) -> _Days:
    raw = (groups["count"] or "").lower()
    count = int(raw) if raw.isdigit() else _NUMBER_WORDS[raw]
    unit = (groups["unit"] or "").lower()
    if unit == "week":
        return _week(today, count)
    if unit == "month":
        return _month(today, count)
    day = today - timedelta(days=count)
    return day, day


def _iso_date(groups: dict[str, str | None], today: date) -> _Days:
    day = date(int(groups["year"] or ""), int(groups["month"] or ""), int(groups["dom"] or ""))
    return day, day


def _week(today: date, back: int) -> _Days:
    """The Monday–Sunday week ``back`` weeks before the one holding ``today``."""
    monday = today - timedelta(days=today.weekday(), weeks=back)
    return monday, monday + timedelta(days=6)


def _month(today: date, back: int) -> _Days:
    """The calendar month ``back`` months before the one holding ``today``."""
    index = today.year * 12 + today.month - 1 - back
    first = date(index // 12, index % 12 + 1, 1)
    following = date(first.year + first.month // 12, first.month % 12 + 1, 1)
    return first, following - timedelta(days=1)


_RESOLVERS: tuple[tuple[str, Callable[[dict[str, str | None], date], _Days]], ...] = (
    ("day", _day),
    ("which", _this_or_last),
    ("weekday", _last_weekday),
    ("count", _ago),
    ("year", _iso_date),
)
