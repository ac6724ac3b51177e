"""Who holds a store's RocksDB lock: the words for a data directory another process has
open (RocksDB locks its LOCK file with ``fcntl``; Linux names the holder in /proc/locks)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["in_use", "lock_holder"]


def in_use(path: Path) -> str:
    """Why the store in ``path`` cannot be opened: who holds its RocksDB lock."""
    lock = path / "rocksdb" / "LOCK"
    holder = lock_holder(lock)
    if holder == os.getpid():
        who = "this process holds"
    elif holder is not None:
        who = f"process {holder} holds"
    else:
        who = "another process holds"
    return (
        f"the data directory {path} is in use: {who} its RocksDB lock ({lock}), and a "
        "store is opened by one process at a time: stop that one (a running `calor "
        "serve`?), or point --data-dir elsewhere"
    )


def lock_holder(lock: Path) -> int | None:
    """The process holding the POSIX lock on ``lock``, as ``/proc/locks`` names it
    (RocksDB locks its LOCK file with ``fcntl``); None where that cannot be told."""
    try:
        found = os.stat(lock)
        with open("/proc/locks", encoding="ascii") as locks:
            lines = locks.read().splitlines()
    except OSError:  # no such file, or no /proc (not Linux)
        return None
    # A line: "1: POSIX  ADVISORY  WRITE 3890 fe:00:2147198 0 EOF" (a waiter has "->").
    where = (os.major(found.st_dev), os.minor(found.st_dev), found.st_ino)
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            held = (int(major, 16), int(minor, 16), int(inode))
            pid = int(fields[4])
        except ValueError:  # a line of another shape: not the lock looked for
            continue
        if held == where and pid > 0:  # 0 or less: a holder outside our pid namespace
            return pid
    return None
