"""A client in another language: Node.js (@grpc/grpc-js + @grpc/proto-loader) straight from protos/.

``make test`` installs the pinned npm packages (``npm ci`` in tests/node); without node or
those packages this test fails rather than skips.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).parent / "node"
SCRIPT = NODE_DIR / "calor_client.mjs"
REPO = Path(__file__).parent.parent


def test_node_stores_recalls_and_hears(calor_target: str, channel_name: str) -> None:
    # A short test name: the trigger id "node-notify-<channel>" must fit in 64 characters.
    node = shutil.which("node")
    assert node, "node is not on PATH; the Node.js client test needs Node.js (and npm)"
    for package in ("@grpc/grpc-js", "@grpc/proto-loader"):
        assert (NODE_DIR / "node_modules" / package / "package.json").is_file(), (
            f"{package} is missing from tests/node; `make tests/node/node_modules/.installed`"
        )

    done = subprocess.run(
        [node, str(SCRIPT), calor_target, channel_name],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, (
        f"node client exited {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    )
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line, got: {done.stdout!r}"
    summary = json.loads(lines[0])
    trigger_id = f"node-notify-{channel_name}"
    assert summary["ok"] is True
    assert summary["channel"] == channel_name
    assert summary["trigger_id"] == trigger_id
    assert summary["memory_id"]
    assert summary["heat"] == pytest.approx(1.0, abs=1e-6)  # heat is read-time: a hair under 1
    assert summary["top_hit_id"] == summary["memory_id"]
    assert summary["event_kind"] == "EVENT_KIND_NOTIFY"
    assert summary["event_trigger_id"] == trigger_id
    assert summary["event_message"] == "node saw The node client stored this memory."
