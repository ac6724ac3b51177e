"""``calor serve`` as a child process for the fault tests: started on a data dir, killed
with -9 or stopped with SIGTERM, and started again on the same dir.

Its output goes through a pipe into a log file the test process writes, so a limit put
on the server's own file writes (``RLIMIT_FSIZE``) never reaches its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.server.cluster.local import free_port

SERVING = health_pb2.HealthCheckResponse.SERVING


def health(
    target: str, timeout: float = 5.0, credentials: grpc.ChannelCredentials | None = None
) -> int:
    """What the server's health service says about the whole server."""
    with (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    ) as channel:
        request = health_pb2.HealthCheckRequest(service="")
        return int(health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout).status)


class CalorProcess:
    """``calor serve --data-dir DATA_DIR`` on a free port, with ``args`` added."""

    def __init__(self, data_dir: Path, log_path: Path, *args: str) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.args = args
        self.credentials: grpc.ChannelCredentials | None = None
        """How to reach it when it serves TLS (plaintext: None)."""
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._drain: threading.Thread | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self, timeout: float = 120.0) -> float:
        """Start it on a new free port and wait until it is SERVING; returns the seconds
        that took."""
        self.port = free_port()
        command = [str(Path(sys.executable).with_name("calor")), "serve"]
        command += ["--data-dir", str(self.data_dir), "--port", str(self.port), *self.args]
        started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        assert self.process.stdout is not None
        self._drain = threading.Thread(
            target=_copy, args=(self.process.stdout, self.log_path), daemon=True
        )
        self._drain.start()
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited while starting:\n{self.log_tail()}")
            try:
                if health(self.target, 1.0, self.credentials) == SERVING:
                    return time.monotonic() - started
            except grpc.RpcError:
                pass
            if time.monotonic() - started > timeout:
                raise AssertionError(f"not SERVING after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """kill -9, and reap it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self._join()

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, and wait for it to exit; returns its exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        self._join()
        return code

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for it to exit by itself; returns its exit status."""
        assert self.process is not None
        code = self.process.wait(timeout)
        self._join()
        return code

    def close(self) -> None:
        """Kill it if it still runs (the end of a test, passed or not)."""
        if self.process is not None and self.process.poll() is None:
            self.kill()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _join(self) -> None:
        if self._drain is not None:
            self._drain.join(10)
            self._drain = None
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


def _copy(source: IO[bytes], log_path: Path) -> None:
    """Copy the server's output into the log file until the server closes it."""
    with log_path.open("ab") as log:
        for line in source:
            log.write(line)
            log.flush()
