"""A whole cluster on one machine: ``nats-server`` processes with JetStream, clustered on
loopback, and ``calor serve --cluster`` nodes on them (``make cluster``; the cluster
tests start their NATS servers with :class:`NatsServers` too).

    python -m calor.server.cluster.local [--nodes 3] [--dir ~/.calor/cluster] [--port 50051]

runs until Ctrl-C or SIGTERM, then stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import nats
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats.errors import Error as NatsError
from nats.js.api import ClusterInfo

__all__ = [
    "LocalCluster",
    "NatsServers",
    "free_port",
    "kill9",
    "nats_server_binary",
    "start_node",
    "wait_for_port",
    "wait_until_serving",
]

NATS_SERVERS = 3
_START_ATTEMPTS = 3
"""Times :meth:`NatsServers.start` picks free ports again when a server could not bind
one (another process took it between the pick and the bind)."""


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nats_server_binary() -> str:
    """The ``nats-server`` executable: the virtualenv's (``make test`` and ``make
    cluster`` unpack Debian's package there), else one on the ``PATH``."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/bin")
    if found is None:
        raise RuntimeError("nats-server is not installed: `make nats-server` installs it")
    return found


class NatsServers:
    """``size`` nats-server processes with JetStream, routed to each other on loopback,
    each keeping its JetStream store under ``root``."""

    def __init__(self, root: Path, size: int = NATS_SERVERS, first_port: int = 0) -> None:
        self.root = root
        self._ports_given = bool(first_port)
        if first_port:
            self.client_ports = [first_port + n for n in range(size)]
            self.route_ports = [first_port + 2000 + n for n in range(size)]
        else:
            self._pick_ports(size)
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size

    @property
    def urls(self) -> list[str]:
        """Every server's client URL."""
        return [f"nats://127.0.0.1:{port}" for port in self.client_ports]

    def start(self, timeout: float = 60.0) -> None:
        """Start every server and wait until each takes clients and JetStream answers
        (the servers have elected their meta leader)."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for attempt in range(1, _START_ATTEMPTS + 1):
                for number in range(len(self.client_ports)):
                    self.start_server(number)
                if self._listening(timeout):
                    break
                self.stop()
                if self._ports_given or attempt == _START_ATTEMPTS:
                    raise TimeoutError(f"a NATS server could not start: see its log in {self.root}")
                for number in range(len(self.client_ports)):  # a fresh start on fresh ports
                    shutil.rmtree(self.root / f"n{number}", ignore_errors=True)
                self._pick_ports(len(self.client_ports))
            asyncio.run(self._jetstream_ready(timeout))
        except BaseException:
            self.stop()  # none left running behind a failed start
            raise

    def _pick_ports(self, size: int) -> None:
        self.client_ports = [free_port() for _ in range(size)]
        self.route_ports = [free_port() for _ in range(size)]

    def _listening(self, timeout: float) -> bool:
        """Wait until every server listens for clients and routes; False as soon as one
        has exited instead (a port it was given was taken)."""
        deadline = time.monotonic() + timeout
        for number, process in enumerate(self.processes):
            for port in (self.client_ports[number], self.route_ports[number]):
                while not _accepts(port):
                    if process is None or process.poll() is not None:
                        return False
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"nothing listens on port {port}")
                    time.sleep(0.1)
        return all(process is not None and process.poll() is None for process in self.processes)

    async def _jetstream_ready(self, timeout: float) -> None:
        client = await nats.connect(self.urls)
        try:
            give_up = time.monotonic() + timeout
            while True:
                try:
                    await client.jetstream(timeout=2.0).account_info()
                    return
                except (NatsError, TimeoutError):
                    if time.monotonic() > give_up:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await client.close()

    def wait_whole(self, timeout: float = 60.0) -> None:
        """Wait until every stream has a leader and every one of its replicas is
        current (a restarted server caught up): the cluster can lose a server again
        without losing a stream's quorum."""
        asyncio.run(self._whole(timeout))

    async def _whole(self, timeout: float) -> None:
        client = await nats.connect(self.urls)
        try:
            js, give_up = client.jetstream(timeout=2.0), time.monotonic() + timeout
            while True:
                try:
                    streams = await js.streams_info()
                    if all(_whole(stream.cluster) for stream in streams):
                        return
                except (NatsError, TimeoutError):
                    pass
                if time.monotonic() > give_up:
                    raise TimeoutError(f"JetStream not whole again within {timeout} s")
                await asyncio.sleep(0.2)
        finally:
            await client.close()

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
  name: calor
  listen: 127.0.0.1:{self.route_ports[number]}
  routes: [{routes}]
}}
"""
        )
        with (self.root / f"{name}.log").open("ab") as log:  # the child keeps its own copy
            # A session of its own: Ctrl-C reaches the nodes, which stop on it while NATS
            # is still there (their leases given up); the NATS servers stop after them.
            self.processes[number] = subprocess.Popen(
                [nats_server_binary(), "-c", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self, number: int) -> None:
        """``kill -9`` server ``number``."""
        kill9(self.processes, number)

    def stop(self) -> None:
        """Stop every server."""
        for number in range(len(self.processes)):
            self.kill(number)


class LocalCluster:
    """``size`` Calor nodes (``node-0``, ...) on ``NATS_SERVERS`` NATS servers, all under
    ``root``: each node keeps its data in ``root/node-N`` and logs to
    ``root/node-N.log``."""

    def __init__(self, root: Path, size: int = 3, *, first_port: int = 0, nats_port: int = 0):
        self.root = root
        self.nats = NatsServers(root / "nats", first_port=nats_port)
        ports = range(first_port, first_port + size) if first_port else range(size)
        self.ports = list(ports) if first_port else [free_port() for _ in ports]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size
        self.options: list[str] = []
        """Further ``calor serve`` options for every node."""

    def targets(self) -> list[str]:
        """Every node's ``host:port``."""
        return [f"127.0.0.1:{port}" for port in self.ports]

    def start(self) -> None:
        """Start the NATS servers, then every node; wait until each serves."""
        self.nats.start()
        for number in range(len(self.ports)):
            self.start_node(number, wait=False)
        for port in self.ports:
            wait_until_serving(port, 120.0)

    def start_node(self, number: int, *, wait: bool = True) -> None:
        """Start (or restart, on its old data) node ``number``; with ``wait``, until it
        serves (it joined the cluster: it answers, or forwards to the owners)."""
        name = f"node-{number}"
        self.processes[number] = start_node(
            self.nats.urls,
            name,
            self.ports[number],
            self.root / name,
            self.root / f"{name}.log",
            *self.options,
        )
        if wait:
            wait_until_serving(self.ports[number], 120.0)

    def kill_node(self, number: int) -> None:
        """``kill -9`` node ``number``."""
        kill9(self.processes, number)

    def live(self) -> list[int]:
        """The nodes running now."""
        return [n for n, process in enumerate(self.processes) if process is not None]

    def exited(self) -> list[int]:
        """The nodes that exited without being killed here."""
        return [n for n, p in enumerate(self.processes) if p is not None and p.poll() is not None]

    def stop(self) -> None:
        """Stop every node (SIGTERM; -9 after 30 s), then the NATS servers."""
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for number, process in enumerate(self.processes):
            if process is not None:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    self.kill_node(number)
        self.nats.stop()


