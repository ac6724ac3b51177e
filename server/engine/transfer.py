"""Export and Import that round-trip a channel (DESIGN §9): which memories an export
holds and the edges among them, and an import that reproduces the memories it carries.

An exported memory carries its whole state (see :mod:`calor.server.storage.markdown`);
importing it writes that state back as it was, so at any moment it has the same heat,
state and standing as the original. What it carries is not worked out again: no novelty,
importance or utility from the store pipeline, and no links among the imported memories
but the file's own edges (the graph a channel grew from its history, which a new
similarity search would not reproduce). Each one that is live is linked, though, to the
memories that were in the channel before the import, as a store would link it: the file
cannot know them, and without those links its memories would stay apart from theirs in
recall's graph context and in resonance. Into an empty channel that adds nothing, so
the graph is the exported one exactly. Memories without a state (notes, older exports)
go through the store pipeline, as every import did before.

Imported memories keep their ids unless asked to remap them: then each gets a new one,
and the references among them (edges, merges, supersession tags, ``near_duplicate_of``
and ``issue_memory_id`` provenance) are rewritten to the new ids. An id the channel holds
already (a forgotten memory's included) refuses the whole import, before any write.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from calor.models.entities import extract_entities
from calor.models.text import CLASSIFIER_VERSION, classify_type
from calor.server.clock import Clock
from calor.server.engine.changes import Changes, commit
from calor.server.engine.channel import Channel
from calor.server.engine.ingest import Ingested, build_records
from calor.server.engine.registry import ChannelRegistry
from calor.server.engine.results import Current
from calor.server.engine.storing import StorePipeline
from calor.server.errors import AlreadyExistsError, InvalidArgumentError
from calor.server.events import memory_event
from calor.server.heap import BULK_ITEMS, bulk_build
from calor.server.ids import new_id
from calor.server.records import ACTIVE, ARCHIVED, COLD, DELETED, MERGED, MemoryRecord
from calor.server.storage.markdown import CarriedState, ParsedMemory, to_new_memory
from calor.server.storage.store import MemoryStore
from calor.server.thermo.graph import Edge
from calor.server.thermo.heat import SOURCE_TRUST
from calor.server.thermo.history import origin
from calor.server.thermo.lifecycle import Clocks, current_heat, evolve, piece_of, refresh_utility
from calor.server.thermo.policy import ChannelPolicy

__all__ = ["Exported", "Transfer"]

# Tags and provenance entries that name another memory of the same channel.
_ID_TAGS = ("superseded_by", "supersedes", "summarised_in")
_ID_PROVENANCE = ("near_duplicate_of", "issue_memory_id")
# A record keeps this many of its latest recall times (as a recall does).
_RECALL_TIMES = 32
# Imported memories in these states are linked to the channel's own memories.
_LINKED = frozenset({ACTIVE, COLD, ARCHIVED})


@dataclass(frozen=True)
class Exported:
    """One memory of an export: as it stands, its edges to the other exported memories,
    and the channel's interactions since its ``t0``."""

    current: Current
    edges: list[Edge]
    interactions: int


