"""The store pipeline after embedding (DESIGN §4): novelty, type, entities, utility, links.

Pure: it reads the channel's view (never writing to it) plus what earlier items of the
same batch added, and returns the records and edges to write; the engine commits them
as one change, and only then does the view take them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from calor.models.entities import entity_key
from calor.models.text import CLASSIFIER_VERSION
from calor.server.commands import NewMemory, read_text
from calor.server.engine.rejections import Rejections
from calor.server.ids import new_id
from calor.server.recall.index import ChannelIndex, ScratchIndex
from calor.server.records import DELETED, MERGED, MemoryRecord
from calor.server.thermo.graph import Edge
from calor.server.thermo.heat import SOURCE_TRUST
from calor.server.thermo.lifecycle import refresh_utility
from calor.server.thermo.policy import ChannelPolicy, IngestTuning

__all__ = [
    "LINK_CHUNK",
    "Ingested",
    "Neighbourhood",
    "RecordBuilder",
    "build_records",
    "novelty_adjustment",
]

# Novelty, near-duplicates and entity hubs are channel settings (``ChannelPolicy.ingest``).

# Items of a batch are linked a chunk at a time: exact search over the channel, over the
# batch's earlier chunks, and within the chunk, never an all-pairs matrix of the batch.
LINK_CHUNK = 64


@dataclass
class Neighbourhood:
    """What a channel already holds that a new memory may link to, read-only, and what
    earlier items of the batch being built added (kept here, apart)."""

    index: ChannelIndex
    records: Mapping[str, MemoryRecord]
    entity_members: Mapping[str, list[str]]
    last_in_session: Mapping[str, tuple[str, float]]
    rejections: Rejections | None = None
    """What the channel was told not to learn again (Forget with reject)."""
    added_members: dict[str, list[str]] = field(default_factory=dict)
    added_last: dict[str, tuple[str, float]] = field(default_factory=dict)

    def members(self, key: str) -> list[str]:
        """The memories naming an entity, the batch's own last."""
        added = self.added_members.get(key)
        held = self.entity_members.get(key, [])
        return held if added is None else [*held, *added]

    def last(self, session: str) -> tuple[str, float] | None:
        """The latest memory of a session stream, the batch's own first; none when that
        memory was forgotten or merged away (nothing links to those)."""
        found = self.added_last.get(session) or self.last_in_session.get(session)
        held = self.records.get(found[0]) if found is not None else None
        if held is not None and held.state in (DELETED, MERGED):
            return None
        return found

    def knows_entity(self, key: str) -> bool:
        """Whether a memory of the channel, or of the batch so far, names this entity."""
        return bool(self.members(key))

    def remember(self, record: MemoryRecord) -> None:
        """Let later items of the same batch link to this record."""
        for entity in dict.fromkeys(entity_key(e) for e in record.entities):
            self.added_members.setdefault(entity, []).append(record.id)
        if record.session:
            self.added_last[record.session] = (record.id, record.created_at)


@dataclass
class Ingested:
    """A record ready to write, with its edges and the older memories it confirms."""

    record: MemoryRecord
    vector: np.ndarray
    edges: list[Edge] = field(default_factory=list)
    confirms: list[str] = field(default_factory=list)


def novelty_adjustment(nearest: float, tuning: IngestTuning) -> float:
    """Importance change for a memory whose closest neighbour has cosine ``nearest``: the
    near-duplicate penalty, else a bonus that grows linearly from none at the familiar
    similarity to all of it at the novel one."""
    if nearest >= tuning.near_duplicate_similarity:
        return -tuning.near_duplicate_penalty
    share = (tuning.familiar_similarity - nearest) / (
        tuning.familiar_similarity - tuning.novel_similarity
    )
    return tuning.novelty_bonus * min(1.0, max(0.0, share))


def _session(item: NewMemory) -> str:
    """The session stream an episodic memory joins: its ``session`` tag, or the untagged one
    (where only memories within the session gap of each other are linked)."""
    tagged = item.tags.get("session")
    return "tag:" + tagged if tagged else "time:"


def build_records(
    items: Sequence[NewMemory],
    vectors: np.ndarray,
    hood: Neighbourhood,
    policy: ChannelPolicy,
    now: float,
    interactions: int,
) -> list[Ingested]:
    """Turn validated items of one channel into records and edges, in order.

    Later items of the batch see earlier ones as neighbours, so a batch links the
    same way as the same memories stored one by one.
    """
    return RecordBuilder(hood, policy, now, interactions).build(items, vectors)


