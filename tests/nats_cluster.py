"""Real ``nats-server`` processes with JetStream, clustered on loopback, for cluster tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.calor_process import free_port

__all__ = ["NatsCluster", "nats_server_binary"]


def nats_server_binary() -> str:
    """The ``nats-server`` executable (``make test`` installs Debian's package)."""
    found = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/bin")
    if found is None:
        raise RuntimeError("nats-server is not installed: run `make test`, which installs it")
    return found


class NatsCluster:
    """``size`` nats-server processes with JetStream, routed to each other on loopback."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root = root
        self.client_ports = [free_port() for _ in range(size)]
        self.route_ports = [free_port() for _ in range(size)]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size

    @property
    def urls(self) -> list[str]:
        """Every server's client URL."""
        return [f"nats://127.0.0.1:{port}" for port in self.client_ports]

    def start(self, timeout: float = 30.0) -> None:
        """Start every server and wait until each takes clients."""
        for number in range(len(self.client_ports)):
            self.start_server(number)
        for port in self.client_ports:
            _wait_for_port(port, timeout)

    def start_server(self, number: int) -> None:
        """Start (or restart, on its old store) server ``number``."""
        name = f"n{number}"
        config = self.root / f"{name}.conf"
        routes = ", ".join(f"nats-route://127.0.0.1:{port}" for port in self.route_ports)
        config.write_text(
            f"""
server_name: {name}
listen: 127.0.0.1:{self.client_ports[number]}
jetstream {{ store_dir: "{self.root / name}" }}
cluster {{
  name: calor-test
  listen: 127.0.0.1:{self.route_ports[number]}
  routes: [{routes}]
}}
"""
        )
        with (self.root / f"{name}.log").open("ab") as log:  # the child keeps its own copy
            self.processes[number] = subprocess.Popen(
                [nats_server_binary(), "-c", str(config)], stdout=log, stderr=subprocess.STDOUT
            )

    def kill(self, number: int) -> None:
        """``kill -9`` server ``number``."""
        process = self.processes[number]
        if process is not None:
            process.kill()
            process.wait()
            self.processes[number] = None

    def stop(self) -> None:
        """Stop every server."""
        for number in range(len(self.processes)):
            self.kill(number)


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nats-server on port {port} did not start")
