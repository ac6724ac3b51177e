"""What falls due in a channel by itself, persisted on time: state changes reached by decay
(with their ``on_decay`` events), the consolidation sweep a channel owes, and the dream
its curator's schedule owes (:mod:`calor.server.engine.due` says when)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from calor.server.clock import Clock
from calor.server.engine.changes import changing
from calor.server.engine.channel import Channel
from calor.server.engine.registry import ChannelRegistry
from calor.server.events import EventRecord, memory_event
from calor.server.records import ACTIVE, MemoryRecord
from calor.server.storage.store import MemoryStore
from calor.server.thermo.lifecycle import Clocks, current_heat
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["Upkeep"]


class Upkeep:
    """Every channel's due changes. ``dream(channel, cold_only)`` dreams over a channel;
    ``background(work)`` runs work off the caller's thread."""

    def __init__(
        self,
        store: MemoryStore,
        clock: Clock,
        channels: ChannelRegistry,
        dream: Callable[[str, bool], object],
        background: Callable[[Callable[[], object]], object],
    ) -> None:
        self._store = store
        self._clock = clock
        self._channels = channels
        self._dream = dream
        self._background = background

    def migrate_due(self, channel: Channel) -> None:
        """Persist the state changes whose moment has come (COLD, cold storage, ghosts),
        and count a consolidation sweep when enough memories turned cold."""
        policy = channel.policy
        clocks = channel.clocks()
        due = channel.due_transitions()
        sweep = channel.cold_since_sweep >= policy.cold_count_trigger
        if not due and not sweep:
            return
        state = replace(channel.state, sweeps=channel.state.sweeps + 1) if sweep else None
        with changing(self._store, channel) as change:
            for record in due:
                change.put(record)
                before = channel.records[record.id].state
                if record.state != before:
                    change.log(_transition_event(record, before, policy, clocks))
            if state is not None:
                change.set_state(state)
        if state is not None:
            # The consolidation sweep: the cold memories' heat and states are now
            # materialised and due migrations done (above); a dream over the cold
            # memories follows, off this call (DESIGN §6).
            name = channel.name
            self._background(lambda: self._dream(name, True))

    def settle_due(self) -> None:
        """Persist, on time, what fell due by itself in every channel whose moment came
        (see :mod:`calor.server.engine.due`): state changes, their ``on_decay`` events,
        the consolidation sweep a channel owes, the dream its curator's schedule owes."""
        due = self._channels.due
        now = self._clock.now()
        for name in due.take_due(now):
            channel = self._channels.find(name)
            if channel is None:
                continue
            with channel.lock:
                self.migrate_due(channel)
                if not channel.dreaming and now >= channel.dream_due_at():
                    channel.dreaming = True  # its dream notes the next moment when done
                    self._background(partial(self._scheduled_dream, channel))
                upcoming = channel.schedule[0][0] if channel.schedule else math.inf
                if not channel.dreaming:
                    upcoming = min(upcoming, channel.dream_due_at())
                if upcoming != math.inf:
                    due.note(upcoming, name)

    def _scheduled_dream(self, channel: Channel) -> None:
        """The dream the curator's schedule owes a channel (``dream_interval_seconds``)."""
        try:
            self._dream(channel.name, False)
        finally:
            with channel.lock:
                channel.dreaming = False
                channel.note_dream()


def _transition_event(
    record: MemoryRecord, before: str, policy: ChannelPolicy, clocks: Clocks
) -> EventRecord:
    """The ``on_decay`` event of a state a memory reached by itself (COLD, cold storage,
    ghost), at the moment it was reached, naming the state; leaving ACTIVE it names the
    cold threshold it crossed too, as ever."""
    crossed = {"threshold": repr(policy.cold_threshold)} if before == ACTIVE else {}
    heat = current_heat(record, policy, clocks)
    payload = {"state": record.state, **crossed}
    return memory_event("on_decay", record, record.updated_at, heat, None, **payload)
