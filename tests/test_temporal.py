"""Tests for natural time references and the temporal boost."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from calor.server.errors import InvalidArgumentError
from calor.server.recall.temporal import TimeWindow, detect_window, temporal_boost
from tests.helpers import VECTORS

TEMPORAL = VECTORS / "temporal.json"
PHRASES = VECTORS.parent / "temporal_phrases.json"
# Thursday 2026-04-09, mid-afternoon.
NOW = datetime(2026, 4, 9, 15, 30, tzinfo=UTC)


def _cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(TEMPORAL.read_text(encoding="utf-8"))["cases"]
    return cases


def _days(query: str, now: datetime = NOW) -> tuple[str, str] | None:
    """The window's first and last day as ISO dates, for compact expectations."""
    window = detect_window(query, now)
    if window is None:
        return None
    return window.start.date().isoformat(), window.end.date().isoformat()


def _phrases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(PHRASES.read_text(encoding="utf-8"))["cases"]
    return cases


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case["query"])
def test_shared_vectors(case: dict[str, Any]) -> None:
    _check(case)


@pytest.mark.parametrize("case", _phrases(), ids=lambda case: f"{case['query']}@{case['now'][:10]}")
def test_phrases_users_say(case: dict[str, Any]) -> None:
    _check(case)


def _check(case: dict[str, Any]) -> None:
    window = detect_window(case["query"], datetime.fromisoformat(case["now"]))
    if case["start"] is None:
        assert window is None
        return
    assert window is not None
    assert window.start == datetime.fromisoformat(case["start"])
    assert window.end == datetime.fromisoformat(case["end"])
    assert window.start.tzinfo is UTC
    assert window.end.tzinfo is UTC


def test_window_bounds_are_whole_days_and_name_the_phrase() -> None:
    window = detect_window("What did we ship Yesterday?", NOW)
    assert window == TimeWindow(
        start=datetime(2026, 4, 8, tzinfo=UTC),
        end=datetime(2026, 4, 8, 23, 59, 59, tzinfo=UTC),
        phrase="Yesterday",
    )


@pytest.mark.parametrize(
    ("query", "now", "expected"),
    [
        ("last month", datetime(2026, 1, 15, tzinfo=UTC), ("2025-12-01", "2025-12-31")),
        ("this month", datetime(2024, 2, 10, tzinfo=UTC), ("2024-02-01", "2024-02-29")),
        ("this month", datetime(2026, 12, 31, tzinfo=UTC), ("2026-12-01", "2026-12-31")),
        ("2 months ago", datetime(2026, 1, 31, tzinfo=UTC), ("2025-11-01", "2025-11-30")),
        ("14 months ago", datetime(2026, 4, 9, tzinfo=UTC), ("2025-02-01", "2025-02-28")),
        # Monday 2026-04-06: last week is the whole previous week, this week starts today.
        ("last week", datetime(2026, 4, 6, 0, 0, tzinfo=UTC), ("2026-03-30", "2026-04-05")),
        ("this week", datetime(2026, 4, 6, tzinfo=UTC), ("2026-04-06", "2026-04-12")),
        # Sunday 2026-04-12 still belongs to the week that started on Monday the 6th.
        ("this week", datetime(2026, 4, 12, 23, 0, tzinfo=UTC), ("2026-04-06", "2026-04-12")),
        ("3 days ago", datetime(2026, 3, 2, tzinfo=UTC), ("2026-02-27", "2026-02-27")),
        ("1 day ago", datetime(2026, 1, 1, tzinfo=UTC), ("2025-12-31", "2025-12-31")),
        ("yesterday", datetime(2026, 3, 1, tzinfo=UTC), ("2026-02-28", "2026-02-28")),
        ("this year", NOW, ("2026-01-01", "2026-12-31")),
        ("last year", NOW, ("2025-01-01", "2025-12-31")),
    ],
)
def test_calendar_boundaries(query: str, now: datetime, expected: tuple[str, str]) -> None:
    assert _days(query, now) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("what broke two weeks ago", ("2026-03-23", "2026-03-29")),
        ("Three Days Ago", ("2026-04-06", "2026-04-06")),
        ("a week ago", ("2026-03-30", "2026-04-05")),
        ("a day ago", ("2026-04-08", "2026-04-08")),
        ("a month ago", ("2026-03-01", "2026-03-31")),
        ("one month ago", ("2026-03-01", "2026-03-31")),
        ("twelve days ago", ("2026-03-28", "2026-03-28")),
        ("eleven weeks ago", ("2026-01-19", "2026-01-25")),
        ("1 week ago", ("2026-03-30", "2026-04-05")),
        ("0 days ago", ("2026-04-09", "2026-04-09")),
    ],
)
def test_number_words_and_digits(query: str, expected: tuple[str, str]) -> None:
    assert _days(query) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # Thursday 2026-04-09: "last thursday" is a week back, never today.
        ("last thursday", ("2026-04-02", "2026-04-02")),
        ("last Wednesday", ("2026-04-08", "2026-04-08")),
        ("LAST SUNDAY", ("2026-04-05", "2026-04-05")),
        ("last friday\u2019s retro", ("2026-04-03", "2026-04-03")),
    ],
)
def test_last_weekday(query: str, expected: tuple[str, str]) -> None:
    assert _days(query) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("release 2026/03/01", ("2026-03-01", "2026-03-01")),
        ("at 2026-03-01T10:00Z", ("2026-03-01", "2026-03-01")),
        ("leap 2024-02-29", ("2024-02-29", "2024-02-29")),
        ("todays notes", ("2026-04-09", "2026-04-09")),
        ("yesterday's and yesterdays notes", ("2026-04-08", "2026-04-08")),
    ],
)
def test_dates_and_suffixes(query: str, expected: tuple[str, str]) -> None:
    assert _days(query) == expected


