"""The curator's steps of a dream (DESIGN §6): episode summaries and re-classification.

*Episode summaries.* A session (episodic memories chained by ``sequence`` edges) of at
least ``episode_min`` memories not summarised yet gets one semantic memory made of its
most central sentences: those whose embeddings lie closest to the mean of the session's
memories, in the order they were said, none repeating another. Nothing is generated;
the only model is the embedder. The summary links to each source by a ``summary`` edge;
each source is tagged ``summarised_in`` (the summary's id) and gives up
``episode_cooling`` of its heat, once. Forgetting a summary (or a source it quotes, which
takes the summary with it) leaves its other sources to be summarised again.

*Re-classification.* A memory whose type was inferred records the classifier version
that inferred it; once the server's classifier is newer, the memory is classified again
and, where the type changes, takes the new type's decay from its current heat on.

Each step reads the channel under its lock, does its slow part (the model, the rules)
without it, and writes under it again only what did not change meanwhile.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from calor.models.text import CLASSIFIER_VERSION, classify_type
from calor.server.commands import NewMemory
from calor.server.engine.channel import Channel
from calor.server.records import ACTIVE, COLD, DELETED, MemoryRecord
from calor.server.thermo.lifecycle import Clocks, current_heat
from calor.server.thermo.policy import ChannelPolicy

__all__ = [
    "MAX_EPISODES",
    "SUMMARY_TAG",
    "Embed",
    "Episode",
    "Reclassified",
    "classify_all",
    "SUMMARISED_TAG",
    "covered",
    "episodes",
    "quotes_sentence_of",
    "reclassified",
    "reclassify",
    "sentences",
    "still_open",
    "summary_item",
    "summary_of",
]

Embed = Callable[[list[str]], np.ndarray]
"""The embedder as a dream calls it: passages in, one unit row each out (blocking)."""

MAX_EPISODES = 64
"""Episodes one dream summarises at most, the oldest first; the next dream goes on."""

SUMMARY_TAG = "episode_summary"
"""The tag an episode's summary carries: how many memories it summarises."""

SUMMARISED_TAG = "summarised_in"
"""The tag of a summarised memory: the id of the summary that covers it."""

_LIVE = frozenset({ACTIVE, COLD})
_SEQUENCE = "sequence"
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
_MIN_WORDS = 3  # "Yes." or "Thanks!" says nothing about the episode
_MAX_SENTENCE_CHARS = 600  # longer is a code block or a list, not a sentence
_CANDIDATES = 512  # sentences embedded per episode at most, spread over its memories
_MAX_CHARS = 2_000  # a summary's length at most
_REDUNDANT = 0.90  # a sentence this close to one already chosen adds nothing


@dataclass(frozen=True)
class Episode:
    """A session to summarise: its sources in the order they were stored, their
    candidate sentences (each with the position of its source), and the session's
    centre (the unit mean of the sources' embeddings)."""

    sources: tuple[str, ...]
    sentences: tuple[str, ...]
    owners: tuple[int, ...]
    centre: np.ndarray
    session: str


def sentences(text: str) -> list[str]:
    """A text's sentences that can stand in a summary: at least three words, at most
    600 characters, stripped, in order."""
    return [
        s
        for piece in _SENTENCE_BREAK.split(text)
        if len((s := piece.strip()).split()) >= _MIN_WORDS and len(s) <= _MAX_SENTENCE_CHARS
    ]


def episodes(channel: Channel, minimum: int) -> list[Episode]:
    """The sessions of the channel with at least ``minimum`` live episodic memories no
    summary links to yet (at most ``MAX_EPISODES``, the oldest first), each with its
    candidate sentences; the caller holds the lock."""
    if minimum <= 0:
        return []
    open_members: dict[str, list[MemoryRecord]] = {}
    for session, memory_ids in _sessions(channel).items():
        for memory_id in memory_ids:
            record = channel.records[memory_id]
            if record.memory_type == "episodic" and not _summarised(channel, memory_id):
                open_members.setdefault(session, []).append(record)
    ready = sorted(
        (
            sorted(members, key=_stored_order)
            for members in open_members.values()
            if len(members) >= minimum
        ),
        key=lambda members: _stored_order(members[0]),
    )
    found = []
    for members in ready:
        episode = _episode(channel, members)
        if episode is not None:
            found.append(episode)
        if len(found) == MAX_EPISODES:
            break
    return found


def _sessions(channel: Channel) -> dict[str, list[str]]:
    """The live memories chained by sequence edges, by session (any one member's id)."""
    parent: dict[str, str] = {}

    def root(memory_id: str) -> str:
        parent.setdefault(memory_id, memory_id)
        while parent[memory_id] != memory_id:
            parent[memory_id] = parent[parent[memory_id]]
            memory_id = parent[memory_id]
        return memory_id

    states = channel.records
    for memory_id in states.ids_in(_LIVE):
        for edge in channel.graph.edges(memory_id):
            if edge.kind == _SEQUENCE and states.state(edge.to_id) in _LIVE:
                a, b = root(memory_id), root(edge.to_id)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    sessions: dict[str, list[str]] = {}
    for memory_id in list(parent):
        sessions.setdefault(root(memory_id), []).append(memory_id)
    return sessions


def _stored_order(record: MemoryRecord) -> tuple[float, str]:
    return record.created_at, record.id


def _summarised(channel: Channel, memory_id: str) -> bool:
    """Whether a summary covers the memory now (one that was forgotten covers nothing)."""
    summary_id = channel.records[memory_id].tags.get(SUMMARISED_TAG)
    return summary_id is not None and channel.records.state(summary_id) not in (None, DELETED)


