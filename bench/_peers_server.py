"""``calor serve`` for the peers bench: ``bench/_server.py``'s subprocess, restartable on
the same data dir, with the server's own time for each call read from its request log."""

from __future__ import annotations

import json
import subprocess
import time

import grpc
from _server import Server

from calor.server.metrics import data_bytes
from calor.v1 import memory_service_pb2_grpc as pb_grpc

RECALL_RPC = "calor.v1.MemoryService/Recall"


class PeerServer(Server):
    """A bench server that can be stopped and started again on the same data and port."""

    def restart(self) -> float:
        """Start the stopped server again with the same command (same data dir, same
        port); returns the seconds from spawning the process to health SERVING."""
        if self.process.poll() is None:
            raise RuntimeError("restart() needs the server stopped first")
        command = [str(arg) for arg in self.process.args]  # type: ignore[union-attr]
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.MemoryServiceStub(self.channel)
        self.wait_ready()
        return time.perf_counter() - started

    def data_bytes(self) -> int:
        """The data dir's size on disk (apparent sizes of its files), in bytes."""
        return int(data_bytes(self.data_dir))

    def call_ms(self, rpc: str = RECALL_RPC) -> list[float]:
        """The server's own milliseconds for every ``rpc`` call so far, in log order
        (from the handler's start to its end: no network, no client-side conversion).
        Empty when the log is not in JSON lines."""
        self._log.flush()
        times: list[float] = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if rpc not in line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("rpc") == rpc and "ms" in entry:
                times.append(float(entry["ms"]))
        return times
