"""Tests for the CLI's progress bar."""

from __future__ import annotations

import io

from calor.client import _progress
from calor.client._progress import Progress


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _frames(output: str) -> list[str]:
    return [frame.rstrip(" \n") for frame in output.split("\r")[1:]]


def test_draws_count_total_bar_rate_and_time_left() -> None:
    out, clock = io.StringIO(), FakeClock()
    with Progress(10, label="import", stream=out, force=True, width=10, clock=clock) as bar:
        clock.now += 2.0
        bar.update(4)
    frames = _frames(out.getvalue())
    assert frames[0] == "import  [..........]  0/10    0%  0.0/s"
    assert frames[1] == "import  [####......]  4/10   40%  2.0/s  eta 0:03"
    assert out.getvalue().endswith("\n")


def test_redraws_at_most_ten_times_a_second() -> None:
    out, clock = io.StringIO(), FakeClock()
    with Progress(1000, stream=out, force=True, clock=clock) as bar:
        for _ in range(100):
            clock.now += 0.01  # a hundred items in one second
            bar.update()
    frames = _frames(out.getvalue())
    assert 10 <= len(frames) <= 13  # the first, about ten, and the last
    assert "100/1,000" in frames[-1]
    assert "100.0/s" in frames[-1] or "100/s" in frames[-1]


def test_the_last_item_is_always_drawn() -> None:
    out, clock = io.StringIO(), FakeClock()
    with Progress(3, stream=out, force=True, clock=clock) as bar:
        bar.update()
        bar.update()
        bar.update()
        assert "3/3" in _frames(out.getvalue())[-1]
        assert "100%" in _frames(out.getvalue())[-1]


def test_unknown_total_shows_count_and_rate_and_the_total_can_come_later() -> None:
    out, clock = io.StringIO(), FakeClock()
    with Progress(label="export", stream=out, force=True, clock=clock) as bar:
        clock.now += 0.5
        bar.update(1500)
        assert _frames(out.getvalue())[-1] == "export  1,500  3,000/s"
        bar.set_total(3000)
        clock.now += 0.5
        bar.update(1500)
    assert "[########################]  3,000/3,000  100%" in _frames(out.getvalue())[-1]


def test_a_shorter_line_wipes_the_longer_one_before_it() -> None:
    out, clock = io.StringIO(), FakeClock()
    with Progress(100, stream=out, force=True, clock=clock, width=4) as bar:
        clock.now += 1.0
        bar.update(50)  # shows "eta 0:01"
        clock.now += 1.0
        bar.update(50)  # done: no eta, so the line is shorter
    start, half, done, final = out.getvalue().split("\r")[1:]
    assert half.endswith("  eta 0:01")
    text = "[####]  100/100  100%  50.0/s"
    assert done == text + " " * (len(half) - len(text))
    assert final == "[####]  100/100  100%  50.0/s\n"


def test_nothing_is_written_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress(5, stream=out) as bar:
        assert not bar.enabled
        bar.update(5)
    assert out.getvalue() == ""
    assert bar.count == 5


def test_close_is_idempotent_and_runs_on_errors() -> None:
    out = io.StringIO()
    try:
        with Progress(2, stream=out, force=True, clock=FakeClock()) as bar:
            bar.update()
            raise KeyError("stop")
    except KeyError:
        pass
    bar.close()
    assert out.getvalue().count("\n") == 1
    assert "1/2" in _frames(out.getvalue())[-1]


def test_zero_total_reads_as_done() -> None:
    out = io.StringIO()
    with Progress(0, stream=out, force=True, width=2, clock=FakeClock()):
        pass
    assert _frames(out.getvalue())[-1] == "[##]  0/0  100%  0.0/s"


def test_public_surface() -> None:
    assert _progress.__all__ == ["Progress", "following", "polled"]
