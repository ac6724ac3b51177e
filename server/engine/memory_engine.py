"""The memory engine: stores, recalls and tends memories, one lock per channel.

Every method is synchronous and may block (RocksDB, FAISS); the servicers run them
off the event loop. Every write is said to a change (:mod:`calor.server.engine.changes`),
committed to RocksDB in one atomic batch, and only then applied to the channel's live
view, so what a reader sees has always been written (and made durable: a recall's heat
effects moments later, :mod:`calor.server.storage.wal_sync`). Reads that need no engine
work (listing, status, conflicts) are the registry's, as ``engine.channels``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from calor.server.clock import Clock
from calor.server.commands import NewMemory, RecallQuery, UpdateChange
from calor.server.config import APPROXIMATE_ABOVE
from calor.server.engine.cards import EntityCard, EntityCards
from calor.server.engine.changes import Bookkeeping, changing, forgotten_with
from calor.server.engine.channel import Channel
from calor.server.engine.context import ContextBuilder, ContextQuery, ContextResult, TokenCounter
from calor.server.engine.curator import Embed
from calor.server.engine.dream import Dreamer, DreamReport, keep_apart
from calor.server.engine.evaluate import Evaluation, evaluate
from calor.server.engine.feedback import TypeTally
from calor.server.engine.ratings import Ratings
from calor.server.engine.recall_log import (
    ForeignHit,
    RecallEntry,
    RecallLog,
)
from calor.server.engine.recalling import Recaller
from calor.server.engine.registry import ChannelRegistry
from calor.server.engine.rejections import rejection
from calor.server.engine.results import Current, RecallResult, Stored
from calor.server.engine.settling import mark_superseded, settle_conflicts
from calor.server.engine.share import shared_copy
from calor.server.engine.storing import StagedStore, StorePipeline
from calor.server.engine.transfer import Transfer
from calor.server.engine.tuning import TuneReport
from calor.server.engine.upkeep import Upkeep
from calor.server.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from calor.server.events import Cause, EventRecord, memory_event
from calor.server.recall.ranking import Hit
from calor.server.records import DELETED, MERGED, MemoryRecord
from calor.server.storage.store import MemoryStore
from calor.server.thermo.curve import HeatCurve, heat_curve
from calor.server.thermo.gates import load_limit
from calor.server.thermo.graph import Edge
from calor.server.thermo.lifecycle import (
    Clocks,
    apply_boost,
    apply_keystone,
    current_heat,
    evolve,
    refresh_utility,
)
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["ChannelOwner", "Current", "MemoryEngine", "RecallResult", "Stored"]

# A change applied to a copy of a record: (record, policy, clocks).
_Edit = Callable[[MemoryRecord, ChannelPolicy, Clocks], None]


class ChannelOwner(Protocol):
    """Another component that keeps things of a channel (the trigger engine: its rules)
    and drops them with it, in the same batch."""

    def drop_writes(self, channel: str) -> Bookkeeping:
        """The writes that remove what it keeps of ``channel``."""
        ...

    def dropped(self, channel: str) -> None:
        """The batch holding :meth:`drop_writes` is durable: forget ``channel`` in memory."""
        ...


class MemoryEngine:
    """Every channel's memories, backed by a :class:`MemoryStore`."""

    def __init__(
        self,
        store: MemoryStore,
        clock: Clock,
        policy: ChannelPolicy,
        approximate_above: int = APPROXIMATE_ABOVE,
        memory_budget: int = 0,
    ) -> None:
        self._store = store
        self._clock = clock
        self.channels = ChannelRegistry(store, clock, policy, approximate_above, memory_budget)
        """Every channel's live view, and the reads over them (listing, status, ...)."""
        self._cards = EntityCards()
        self._contexts = ContextBuilder(self._cards)
        self._storing = StorePipeline(self.channels, store, clock)
        self._dreamer = Dreamer(store, self._storing, after=self._cards.refresh)
        self.transfer = Transfer(self.channels, store, clock, self._storing)
        """Export and Import of whole channels (see :mod:`calor.server.engine.transfer`)."""
        self.recall_log = RecallLog(store)
        """Every channel's log of recalls (and context calls), which feedback names."""
        self._ratings = Ratings(store, clock, self.channels, self.recall_log)
        self.background: Callable[[Callable[[], object]], object] = lambda work: work()
        """Runs work off the caller's thread (consolidation sweeps, scheduled dreams);
        the server gives it its executor."""
        self._upkeep = Upkeep(
            store,
            clock,
            self.channels,
            dream=self.dream,
            background=lambda work: self.background(work),
        )
        self._recaller = Recaller(
            store, clock, self.channels, self.recall_log, self._upkeep.migrate_due
        )
        self.owners: list[ChannelOwner] = []
        """Components whose keeping of a channel goes when it is dropped."""
        self.dreamt: Callable[[DreamReport, bool], None] = lambda report, cold_only: None
        """Told of every dream once it ran: its report, and whether it was a sweep."""

    @classmethod
    def open(
        cls,
        store: MemoryStore,
        clock: Clock,
        policy: ChannelPolicy,
        approximate_above: int = APPROXIMATE_ABOVE,
        memory_budget: int = 0,
    ) -> MemoryEngine:
        """An engine over everything ``store`` holds, each channel loaded when first
        asked for; channels past ``approximate_above`` memories get an HNSW graph, built
        in the background; past ``memory_budget`` bytes (0: none), the channels least
        recently asked for are unloaded."""
        engine = cls(store, clock, policy, approximate_above, memory_budget)
        engine.channels.rebuild()
        return engine

    def use_model(self, embed: Embed) -> None:
        """Let dreams embed what they make (episode summaries); without it, they make none.
        ``embed`` blocks, and is called from the thread a dream runs on."""
        self._dreamer.embed = embed

    # --- store -----------------------------------------------------------------

    def store(self, items: Sequence[NewMemory], vectors: np.ndarray) -> list[Stored]:
        """Store memories (with their embeddings, one row each) in one atomic batch."""
        return self._storing.store(items, vectors)

    def store_all(self, items: Sequence[NewMemory], vectors: np.ndarray) -> list[str]:
        """Store a big batch in one atomic batch as :meth:`store` does, answering only
        the ids, in item order; ``items``, a list, is emptied as it is taken in (see
        :meth:`StorePipeline.store_all`)."""
        return self._storing.store_all(items, vectors)

    def staged(self) -> StagedStore:
        """A big batch to store a part at a time as its parts arrive, written in one
        atomic batch at its end (see :class:`StagedStore`)."""
        return self._storing.staged()

    # --- recall ----------------------------------------------------------------

    def recall(
        self,
        query: RecallQuery,
        query_vector: np.ndarray,
        inflight: int = 1,
        foreign: Sequence[ForeignHit] = (),
        room: Callable[[Sequence[Hit | ForeignHit]], int] | None = None,
    ) -> RecallResult:
        """Rank the memories of the caller's channel (and any it names) for a query, and
        recall them unless ``peek`` (see :meth:`Recaller.recall`)."""
        return self._recaller.recall(query, query_vector, inflight, foreign, room)

    def settle_due(self) -> None:
        """Persist, on time, what fell due by itself in every channel whose moment came
        (see :class:`Upkeep`)."""
        self._upkeep.settle_due()

    # --- reads -----------------------------------------------------------------

    def _get(self, channel: Channel, memory_id: str) -> MemoryRecord:
        record = channel.records.get(memory_id)
        if record is None:
            raise NotFoundError(f"no memory {memory_id} in channel {channel.name!r}")
        return record

    def inspect(self, channel: str, memory_id: str) -> tuple[Current, list[Edge]]:
        """One memory of a channel as it stands (tombstones included) and its edges."""
        now, edges, _ = self.inspect_with(channel, memory_id, curve=False)
        return now, edges

    def inspect_with(
        self, channel: str, memory_id: str, curve: bool
    ) -> tuple[Current, list[Edge], HeatCurve | None]:
        """:meth:`inspect`, and when ``curve`` asks, the memory's heat curve as of the
        same moment."""
        live = self.channels.existing(channel, memory_id)
        with live.lock:
            clocks = live.clocks()
            now = live.current(self._get(live, memory_id), clocks)
            drawn = heat_curve(now.record, live.policy, clocks) if curve else None
            return now, live.graph.edges(memory_id), drawn

    def log(self, *events: EventRecord, extra: Bookkeeping = (), synced: bool = True) -> None:
        """Append events that change no memory (notifications, webhook outcomes).

        ``extra`` adds the caller's own writes (a trigger's cursor and bookkeeping) to
        the same atomic batch, so both are durable or neither is; unless ``synced``,
        on disk moments after this returns (``storage.wal_sync``).
        """
        with changing(self._store, None, synced=synced) as change:
            change.log(*events)
            change.keep(extra)

    # --- changes ---------------------------------------------------------------

    def _change(
        self,
        channel: str,
        memory_ids: Sequence[str],
        edit: _Edit,
        event: str = "",
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> list[Current]:
        """Apply ``edit`` to each memory (one channel), in one batch with ``extra``."""
        if not memory_ids:
            self.log(extra=extra)
            return []
        live = self.channels.existing(channel, memory_ids[0])
        with live.lock:
            policy, clocks = live.policy, live.clocks()
            changes: list[MemoryRecord] = []
            for memory_id in dict.fromkeys(memory_ids):
                current = self._get(live, memory_id)
                if current.state == DELETED:
                    raise NotFoundError(f"memory {memory_id} was forgotten")
                changed = evolve(replace(current), policy, clocks)
                edit(changed, policy, clocks)
                refresh_utility(changed, clocks.now)
                changes.append(changed)
            with changing(self._store, live) as change:
                for changed in changes:
                    change.put(changed)
                    if event:
                        heat = current_heat(changed, policy, clocks)
                        change.log(memory_event(event, changed, clocks.now, heat, cause=cause))
                change.keep(extra)
            return [live.current(changed, clocks) for changed in changes]

    # A trigger's action passes ``cause`` and, as ``extra``, its cursor and bookkeeping
    # writes: they join the action's own batch, so after a crash the action is either
    # done and accounted for or not done at all.

    def keystone(
        self,
        channel: str,
        memory_id: str,
        on: bool,
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> Current:
        """Pin (keystone) or unpin a memory; a trigger's pin is logged as a ``pin`` event."""
        [changed] = self._change(
            channel,
            [memory_id],
            lambda r, p, c: apply_keystone(r, p, c, on),
            "pin" if cause is not None else "",
            cause,
            extra,
        )
        return changed

    def boost(
        self,
        channel: str,
        memory_id: str,
        delta: float,
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> Current:
        """Add heat to a memory; 0 means the channel's ``boost_delta``."""
        [changed] = self.boost_all(channel, [memory_id], delta, cause, extra)
        return changed

    def boost_all(
        self,
        channel: str,
        memory_ids: Sequence[str],
        delta: float,
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> list[Current]:
        """Add heat to several memories of a channel in one batch (a trigger's boost of
        a memory's neighbours); none is boosted if one cannot be."""
        return self._change(
            channel,
            memory_ids,
            lambda r, p, c: apply_boost(r, p, c, delta or p.boost_delta),
            "on_boost",
            cause,
            extra,
        )

    def tag(
        self,
        channel: str,
        memory_id: str,
        tags: dict[str, str],
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> Current:
        """Add tags to a memory (a trigger's ``tag`` action)."""

        def add(record: MemoryRecord, policy: ChannelPolicy, clocks: Clocks) -> None:
            record.tags = {**record.tags, **tags}

        kind = "tag" if cause is not None else ""
        [changed] = self._change(channel, [memory_id], add, kind, cause, extra)
        return changed

    def deprecate(
        self,
        channel: str,
        memory_id: str,
        cause: Cause | None = None,
        extra: Bookkeeping = (),
    ) -> Current:
        """Deprecate a memory (a trigger's ``deprecate`` action): settled history, see
        :mod:`calor.server.engine.settling`."""
        live = self.channels.existing(channel, memory_id)
        with live.lock:
            policy, clocks = live.policy, live.clocks()
            record = evolve(replace(self._get(live, memory_id)), policy, clocks)
            if record.state == DELETED:
                raise NotFoundError(f"memory {memory_id} was forgotten")
            mark_superseded(record, None, policy, clocks)
            refresh_utility(record, clocks.now)
            with changing(self._store, live) as change:
                settle_conflicts(change, live, record, (), policy, clocks)
                change.put(record)
                heat = current_heat(record, policy, clocks)
                change.log(memory_event("deprecate", record, clocks.now, heat, cause=cause))
                change.keep(extra)
            return live.current(record, clocks)

    def connect(self, channel: str, from_id: str, to_id: str, weight: float) -> Edge:
        """Link two memories of a channel by hand (a ``manual`` edge)."""
        if from_id == to_id:
            raise InvalidArgumentError("to_id: a memory cannot be linked to itself")
        live = self.channels.existing(channel, from_id)
        with live.lock:
            for memory_id in (from_id, to_id):
                if self._get(live, memory_id).state == DELETED:
                    raise NotFoundError(f"memory {memory_id} was forgotten")
            with changing(self._store, live) as change:
                edge = change.link(from_id, to_id, "manual", weight)
            return edge

    def update(self, change: UpdateChange, vector: np.ndarray | None) -> Current:
        """Correct a memory; a new text comes with its new embedding."""
        live = self.channels.existing(change.channel, change.memory_id)
        with live.lock:
            policy, clocks = live.policy, live.clocks()
            current = self._get(live, change.memory_id)
            if current.state == DELETED:
                raise NotFoundError(f"memory {change.memory_id} was forgotten")
            older = None
            if change.supersedes:
                if change.supersedes == change.memory_id:
                    raise InvalidArgumentError("supersedes: a memory cannot supersede itself")
                older = evolve(replace(self._get(live, change.supersedes)), policy, clocks)
                if older.state == DELETED:
                    raise NotFoundError(f"supersedes: memory {older.id} was forgotten")
            changed = evolve(replace(current, updated_at=clocks.now), policy, clocks)
            change.apply(changed, clocks.now, live.knows_entity)
            if older is not None:
                mark_superseded(older, changed, policy, clocks)
            survivor = None
            if change.clear_merge and current.state == MERGED:
                survivor = replace(self._get(live, current.merged_into))
                survivor.merged_from = [i for i in survivor.merged_from if i != current.id]
                survivor.updated_at = clocks.now
                keep_apart(changed, survivor)
            refresh_utility(changed, clocks.now)
            with changing(self._store, live) as writing:
                if older is not None:
                    settle_conflicts(writing, live, older, [changed], policy, clocks)
                    writing.put(older)
                    writing.link(changed.id, older.id, "supersedes", 1.0)
                if survivor is not None:
                    writing.put(survivor)
                writing.put(changed, vector)
                if change.text is not None:  # a corrected text settles its conflicts
                    writing.settle_all(changed.id)
            return live.current(changed, clocks)

    def forget(self, channel: str, memory_ids: Iterable[str], reject: bool = False) -> int:
        """Forget memories: each becomes a tombstone without text, embedding or edges, and
        what quoted its text (event messages, webhook deliveries waiting in the outbox)
        is rewritten without it, in one batch; the bytes leave the disk at the next purge.

        What holds a copy of a forgotten text goes with it: the memories a dream merged
        into it (and into those), and the Evaluate findings that quote it. With
        ``reject``, each one's embedding stays behind as a rejection of the channel
        (:mod:`calor.server.engine.rejections`). Returns how many memories were
        forgotten, those included.
        """
        live = self.channels.find(channel)
        if live is None:
            return 0
        with live.lock:
            now = self._clock.now()
            gone = forgotten_with(live, memory_ids)
            if not gone:
                return 0  # nothing to forget: write nothing
            kept = [self._store.get_vector(channel, record.id) for record in gone] if reject else []
            with changing(self._store, live) as change:
                for record in gone:
                    change.forget(record, now)
                change.keep(
                    [
                        rejection(channel, record.id, vector)
                        for record, vector in zip(gone, kept, strict=False)
                        if vector is not None
                    ]
                )
            return len(gone)

    def drop_channel(self, channel: str) -> int:
        """Remove a whole channel in one batch: its memories (forgotten ones too), their
        embeddings and edges, its settings and own state, recall log and feedback, its
        triggers with their history (:attr:`owners`), and the text its events and webhook
        deliveries quoted (the events stay, numbered as they were). Its live view goes;
        a later write starts an empty channel of that name. A ``notify`` event says it was
        dropped. Returns how many memories it held; 0, writing nothing, for a channel
        that holds nothing (a retried drop).
        """
        live = self.channels.find(channel)
        if live is None:
            return self._drop(channel, None)
        with live.lock:
            return self._drop(channel, live)

    def _drop(self, channel: str, live: Channel | None) -> int:
        """Drop a channel (its view's lock held, if it has one); see :meth:`drop_channel`."""
        held = len(live.records) if live is not None else 0
        extra = [write for owner in self.owners for write in owner.drop_writes(channel)]
        if live is None and not extra:
            return 0
        event = EventRecord(
            kind="notify",
            channel=channel,
            at=self._clock.now(),
            message=f"channel {channel!r} dropped: {held} memories",
            payload={"dropped": str(held)},
        )
        with changing(self._store, live, channel) as change:
            change.drop_channel()
            change.keep(extra)
            change.log(event)
        if live is not None:
            self.channels.retire(channel)  # the view empties and takes no more changes
            self._cards.refresh(live)  # so the channel's cached cards go
        for owner in self.owners:
            owner.dropped(channel)
        self.recall_log.forget(channel)
        return held

    def purge(self) -> int:
        """Make RocksDB drop the bytes of what was forgotten or dropped, now (the server's
        background purge does it within seconds anyway; see
        :mod:`calor.server.storage.purge`). Returns how many key ranges were compacted."""
        return self._store.purge()

    # --- context and entity cards ----------------------------------------------

    def context(
        self,
        query: ContextQuery,
        vector: np.ndarray | None,
        count_tokens: TokenCounter,
        inflight: int = 1,
    ) -> ContextResult | None:
        """The block an agent prepends to its prompt (DESIGN §8; see
        :mod:`calor.server.engine.context`), with each shown memory as it stands.

        ``vector`` is the message's embedding. Without it, only what needs no model is
        answered (a block reused from the window, or the empty block of a channel never
        written to); None asks the caller to embed the message and call again. Every
        block that shows memories is logged in the recall log under a new ``recall_id``
        (for Feedback; a reused block answers with the id its first call was logged
        under and writes nothing); no heat changes unless ``heat``: then what the block shows is
        recalled as a recall of those memories would be (relevant ones heated). Under
        critical load (the load gate) the block holds fewer memories.
        """
        live = self.channels.find(query.channel)
        if live is None:
            return ContextResult()
        with live.lock:
            policy, now = live.policy, self._clock.now()
            if query.heat:
                live.state.check_ceiling(policy, now)
            nodes = load_limit(policy, query.max_nodes, inflight)
            result = self._contexts.assemble(live, query, vector, count_tokens, nodes)
            if result is None:
                return None
            # Logged for feedback, as a recall is; a reused block keeps the recall id
            # it was logged under, unless it heats (each heating call is a recall).
            if result.items and (query.heat or not result.reused):
                hits = [replace(i.hit, record=i.hit.record.copy()) for i in result.items]
                entry = RecallEntry.new(hits, live.name, self.channels.policy, now)
                if query.heat:
                    self._recaller.recalled(live, hits, entry)
                else:
                    with changing(self._store, live) as change:
                        change.keep(self.recall_log.writes(live.name, entry))
                result = replace(result, recall_id=entry.recall_id)
            if not result.reused:
                self._contexts.keep(live, query, nodes, result)
            memories = [live.current(live.records[i.hit.record.id]) for i in result.items]
            return replace(result, memories=memories)

    def entity_card(self, channel: str, entity: str) -> tuple[EntityCard, list[Current]]:
        """The card of an entity the channel's memories name (DESIGN §8), and its
        memories as they stand; NOT_FOUND when fewer than five name it."""
        live = self.channels.find(channel)
        if live is None:
            raise NotFoundError(f"no entity card for {entity!r}: channel {channel!r} is empty")
        with live.lock:
            card = self._cards.require(live, entity)
            return card, [live.current(live.records[i]) for i in card.memory_ids]

    # --- evaluate and share -----------------------------------------------------

    def evaluate(self, channel: str, text: str, vector: np.ndarray) -> Evaluation:
        """Check a text (embedded like a memory) against a channel's memories, reading
        only: contradictions, preference drift, stale references (see
        :mod:`calor.server.engine.evaluate`). A channel never written to has nothing
        to go against: alignment 1.0."""
        live = self.channels.find(channel)
        if live is None:
            return Evaluation(1.0)
        with live.lock:
            return evaluate(live, text, vector, live.policy.dreams.conflict_similarity)

    def share(self, channel: str, memory_id: str, target: str, max_text_bytes: int) -> Stored:
        """Copy a memory into ``target`` as a new memory of its own (see
        :mod:`calor.server.engine.share`), stored through the store pipeline with the
        source's embedding. NOT_FOUND for an unknown or forgotten memory;
        INVALID_ARGUMENT when the prefixed copy would be over ``max_text_bytes``."""
        live = self.channels.existing(channel, memory_id)
        with live.lock:
            record = self._get(live, memory_id)
            if record.state == DELETED:
                raise NotFoundError(f"memory {memory_id} was forgotten")
            item = shared_copy(live.evolved(record), target)
            vector = self._store.get_vector(channel, memory_id)
        if vector is None:  # every memory not forgotten has one; `calor check` restores it
            raise FailedPreconditionError(
                f"memory {memory_id} has no stored embedding; run `calor check --fix`"
            )
        return self.store_shared(item, vector, max_text_bytes)

    def store_shared(self, item: NewMemory, vector: np.ndarray, max_text_bytes: int) -> Stored:
        """Store a shared copy (:func:`~calor.server.engine.share.shared_copy`) with its
        source's embedding; INVALID_ARGUMENT when its text, prefixed, would be over
        ``max_text_bytes``."""
        size = len(item.text.encode())
        if size > max_text_bytes:
            shared = item.provenance.get("shared_from_id", "")
            raise InvalidArgumentError(
                f"id: the shared copy of {shared} would be {size} bytes with its prefix,"
                f" over the limit of {max_text_bytes}"
            )
        [stored] = self._storing.store([item], vector.reshape(1, -1))
        return stored

    # --- feedback and tuning ---------------------------------------------------

    def feedback(
        self, channel: str, recall_id: str, rating: str, memory_ids: Sequence[str]
    ) -> dict[str, TypeTally]:
        """Rate a logged recall (see :mod:`calor.server.engine.feedback`); the channel's
        per-type tallies of the last 30 days. NOT_FOUND for an unknown recall id."""
        return self._ratings.give(channel, recall_id, rating, memory_ids)

    def feedback_by_type(self, channel: str) -> dict[str, TypeTally]:
        """A channel's feedback tallies per memory type over the last 30 days."""
        return self._ratings.by_type(channel)

    def tune(self, channel: str, dry_run: bool) -> TuneReport:
        """Fit a channel's recall weights to its feedback (see
        :mod:`calor.server.engine.tuning`); applied, unless ``dry_run``, only when they
        agree better with held-back feedback. FAILED_PRECONDITION under 20 rated recalls."""
        return self._ratings.tune(channel, dry_run)

    # --- dreams ----------------------------------------------------------------

    def dream(
        self,
        channel: str,
        cold_only: bool = False,
        on_step: Callable[[str], None] = lambda step: None,
    ) -> DreamReport:
        """Consolidate a channel now (one dream per channel at a time); ``on_step``
        hears each step's name as it begins (``DREAM_STEPS``).

        A channel never written to has nothing to consolidate: its report is all
        zeros, and nothing is written (no channel record, no dream event).
        """
        live = self.channels.find(channel)
        if live is None:
            return DreamReport()
        with live.dream_lock:
            report = self._dreamer.dream(live, cold_only, on_step)
        self.dreamt(report, cold_only)
        return report

    def offer(self, channel: str, entropy: int) -> tuple[int, DreamReport | None]:
        """Add offered bytes to the channel's entropy; dream when it crosses the threshold.

        Offering nothing to a channel never written to leaves it unwritten (accumulated 0).
        """
        live = self.channels.channel(channel) if entropy else self.channels.find(channel)
        if live is None:
            return 0, None
        accumulated, crossed = self._dreamer.add_entropy(live, entropy)
        return accumulated, self.dream(channel) if crossed else None
