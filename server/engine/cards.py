"""Entity cards (DESIGN §8): what a channel knows about one entity, and how a memory is
shown in a card or a Context block.

A card gathers the memories naming an entity (``Channel.entity_members``) once at least
:data:`CARD_MIN_MEMORIES` of them exist: its core, fact and preference memories first,
then the hottest others, near-identical texts once, at most :data:`CARD_SIZE`. Cards are
built from the live view with no model and cached per channel; a card is rebuilt when a
memory naming its entity arrives, leaves or changes what it shows, and at the end of
every dream (:meth:`EntityCards.refresh`), which also brings its heat order up to date.
Rendering is deterministic: the same memories give byte-identical text.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from calor.models.entities import entity_key
from calor.server.engine.channel import Channel
from calor.server.errors import NotFoundError
from calor.server.records import ACTIVE, ARCHIVED, COLD, MemoryRecord
from calor.server.thermo.lifecycle import Clocks, current_heat

__all__ = [
    "CARD_MIN_MEMORIES",
    "CARD_SIZE",
    "PROFILE_TYPES",
    "Distinct",
    "EntityCard",
    "EntityCards",
    "Shows",
    "day",
    "one_line",
    "shows",
]

CARD_MIN_MEMORIES = 5
"""Memories that must name an entity before it has a card."""
CARD_SIZE = 20
"""Most memories a card holds."""
PROFILE_TYPES = frozenset({"core", "fact", "preference"})
"""The memory types that say who the user is: first in a card, always in a Context."""

_LIVE = frozenset({ACTIVE, COLD})
_KNOWN = frozenset({ACTIVE, COLD, ARCHIVED})  # what a card may show (not ghosts, merged, gone)
_CACHED_CARDS = 1024  # per server, least recently used dropped first
_CARD_SCAN = 500  # of an entity named very often, the latest memories of each kind weighed
_SPACE = re.compile(r"\s+")
_WORDS = re.compile(r"\w+")

# What a card or block shows of a memory: text, type, date, tags, pin, and whether it is
# live (ACTIVE and COLD look alike: heat alone never changes what is shown).
Shows = tuple[str, str, float, tuple[tuple[str, str], ...], bool, str]


def shows(record: MemoryRecord | None) -> Shows | None:
    """What a card or Context block shows of a stored memory, to tell when it changed."""
    if record is None:
        return None
    state = "live" if record.state in _LIVE else record.state
    tags = tuple(sorted(record.tags.items()))
    return (record.text, record.memory_type, record.created_at, tags, record.keystone, state)


def one_line(text: str) -> str:
    """A memory's text on one line: every run of whitespace becomes one space."""
    return _SPACE.sub(" ", text).strip()


def day(seconds: float) -> str:
    """The UTC date of a moment, ``2026-11-23``: absolute, so a rendered line never ages."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d")


class Distinct:
    """Admits memories one at a time, refusing a text near-identical to one admitted:
    the same words (case, spacing and punctuation aside), or embeddings at least
    ``similarity`` close."""

    def __init__(self, channel: Channel, similarity: float) -> None:
        self._channel = channel
        self._similarity = similarity
        self._texts: set[str] = set()
        self._matrix = np.empty((8, channel.dim), dtype=np.float32)  # admitted rows first
        self._rows = 0
        self._looked_up: tuple[str, np.ndarray | None] = ("", None)

    def admits(self, record: MemoryRecord) -> bool:
        """Whether the memory says something not admitted yet (without admitting it)."""
        if _words(record.text) in self._texts:
            return False
        vector = self._vector(record.id)
        if vector is None or not self._rows:
            return True
        return float(np.max(self._matrix[: self._rows] @ vector)) < self._similarity

    def admit(self, record: MemoryRecord) -> None:
        """Take the memory in: later near-identical texts are refused."""
        self._texts.add(_words(record.text))
        vector = self._vector(record.id)
        if vector is None:
            return
        if self._rows == len(self._matrix):
            self._matrix = np.concatenate([self._matrix, np.empty_like(self._matrix)])
        self._matrix[self._rows] = vector
        self._rows += 1

    def _vector(self, memory_id: str) -> np.ndarray | None:
        """The memory's embedding (the last one looked up is kept: admits, then admit)."""
        if self._looked_up[0] != memory_id:
            vector = self._channel.index.vector(memory_id)
            if vector is None:
                vector = self._channel.attic.vector(memory_id)
            self._looked_up = (memory_id, vector)
        return self._looked_up[1]


def _words(text: str) -> str:
    return " ".join(_WORDS.findall(text.casefold()))


@dataclass(frozen=True)
class EntityCard:
    """One entity's card: its name as the memories spell it, the memories in the order
    shown, and the rendered text."""

    entity: str
    memory_ids: tuple[str, ...]
    text: str


@dataclass
class _Cached:
    """A card and what it was built from: the memories naming the entity, each as last
    seen (a changed record that shows the same is taken in)."""

    card: EntityCard
    revision: int  # the channel's revision the card was last found current at
    members: tuple[str, ...]
    records: list[MemoryRecord | None]


