"""The recall log: what each recall returned and why, kept so that feedback can name a
recall and a fit can rank its hits again with other weights.

Every non-peek recall (and every context call) gets a recall id, a ULID stamped with
the server's clock, so a channel's entries sort by time. An entry holds the hits in
rank order, each with its memory type and the signals its score was made of, before
weighting (similarity, lexical, keyword, heat, temporal, source, own channel).

Retention is decided here, once: an entry is kept for :data:`RETENTION_SECONDS` (30
days) and a channel keeps at most :data:`MAX_ENTRIES` of them; each new entry drops up
to :data:`TRIM_PER_ENTRY` of the oldest that are past either bound, with their feedback,
in the same batch. Entries are written with the change they describe:

    entry = RecallEntry.new(ranked, channel.name, registry.policy, now)
    with changing(store, channel) as change:
        ...
        change.keep(recall_log.writes(channel.name, entry))

The caller holds the channel's lock, so the tally of entries stays exact.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from calor.server.ids import new_id
from calor.server.recall.ranking import Hit
from calor.server.storage.ops import DeleteKey, PutKey
from calor.server.storage.store import Keys, MemoryStore
from calor.server.thermo.policy import ChannelPolicy, RecallWeights

__all__ = [
    "MAX_ENTRIES",
    "RETENTION_SECONDS",
    "TRIM_PER_ENTRY",
    "ForeignHit",
    "LoggedHit",
    "RecallEntry",
    "RecallLog",
    "Scored",
    "id_seconds",
    "log_entry",
    "logged_hit",
    "logged_hits",
    "new_recall_id",
    "since_id",
]

RETENTION_SECONDS = 30 * 86_400.0
"""How long a recall (and the feedback on it) is kept: the window Identity reports on."""
MAX_ENTRIES = 1000
"""The most recalls a channel's log keeps; older ones go first."""
TRIM_PER_ENTRY = 8
"""The most old entries one new entry drops, so a log past its bounds shrinks back
without any one recall paying for all of it."""

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32, as ids are written
_TIME_CHARS = 10  # a ULID's first ten characters are its milliseconds


def new_recall_id(at: float) -> str:
    """A new recall id stamped with ``at`` (the server's clock), so ids sort by time."""
    return new_id(at)


def id_seconds(recall_id: str) -> float:
    """The moment stamped into a recall id, in seconds since the epoch."""
    ms = 0
    for char in recall_id[:_TIME_CHARS]:
        ms = ms * 32 + _ALPHABET.index(char)
    return ms / 1000.0


def since_id(at: float) -> str:
    """The least recall id stamped at or after ``at``: where a scan from then starts."""
    ms = max(int(at * 1000), 0)
    chars = []
    for _ in range(_TIME_CHARS):
        chars.append(_ALPHABET[ms & 31])
        ms >>= 5
    return "".join(reversed(chars))


