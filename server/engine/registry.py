"""The channels a server holds: their live views and policies, the rebuild from RocksDB, and
read-only queries over the views."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import islice

import numpy as np

from calor.server.clock import Clock
from calor.server.commands import HEAT_POSITION, ListQuery
from calor.server.config import APPROXIMATE_ABOVE
from calor.server.engine.changes import Changes, changing, commit
from calor.server.engine.channel import Channel
from calor.server.engine.due import DueChannels
from calor.server.engine.graphs import GraphBuilds
from calor.server.engine.hottest import by_heat, ranked_all, type_census
from calor.server.engine.results import ChannelStatus, Current, ListedPage
from calor.server.engine.states import RecordTable
from calor.server.errors import NotFoundError
from calor.server.heap import BULK_ITEMS, release
from calor.server.recall.graph_files import GraphFiles
from calor.server.records import DELETED, MemoryRecord
from calor.server.storage.ops import ChangeList, OpenConflict, PutKey, SetPolicy, SetState
from calor.server.storage.store import MemoryStore
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.curve import sparkline
from calor.server.thermo.lifecycle import crossing_at, current_heat
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["BYTES_PER_MEMORY", "ChannelRegistry", "estimated_bytes"]

BYTES_PER_MEMORY = 4 * 1024
"""What a loaded memory costs the server, about: its id, state, words, links, columns and
compressed vector (2.2 KB measured at 100,000 short memories), and its full record
while kept (a small channel keeps all of them; see ``states.RECORDS_CACHED``)."""
# How long the background warm-up waits for calls in flight before each channel it loads
# (so it still moves on under constant load), and how often it looks.
_LOAD_CHUNK = 2_048  # records a load decodes and indexes at a time
_HOTTEST_SHOWN = 5  # the hottest memories a channel's status shows
_YIELD_SECONDS = 0.1
_YIELD_STEP = 0.002
# References to a loaded view nobody holds: the registry's table, the loop's variable and
# getrefcount's own argument.
_UNHELD = 3


def estimated_bytes(view: Channel) -> int:
    """About how much memory a loaded channel takes."""
    return len(view.records) * BYTES_PER_MEMORY


class ChannelRegistry:
    """Every channel's live view; channels come into being on first write."""

    def __init__(
        self,
        store: MemoryStore,
        clock: Clock,
        default_policy: ChannelPolicy,
        approximate_above: int = APPROXIMATE_ABOVE,
        memory_budget: int = 0,
    ) -> None:
        self._store = store
        self._approximate_above = approximate_above
        self._budget = memory_budget
        self._clock = clock
        self._default_policy = default_policy
        self._channels: dict[str, Channel] = {}  # loaded, least recently asked for first
        self._stored: set[str] = set()  # held by the store, not loaded yet
        self._loading: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        # Dropped channels' last (revision, arrivals): a view made again under the same
        # name counts on from there, so nothing derived from the dropped one (an entity
        # card, a reused Context block) passes for current.
        self._retired: dict[str, tuple[int, int]] = {}
        self.due = DueChannels()
        """The next moment something falls due by itself, per channel."""
        self.graphs = GraphBuilds(GraphFiles(store.path / "graphs", store.dim), store.sequence)
        """The HNSW graphs of large channels, built in the background."""

    def rebuild(self) -> None:
        """Learn which channels the store holds; each is loaded when first asked for
        (:meth:`find`, :meth:`channel`) or by :meth:`load_all`, so start-up does not
        grow with the number of channels."""
        names = self._store.channel_names()
        with self._lock:
            self._stored = names - set(self._channels)

    def unloaded(self) -> int:
        """How many stored channels are not loaded yet."""
        with self._lock:
            return len(self._stored)

    def load_all(
        self, stop: threading.Event | None = None, busy: Callable[[], bool] = lambda: False
    ) -> None:
        """Load every stored channel not loaded yet (a background warm-up), unless
        ``stop`` is set first or the memory budget is full (the rest load when asked).
        While ``busy`` says calls are being served, it waits up to ``_YIELD_SECONDS``
        before each channel: a load holds the GIL, and calls come first."""
        with self._lock:
            names = sorted(self._stored)
            size = sum(estimated_bytes(view) for view in self._channels.values())
        for name in names:
            waited = 0.0
            while busy() and waited < _YIELD_SECONDS:
                time.sleep(_YIELD_STEP)
                waited += _YIELD_STEP
            if stop is not None and stop.is_set() or self._budget and size >= self._budget:
                return
            view = self.find(name)
            size += estimated_bytes(view) if view is not None else 0

    def _loaded(self, name: str) -> Channel | None:
        """A channel's view, loading it from the store first if it is stored but not
        loaded yet; None if the store holds nothing of it."""
        with self._lock:
            view = self._channels.get(name)
            if view is not None:
                if self._budget:
                    self._channels[name] = self._channels.pop(name)  # the latest asked for
                return view
            if name not in self._stored:
                return None
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:  # one loader per channel; others wait for its view
            with self._lock:
                view = self._channels.get(name)
                if view is not None or name not in self._stored:
                    return view
            view = self._load(name)
            with self._lock:
                self._channels[name] = view
                self._stored.discard(name)
                self._loading.pop(name, None)
                if self._budget:
                    self._keep_within_budget(name)
            return view

    def _keep_within_budget(self, keep: str) -> None:
        """Unload the least recently asked-for channels while the loaded ones' estimated
        size is over the budget (hold the registry's lock). Only a view nobody holds goes
        (no thread has it in hand: its reference count says so); it is loaded again
        from the store when next asked for, counting on from its revision."""
        size = sum(estimated_bytes(view) for view in self._channels.values())
        for name in list(self._channels):
            if size <= self._budget:
                return
            view = self._channels[name]
            if name == keep or sys.getrefcount(view) > _UNHELD:
                continue
            del self._channels[name]
            self._stored.add(name)
            self._retired[name] = (view.revision + 1, view.arrivals + 1)
            size -= estimated_bytes(view)

    def _load(self, name: str) -> Channel:
        """A channel's view built from what the store holds: policy, state, records,
        edges, conflicts, rejections and embeddings (an embedding written ahead by a bulk
        store whose records never were is dropped)."""
        view = self._new_view(name)
        said = ChangeList(name)
        policy, state = self._store.channel_policy(name), self._store.channel_state(name)
        if policy is not None:
            said.ops.append(SetPolicy(ChannelPolicy.from_json(policy)))
        if state is not None:
            said.ops.append(SetState(ChannelState.from_json(state)))
        view.apply(said)
        orphans = Changes(name)
        vectors = self._store.vectors(name)  # in id order, as the records are
        waiting = next(vectors, None)
        loaded = 0
        with view.lock:  # a graph build the indexing asks for waits for the saved graphs
            # A chunk at a time: the records decoded for one are let go before the next,
            # so the heap does not hold a channel's worth of them among what stays.
            records = self._store.records(name)
            while chunk := list(islice(records, _LOAD_CHUNK)):
                known: dict[str, MemoryRecord] = {}
                for record in chunk:
                    view.remember(record)
                    known[record.id] = record
                entries: list[tuple[MemoryRecord, np.ndarray]] = []
                last = chunk[-1].id
                while waiting is not None and waiting[1] <= last:
                    found = known.get(waiting[1])
                    if found is not None:
                        entries.append((found, waiting[2]))
                    else:
                        self._orphan(orphans, name, waiting[1])
                    waiting = next(vectors, None)
                view.index_all(entries, noting=False)
                loaded += len(chunk)
            while waiting is not None:
                self._orphan(orphans, name, waiting[1])
                waiting = next(vectors, None)
            view.link_all(edge[1:] for edge in self._store.edges(name))
            said = ChangeList(name)
            for _, a, b, reason in self._store.conflicts(name):
                said.ops.append(OpenConflict(a, b, reason))
            said.ops.extend(PutKey(key, value) for key, value in self._store.rejections(name))
            view.apply(said)
            commit(self._store, [orphans])
            view.note_size()
            self.graphs.restore(view)
        if loaded >= BULK_ITEMS:
            release()  # the records decoded on the way, most of them no longer kept
        return view

    def _orphan(self, orphans: Changes, name: str, memory_id: str) -> None:
        """An embedding without a record: dropped if it was written ahead by a bulk
        store whose records never were (a crash)."""
        if self._store.record(name, memory_id) is None:
            orphans.drop_vector(memory_id)

    def channel(self, name: str) -> Channel:
        """A channel's view, made empty if it does not exist yet: for writes only, which
        then make it durable. Reads use :meth:`find`, so a read never creates a channel."""
        loaded = self._loaded(name)
        if loaded is not None:
            return loaded
        with self._lock:
            channel = self._channels.get(name)
            if channel is None:
                channel = self._new_view(name)
                self._channels[name] = channel
            return channel

    def _new_view(self, name: str) -> Channel:
        """An empty view of a channel, hooked to the due timer and the graph builder."""
        channel = Channel(
            name,
            self._store.dim,
            self._default_policy,
            self._clock,
            records=RecordTable(reader=functools.partial(self._store.record, name)),
            approximate_above=self._approximate_above,
            whole_vectors=functools.partial(self._store.get_vectors, name),
        )
        channel.on_due = self.due.note
        channel.on_large = self.graphs.note
        channel.revision, channel.arrivals = self._retired.get(name, (0, 0))
        return channel

    def retire(self, name: str) -> None:
        """Take a dropped channel's view out (hold its lock): reads find no channel, the
        view takes no more changes, and a write makes a new, empty one."""
        with self._lock:
            view = self._channels.pop(name, None)
            self._stored.discard(name)
            if view is not None:
                view.drop()
                self._retired[name] = (view.revision + 1, view.arrivals + 1)
        self.graphs.discard(name)

    def names(self) -> list[str]:
        """Every channel the server holds, loaded or not, in name order."""
        with self._lock:
            return sorted(self._stored.union(self._channels))

    def find(self, name: str) -> Channel | None:
        """A channel's view, if the channel exists (loaded from the store on first use)."""
        return self._loaded(name)

    def existing(self, name: str, memory_id: str) -> Channel:
        """The view of a channel that must hold ``memory_id``; NOT_FOUND if it does not exist."""
        channel = self._loaded(name)
        if channel is None:
            raise NotFoundError(f"no memory {memory_id} in channel {name!r}")
        return channel

    def policy(self, name: str) -> ChannelPolicy:
        """The policy in force in a channel."""
        channel = self._loaded(name)
        return channel.policy if channel is not None else self._default_policy

    def set_policy(self, name: str, policy: ChannelPolicy) -> ChannelPolicy:
        """Make ``policy`` the channel's own from now on (durably); every read uses it."""
        channel = self.channel(name)
        with channel.lock, changing(self._store, channel) as change:
            change.set_policy(policy)
        return policy

    def list_page(self, query: ListQuery) -> ListedPage:
        """A page of memories in id order (resuming after a memory id) or hottest first
        (resuming at a position of the order as it stands at each page's request)."""
        channel = self.find(query.channel)
        if channel is None:
            return ListedPage([], [], "")
        with channel.lock:
            clocks = channel.clocks()
            page = ListedPage([], [], "", at=clocks.now)
            candidates: Iterator[tuple[str, str]]  # (memory id, where to resume after it)
            if query.order == "heat":
                rest = by_heat(channel, clocks)[query.position :]
                after = enumerate(rest, start=query.position + 1)
                candidates = ((i, f"{HEAT_POSITION}{n}") for n, i in after)
            else:
                candidates = ((i, i) for i in channel.ids_after(query.after_id))
            for memory_id, resume in candidates:
                record = channel.evolved(channel.records[memory_id], clocks)
                if not query.matches(record):
                    continue
                if len(page.memories) == query.page_size:
                    return replace(page, next=page.resume_after[-1])
                page.memories.append(channel.current(record, clocks))
                page.resume_after.append(resume)
                if query.sparklines:
                    page.sparklines.append(sparkline(record, channel.policy, clocks))
        return page

    def status(self, channel: str) -> ChannelStatus:
        """How many memories a channel holds, by state and by type, and its heat."""
        live = self.find(channel)
        if live is None:
            return ChannelStatus(0, {}, {}, 0.0)
        with live.lock:
            clocks = live.clocks()
            states = live.states()
            types, histograms = type_census(live, clocks)
            heat = live.state.heat(live.policy, clocks.now)
            sweeps, interactions = live.state.sweeps, live.state.interactions
            dreams = list(reversed(live.state.recent_dreams))
            hottest = ranked_all(live, clocks)[:_HOTTEST_SHOWN]
            shown = [live.current(live.records[memory_id], clocks) for memory_id in hottest]
        total = sum(count for state, count in states.items() if state != DELETED)
        return ChannelStatus(
            total, states, types, heat, sweeps, interactions, shown, dreams, histograms
        )

    def census(self) -> tuple[int, dict[str, int]]:
        """How many channels hold a memory that is not forgotten, and the memories of every
        channel per state, from the counts each channel keeps (no scan of the memories;
        channels not loaded yet are loaded first, as far as the memory budget allows: under
        a budget, the memories of channels not loaded are not counted)."""
        self.load_all()
        with self._lock:
            views = list(self._channels.values())
            unloaded = len(self._stored)
        holding, states = unloaded, Counter[str]()
        for view in views:
            with view.lock:
                counts = view.states()
            holding += any(n for state, n in counts.items() if state != DELETED)
            states.update(counts)
        return holding, dict(states)

    def decay_crossing(
        self, channel: str, memory_id: str, threshold: float | None
    ) -> tuple[float, float, float] | None:
        """When a memory's heat will cross below ``threshold`` (default: the cold threshold).

        Returns (moment, t0 of the heat trajectory, heat now), or None when no crossing
        lies ahead on the wall clock.
        """
        live = self.find(channel)
        if live is None:
            return None
        with live.lock:
            record = live.records.get(memory_id)
            if record is None:
                return None
            clocks = live.clocks()
            record = live.evolved(record, clocks)
            level = live.policy.cold_threshold if threshold is None else threshold
            moment = crossing_at(record, live.policy, level)
            if moment is None:
                return None
            return moment, record.t0, current_heat(record, live.policy, clocks)

    def memory_ids(self, channel: str) -> list[str]:
        """Every memory id of a channel (tombstones included), in id order."""
        live = self.find(channel)
        if live is None:
            return []
        with live.lock:
            return list(live.ids_after(""))

    def neighbours(self, channel: str, memory_id: str) -> list[str]:
        """The memories linked to one memory."""
        live = self.find(channel)
        if live is None:
            return []
        with live.lock:
            return sorted(live.graph.neighbours(memory_id))

    def matching(self, query: ListQuery) -> list[str]:
        """The ids of every memory a listing filter matches, across all its pages."""
        ids: list[str] = []
        page_query = replace(query, page_size=1000)
        while True:
            page = self.list_page(page_query)
            ids.extend(c.record.id for c in page.memories)
            if not page.next:
                return ids
            page_query = replace(page_query, after_id=page.next)

    def find_idempotent(self, channel: str, key: str) -> Current | None:
        """The memory an earlier store with this idempotency key made, if any."""
        if not key:
            return None
        memory_id = self._store.idempotent_id(channel, key)
        live = self.find(channel)
        if memory_id is None or live is None:
            return None
        with live.lock:
            record = live.records.get(memory_id)
            return None if record is None else live.current(record)

    def conflicts(self, channel: str) -> list[tuple[str, str, str]]:
        """The channel's open conflicts as (a, b, reason)."""
        live = self.find(channel)
        if live is None:
            return []
        with live.lock:
            return [(a, b, reason) for (a, b), reason in sorted(live.conflicts.items())]