class EntityCards:
    """The cards of every channel, built on demand and kept (least recently used dropped).

    Every method expects the caller to hold the channel's lock.
    """

    def __init__(self, size: int = _CACHED_CARDS) -> None:
        self._size = size
        self._cards: OrderedDict[tuple[str, str], _Cached] = OrderedDict()
        self._lock = threading.Lock()  # the cache is shared by every channel's callers

    def card(self, channel: Channel, key: str) -> EntityCard | None:
        """The card of an entity (by :func:`entity_key`), or None when fewer than
        :data:`CARD_MIN_MEMORIES` memories name it."""
        with self._lock:
            cached = self._cards.get((channel.name, key))
            if cached is not None:
                self._cards.move_to_end((channel.name, key))
        if cached is not None and _still_current(cached, channel, key):
            return cached.card
        return self._build(channel, key)

    def require(self, channel: Channel, entity: str) -> EntityCard:
        """The card of an entity named as the caller spells it; NOT_FOUND without one."""
        key = entity_key(entity)
        card = self.card(channel, key)
        if card is None:
            named = len(_known(channel, channel.entity_members.get(key, []), channel.clocks()))
            raise NotFoundError(
                f"no entity card for {entity!r} in channel {channel.name!r}: it is named in "
                f"{named} memories, and a card needs at least {CARD_MIN_MEMORIES}"
            )
        return card

    def refresh(self, channel: Channel) -> None:
        """Rebuild the channel's cached cards from its live view (at the end of a dream)."""
        with self._lock:
            keys = [key for name, key in self._cards if name == channel.name]
        for key in keys:
            self._build(channel, key)

    def _build(self, channel: Channel, key: str) -> EntityCard | None:
        members = tuple(channel.entity_members.get(key, []))
        records = [channel.records.get(i) for i in members]
        card = build_card(channel, key, channel.clocks())
        with self._lock:
            if card is None:
                self._cards.pop((channel.name, key), None)
                return None
            cached = _Cached(card, channel.revision, members, records)
            self._cards[(channel.name, key)] = cached
            self._cards.move_to_end((channel.name, key))
            while len(self._cards) > self._size:
                self._cards.popitem(last=False)
        return card


def _still_current(cached: _Cached, channel: Channel, key: str) -> bool:
    """Whether a card still says what its entity's memories say: the same memories name
    it and each shows what it showed (heat, counts and other bookkeeping aside)."""
    if cached.revision == channel.revision:
        return True  # nothing at all changed in the channel
    if tuple(channel.entity_members.get(key, [])) != cached.members:
        return False
    for n, memory_id in enumerate(cached.members):
        record = channel.records.get(memory_id)
        if record is cached.records[n]:
            continue
        if shows(record) != shows(cached.records[n]):
            return False
        cached.records[n] = record
    cached.revision = channel.revision
    return True


def _known(channel: Channel, ids: Iterable[str], clocks: Clocks) -> list[MemoryRecord]:
    """The memories among ``ids`` a card may show, as they stand: not ghosts, merged,
    forgotten or superseded."""
    known: list[MemoryRecord] = []
    for memory_id in ids:
        record = channel.records.get(memory_id)
        if record is None:
            continue
        record = channel.evolved(record, clocks)
        if record.state in _KNOWN and not record.superseded:
            known.append(record)
    return known


def build_card(channel: Channel, key: str, clocks: Clocks) -> EntityCard | None:
    """An entity's card from the live view, or None when too few memories name it.

    Of an entity named very often, the latest :data:`_CARD_SCAN` profile memories and
    the latest as many others are weighed, so a card costs the same however often its
    entity is named.
    """
    ids = channel.entity_members.get(key, [])
    profile: list[str] = []
    others: list[str] = []
    for memory_id in ids:
        record = channel.records.get(memory_id)
        if record is not None:
            (profile if record.memory_type in PROFILE_TYPES else others).append(memory_id)
    weighed = [*profile[-_CARD_SCAN:], *others[-_CARD_SCAN:]]
    members = _known(channel, weighed, clocks)
    if len(members) < CARD_MIN_MEMORIES and len(weighed) < len(ids):
        members = _known(channel, ids, clocks)
    if len(members) < CARD_MIN_MEMORIES:
        return None
    policy = channel.policy
    heat = {r.id: current_heat(r, policy, clocks) for r in members}
    order = sorted(members, key=lambda r: (r.memory_type not in PROFILE_TYPES, -heat[r.id], r.id))
    distinct = Distinct(channel, policy.ingest.near_duplicate_similarity)
    picked: list[MemoryRecord] = []
    for record in order:
        if len(picked) == CARD_SIZE:
            break
        if distinct.admits(record):
            distinct.admit(record)
            picked.append(record)
    # Shown in a stable order (profile first, then the others, each oldest first), so the
    # same memories give the same text whatever their heat.
    picked.sort(key=lambda r: (r.memory_type not in PROFILE_TYPES, r.id))
    name = _spelling(picked, key)
    lines = [f"## {name}"]
    lines.extend(f"- {day(r.created_at)} {r.memory_type}: {one_line(r.text)}" for r in picked)
    return EntityCard(name, tuple(r.id for r in picked), "\n".join(lines) + "\n")


def _spelling(members: list[MemoryRecord], key: str) -> str:
    """How the card's memories spell the entity most often (the earliest on a tie)."""
    spellings: Counter[str] = Counter()
    first: dict[str, str] = {}
    for record in sorted(members, key=lambda r: r.id):
        for entity in record.entities:
            if entity_key(entity) == key:
                spellings[entity] += 1
                first.setdefault(entity, record.id)
    if not spellings:
        return key
    return min(spellings, key=lambda s: (-spellings[s], first[s], s))
