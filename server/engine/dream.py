"""Dreams (DESIGN §6): the sleep cycle that keeps a channel dense, deduplicated and honest.

Steps, in order, each counted in the report: materialise heat and states; cold
migration; conflict detection; merging near-duplicate clusters; keystone promotion;
type promotion; the curator's re-classification and episode summaries (see
:mod:`calor.server.engine.curator`); ghost echoes, then ghost pruning; archival;
channel-heat cooling.
Every merge is one atomic RocksDB batch, so a dream cut short by a crash leaves no
half-merged memory, and the next dream finishes the work. Run again with nothing
changed, a dream reports zero changes.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from calor.models.contrast import contradiction, same_numbers
from calor.server.engine import curator
from calor.server.engine.changes import changing, commit
from calor.server.engine.channel import Channel
from calor.server.engine.curator import Embed
from calor.server.engine.dream_report import DreamReport
from calor.server.engine.storing import StorePipeline
from calor.server.events import EventRecord
from calor.server.recall.index import ScratchIndex
from calor.server.records import ACTIVE, ARCHIVED, COLD, GHOST, MERGED, MemoryRecord
from calor.server.storage.store import MemoryStore
from calor.server.thermo.lifecycle import Clocks, current_heat, evolve
from calor.server.thermo.policy import ChannelPolicy, DreamThresholds

__all__ = ["Dreamer", "keep_apart"]

# Every threshold of a dream is the channel's setting: ``ChannelPolicy.dreams``.
_NEIGHBOURS = 16
_KEPT_APART = "kept_apart_from"  # the tag naming the memories a user separated
_LIVE = frozenset({ACTIVE, COLD})
DAY = 86_400.0


class Dreamer:
    """Runs dreams over a channel's live view; the caller holds the channel's lock.

    ``after`` runs at the end of every dream, under the channel's lock: what is derived
    from the view and refreshed in dreams (entity cards) is rebuilt there. ``storing``
    stores the memories a dream makes (episode summaries), which ``embed`` embeds: without
    a model (None), a dream makes none.
    """

    def __init__(
        self,
        store: MemoryStore,
        storing: StorePipeline,
        after: Callable[[Channel], None] | None = None,
    ) -> None:
        self._store = store
        self._storing = storing
        self._after = after
        self.embed: Embed | None = None
        """The model, for the sentences and texts of episode summaries."""

    def dream(
        self,
        channel: Channel,
        cold_only: bool = False,
        on_step: Callable[[str], None] = lambda step: None,
    ) -> DreamReport:
        """Dream once over the channel (or, for a consolidation sweep, its cold memories).

        Each step holds the channel's lock only while it reads or writes the channel;
        the similarity search runs on a snapshot, so stores and recalls go on meanwhile.
        ``on_step`` hears the name of each step as it begins
        (:data:`~calor.server.engine.dream_report.DREAM_STEPS`).
        """
        started = time.perf_counter()
        on_step("materialising")
        with channel.lock:
            policy, clocks = channel.policy, channel.clocks()
            report = DreamReport(channel_heat_before=channel.state.heat(policy, clocks.now))
            report.migrated = self._materialise(channel, policy, clocks)
            report.retiered = channel.retier()
            scope = self._scope(channel, cold_only)
            snapshot = [(i, v) for i in scope if (v := channel.index.vector(i)) is not None]
        least = min(policy.dreams.conflict_similarity, policy.dreams.merge_similarity)
        on_step("pairing")
        pairs = _close_pairs(snapshot, least)
        on_step("conflicts")
        with channel.lock:
            pairs = {p: s for p, s in pairs.items() if all(_live(channel, i) for i in p)}
            contradicting = self._contradictions(channel, pairs, policy)
            opened = contradicting[: policy.dreams.max_conflicts]
            self._open_conflicts(channel, opened)
            report.conflicts = len(opened)
            report.conflicts_unopened = len(contradicting) - len(opened)
            disputed = {(a, b) for a, b, _ in contradicting}
            clusters = self._clusters(channel, pairs, disputed, policy, clocks)
        on_step("merging")
        for cluster in clusters:
            with channel.lock:
                if all(_live(channel, i) for i in cluster):
                    self._absorb(channel, cluster[0], cluster[1:], policy, clocks)
                    report.merged += len(cluster) - 1
                    report.merged_ids.extend(cluster[1:])
        on_step("promoting")
        with channel.lock:
            report.keystoned, report.promoted = self._promote(channel, policy, clocks, scope)
        if not cold_only:
            on_step("reclassifying")
            report.reclassified = self._reclassify(channel, clocks)
            on_step("summarising")
            report.summary_ids = self._summarise(channel, policy, clocks)
            report.summarised = len(report.summary_ids)
        on_step("archiving")
        with channel.lock:
            report.echoed, report.pruned = self._ghosts(channel, policy, clocks)
            report.archived_ids = self._archive(channel, policy, clocks)
            if cold_only:
                swept = self._sweep(channel, policy, clocks)
                report.swept = len(swept)
                report.archived_ids += swept
            report.archived = len(report.archived_ids)
            state = replace(channel.state)
            state.cool(policy, clocks.now)
            if not cold_only:
                state.last_dream_at = clocks.now  # the curator's schedule counts from here
            report.channel_heat_after = state.heat(policy, clocks.now)
            report.duration_ms = int((time.perf_counter() - started) * 1000)
            state.dreamt(clocks.now, cold_only, report.counts())
            event = EventRecord(
                kind="dream",
                channel=channel.name,
                at=clocks.now,
                message="consolidation sweep" if cold_only else "dream",
                payload={**report.payload(), "sweep": str(cold_only).lower()},
            )
            with changing(self._store, channel) as change:
                change.set_state(state)
                change.log(event)
            if self._after is not None:
                self._after(channel)
        return report

    def add_entropy(self, channel: Channel, entropy: int) -> tuple[int, bool]:
        """Accumulate offered bytes, durably; True (and reset to 0) when the channel's
        ``entropy_threshold`` is crossed, so the caller dreams."""
        with channel.lock:
            state = replace(channel.state, entropy=channel.state.entropy + entropy)
            crossed = state.entropy >= channel.policy.entropy_threshold
            if crossed:
                state.entropy = 0
            if state == channel.state:
                return state.entropy, crossed  # nothing offered: nothing to write
            with changing(self._store, channel) as change:
                change.set_state(state)
        return state.entropy, crossed

    # --- steps ---------------------------------------------------------------------

    def _write(self, channel: Channel, records: Iterable[MemoryRecord]) -> None:
        with changing(self._store, channel) as change:
            for record in records:
                change.put(record)

    def _materialise(self, channel: Channel, policy: ChannelPolicy, clocks: Clocks) -> int:
        """Persist every state that changed by itself; count moves to cold storage."""
        changed = [
            evolved
            for record in channel.records.values()
            if (evolved := evolve(record, policy, clocks)) is not record
        ]
        migrated = sum(1 for r in changed if r.state == ARCHIVED)
        self._write(channel, changed)
        return migrated

    def _scope(self, channel: Channel, cold_only: bool) -> list[str]:
        wanted = frozenset({COLD}) if cold_only else _LIVE
        return sorted(channel.records.ids_in(wanted))

    def _contradictions(
        self, channel: Channel, pairs: dict[tuple[str, str], float], policy: ChannelPolicy
    ) -> list[tuple[str, str, str]]:
        """The close pairs that contradict each other and are not in conflict yet, the
        closest first, each with why. A memory superseded or deprecated is settled
        already: it contradicts nothing."""
        found: list[tuple[float, str, str, str]] = []
        for (a, b), similarity in pairs.items():
            if similarity < policy.dreams.conflict_similarity or (a, b) in channel.conflicts:
                continue
            first, second = channel.records[a], channel.records[b]
            if first.superseded or second.superseded:
                continue
            reason = contradiction(first.text, second.text)
            if reason is not None:
                found.append((-similarity, a, b, reason))
        return [(a, b, reason) for _, a, b, reason in sorted(found)]

    def _open_conflicts(self, channel: Channel, conflicts: list[tuple[str, str, str]]) -> None:
        if conflicts:
            with changing(self._store, channel) as change:
                for a, b, reason in conflicts:
                    change.open_conflict(a, b, reason)

    def _clusters(
        self,
        channel: Channel,
        pairs: dict[tuple[str, str], float],
        disputed: set[tuple[str, str]],
        policy: ChannelPolicy,
        clocks: Clocks,
    ) -> list[list[str]]:
        """Groups in which every pair is at least the merge similarity close, none in
        conflict (open, or ``disputed`` in this dream) or kept apart (:func:`keep_apart`),
        none superseded (history stays as it was said), and every pair giving the same
        numbers (a paraphrase does; "episode 3" and "episode 4" are two memories); the
        first of each group survives (a keystone, else the hottest)."""
        records = channel.records
        close = {
            (a, b)
            for (a, b), similarity in pairs.items()
            if similarity >= policy.dreams.merge_similarity
            and (a, b) not in channel.conflicts
            and (a, b) not in disputed
            and b not in _kept_apart(records[a])
            and a not in _kept_apart(records[b])
            and not records[a].superseded
            and not records[b].superseded
            and same_numbers(records[a].text, records[b].text)
        }
        heat = {i: current_heat(channel.records[i], policy, clocks) for p in close for i in p}
        order = sorted(heat, key=lambda i: (not channel.records[i].keystone, -heat[i], i))
        taken: set[str] = set()
        clusters: list[list[str]] = []
        for seed in order:
            if seed in taken:
                continue
            cluster = [seed]
            for other in order:
                if other in taken or other in cluster:
                    continue
                if all((min(other, m), max(other, m)) in close for m in cluster):
                    if channel.records[other].keystone and not channel.records[seed].keystone:
                        continue  # a keystone is never absorbed into a non-keystone
                    cluster.append(other)
            if len(cluster) > 1:
                taken.update(cluster)
                clusters.append(cluster)
        return clusters

    def _absorb(
        self,
        channel: Channel,
        survivor_id: str,
        absorbed_ids: list[str],
        policy: ChannelPolicy,
        clocks: Clocks,
    ) -> None:
        """Fold ``absorbed_ids`` into the survivor, in one atomic batch."""
        survivor = replace(channel.records[survivor_id])
        absorbed = [replace(channel.records[i]) for i in absorbed_ids]
        heat = max(current_heat(r, policy, clocks) for r in [survivor, *absorbed])
        survivor.heat0, survivor.t0 = heat, clocks.now
        survivor.interactions0 = clocks.interactions
        survivor.recall_count += sum(r.recall_count for r in absorbed)
        survivor.merged_from = sorted({*survivor.merged_from, *absorbed_ids})
        for record in absorbed:
            survivor.tags = {**record.tags, **survivor.tags}
            record.state, record.merged_into, record.updated_at = MERGED, survivor.id, clocks.now
        survivor.updated_at = clocks.now
        with changing(self._store, channel) as change:
            for record in absorbed:
                for edge in channel.graph.edges(record.id):
                    change.unlink(edge)
                    if edge.to_id not in (survivor.id, *absorbed_ids):
                        change.link(survivor.id, edge.to_id, edge.kind, edge.weight)
                change.put(record)
            change.put(survivor)

    def _promote(
        self, channel: Channel, policy: ChannelPolicy, clocks: Clocks, scope: list[str]
    ) -> tuple[int, int]:
        """Keystones for the much-recalled and hot; working → episodic → semantic."""
        changed: dict[str, MemoryRecord] = {}
        keystoned = promoted = 0
        dreams = policy.dreams
        for memory_id in scope:
            record = channel.records[memory_id]
            if record.state not in _LIVE:
                continue
            heat = current_heat(record, policy, clocks)
            update = replace(
                record,
                heat0=heat,
                t0=clocks.now,
                interactions0=clocks.interactions,
                updated_at=clocks.now,
            )
            if (
                not record.keystone
                and record.recall_count >= dreams.keystone_recalls
                and heat >= dreams.keystone_heat
            ):
                update.keystone = True
                keystoned += 1
                changed[memory_id] = update
            new_type = _promoted_type(record, dreams)
            if new_type is not None:
                update.memory_type = new_type
                update.classifier_version = 0  # the dream's rule decided it, not the classifier
                promoted += 1
                changed[memory_id] = update
        self._write(channel, changed.values())
        return keystoned, promoted

    def _reclassify(self, channel: Channel, clocks: Clocks) -> int:
        """Classify again what an older classifier typed; how many changed type."""
        with channel.lock:
            stale = curator.reclassified(channel)
        if not stale:
            return 0
        types = curator.classify_all(stale)  # the rules, without the lock
        with channel.lock:
            changed, retyped = curator.reclassify(channel, stale, types, clocks)
            self._write(channel, changed)
        return retyped

    def _summarise(self, channel: Channel, policy: ChannelPolicy, clocks: Clocks) -> list[str]:
        """Summarise the sessions that are due one; the summaries' ids."""
        embed = self.embed
        if embed is None:
            return []
        with channel.lock:
            found = curator.episodes(channel, policy.dreams.episode_min)
        if not found:
            return []
        rows = embed([text for episode in found for text in episode.sentences])
        texts: list[str] = []
        for episode in found:
            texts.append(curator.summary_of(episode, rows[: len(episode.sentences)]))
            rows = rows[len(episode.sentences) :]
        vectors = embed(texts)
        with channel.lock:
            keep = [i for i, episode in enumerate(found) if curator.still_open(channel, episode)]
            if not keep:
                return []
            items = [curator.summary_item(channel, found[i], texts[i]) for i in keep]
            summaries, change = self._storing.derived(channel, items, vectors[keep])
            share = policy.dreams.episode_cooling
            # Cooled as of now: a source boosted or recalled while the episodes were
            # embedded holds a later moment than the dream began at.
            clocks = channel.clocks()
            for summary, i in zip(summaries, keep, strict=True):
                for source in found[i].sources:
                    change.link(summary.id, source, "summary", 1.0)
                    # Put last: a summary does not corroborate what it was made from.
                    record = channel.records[source]
                    change.put(curator.covered(record, summary.id, share, policy, clocks))
            commit(self._store, [change])
        return [summary.id for summary in summaries]

    def _ghosts(self, channel: Channel, policy: ChannelPolicy, clocks: Clocks) -> tuple[int, int]:
        ghosts = [channel.records[i] for i in channel.records.ids_in([GHOST])]
        echoes: set[tuple[str, str]] = set()
        for ghost in ghosts:
            live = sorted(
                n for n in channel.graph.neighbours(ghost.id) if channel.records.state(n) in _LIVE
            )
            for i, a in enumerate(live):
                for b in live[i + 1 :]:
                    if "echo" not in channel.graph.kinds(a, b):
                        echoes.add((a, b))
        prune_below = policy.dreams.prune_heat
        doomed = [g for g in ghosts if current_heat(g, policy, clocks) < prune_below]
        with changing(self._store, channel) as change:
            for a, b in sorted(echoes):
                change.link(a, b, "echo", 0.5)
            for ghost in doomed:
                change.forget(ghost, clocks.now)
        return len(echoes), len(doomed)

    def _sweep(self, channel: Channel, policy: ChannelPolicy, clocks: Clocks) -> list[str]:
        """Move the coldest COLD memories (not keystones, not core) to cold storage until
        the channel holds fewer than ``cold_count_trigger`` cold ones; their ids, coldest
        first."""
        cold = channel.records.ids_in((COLD,))
        excess = len(cold) - (policy.cold_count_trigger - 1)
        if excess <= 0:
            return []
        movable = [
            (current_heat(record, policy, clocks), memory_id)
            for memory_id in cold
            if not (record := channel.records[memory_id]).keystone and record.memory_type != "core"
        ]
        coldest = [memory_id for _, memory_id in heapq.nsmallest(excess, movable)]
        moved = [
            replace(channel.records[i], state=ARCHIVED, updated_at=clocks.now) for i in coldest
        ]
        self._write(channel, moved)
        return coldest

    def _archive(self, channel: Channel, policy: ChannelPolicy, clocks: Clocks) -> list[str]:
        dreams = policy.dreams
        old = [
            replace(r, state=ARCHIVED, updated_at=clocks.now)
            for r in channel.records.values()
            if r.state in _LIVE
            and not r.keystone
            and r.memory_type not in dreams.archive_exempt_types
            and clocks.now - r.created_at > dreams.archive_age_days * DAY
            and current_heat(r, policy, clocks) < dreams.archive_heat
            and r.importance < dreams.archive_importance
            and r.recall_count < dreams.archive_recalls
        ]
        self._write(channel, old)
        return [record.id for record in old]


