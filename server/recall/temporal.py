"""Natural time references in a recall query, turned into a UTC window and a fading boost."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from calor.server.errors import InvalidArgumentError

__all__ = ["TimeWindow", "detect_window", "temporal_boost"]

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
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

# One pattern, so re.search finds the reference that comes first in the text; where
# two start at the same word, the longer phrase is listed first ("the day before
# yesterday" before "yesterday", "last weekend" before "last week"). Every alternative
# is a fixed sequence of words; the only repetitions (\s+, [0-9]{1,4}) are bounded by
# distinct neighbours, so matching stays linear. A trailing "s"/"'s" is allowed
# ("yesterday's notes", "todays"), anything else glued on is not ("weekly").
_REFERENCE = re.compile(
    r"\b(?:"
    r"(?P<before>(?:the\s+)?day\s+before\s+yesterday)"
    r"|(?P<part>last\s+night|this\s+morning|earlier\s+today)"
    r"|(?P<weekend>(?:the|this|last)\s+weekend)"
    r"|(?P<day>today|yesterday)"
    r"|(?P<which>this|last)\s+(?P<span>week|month|year)"
    rf"|last\s+(?P<weekday>{'|'.join(_WEEKDAYS)})"
    rf"|(?P<count>{_NUMBER})\s+(?P<unit>day|week|month|year)s?\s+ago"
    rf"|in\s+(?P<month_name>{'|'.join(_MONTHS)})(?:\s+(?P<month_year>[0-9]{{4}}))?"
    r")(?:['\u2019]?s)?\b"
    r"|(?<![0-9])(?P<year>[0-9]{4})(?P<sep>[-/])(?P<month>[0-9]{1,2})(?P=sep)"
    r"(?P<dom>[0-9]{1,2})(?![0-9])",
    re.IGNORECASE,
)

_Days = tuple[date, date]
_Span = tuple[datetime, datetime]
_Groups = dict[str, str | None]
_DAY_END = time(23, 59, 59)
_SECOND = timedelta(seconds=1)


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

    Understood: today, yesterday, the day before yesterday, this/last week, this/last
    month, this/last year, last monday…sunday, N days/weeks/months/years ago (N in
    digits, "a", or one…twelve), the/this/last weekend, last night, this morning,
    earlier today, in March (or "in March 2025"), and dates written YYYY-MM-DD or
    YYYY/MM/DD. Weeks run Monday to Sunday; "N weeks ago" is the whole week N weeks
    before this one, "N months ago" the calendar month, "N years ago" the calendar
    year. "The weekend" is the latest Saturday and Sunday that have begun, "this
    weekend" the one of this week, "last weekend" the one of last week. "Last night"
    runs from 18:00 yesterday to 06:00 today, "this morning" from midnight to noon,
    "earlier today" from midnight to now. "In March" is the latest March that has
    begun (this year's from March on, else last year's). A date that does not exist
    (2026-02-30) is not a reference.

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
    utc_now = now.astimezone(UTC)
    for match in _REFERENCE.finditer(query):
        try:
            start, end = _resolve(match, utc_now)
        except (ValueError, OverflowError):
            continue  # a date that does not exist, or arithmetic past year 1..9999
        return TimeWindow(start=start, end=end, phrase=match.group(0))
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


def _resolve(match: re.Match[str], now: datetime) -> _Span:
    """Turn one matched reference into the first and last instant it names."""
    groups = match.groupdict()
    for name, resolver in _RESOLVERS:
        if groups[name] is not None:
            return resolver(groups, now)
    raise AssertionError("the reference pattern matched no named alternative")


def _whole(first: date, last: date) -> _Span:
    """The days from ``first`` to ``last``, whole."""
    return datetime.combine(first, time.min, tzinfo=UTC), datetime.combine(
        last, _DAY_END, tzinfo=UTC
    )


def _day(groups: _Groups, now: datetime) -> _Span:
    word = (groups["day"] or "").lower()
    today = now.date()
    day = today if word == "today" else today - timedelta(days=1)
    return _whole(day, day)


def _day_before_yesterday(groups: _Groups, now: datetime) -> _Span:
    day = now.date() - timedelta(days=2)
    return _whole(day, day)


def _part_of_day(groups: _Groups, now: datetime) -> _Span:
    words = " ".join((groups["part"] or "").lower().split())
    midnight = datetime.combine(now.date(), time.min, tzinfo=UTC)
    if words == "last night":
        return midnight - timedelta(hours=6), midnight + timedelta(hours=6) - _SECOND
    if words == "this morning":
        return midnight, midnight + timedelta(hours=12) - _SECOND
    return midnight, now.replace(microsecond=0)  # earlier today


def _weekend(groups: _Groups, now: datetime) -> _Span:
    which = (groups["weekend"] or "").lower().split()[0]
    today = now.date()
    saturday = today - timedelta(days=today.weekday()) + timedelta(days=5)  # this week's
    if which == "last" or (which == "the" and today < saturday):
        saturday -= timedelta(weeks=1)
    return _whole(saturday, saturday + timedelta(days=1))


def _this_or_last(groups: _Groups, now: datetime) -> _Span:
    back = 1 if (groups["which"] or "").lower() == "last" else 0
    span = (groups["span"] or "").lower()
    today = now.date()
    if span == "week":
        return _whole(*_week(today, back))
    if span == "month":
        return _whole(*_month(today, back))
    year = today.year - back
    return _whole(date(year, 1, 1), date(year, 12, 31))


def _last_weekday(groups: _Groups, now: datetime) -> _Span:
    wanted = _WEEKDAYS.index((groups["weekday"] or "").lower())
    today = now.date()
    back = (today.weekday() - wanted) % 7 or 7
    day = today - timedelta(days=back)
    return _whole(day, day)


def _ago(groups: _Groups, now: datetime) -> _Span:
    raw = (groups["count"] or "").lower()
    count = int(raw) if raw.isdigit() else _NUMBER_WORDS[raw]
    unit = (groups["unit"] or "").lower()
    today = now.date()
    if unit == "week":
        return _whole(*_week(today, count))
    if unit == "month":
        return _whole(*_month(today, count))
    if unit == "year":
        return _whole(date(today.year - count, 1, 1), date(today.year - count, 12, 31))
    day = today - timedelta(days=count)
    return _whole(day, day)


def _in_month(groups: _Groups, now: datetime) -> _Span:
    month = _MONTHS.index((groups["month_name"] or "").lower()) + 1
    written = groups["month_year"]
    year = int(written) if written else now.year - (1 if month > now.month else 0)
    first = date(year, month, 1)
    return _whole(*_month(first, 0))


def _iso_date(groups: _Groups, now: datetime) -> _Span:
    day = date(int(groups["year"] or ""), int(groups["month"] or ""), int(groups["dom"] or ""))
    return _whole(day, day)


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


_RESOLVERS: tuple[tuple[str, Callable[[_Groups, datetime], _Span]], ...] = (
    ("before", _day_before_yesterday),
    ("part", _part_of_day),
    ("weekend", _weekend),
    ("day", _day),
    ("which", _this_or_last),
    ("weekday", _last_weekday),
    ("count", _ago),
    ("month_name", _in_month),
    ("year", _iso_date),
)