class Transfer:
    """Export and Import of whole channels; each import is one atomic batch."""

    def __init__(
        self, registry: ChannelRegistry, store: MemoryStore, clock: Clock, storing: StorePipeline
    ) -> None:
        self._reg = registry
        self._store = store
        self._clock = clock
        self._storing = storing

    # --- export ------------------------------------------------------------------

    def export_ids(self, channel: str, include_archived: bool) -> list[str]:
        """The ids an export of the channel holds, in id order: its active and cold
        memories (archived ones too when asked), and the memories merged into them."""
        live = self._reg.find(channel)
        if live is None:
            return []
        wanted = {ACTIVE, COLD, ARCHIVED} if include_archived else {ACTIVE, COLD}
        with live.lock:
            clocks = live.clocks()
            states = {i: live.evolved(live.records[i], clocks).state for i in live.ids_after("")}
            return [
                memory_id
                for memory_id, state in states.items()
                if state in wanted or (state == MERGED and _survivor(live, memory_id) in wanted)
            ]

    def export_page(
        self, channel: str, memory_ids: Sequence[str], within: Set[str]
    ) -> list[Exported]:
        """Memories of an export as they stand, each with its edges to the memories
        ``within`` the export; one forgotten since the export began is left out."""
        live = self._reg.find(channel)
        if live is None:
            return []
        with live.lock:
            clocks = live.clocks()
            page = []
            for memory_id in memory_ids:
                record = live.records.get(memory_id)
                if record is None or record.state == DELETED:
                    continue
                now = live.current(record, clocks)
                edges = [e for e in live.graph.edges(memory_id) if e.to_id in within]
                page.append(Exported(now, edges, clocks.interactions - now.record.interactions0))
            return page

    # --- import ------------------------------------------------------------------

    def import_memories(
        self,
        channel: str,
        parsed: Sequence[ParsedMemory],
        vectors: np.ndarray,
        remap_ids: bool = False,
    ) -> list[str]:
        """Import memories read from Markdown (validated, with their embeddings, one row
        each) in one atomic batch; returns their ids in document order.

        Those that carry their state are reproduced (see the module docstring); the
        others are stored anew. Without ``remap_ids`` a memory keeps its exported id.

        Raises:
            AlreadyExistsError: The channel holds one of the ids already (not remapping);
                nothing is imported.
            InvalidArgumentError: Two memories that carry their state name the same id.
        """
        if not any(p.state is not None or p.edges for p in parsed):
            items = [to_new_memory(p, channel) for p in parsed]
            return self._storing.store_all(items, vectors)
        live = self._reg.channel(channel)
        bulk = bulk_build() if len(parsed) >= BULK_ITEMS else nullcontext()
        with live.lock, bulk:
            _check_ids(live, parsed, remap_ids)
            return self._import_locked(live, parsed, vectors, remap_ids)

    def _import_locked(
        self, live: Channel, parsed: Sequence[ParsedMemory], vectors: np.ndarray, remap: bool
    ) -> list[str]:
        policy, now = live.policy, self._clock.now()
        plain = [n for n, p in enumerate(parsed) if p.state is None]
        carried = [n for n, p in enumerate(parsed) if p.state is not None]
        items = [to_new_memory(parsed[n], live.name) for n in plain]
        interactions = live.state.interactions
        ingested = (
            build_records(items, vectors[plain], live.neighbourhood(), policy, now, interactions)
            if plain
            else []
        )
        interactions += len(plain)  # stores count on the interaction clock; restores do not
        final: dict[int, str] = {n: e.record.id for n, e in zip(plain, ingested, strict=True)}
        for n in carried:
            kept = parsed[n].original_id
            final[n] = kept if kept and not remap else new_id()
        renamed: dict[str, str] = {}
        for n in carried + plain:
            renamed.setdefault(parsed[n].original_id or "", final[n])
        renamed.pop("", None)
        records = {
            n: _reproduced(parsed[n], final[n], live.name, policy, now, interactions, renamed)
            for n in carried
        }
        change = Changes(live.name, live)
        at = dict(zip(plain, ingested, strict=True))
        clocks = Clocks(now, interactions)
        for n in range(len(parsed)):
            if n in records:
                record = records[n]
                change.add(record, vectors[n])
                heat = current_heat(evolve(record, policy, clocks), policy, clocks)
                change.log(memory_event("on_store", record, now, heat))
            else:
                entry = at[n]
                change.add(entry.record, entry.vector)
                change.log(memory_event("on_store", entry.record, now, entry.record.heat0))
                for edge in entry.edges:
                    change.link(edge.from_id, edge.to_id, edge.kind, edge.weight)
        for n, p in enumerate(parsed):
            for link in p.edges:
                other = renamed.get(link.to_id)
                if other is not None and other != final[n]:
                    change.link(final[n], other, link.kind, link.weight)
        self._link_to_channel(change, live, [records[n] for n in carried], vectors[carried])
        _confirm(change, live, ingested, now)
        change.set_state(replace(live.state, interactions=interactions))
        commit(self._store, [change])
        return [final[n] for n in range(len(parsed))]

    @staticmethod
    def _link_to_channel(
        change: Changes, live: Channel, records: list[MemoryRecord], vectors: np.ndarray
    ) -> None:
        """Link reproduced memories to the channel's own nearest ones, as a store would
        (the live index holds none of the imported memories yet)."""
        policy = live.policy
        sims, labels = live.index.search_many(vectors, policy.semantic_link_max)
        for row, record in enumerate(records):
            if record.state not in _LINKED:
                continue
            for similarity, label in zip(sims[row], labels[row], strict=True):
                if label >= 0 and similarity >= policy.semantic_link_threshold:
                    other = live.index.memory_id(int(label))
                    change.link(record.id, other, "semantic", float(similarity))


def _survivor(live: Channel, memory_id: str) -> str:
    """The state of the memory a merged one was merged into, through merges of merges."""
    seen = {memory_id}
    record = live.records[memory_id]
    while record.state == MERGED and record.merged_into:
        survivor = live.records.get(record.merged_into)
        if survivor is None or survivor.id in seen:
            return ""
        seen.add(survivor.id)
        record = live.evolved(survivor)
    return record.state if record.state != MERGED else ""


