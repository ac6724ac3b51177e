"""The reuse window of Context blocks (for prompt caches): the same request gets the
byte-identical block back while nothing the block depends on changed.

A block kept here is handed back for the same channel, message and limits for the
channel's ``reuse_seconds`` unless the channel changed in a way that touches it: a
memory it shows changed what it shows or was forgotten (:func:`~calor.server.engine.
cards.shows`), or a memory arrived (``Channel.arrivals``: stored, re-embedded, back in
the live index), or the settings changed. Heat moving with time or recalls does not
count: a block shows no heat. The window is one per server, least recently used first
out, bounded in entries and in characters.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from calor.server.engine.cards import Shows, shows
from calor.server.engine.channel import Channel

__all__ = ["ReuseKey", "ReuseWindow"]

ReuseKey = tuple[str, str, int, int, int]
"""Channel, message, token budget, most memories (after the load gate), most characters."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class _Kept(Generic[_T]):
    """A block in the window, with the state of the channel it was made from."""

    value: _T
    chars: int
    made_at: float
    revision: int
    arrivals: int
    shown: tuple[tuple[str, Shows | None], ...]


class ReuseWindow(Generic[_T]):
    """Blocks recently made, by :data:`ReuseKey`; every method that names a channel
    expects the caller to hold its lock (so nothing changes it between check and use)."""

    def __init__(self, entries: int = 256, chars: int = 4_000_000) -> None:
        self._entries = entries
        self._chars = chars
        self._held = 0
        self._kept: OrderedDict[ReuseKey, _Kept[_T]] = OrderedDict()
        self._lock = threading.Lock()  # one window serves every channel

    def get(self, channel: Channel, key: ReuseKey, now: float) -> _T | None:
        """The block kept for ``key`` if it is still the channel's; a stale one is dropped."""
        with self._lock:
            kept = self._kept.get(key)
        if kept is None:
            return None
        current = now - kept.made_at < channel.policy.context.reuse_seconds and (
            kept.revision == channel.revision  # nothing at all changed
            or (
                kept.arrivals == channel.arrivals
                and all(shows(channel.records.get(i)) == was for i, was in kept.shown)
            )
        )
        with self._lock:
            if not current:
                self._drop(key)
                return None
            self._kept.move_to_end(key)
        return kept.value

    def put(
        self,
        channel: Channel,
        key: ReuseKey,
        value: _T,
        chars: int,
        shown_ids: Sequence[str],
        now: float,
    ) -> None:
        """Keep a block of ``chars`` characters that shows ``shown_ids``, made now from the
        channel as it stands; the least recently used go while the window is over its
        entries or characters (the newest always stays)."""
        shown = tuple((i, shows(channel.records.get(i))) for i in shown_ids)
        kept = _Kept(value, chars, now, channel.revision, channel.arrivals, shown)
        with self._lock:
            self._drop(key)
            self._kept[key] = kept
            self._held += chars
            while len(self._kept) > 1 and (
                len(self._kept) > self._entries or self._held > self._chars
            ):
                self._drop(next(iter(self._kept)))

    def _drop(self, key: ReuseKey) -> None:
        """Take a block out (the caller holds ``_lock``)."""
        gone = self._kept.pop(key, None)
        if gone is not None:
            self._held -= gone.chars