def _promoted_type(record: MemoryRecord, dreams: DreamThresholds) -> str | None:
    if record.memory_type == "working":
        return "episodic"
    if (
        record.memory_type == "episodic"
        and record.importance >= dreams.semantic_importance
        and record.recall_count >= dreams.semantic_recalls
    ):
        return "semantic"
    return None


def keep_apart(restored: MemoryRecord, survivor: MemoryRecord) -> None:
    """Mark two memories a user separated (a merge undone) so dreams never merge them
    again; clearing the ``kept_apart_from`` tag lets them merge."""
    for record, other in ((restored, survivor), (survivor, restored)):
        apart = {*_kept_apart(record), other.id}
        record.tags = {**record.tags, _KEPT_APART: ",".join(sorted(apart))}


def _kept_apart(record: MemoryRecord) -> set[str]:
    value = record.tags.get(_KEPT_APART, "")
    return set(value.split(",")) if value else set()


def _live(channel: Channel, memory_id: str) -> bool:
    record = channel.records.get(memory_id)
    return record is not None and record.state in _LIVE


def _close_pairs(
    snapshot: list[tuple[str, np.ndarray]], least: float
) -> dict[tuple[str, str], float]:
    """Pairs of memories whose cosine is at least ``least``, with their cosine."""
    if len(snapshot) < 2:
        return {}
    index = ScratchIndex(snapshot[0][1].shape[0])
    matrix = np.stack([v for _, v in snapshot])
    index.add([i for i, _ in snapshot], matrix)
    pairs: dict[tuple[str, str], float] = {}
    for (memory_id, _), found in zip(snapshot, index.search(matrix, _NEIGHBOURS), strict=True):
        for similarity, other in found:
            if other != memory_id and similarity >= least:
                pairs[(min(memory_id, other), max(memory_id, other))] = similarity
    return pairs
