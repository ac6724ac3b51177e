"""Concurrent clients mixing store and recall (and some Context and Identity) against a
``calor serve`` of their own, through ``bench/load.py``: no unexpected error, and every
stored memory listed and found by a recall of its text afterwards.

Only correctness is asserted, never timings (those are the bench's to report). ``make
test`` runs 8 clients for 10 s; ``make soak`` 32 clients for 60 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LOAD = Path(__file__).resolve().parents[1] / "bench" / "load.py"


def run_load(tmp_path: Path, clients: int, seconds: int) -> dict[str, object]:
    """Run the load script; its JSON report, once it exited cleanly."""
    report = tmp_path / "load.json"
    command = [sys.executable, str(LOAD), "--clients", str(clients), "--seconds", str(seconds)]
    done = subprocess.run(
        [*command, "--json", str(report)], capture_output=True, text=True, timeout=seconds + 900
    )
    print(done.stdout)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    result: dict[str, object] = json.loads(report.read_text())
    return result


def check(result: dict[str, object]) -> None:
    errors = result["errors"]
    verified = result["verified"]
    rpcs = result["rpcs"]
    assert isinstance(errors, dict) and isinstance(verified, dict) and isinstance(rpcs, dict)
    assert errors["unexpected"] == 0, errors["examples"]
    assert verified["stored"] > 0 and verified["missing"] == []
    assert set(rpcs) == {"Store", "Recall", "Context", "Identity"}
    assert result["server_exit"] == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_eight_clients_for_ten_seconds(tmp_path: Path) -> None:
    check(run_load(tmp_path, clients=8, seconds=10))


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_thirty_two_clients_for_a_minute(tmp_path: Path) -> None:
    check(run_load(tmp_path, clients=32, seconds=60))