def _check_ids(live: Channel, parsed: Sequence[ParsedMemory], remap: bool) -> None:
    """Refuse an import whose memories name one id twice, or (keeping their ids) an id the
    channel holds already; checked before anything is written."""
    first: dict[str, int] = {}
    taken: list[tuple[str, int]] = []
    for p in parsed:
        if p.state is None or not p.original_id:
            continue
        if p.original_id in first:
            raise InvalidArgumentError(
                f"line {p.line}: id {p.original_id} is named again (first at line"
                f" {first[p.original_id]})"
            )
        first[p.original_id] = p.line
        if not remap and p.original_id in live.records:
            taken.append((p.original_id, p.line))
    if taken:
        memory_id, line = taken[0]
        more = f" (and {len(taken) - 1} more of the file's ids)" if len(taken) > 1 else ""
        raise AlreadyExistsError(
            f"line {line}: memory {memory_id} already exists in channel {live.name!r}{more};"
            " nothing was imported (import with remap_ids to give the memories new ids)"
        )


def _reproduced(
    parsed: ParsedMemory,
    memory_id: str,
    channel: str,
    policy: ChannelPolicy,
    now: float,
    interactions: int,
    renamed: dict[str, str],
) -> MemoryRecord:
    """The record a section that carries its state stands for, its references to other
    memories of the file renamed (those naming none of them are dropped)."""
    state = parsed.state
    assert state is not None  # only sections that carry their state are reproduced
    source = parsed.source or "agent"
    importance = parsed.importance
    if importance is None:
        importance = policy.default_importance * SOURCE_TRUST[source]
    record = MemoryRecord(
        id=memory_id,
        channel=channel,
        text=parsed.text,
        memory_type=parsed.memory_type or classify_type(parsed.text),
        created_at=state.t0 if parsed.created_at is None else parsed.created_at,
        updated_at=now if state.updated_at is None else state.updated_at,
        heat0=state.heat0,
        t0=state.t0,
        stability=state.stability,
        importance=importance,
        recall_count=state.recall_count,
        last_recalled_at=state.last_recalled_at,
        keystone=parsed.keystone,
        state=state.state,
        tags=_renamed_values(parsed.tags, _ID_TAGS, renamed),
        entities=extract_entities(parsed.text) if state.entities is None else list(state.entities),
        source=source,
        confidence=parsed.confidence or "observed",
        provenance=_renamed_values(parsed.provenance, _ID_PROVENANCE, renamed),
        interactions0=interactions - state.interactions,
        recall_times=list(state.recall_times[-_RECALL_TIMES:]),
        confirmations=state.confirmations,
        valence=state.valence,
        session=state.session,
        surprise=state.surprise,
        importance_adjustment=state.importance_adjustment,
        classifier_version=state.classifier_version if parsed.memory_type else CLASSIFIER_VERSION,
    )
    _merge_links(record, state, renamed)
    if state.utility is None:
        refresh_utility(record, now)
    else:
        record.utility = state.utility
    record.heat_history = origin(piece_of(record, policy))  # its past before the file is unknown
    return record


def _merge_links(record: MemoryRecord, state: CarriedState, renamed: dict[str, str]) -> None:
    """A merged memory's survivor and a survivor's merged memories, as named in the file;
    a merged memory whose survivor the file does not hold comes back unmerged."""
    record.merged_into = renamed.get(state.merged_into, "")
    record.merged_from = [renamed[i] for i in state.merged_from if i in renamed]
    if record.state == MERGED and not record.merged_into:
        record.state = ACTIVE  # the state it has now is worked out from its heat on read


def _renamed_values(
    values: dict[str, str], keys: Sequence[str], renamed: dict[str, str]
) -> dict[str, str]:
    """A tags or provenance map whose entries under ``keys`` name memories by their ids
    in the channel they are imported into."""
    return {k: renamed.get(v, v) if k in keys else v for k, v in values.items()}


def _confirm(change: Changes, live: Channel, ingested: list[Ingested], now: float) -> None:
    """The channel's memories that stored near-duplicates confirm (as a store does)."""
    for older_id in sorted({c for entry in ingested for c in entry.confirms}):
        older = live.records.get(older_id)
        if older is not None:
            confirmed = replace(older, confirmations=older.confirmations + 1)
            refresh_utility(confirmed, now)
            change.put(confirmed)
