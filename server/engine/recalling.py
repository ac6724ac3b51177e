"""Recall (DESIGN §5): a query's hits from the caller's channel and any it names, and
what recalling them does (bumps, resonance, the recall log), written in one batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from calor.server.clock import Clock
from calor.server.commands import RecallQuery
from calor.server.engine.changes import changing
from calor.server.engine.channel import Channel
from calor.server.engine.recall_effects import heated, recall_effects
from calor.server.engine.recall_log import (
    ForeignHit,
    RecallEntry,
    RecallLog,
)
from calor.server.engine.registry import ChannelRegistry
from calor.server.engine.results import Current, RecallResult
from calor.server.errors import ResourceExhaustedError
from calor.server.events import memory_event
from calor.server.recall.ranking import Hit, rank_channel, recall_window
from calor.server.recall.temporal import TimeWindow
from calor.server.records import MemoryRecord
from calor.server.stages import stage
from calor.server.storage.store import MemoryStore
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.gates import load_limit
from calor.server.thermo.lifecycle import Clocks

__all__ = ["Recaller"]

# At most this many warmed neighbours are named in an on_recall event, for the decay
# scheduler; warmth only delays a crossing, so an unnamed one is rescheduled when its
# old crossing comes due.
_RESONATED_LOGGED = 64


class Recaller:
    """Every channel's recalls (the engine's :meth:`MemoryEngine.recall`)."""

    def __init__(
        self,
        store: MemoryStore,
        clock: Clock,
        channels: ChannelRegistry,
        recall_log: RecallLog,
        migrate_due: Callable[[Channel], None],
    ) -> None:
        self._store = store
        self._clock = clock
        self._channels = channels
        self._recall_log = recall_log
        self._migrate_due = migrate_due
        """Persists what fell due in a channel before it is ranked (the caller holds its
        lock)."""

    def recall(
        self,
        query: RecallQuery,
        query_vector: np.ndarray,
        inflight: int = 1,
        foreign: Sequence[ForeignHit] = (),
        room: Callable[[Sequence[Hit | ForeignHit]], int] | None = None,
    ) -> RecallResult:
        """Rank the memories of the caller's channel (and any it names) for a query.

        Unless ``peek``, the returned memories of the caller's own channel whose band
        reaches the channel's ``heat_min_band`` are recalled (heat bumped, stability
        multiplied, count raised) and their heat resonates to their neighbours: an
        unrelated hit that only fills ``limit`` is not rewarded (relevance before heat).
        The recall itself still warms the channel and counts as an interaction; all
        written before it answers, and on disk moments later (``storage.wal_sync``).
        ``min_band`` leaves out hits below that band.
        Every hit returned is logged, in the same batch, under a new recall id that
        feedback names (``recall_id``; empty for a peek, which logs nothing).
        A channel never written to is read as an empty one and stays unwritten (and
        its recall, logging nothing, has no recall id).
        ``inflight`` counts the calls the server is serving, this one included (the
        load gate reads it). ``foreign`` are the hits of named channels that other
        shards hold (cluster mode), ranked there: they take their place among this
        store's hits, and are returned and logged like them. ``room`` says how many of
        the best hits one answer can carry (the server's message limit): the rest are
        left out before anything is recalled or logged (``RecallResult.truncated``).

        Raises:
            ResourceExhaustedError: Not even the best hit fits in one answer.
        """
        now = self._clock.now()
        window = recall_window(query, now)
        policy = self._channels.policy(query.channel)
        limit = load_limit(policy, query.limit, inflight)
        hits: list[Hit] = []
        own = self._channels.find(query.channel)
        if own is None:
            if not query.peek:
                ChannelState().check_ceiling(policy, now)
        else:
            with own.lock:
                if not query.peek:
                    own.state.check_ceiling(policy, now)
                self._migrate_due(own)
                hits.extend(self._rank(own, query, query_vector, window, limit, mine=True))
        for name in query.channels:
            other = self._channels.find(name)
            if other is not None:
                with other.lock:
                    hits.extend(self._rank(other, query, query_vector, window, limit, mine=False))
        ranked: list[Hit | ForeignHit] = [*hits, *foreign]
        ranked.sort(key=_rank_order)
        best = ranked[:limit]
        carried = len(best) if room is None else room(best)
        if best and carried == 0:
            raise ResourceExhaustedError(
                "the best hit alone is larger than one answer may be (the server's "
                "--max-message-bytes); nothing was recalled"
            )
        kept = [
            replace(h, record=h.record.copy()) if isinstance(h, Hit) else h for h in best[:carried]
        ]
        recall_id = ""
        if not query.peek and own is not None:
            entry = RecallEntry.new(kept, own.name, self._channels.policy, now)
            recall_id = entry.recall_id
            mine = [h for h in kept if isinstance(h, Hit) and h.record.channel == own.name]
            with own.lock:
                self.recalled(own, mine, entry)
        memories = [self._current(h.record) if isinstance(h, Hit) else None for h in kept]
        return RecallResult(kept, window, memories, recall_id, carried < len(best))

    def _current(self, record: MemoryRecord) -> Current:
        """A memory of a hit as it stands now."""
        view = self._channels.find(record.channel)
        assert view is not None  # a hit comes from a channel that exists
        return view.current(record)

    def _rank(
        self,
        channel: Channel,
        query: RecallQuery,
        vector: np.ndarray,
        window: TimeWindow | None,
        limit: int,
        mine: bool,
    ) -> list[Hit]:
        """The best ``limit`` hits of the channel's live index, and its attic when asked
        (their words weighed by what both hold, so that their scores compare)."""
        indexes = (channel.index, channel.attic) if query.include_archived else (channel.index,)
        return rank_channel(
            indexes,
            channel.records,
            channel.policy,
            query,
            vector,
            window,
            channel.clocks(),
            mine,
            limit,
        )

    def recalled(self, channel: Channel, hits: list[Hit], entry: RecallEntry) -> None:
        """Bump the relevant hits (:func:`heated`), spread their heat, warm the channel,
        and log the recall (``entry``, every hit it returned); one batch."""
        policy = channel.policy
        clocks = Clocks(self._clock.now(), channel.state.interactions + 1)
        with stage("heat effects"):
            effects = recall_effects(channel, heated(hits, policy), policy, clocks)
        # Heat effects answer before the disk has them (synced within moments after:
        # wal_sync.py); a crash of the server loses none of them.
        with stage("commit"), changing(self._store, channel, synced=False) as change:
            for record in effects.changed.values():
                change.put(record)
            change.set_heats(effects.warmed, clocks.now, clocks.interactions)
            warm = sorted({*effects.changed, *effects.warmed} - set(effects.recalled))
            warmed = ",".join(warm[:_RESONATED_LOGGED])
            for memory_id in effects.recalled:
                record = effects.changed[memory_id]
                change.log(
                    memory_event("on_recall", record, clocks.now, record.heat0, resonated=warmed)
                )
            change.set_state(effects.state)
            change.keep(self._recall_log.writes(channel.name, entry))
        for hit in hits:
            if hit.record.id in effects.changed:
                hit.record = replace(effects.changed[hit.record.id])


def _rank_order(hit: Hit | ForeignHit) -> tuple[float, str]:
    """Where a hit ranks among a recall's hits (best first, ties by memory id)."""
    return hit.order if isinstance(hit, ForeignHit) else (-hit.score, hit.record.id)