def _episode(channel: Channel, members: list[MemoryRecord]) -> Episode | None:
    vectors = [channel.index.vector(r.id) for r in members]
    held = [v for v in vectors if v is not None]
    if not held:
        return None
    centre = np.mean(held, axis=0)
    centre /= max(float(np.linalg.norm(centre)), 1e-12)
    share = max(1, _CANDIDATES // len(members))
    texts: list[str] = []
    owners: list[int] = []
    for position, record in enumerate(members):
        taken = sentences(record.text)[:share]
        texts += taken
        owners += [position] * len(taken)
    if not texts:
        return None
    session = members[-1].session
    return Episode(tuple(r.id for r in members), tuple(texts), tuple(owners), centre, session)


def summary_of(episode: Episode, vectors: np.ndarray) -> str:
    """The episode's summary text: its most central sentences (``vectors``: one unit row
    per candidate sentence), none within 0.90 cosine of another chosen, about one per
    square root of its size (three to eight), at most 2,000 characters, in the order
    they were said."""
    wanted = min(8, max(3, round(math.sqrt(len(episode.sources)))))
    order = np.argsort(-(vectors @ episode.centre), kind="stable")
    chosen: list[int] = []
    length = 0
    for index in order.tolist():
        if len(chosen) == wanted:
            break
        text = episode.sentences[index]
        if length + len(text) + 1 > _MAX_CHARS or text in (episode.sentences[c] for c in chosen):
            continue
        if chosen and float(np.max(vectors[chosen] @ vectors[index])) >= _REDUNDANT:
            continue
        chosen.append(index)
        length += len(text) + 1
    chosen.sort(key=lambda c: (episode.owners[c], c))
    return " ".join(episode.sentences[c] for c in chosen)


def summary_item(channel: Channel, episode: Episode, text: str) -> NewMemory:
    """The new memory that stands for an episode: semantic, inferred, extracted from its
    sources, as important as the most important of them."""
    sources = [channel.records[i] for i in episode.sources]
    tags = {SUMMARY_TAG: str(len(sources))}
    if episode.session.startswith("tag:"):
        tags["session"] = episode.session.removeprefix("tag:")
    return NewMemory(
        channel=channel.name,
        text=text,
        memory_type="semantic",
        importance=max(r.importance for r in sources),
        tags=tags,
        source="extracted",
        confidence="inferred",
    )


def still_open(channel: Channel, episode: Episode) -> bool:
    """Whether every source is still live, episodic and unsummarised (nothing changed
    them while the summary was made without the lock)."""
    for memory_id in episode.sources:
        record = channel.records.get(memory_id)
        if record is None or record.state not in _LIVE or record.memory_type != "episodic":
            return False
        if _summarised(channel, memory_id):
            return False
    return True


def covered(
    record: MemoryRecord, summary_id: str, share: float, policy: ChannelPolicy, clocks: Clocks
) -> MemoryRecord:
    """A source as its summary leaves it: tagged with the summary's id and, the first
    time it is summarised, with ``share`` of its current heat taken away (a source whose
    earlier summary was forgotten is not cooled twice)."""
    update = replace(
        record,
        tags={**record.tags, SUMMARISED_TAG: summary_id},
        updated_at=clocks.now,
    )
    if SUMMARISED_TAG not in record.tags:
        update.heat0 = current_heat(record, policy, clocks) * (1.0 - share)
        update.t0, update.interactions0 = clocks.now, clocks.interactions
    return update


def quotes_sentence_of(summary: MemoryRecord, source_text: str) -> bool:
    """Whether a summary holds a sentence of a source's text."""
    return any(sentence in summary.text for sentence in sentences(source_text))


@dataclass(frozen=True)
class Reclassified:
    """A memory to classify again: its id, the text and version it was classified from."""

    memory_id: str
    text: str
    version: int


def reclassified(channel: Channel) -> list[Reclassified]:
    """The live memories whose type an older classifier inferred; the caller holds the
    lock."""
    return [
        Reclassified(record.id, record.text, record.classifier_version)
        for record in channel.records.values()
        if record.state in _LIVE and 0 < record.classifier_version < CLASSIFIER_VERSION
    ]


def reclassify(
    channel: Channel, stale: Sequence[Reclassified], types: Sequence[str], clocks: Clocks
) -> tuple[list[MemoryRecord], int]:
    """The records to write for memories classified again as ``types`` (one per stale
    memory), those changed since left out, and how many changed type; the caller holds
    the lock. A memory whose type changes takes the new type's decay from its current
    heat on."""
    policy = channel.policy
    changed: list[MemoryRecord] = []
    retyped = 0
    for entry, memory_type in zip(stale, types, strict=True):
        record = channel.records.get(entry.memory_id)
        if (
            record is None
            or record.state not in _LIVE
            or record.text != entry.text
            or record.classifier_version != entry.version
        ):
            continue  # corrected, retyped or forgotten meanwhile: not ours to change
        update = replace(record, classifier_version=CLASSIFIER_VERSION)
        if memory_type != record.memory_type:
            update.heat0 = current_heat(record, policy, clocks)
            update.t0, update.interactions0 = clocks.now, clocks.interactions
            update.memory_type, update.updated_at = memory_type, clocks.now
            retyped += 1
        changed.append(update)
    return changed, retyped


def classify_all(stale: Sequence[Reclassified]) -> list[str]:
    """The type today's classifier gives each stale memory's text."""
    return [classify_type(entry.text) for entry in stale]
