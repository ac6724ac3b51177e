"""The named migrations that bring a store written by an older schema version up to
date at open; the store records each under ``meta:migrations``."""

from __future__ import annotations

import json
from collections.abc import Callable

import rocksdict

from calor.server.storage.keys import Keys
from calor.server.storage.trigger_keys import triggers_by_channel

__all__ = ["migrate"]

# A migration brings a store from the version before it to its own: (version, name, step).
_Migration = tuple[int, str, Callable[[rocksdict.Rdict], None]]


def _cursor_as_json(db: rocksdict.Rdict) -> None:
    """Version 2: the trigger cursor, once a bare sequence number, becomes JSON."""
    saved = db.get(Keys.CURSOR)
    if saved is not None and not bytes(saved).startswith(b"{"):
        db.put(Keys.CURSOR, json.dumps({"seq": int(saved), "done": []}).encode())


MIGRATIONS: list[_Migration] = [
    (2, "cursor_as_json", _cursor_as_json),
    (4, "triggers_by_channel", triggers_by_channel),
]


def migrate(db: rocksdict.Rdict, version: int) -> list[str]:
    """Run the migrations after ``version`` in order; the names of every migration the
    store went through, these last, for the store to record with its new version.

    Each migration is idempotent, so a crash before the record is written repeats it.
    """
    done: list[str] = json.loads(db.get(Keys.MIGRATIONS) or b"[]")
    for target, name, step in MIGRATIONS:
        if target > version:
            step(db)
            done.append(name)
    return done