@dataclass(frozen=True)
class LoggedHit:
    """One hit of a logged recall: the memory, its type, and the signals its score was
    made of, before weighting.

    Attributes:
        memory_id: The memory.
        memory_type: Its type then (``episodic``, ``fact``, ...).
        own: Whether it is a memory of the recalling channel (the own-channel bonus).
        score: The score it was ranked by.
        band: Its confidence band.
        similarity: Cosine similarity to the query.
        lexical: What the words added to its relevance, per unit of ``weight_lexical``
            (relevance = similarity + weight_lexical · lexical).
        keyword: Share of the query's words it holds (0..1), times the recall's spread
            of relevance (see :mod:`calor.server.recall.fusion`).
        heat: The heat the ranking used, times the recall's spread likewise.
        temporal: Closeness to the time the query named (1 inside the window, fading to 0).
        source: The trust of its source (human 1.0, agent 0.7, ...).
    """

    memory_id: str
    memory_type: str
    own: bool
    score: float
    band: str
    similarity: float
    lexical: float
    keyword: float
    heat: float
    temporal: float
    source: float

    def as_dict(self) -> dict[str, Any]:
        """The hit as JSON-ready values."""
        return {
            "id": self.memory_id,
            "type": self.memory_type,
            "own": self.own,
            "score": self.score,
            "band": self.band,
            "similarity": self.similarity,
            "lexical": self.lexical,
            "keyword": self.keyword,
            "heat": self.heat,
            "temporal": self.temporal,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoggedHit:
        """A hit from :meth:`as_dict`'s values."""
        return cls(
            memory_id=str(data["id"]),
            memory_type=str(data["type"]),
            own=bool(data["own"]),
            score=float(data["score"]),
            band=str(data["band"]),
            similarity=float(data["similarity"]),
            lexical=float(data["lexical"]),
            keyword=float(data["keyword"]),
            heat=float(data["heat"]),
            temporal=float(data["temporal"]),
            source=float(data["source"]),
        )


@dataclass(frozen=True)
class RecallEntry:
    """One logged recall: its id, when it was made, and its hits in rank order."""

    recall_id: str
    at: float
    hits: tuple[LoggedHit, ...]

    def to_json(self) -> bytes:
        """The entry as stored."""
        data = {"at": self.at, "hits": [hit.as_dict() for hit in self.hits]}
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def new(
        cls,
        hits: Iterable[Hit | ForeignHit],
        channel: str,
        policy_of: Callable[[str], ChannelPolicy],
        at: float,
    ) -> RecallEntry:
        """The entry of a recall of ``channel`` made ``at`` (a new recall id), its hits
        as :func:`logged_hits` keeps them."""
        return cls(new_recall_id(at), at, tuple(logged_hits(hits, channel, policy_of)))

    @classmethod
    def from_json(cls, recall_id: str, data: bytes) -> RecallEntry:
        """An entry as stored under ``recall_id``."""
        loaded = json.loads(data)
        hits = tuple(LoggedHit.from_dict(hit) for hit in loaded["hits"])
        return cls(recall_id, float(loaded["at"]), hits)

    def hit_types(self) -> dict[str, str]:
        """Each hit's memory id → its memory type."""
        return {hit.memory_id: hit.memory_type for hit in self.hits}


@dataclass(frozen=True)
class ForeignHit:
    """A hit of a channel another shard holds (cluster mode: a recall naming channels
    of several shards), ranked there: how the log keeps it, and its reply as it came."""

    logged: LoggedHit
    reply: object

    @property
    def order(self) -> tuple[float, str]:
        """Where it ranks among the recall's hits (best first, ties by memory id)."""
        return (-self.logged.score, self.logged.memory_id)


def _unweighted(value: float, weight: float) -> float:
    """A signal before its weight; 0 when the weight was 0 (the signal was not kept)."""
    return value / weight if weight > 0 else 0.0


def logged_hits(
    hits: Iterable[Hit | ForeignHit], channel: str, policy_of: Callable[[str], ChannelPolicy]
) -> list[LoggedHit]:
    """Recall hits of ``channel``'s recall as the log keeps them; ``policy_of`` names the
    policy each hit's channel ranked with (temporal and source are logged unweighted).
    A foreign hit is logged as it came."""
    logged = []
    for hit in hits:
        if isinstance(hit, ForeignHit):
            logged.append(hit.logged)
            continue
        record = hit.record
        weights = policy_of(record.channel).weights
        own = record.channel == channel
        logged.append(logged_hit(hit, record.id, record.memory_type, own, weights))
    return logged


class Scored(Protocol):
    """A hit's score and the signals it was made of, as ranked (weighted)."""

    @property
    def score(self) -> float: ...
    @property
    def band(self) -> str: ...
    @property
    def similarity(self) -> float: ...
    @property
    def lexical(self) -> float: ...
    @property
    def keyword(self) -> float: ...
    @property
    def heat(self) -> float: ...
    @property
    def temporal(self) -> float: ...
    @property
    def source(self) -> float: ...
    @property
    def relevance(self) -> float: ...
    @property
    def spread(self) -> float: ...


def logged_hit(
    hit: Scored, memory_id: str, memory_type: str, own: bool, weights: RecallWeights
) -> LoggedHit:
    """A hit of memory ``memory_id`` as the log keeps it; ``weights`` are those its
    channel ranked with. Each signal is what its weight multiplied in the score:
    temporal and source unweighted, the words' share of relevance per unit of
    ``weight_lexical``, heat and keyword overlap times the recall's spread."""
    return LoggedHit(
        memory_id=memory_id,
        memory_type=memory_type,
        own=own,
        score=hit.score,
        band=hit.band,
        similarity=hit.similarity,
        lexical=_unweighted(hit.relevance - hit.similarity, weights.lexical),
        keyword=hit.keyword * hit.spread,
        heat=hit.heat * hit.spread,
        temporal=_unweighted(hit.temporal, weights.temporal),
        source=_unweighted(hit.source, weights.source),
    )


def log_entry(channel: str, entry: RecallEntry) -> PutKey:
    """The write of one entry alone (:meth:`RecallLog.writes` adds its bookkeeping)."""
    return PutKey(Keys.recall(channel, entry.recall_id), entry.to_json())


class RecallLog:
    """Every channel's recall log in one store: its entries, their tally and retention."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._start: dict[str, str] = {}
        """Per channel, a recall id at or before its oldest logged recall: the log is read
        for entries to drop only when that is past retention (or the log is full), and
        from there, not over the dropped entries' tombstones."""

    def forget(self, channel: str) -> None:
        """A channel was dropped: what is known of its log goes too."""
        self._start.pop(channel, None)

    def entry(self, channel: str, recall_id: str) -> RecallEntry | None:
        """One logged recall, or None (never logged, or dropped by retention)."""
        data = self._store.recall_entry(channel, recall_id)
        return None if data is None else RecallEntry.from_json(recall_id, data)

    def writes(self, channel: str, entry: RecallEntry) -> Sequence[PutKey | DeleteKey]:
        """What logging ``entry`` writes: the entry, the channel's tally, and the drop of
        old entries past retention (with their feedback). Hold the channel's lock."""
        saved = self._store.recall_tally(channel)
        count = (json.loads(saved)["entries"] if saved is not None else 0) + 1
        ops: list[PutKey | DeleteKey] = [log_entry(channel, entry)]
        cutoff = entry.at - RETENTION_SECONDS
        start = self._start.get(channel)
        if count > MAX_ENTRIES or start is None or id_seconds(start) < cutoff:
            found = self._store.oldest_recall_ids(channel, TRIM_PER_ENTRY, start or "")
            kept = None
            for old in found:
                if count <= MAX_ENTRIES and id_seconds(old) >= cutoff:
                    kept = old
                    break
                ops.append(DeleteKey(Keys.recall(channel, old)))
                ops.append(DeleteKey(Keys.feedback(channel, old)))
                count -= 1
            if kept is None and len(found) < TRIM_PER_ENTRY:
                kept = entry.recall_id  # everything older went: the new entry is the oldest
            self._start[channel] = kept or found[-1]
        tally = json.dumps({"entries": count}).encode()
        ops.append(PutKey(Keys.recall_tally(channel), tally))
        return ops