def kill9(processes: list[subprocess.Popen[bytes] | None], number: int) -> None:
    """``kill -9`` ``processes[number]`` if it runs, reap it, and mark it gone (None)."""
    process = processes[number]
    if process is not None:
        process.kill()
        process.wait()
        processes[number] = None


def start_node(
    urls: Sequence[str], name: str, port: int, data_dir: Path, log_path: Path, *options: str
) -> subprocess.Popen[bytes]:
    """``calor serve --cluster`` as node ``name`` on ``port``, logging to ``log_path``."""
    calor = str(Path(sys.executable).with_name("calor"))
    command = [calor, "serve", "--cluster", ",".join(urls), "--node-id", name]
    command += ["--port", str(port), "--data-dir", str(data_dir), *options]
    with log_path.open("ab") as log:  # the child keeps its own copy
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def wait_for_port(port: int, timeout: float) -> None:
    """Wait until something listens on ``port`` (TimeoutError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _accepts(port):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port}")


def _accepts(port: int) -> bool:
    """Whether something on loopback takes a connection on ``port`` now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def wait_until_serving(port: int, timeout: float) -> None:
    """Wait until the node on ``port`` says SERVING to a health check (TimeoutError after
    ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                # The health stubs declare HealthStub without its methods.
                answer = health.Check(  # type: ignore[attr-defined, unused-ignore]
                    health_pb2.HealthCheckRequest(), timeout=1.0
                )
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass  # not listening yet
            time.sleep(0.1)
    raise TimeoutError(f"the node on port {port} did not serve within {timeout} s")


def _whole(cluster: ClusterInfo | None) -> bool:
    """Whether a stream has a leader and each of its other replicas is current."""
    return cluster is None or (
        bool(cluster.leader)
        and all(peer.current and not peer.offline for peer in cluster.replicas or [])
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run NATS servers and Calor nodes until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3, help="Calor nodes (default 3)")
    parser.add_argument(
        "--dir", type=Path, default=Path.home() / ".calor" / "cluster", help="where they keep data"
    )
    parser.add_argument("--port", type=int, default=50051, help="the first node's port")
    parser.add_argument("--nats-port", type=int, default=4222, help="the first NATS port")
    parser.add_argument("--shards", type=int, default=3, help="the cluster's shards (default 3)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.dir, args.nodes, first_port=args.port, nats_port=args.nats_port)
    cluster.options = ["--shards", str(args.shards)]
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        cluster.start()
        urls = ",".join(cluster.nats.urls)
        print(f"NATS JetStream (write logs, leases, events, snapshots): {urls}")
        for number, target in enumerate(cluster.targets()):
            print(f"calor node-{number}: {target}  (log {args.dir / f'node-{number}.log'})")
        print(
            f"Any node takes any call: the channels are spread over {args.shards} shards, "
            "each owned by one node, and a call reaches its channel's owner."
        )
        print(f"Try: calor --target {cluster.targets()[-1]} store 'hello from the cluster'")
        print("Ctrl-C stops them all.", flush=True)
        while not stopping.wait(0.5):
            if cluster.exited():
                print("a Calor node exited; see its log", file=sys.stderr)
                return 1
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