class RecordBuilder:
    """:func:`build_records` for a batch given a part at a time: each part's items see
    the parts before as neighbours, as one batch's later items see its earlier ones.
    ``interactions`` is the channel's count before the batch (each item adds one)."""

    def __init__(
        self, hood: Neighbourhood, policy: ChannelPolicy, now: float, interactions: int
    ) -> None:
        self._hood = hood
        self._policy = policy
        self._now = now
        self._interactions = interactions
        self._earlier = ScratchIndex(hood.index.dim, hood.index.vectors.approximate_above)
        self._built = 0

    def build(self, items: Sequence[NewMemory], vectors: np.ndarray) -> list[Ingested]:
        """The next part's records and edges, in order."""
        hood, policy = self._hood, self._policy
        k = max(policy.ingest.novelty_neighbours, policy.semantic_link_max)
        out: list[Ingested] = []
        for start in range(0, len(items), LINK_CHUNK):
            chunk = vectors[start : start + LINK_CHUNK]
            sims, labels = hood.index.search_many(chunk, k)
            from_batch = self._earlier.search(chunk, k)
            within = chunk @ chunk.T
            for row in range(chunk.shape[0]):
                candidates = [
                    (float(s), hood.index.memory_id(int(lab)))
                    for s, lab in zip(sims[row], labels[row], strict=True)
                    if lab >= 0
                ]
                candidates += from_batch[row]
                candidates += [
                    (float(within[row, j]), out[start + j].record.id) for j in range(row)
                ]
                candidates.sort(key=lambda c: (-c[0], c[1]))
                self._built += 1
                out.append(
                    _one(
                        items[start + row],
                        chunk[row],
                        candidates[:k],
                        hood,
                        policy,
                        self._now,
                        self._interactions + self._built,
                    )
                )
                hood.remember(out[-1].record)
            self._earlier.add([entry.record.id for entry in out[start:]], chunk)
        return out


def _one(
    item: NewMemory,
    vector: np.ndarray,
    candidates: list[tuple[float, str]],
    hood: Neighbourhood,
    policy: ChannelPolicy,
    now: float,
    interactions: int,
) -> Ingested:
    created = item.created_at if item.created_at is not None else now
    reading = item.reading or read_text(item.text, item.memory_type)
    memory_type = reading.memory_type
    nearest = candidates[0][0] if candidates else 0.0
    provenance = dict(item.provenance)
    confirms: list[str] = []
    base = item.importance
    if base is None:
        base = policy.default_importance * SOURCE_TRUST[item.source]
    duplicate = policy.ingest.near_duplicate_similarity
    rejected = hood.rejections.closest(vector) if hood.rejections is not None else None
    if rejected is not None and rejected[1] >= duplicate:
        # Like a near-duplicate of what a person removed: penalised, and said so.
        provenance["resembles_rejected"] = rejected[0]
        closeness = max(nearest, rejected[1])
    else:
        closeness = nearest
    importance = base + novelty_adjustment(closeness, policy.ingest)
    importance = min(1.0, max(0.0, importance))
    if nearest >= duplicate:
        provenance["near_duplicate_of"] = candidates[0][1]
        confirms.append(candidates[0][1])
    record = MemoryRecord(
        id=new_id(),
        channel=item.channel,
        text=item.text,
        memory_type=memory_type,
        created_at=created,
        updated_at=now,
        heat0=1.0,
        t0=created,
        importance=importance,
        keystone=item.keystone,
        tags=dict(item.tags),
        entities=reading.entities(hood.knows_entity),
        source=item.source,
        confidence=item.confidence,
        provenance=provenance,
        idempotency_key=item.idempotency_key,
        interactions0=interactions,
        valence=reading.valence,
        surprise=min(1.0, max(0.0, 1.0 - nearest)),
        importance_adjustment=importance - base,
        classifier_version=CLASSIFIER_VERSION if item.memory_type is None else 0,
        heat_history=[],
    )
    if memory_type == "episodic":
        record.session = _session(item)
    refresh_utility(record, now)
    edges = _links(record, candidates, hood, policy)
    return Ingested(record, vector, edges, confirms)


def _links(
    record: MemoryRecord,
    candidates: list[tuple[float, str]],
    hood: Neighbourhood,
    policy: ChannelPolicy,
) -> list[Edge]:
    edges: dict[tuple[str, str], Edge] = {}
    for similarity, other in candidates[: policy.semantic_link_max]:
        if similarity >= policy.semantic_link_threshold:
            edges[(other, "semantic")] = Edge(record.id, other, "semantic", similarity)
    for entity in record.entities:
        members = hood.members(entity_key(entity))
        if len(members) > policy.ingest.entity_hub:
            continue  # named in so many memories it tells them apart no more than "the"
        for other in members[max(len(members) - policy.entity_link_max, 0) :]:  # [-0:] is all
            edges.setdefault((other, "entity"), Edge(record.id, other, "entity", 1.0))
    if record.session:
        last = hood.last(record.session)
        if last is not None:
            gap = abs(record.created_at - last[1])
            if record.session.startswith("tag:") or gap <= policy.session_gap_seconds:
                edges[(last[0], "sequence")] = Edge(record.id, last[0], "sequence", 1.0)
    return list(edges.values())
