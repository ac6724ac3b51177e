"""The memory engine: stores, recalls and tends memories, one lock per channel.

Every method is synchronous and may block (RocksDB, FAISS); the servicers run them
off the event loop. Every write is said to a change (:mod:`calor.server.engine.changes`),
committed to RocksDB in one atomic batch, and only then applied to the channel's live
view, so what a reader sees has always been written (and made durable: a recall's heat
effects moments later, :mod:`calor.server.storage.wal_sync`). Reads that need no engine
work (listing, status, conflicts) are the registry's, as ``engine.channels``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from calor.server.clock import Clock
from calor.server.commands import NewMemory, RecallQuery
from calor.server.config import APPROXIMATE_ABOVE
from calor.server.engine.cards import EntityCard, EntityCards
from calor.server.engine.changes import Bookkeeping, changing
from calor.server.engine.channel import Channel
from calor.server.engine.context import ContextBuilder, ContextQuery, ContextResult, TokenCounter
from calor.server.engine.curator import Embed
from calor.server.engine.dream import Dreamer
from calor.server.engine.dream_report import DreamReport
from calor.server.engine.editing import MemoryEdits, record_of
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
from calor.server.engine.results import Current, RecallResult, Stored
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
from calor.server.events import EventRecord
from calor.server.recall.ranking import Hit
from calor.server.records import DELETED
from calor.server.storage.store import MemoryStore
from calor.server.thermo.curve import HeatCurve, heat_curve
from calor.server.thermo.gates import load_limit
from calor.server.thermo.graph import Edge
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["ChannelOwner", "Current", "MemoryEngine", "RecallResult", "Stored"]


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
        self.edits = MemoryEdits(store, clock, self.channels)
        """Changes to existing memories: pins, boosts, tags, corrections, links,
        deprecations and forgetting (see :mod:`calor.server.engine.editing`)."""
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
            now = live.current(record_of(live, memory_id), clocks)
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

    # --- dropping ---------------------------------------------------------------

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
            record = record_of(live, memory_id)
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
