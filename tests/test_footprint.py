"""What the server holds in memory stays in proportion: memory freed after big builds goes
back to the operating system, a server process keeps to two malloc arenas, and RocksDB's
recent writes are held in small memtables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import rocksdict

from calor.server import heap
from calor.server.storage.keys import Keys
from calor.server.storage.ops import ChangeList, PutKey
from calor.server.storage.store import MemoryStore


def resident_heap_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(heap._trim is None, reason="the C library has no malloc_trim")
def test_freed_memory_scattered_through_the_heap_is_given_back() -> None:
    """What a channel load leaves: many blocks freed, a few kept between them, so the
    allocator cannot shrink its heap from the top and keeps the pages by itself."""
    blocks = [bytes(2048) for _ in range(100_000)]  # about 200 MB, one malloc each
    kept = blocks[::50]
    del blocks
    before = resident_heap_kb()
    heap.release()
    given_back_mb = (before - resident_heap_kb()) / 1024
    assert given_back_mb > 100, f"only {given_back_mb:.0f} MB of about 195 freed went back"
    assert len(kept) == 2_000


def test_recent_writes_are_held_in_small_memtables_also_in_a_store_made_before(
    tmp_path: Path,
) -> None:
    made = rocksdict.Options(raw_mode=True)  # RocksDB's defaults: 64 MB memtables
    made.create_if_missing(True)
    rocksdict.Rdict(str(tmp_path / "rocksdb"), made).close()
    store = MemoryStore.open(tmp_path, model_id="m", dim=4)
    try:
        for batch in range(40):  # 40 MB of writes
            ops = [
                PutKey(Keys.CURSOR + b"%d:%d" % (batch, i), os.urandom(1024)) for i in range(1024)
            ]
            store.write([ChangeList("c", list(ops))])
        held = int(store._db.property_value("rocksdb.cur-size-all-mem-tables"))
        assert held <= 2 * 8 * 1024 * 1024, f"{held / 2**20:.0f} MB of writes held in memtables"
    finally:
        store.close()


def test_a_write_bigger_than_a_memtable_is_not_left_in_memory(tmp_path: Path) -> None:
    """A bulk store is one batch, which RocksDB takes whole into one memtable: it is
    written to a table file at once rather than held until later writes fill it."""
    store = MemoryStore.open(tmp_path, model_id="m", dim=4)
    try:
        ops = [PutKey(Keys.CURSOR + b"%d" % i, os.urandom(1024)) for i in range(20 * 1024)]
        store.write([ChangeList("c", list(ops))])  # 20 MB in one batch
        held = int(store._db.property_value("rocksdb.cur-size-all-mem-tables"))
        assert held < 1024 * 1024, f"{held / 2**20:.0f} MB of one write held in memtables"
        assert store.get(Keys.CURSOR + b"7") is not None, "and it is all there"
    finally:
        store.close()


_COUNT_ARENAS = """
import ctypes, ctypes.util, os, sys, tempfile, threading
from calor.server import heap
print(heap.limit_arenas())
def work():
    kept = [bytearray(512) for _ in range(2_000)]  # each thread's own small allocations
    barrier.wait()
barrier = threading.Barrier(8)
threads = [threading.Thread(target=work) for _ in range(8)]
for thread in threads: thread.start()
for thread in threads: thread.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
path = os.path.join(tempfile.mkdtemp(), "info.xml")
out = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, out)
libc.fclose(out)
print(open(path).read().count("<heap nr="))
"""


@pytest.mark.skipif(heap._trim is None, reason="not glibc")
@pytest.mark.parametrize("given", [None, "6"])
def test_a_server_process_keeps_to_two_malloc_arenas_unless_told_otherwise(
    given: str | None,
) -> None:
    """Memory a thread frees stays in its own arena: eight threads' work spread over
    eight arenas stays resident eight times over. A server keeps to two, unless
    MALLOC_ARENA_MAX says how many."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if given is not None:
        env["MALLOC_ARENA_MAX"] = given
    run = subprocess.run(
        [sys.executable, "-c", _COUNT_ARENAS], env=env, capture_output=True, text=True, check=True
    )
    limited, arenas = run.stdout.split()
    if given is None:
        assert limited == "True" and int(arenas) <= heap.ARENAS
    else:
        assert limited == "False" and heap.ARENAS < int(arenas) <= int(given)
