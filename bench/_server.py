"""``calor serve`` as a subprocess for the benchmark: start, wait for health, measure, stop."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.server.cluster.local import free_port
from calor.v1 import memory_service_pb2_grpc as pb_grpc

READY_TIMEOUT_S = 180.0


def calor_command() -> str:
    """The ``calor`` entry point of this interpreter's environment."""
    beside = Path(sys.executable).parent / "calor"
    found = str(beside) if beside.exists() else shutil.which("calor")
    if found is None:
        raise SystemExit("cannot find the `calor` command; run `make` first")
    return found


class Server:
    """``calor serve`` as a subprocess on a free port with a fresh data dir."""

    def __init__(self, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> None:
        """Start it; ``env`` (if given) is the server's whole environment, ``args`` more
        options of ``calor serve``."""
        self.workdir = Path(tempfile.mkdtemp(prefix="calor-bench-"))
        self.data_dir = self.workdir / "data"
        self.port = free_port()
        self.log_path = self.workdir / "server.log"
        self._log = self.log_path.open("wb")
        command = [calor_command(), "serve", "--data-dir", str(self.data_dir)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *args]
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
        )
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.MemoryServiceStub(self.channel)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Poll health until SERVING; returns the seconds it took."""
        health = health_pb2_grpc.HealthStub(self.channel)
        request = health_pb2.HealthCheckRequest(service="")
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited early:\n{self.log_tail()}")
            try:
                status = health.Check(request, timeout=1.0).status
            except grpc.RpcError:
                status = health_pb2.HealthCheckResponse.UNKNOWN
            if status == health_pb2.HealthCheckResponse.SERVING:
                return time.perf_counter() - started
            time.sleep(0.1)
        raise TimeoutError(f"the server was not SERVING after {timeout:.0f} s:\n{self.log_tail()}")

    def rss_mb(self) -> float | None:
        """The server's resident memory in MB (Linux), or None."""
        return rss_mb(self.pid)

    def data_mb(self) -> float:
        """The size of the data dir in MB."""
        total = sum(p.stat().st_size for p in self.data_dir.rglob("*") if p.is_file())
        return round(total / 2**20, 1)

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        self.channel.close()
        code: int | None = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        else:
            code = self.process.returncode
        return code

    def close(self) -> None:
        """Kill whatever is left and remove the data dir."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def rss_kb(pid: int | str = "self") -> int | None:
    """A process's resident memory in KiB (Linux ``VmRSS``), or None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def rss_mb(pid: int | None) -> float | None:
    """Resident memory of a process in MB (Linux), or None."""
    kb = None if pid is None else rss_kb(pid)
    return None if kb is None else round(kb / 1024, 1)
