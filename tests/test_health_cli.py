"""``calor health``: exit 0 when the server answers SERVING, 1 when it is loading, stopping
or unreachable; what the image's HEALTHCHECK runs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from calor.client.cli import main
from calor.models.embedder import OnnxEmbedder
from calor.server.clock import SystemClock
from calor.server.config import ServerConfig
from tests.conftest import ServerThread


def health(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["health", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_serving_server_exits_0(calor_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert health(capsys, "--target", calor_target) == (0, f"{calor_target}: SERVING\n", "")
    status, out, _ = health(capsys, "--target", calor_target, "--json")
    assert status == 0 and json.loads(out) == {"status": "SERVING"}


def test_the_installed_command_answers_as_a_health_check_would(calor_target: str) -> None:
    calor = Path(sys.executable).with_name("calor")
    done = subprocess.run(
        [str(calor), "health", "--target", calor_target, "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"{calor_target}: SERVING")


def test_nothing_listening_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status, out, err = health(capsys, "--target", f"127.0.0.1:{port}", "--timeout", "5")
    assert (status, out) == (1, "")
    assert "UNAVAILABLE" in err


def test_a_loading_server_exits_1(
    embedder: OnnxEmbedder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Until the model and the indexes are loaded, health answers NOT_SERVING."""
    release = threading.Event()

    def slow_model() -> OnnxEmbedder:
        release.wait(30)
        return embedder

    config = ServerConfig(data_dir=tmp_path, host="127.0.0.1", port=0)
    server = ServerThread(config, SystemClock(), slow_model, wait_ready=False)
    try:
        status, out, err = health(capsys, "--target", server.target)
        assert (status, out) == (1, "")
        assert "NOT_SERVING" in err
        release.set()
        server.call(server.server.ready())
        assert health(capsys, "--target", server.target)[0] == 0
    finally:
        release.set()
        server.stop()


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "soon"])
def test_a_bad_timeout_is_a_usage_error(timeout: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "--timeout", timeout]) == 2
    assert "--timeout" in capsys.readouterr().err
