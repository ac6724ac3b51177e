"""Progress that tells the truth (issue 35, point 4): a StoreStream or Import that names a
progress token is counted by the server as it reads, embeds and stores, ``Progress``
reads the counts while the call runs, and ``calor import`` draws its bar from them."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest

from calor.client import CalorClient, InvalidArgumentError, NotFoundError, _progress
from calor.server.engine.dream_report import DREAM_STEPS
from calor.v1 import memory_service_pb2 as pb
from tests.helpers import Run

NOTES = 3_000


def _notes(count: int) -> str:
    return "".join(
        f"- Note {n}: the shipment to depot {n % 97} left on time.\n" for n in range(count)
    )


def _watch(client: CalorClient, token: str, seen: list[pb.ProgressResponse]) -> threading.Event:
    """Poll the write's progress into ``seen`` until the returned event is set."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                seen.append(client.progress(token))
            except NotFoundError:
                pass  # the server has not read the first message yet
            time.sleep(0.02)

    threading.Thread(target=poll, daemon=True).start()
    return stop


def test_an_import_is_counted_as_the_server_embeds_it(client: CalorClient) -> None:
    seen: list[pb.ProgressResponse] = []
    stop = _watch(client, "import-3000", seen)
    ids = client.import_markdown(_notes(NOTES), progress_token="import-3000")
    stop.set()
    assert len(ids) == NOTES
    moving = sorted({p.embedded for p in seen if 0 < p.embedded < NOTES})
    assert len(moving) >= 2, f"the count moved through the embedding: {moving}"
    assert all(p.embedded <= max(p.received, p.total) for p in seen)
    assert {p.phase for p in seen} <= {"receiving", "embedding", "storing", "done"}
    final = client.progress("import-3000")
    assert (final.phase, final.received, final.embedded, final.stored, final.total) == (
        "done",
        NOTES,
        NOTES,
        NOTES,
        NOTES,
    )


def test_a_stream_is_counted_and_a_failed_import_says_so(client: CalorClient) -> None:
    ids = client.store_many([f"Reading {n} from the hallway sensor." for n in range(300)],
                            progress_token="stream-300")  # fmt: skip
    done = client.progress("stream-300")
    assert (done.phase, done.stored, done.total) == ("done", len(ids), 300)
    with pytest.raises(InvalidArgumentError):
        client.import_markdown(_notes(10) + "- \x00\n", progress_token="bad-one")
    assert client.progress("bad-one").phase == "failed"
    with pytest.raises(NotFoundError):
        client.progress("never-named")
    with pytest.raises(InvalidArgumentError, match="progress_token"):
        client.progress("not a token!")
    with pytest.raises(NotFoundError):
        client.progress("stream-300", channel=client.channel + "-other")


def test_calor_import_draws_the_servers_count(
    calor: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text(_notes(NOTES), encoding="utf-8")
    monkeypatch.setattr(_progress, "_is_terminal", lambda stream: True)
    status, out, err = calor("import", str(notes))
    assert (status, out.strip()) == (0, f"imported {NOTES} memories")
    lines = [line.strip() for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines[-1].startswith(f"import (done)  [{'#' * 24}]  {NOTES:,}/{NOTES:,}  100%")
    embedding = [line for line in lines if line.startswith("import (embedding)")]
    assert embedding, "the bar showed the embedding while it ran"


def test_piped_calor_import_draws_nothing(calor: Run, tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text(_notes(50), encoding="utf-8")
    status, _, err = calor("import", str(notes))
    assert (status, err) == (0, "")


def test_a_dream_tells_the_step_under_way(client: CalorClient) -> None:
    client.store_many(
        [f"Reading {n} from the hallway sensor: {20 + n % 7} degrees." for n in range(200)]
    )
    seen: list[pb.ProgressResponse] = []
    stop = _watch(client, "dream-1", seen)
    client.dream(progress_token="dream-1")
    stop.set()
    final = client.progress("dream-1")
    assert (final.phase, final.step, final.steps) == ("done", len(DREAM_STEPS), len(DREAM_STEPS))
    assert {p.phase for p in seen} <= {"waiting", "done", *DREAM_STEPS}
    steps = [p.step for p in seen]
    assert steps == sorted(steps)
    for progress in seen:  # a step's name goes with its number
        if progress.phase in DREAM_STEPS:
            assert DREAM_STEPS.index(progress.phase) + 1 == progress.step


def test_calor_dream_draws_its_steps_on_a_terminal_only(
    calor: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert calor("store", "The boiler was serviced in March.")[0] == 0
    status, out, err = calor("dream")
    assert status == 0 and out.startswith("migrated ") and err == ""
    monkeypatch.setattr(_progress, "_is_terminal", lambda stream: True)
    status, out, err = calor("dream")
    assert status == 0 and out.startswith("migrated ")
    last = err.replace("\r", "\n").strip().splitlines()[-1].strip()
    steps = len(DREAM_STEPS)
    assert last.startswith(f"dream (done)  [{'#' * 24}]  {steps}/{steps}  100%  0:0")
    assert "/s" not in last  # steps take unequal times: no rate, no time left


def test_a_bar_shows_what_another_thread_counts() -> None:
    stream = io.StringIO()
    ticks = iter([0.0, 2.0, 2.0, 4.0, 4.0])
    bar = _progress.Progress(label="import", stream=stream, force=True, clock=lambda: next(ticks))
    with bar:
        bar.show(500, 1000, "embedding")
        assert (
            bar.line(2.0)
            == "import (embedding)  [############............]  500/1,000   50%  250/s  eta 0:02"
        )