@pytest.mark.parametrize(
    "query",
    [
        "Deploy the server",
        "monday",
        "the monday meeting",
        "on monday",
        "this weekly report",
        "a few days ago",
        "weeks ago",
        "holiday plans",
        "2026-02-30",
        "2025-02-29",
        "2026-13-01",
        "2026-03/01",
        "build 12026-03-01",
        "",
    ],
)
def test_no_window(query: str) -> None:
    assert detect_window(query, NOW) is None


def test_first_reference_in_the_text_wins() -> None:
    assert _days("last week, or maybe yesterday") == ("2026-03-30", "2026-04-05")
    assert _days("yesterday, or maybe last week") == ("2026-04-08", "2026-04-08")
    assert _days("2026-01-05 vs today") == ("2026-01-05", "2026-01-05")


def test_an_invalid_date_does_not_hide_a_later_reference() -> None:
    assert _days("2026-02-30 or yesterday") == ("2026-04-08", "2026-04-08")


def test_now_is_read_in_utc() -> None:
    # 01:00 on the 10th in UTC+3 is still the 9th in UTC.
    now = datetime(2026, 4, 10, 1, 0, tzinfo=timezone(timedelta(hours=3)))
    assert _days("today", now) == ("2026-04-09", "2026-04-09")


def test_naive_now_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError):
        detect_window("today", datetime(2026, 4, 9))


def test_long_inputs_stay_fast() -> None:
    # Inputs that would blow up a backtracking pattern; each must finish at once.
    hostile = ["last " * 20_000, "1 " * 20_000 + "days", "2026-" * 20_000, "a " * 20_000]
    for query in hostile:
        assert detect_window(query, NOW) is None


WINDOW = TimeWindow(
    start=datetime(2026, 4, 6, tzinfo=UTC),
    end=datetime(2026, 4, 6, 23, 59, 59, tzinfo=UTC),
    phrase="last monday",
)


@pytest.mark.parametrize(
    ("created_at", "expected"),
    [
        (WINDOW.start, 0.40),
        (WINDOW.end, 0.40),
        (datetime(2026, 4, 6, 12, tzinfo=UTC), 0.40),
        (WINDOW.end + timedelta(days=3.5), 0.20),
        (WINDOW.start - timedelta(days=3.5), 0.20),
        (WINDOW.start - timedelta(days=7), 0.0),
        (WINDOW.end + timedelta(days=30), 0.0),
    ],
)
def test_boost(created_at: datetime, expected: float) -> None:
    assert temporal_boost(created_at, WINDOW) == pytest.approx(expected)


def test_boost_parameters() -> None:
    near = WINDOW.end + timedelta(days=1)
    assert temporal_boost(near, WINDOW, max_boost=1.0, fade_days=2.0) == pytest.approx(0.5)
    assert temporal_boost(near, WINDOW, fade_days=0.0) == 0.0
    assert temporal_boost(WINDOW.start, WINDOW, fade_days=0.0) == pytest.approx(0.40)


def test_boost_compares_across_timezones() -> None:
    # 22:00 on the 5th in UTC-3 is 01:00 on the 6th in UTC: inside the window.
    created = datetime(2026, 4, 5, 22, 0, tzinfo=timezone(timedelta(hours=-3)))
    assert temporal_boost(created, WINDOW) == pytest.approx(0.40)


def test_boost_and_window_reject_bad_input() -> None:
    with pytest.raises(InvalidArgumentError):
        temporal_boost(datetime(2026, 4, 6), WINDOW)
    with pytest.raises(InvalidArgumentError):
        temporal_boost(WINDOW.start, WINDOW, fade_days=-1.0)
    with pytest.raises(InvalidArgumentError):
        TimeWindow(start=WINDOW.end, end=WINDOW.start, phrase="")
    with pytest.raises(InvalidArgumentError):
        TimeWindow(start=datetime(2026, 4, 6), end=WINDOW.end, phrase="")
