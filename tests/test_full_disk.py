"""A full disk: writes are refused with RESOURCE_EXHAUSTED (never UNKNOWN or INTERNAL),
reads go on, and once space is freed the store opens cleanly with every acknowledged
write in it and none of the refused ones.

Two ways to fill it, each a real error from the kernel: a small tmpfs filled up by a
file (ENOSPC; needs the right to mount, so root), and a file size limit put on the
running server (``prlimit RLIMIT_FSIZE``: EFBIG, which Python's own SIGXFSZ handling
turns into an error rather than a signal; any Linux user).
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import grpc
import pytest

from calor.models.embedder import OnnxEmbedder
from calor.server.storage.consistency import Checker, open_offline
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.calor_process import SERVING, CalorProcess, health

CHANNEL = "disk"
DELETED = memory_pb2.MEMORY_STATE_DELETED
ALL_STATES = [s for s in memory_pb2.MemoryState.values() if s]
REFUSED = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}
TMPFS_BYTES = 16 * 2**20

pytestmark = pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="Linux only")


class Disk(Protocol):
    """Where the data dir lives, and how to fill it up under a running server."""

    path: Path

    def fill(self, server: CalorProcess) -> None: ...

    def free(self, server: CalorProcess) -> None: ...


class Tmpfs:
    """A small tmpfs of its own, filled up by a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._filler = path / "filler"

    def fill(self, server: CalorProcess) -> None:
        with self._filler.open("wb", buffering=0) as filler:
            for chunk in (2**20, 4096, 1):  # down to the last byte
                with contextlib.suppress(OSError):
                    while True:
                        filler.write(b"\0" * chunk)

    def free(self, server: CalorProcess) -> None:
        self._filler.unlink()


class FileSizeLimit:
    """No file of the running server may grow any more: RLIMIT_FSIZE set to 0."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self, server: CalorProcess) -> None:
        resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))

    def free(self, server: CalorProcess) -> None:
        unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        resource.prlimit(server.pid, resource.RLIMIT_FSIZE, unlimited)


@pytest.fixture(params=["tmpfs", "file-size-limit"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk]:
    path = tmp_path / "disk"
    path.mkdir()
    if request.param == "file-size-limit":
        yield FileSizeLimit(path)
        return
    mount = ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(path)]
    try:
        mounted = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    except OSError as error:
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield Tmpfs(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def refused(call: object, *args: object) -> str:
    """Make the call; it must fail as a full disk should. Returns the status's name."""
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, timeout=30)  # type: ignore[operator]
    error = caught.value
    assert error.code() in REFUSED, f"{error.code().name}: {error.details()}"
    return str(error.code().name)


def every_memory(memories: MemoryServiceStub) -> dict[str, memory_pb2.Memory]:
    """Every memory of the channel, forgotten ones included, by id."""
    request = pb.ListMemoriesRequest(channel=CHANNEL, page_size=1000, states=ALL_STATES)
    return {m.id: m for m in memories.ListMemories(request, timeout=30).memories}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_full_disk_refuses_writes_and_loses_nothing(
    disk: Disk, tmp_path: Path, embedder: OnnxEmbedder
) -> None:
    data_dir = disk.path / "data"
    server = CalorProcess(data_dir, tmp_path / "server.log")
    server.start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            memories = MemoryServiceStub(channel)
            kept: dict[str, str] = {}
            for n in range(4):
                text = f"kept note {n}: the lighthouse keeper logs the weather at six."
                reply = memories.Store(pb.StoreRequest(channel=CHANNEL, text=text), timeout=30)
                kept[reply.memory.id] = text
            streamed = [f"streamed note {n}: the ferry leaves from pier four." for n in range(3)]
            requests = [
                pb.StoreStreamRequest(store=pb.StoreRequest(channel=CHANNEL, text=t))
                for t in streamed
            ]
            kept.update(
                zip(memories.StoreStream(iter(requests), timeout=30).ids, streamed, strict=True)
            )
            first = next(iter(kept))

            disk.fill(server)
            # The write-ahead log's last page may still have room for a store or two:
            # what is acknowledged now is kept like the rest.
            for n in range(10):
                probe = f"probe note {n}: squeezed into the last page of the log."
                try:
                    reply = memories.Store(pb.StoreRequest(channel=CHANNEL, text=probe), timeout=30)
                except grpc.RpcError as error:
                    assert error.code() in REFUSED, f"{error.code().name}: {error.details()}"
                    break
                kept[reply.memory.id] = probe
            else:
                raise AssertionError("ten stores went through on a full disk")
            lost = [f"refused note {n}: written while the disk was full." for n in range(3)]
            codes = [
                refused(memories.Store, pb.StoreRequest(channel=CHANNEL, text=lost[0])),
                refused(
                    memories.StoreStream,
                    iter(
                        pb.StoreStreamRequest(store=pb.StoreRequest(channel=CHANNEL, text=t))
                        for t in lost[1:]
                    ),
                ),
                refused(memories.Update, pb.UpdateRequest(channel=CHANNEL, id=first, text="no")),
                refused(memories.Boost, pb.BoostRequest(channel=CHANNEL, id=first, delta=0.1)),
                refused(memories.Forget, pb.ForgetRequest(channel=CHANNEL, ids=[first])),
            ]
            # Reads go on: health, a recall that changes nothing, a listing, one memory, the
            # channel's status, an export.
            assert health(server.target) == SERVING
            query = pb.RecallRequest(channel=CHANNEL, query="lighthouse weather", peek=True)
            assert memories.Recall(query, timeout=30).hits
            assert {i: m.text for i, m in every_memory(memories).items()} == kept
            inspect = pb.InspectRequest(channel=CHANNEL, id=first)
            assert memories.Inspect(inspect, timeout=30).memory.text == kept[first]
            identity = memories.Identity(pb.IdentityRequest(channel=CHANNEL), timeout=30)
            assert identity.total == len(kept)
            export = memories.Export(pb.ExportRequest(channel=CHANNEL), timeout=30)
            assert sum(page.memories for page in export) == len(kept)
            disk.free(server)
        assert server.stop() == 0, server.log_tail()

        server.start()  # the same data dir, with room again
        with grpc.insecure_channel(server.target) as channel:
            memories = MemoryServiceStub(channel)
            found = every_memory(memories)
            assert {i: m.text for i, m in found.items()} == kept  # nothing refused is there
            assert all(m.state != DELETED for m in found.values())
            after = pb.StoreRequest(channel=CHANNEL, text="written once the disk had room again")
            assert memories.Store(after, timeout=30).memory.id
        assert server.stop() == 0, server.log_tail()
    finally:
        server.close()

    store = open_offline(data_dir, model_id=embedder.model_id, dim=embedder.dim)
    try:
        assert Checker(store).run() == []
    finally:
        store.close()
    print(f"\nfull disk ({type(disk).__name__}): writes answered {sorted(set(codes))}")
