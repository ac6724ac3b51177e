"""Context assembly (DESIGN §8): the block an agent prepends to its prompt, and the window
in which the same request gets the same block back.

Candidates come from four signals: semantic recall of the message (ranked as recall ranks,
as a peek; hits of band mid or high), the hottest memories, the memories and entity cards
of the entities the message names with their graph neighbours, and the profile, whatever
the message (every live core memory, and the hottest fact and preference memories, as
many as the budget has lines for). A memory found by several signals is shown once,
under the strongest (:data:`SIGNALS`, strongest first). Each is scored

    score = w_similarity·cosine + w_heat·heat + w_recency·recency + w_source·source_trust

with the channel's ``ChannelPolicy.context`` weights (recency halves every week since the
memory was made) and packed greedily, best first, into the token budget (counted with the
model's own tokenizer, which the caller passes in), ``max_nodes`` and ``max_chars``;
near-identical texts go in once, and core memories (identity and safety) go in first.
The block is rendered deterministically, so the same memories give byte-identical text:
fixed sections, each line with its relevance band and its UTC date, lines ordered by band
then id. No line shows heat, a score or a relative time.

Blocks are kept for reuse (:mod:`calor.server.engine.reuse`): the same request gets the
byte-identical block back while nothing it shows changed.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from calor.models.entities import entity_key, extract_entities
from calor.server.commands import RecallQuery
from calor.server.engine.cards import (
    CARD_SIZE,
    Distinct,
    EntityCards,
    day,
    one_line,
)
from calor.server.engine.channel import Channel
from calor.server.engine.hottest import HOT_POOL, ranked, ranked_all
from calor.server.engine.results import Current
from calor.server.engine.reuse import ReuseKey, ReuseWindow
from calor.server.recall.ranking import Hit, band, rank_channel
from calor.server.records import ACTIVE, COLD, MemoryRecord
from calor.server.thermo.gates import fidelity_admits
from calor.server.thermo.heat import SOURCE_TRUST
from calor.server.thermo.lifecycle import Clocks, current_heat
from calor.server.thermo.policy import BANDS, ChannelPolicy

__all__ = [
    "SIGNALS",
    "ContextBuilder",
    "ContextItem",
    "ContextQuery",
    "ContextResult",
    "TokenCounter",
]

TokenCounter = Callable[[str], int]
"""Counts the tokens of a text with the model's own tokenizer."""

SIGNALS = ("profile", "semantic", "entity", "neighbour", "hot")
"""What found a memory for a block, strongest first."""

# Each signal's section, and the sections in the order the block shows them.
_SECTION_OF = {"profile": 0, "semantic": 1, "entity": 2, "neighbour": 2, "hot": 3}
_HEADERS = ("## Profile", "## Relevant", "## Related", "## Recently active")
_LIVE = frozenset({ACTIVE, COLD})
_RECENCY_HALF_LIFE = 7 * 86_400.0  # seconds since a memory was made for recency to halve
_LINE_TOKENS = 20  # a line's tokens, about: how many semantic hits a budget can use
_NEIGHBOUR_SEEDS = 3  # the best semantic hits whose neighbours join the entities' own
_NEIGHBOURS = 50  # most graph neighbours considered
_HEATS_FRESH = 60.0  # seconds between full heat rankings of a channel
_ENTITIES = 8  # most entities of a message whose memories are gathered
_REUSE_ENTRIES = 256  # blocks kept for reuse, per server (least recently used dropped)
_REUSE_CHARS = 4_000_000  # and the most characters they hold together
_RANKED_CHANNELS = 16  # channels whose heat ranking is kept, per server
_SHAPED_TEXTS = 50_000  # memory texts whose length in words and tokens is kept, per server
_COUNTED_SHORT = 4_096  # line prefixes and headers whose token counts are kept


@dataclass(frozen=True)
class ContextQuery:
    """What a Context call asks for: a channel, a message, the limits, and whether what
    the block shows is heated as a recall would heat it."""

    channel: str
    message: str
    token_budget: int = 1000
    max_nodes: int = 200
    max_chars: int = 50_000
    heat: bool = False


@dataclass(frozen=True)
class ContextItem:
    """One memory a block shows: as ranked (its context score and band in the hit), and
    the signal that found it."""

    hit: Hit
    signal: str


@dataclass(frozen=True)
class ContextResult:
    """A rendered block, its token count, the memories it shows, and each as it stands
    at the reply (``memories``, in the order of ``items``).

    ``recall_id`` names the block in the recall log (a heating call is logged as its
    recall; a reused block keeps its first call's id; empty when it shows nothing);
    ``reused`` says the block came back from the window.
    """

    block: str = ""
    tokens_used: int = 0
    items: tuple[ContextItem, ...] = ()
    memories: list[Current] = field(default_factory=list)
    reused: bool = False
    recall_id: str = ""


@dataclass(frozen=True)
class _Heats:
    """A channel's live memories ranked by heat: the hottest, and the profile (core
    first); ranked in full at ``at``, kept up to date to ``revision`` under ``policy``."""

    revision: int
    at: float
    policy: ChannelPolicy
    hottest: list[str]
    profile: list[str]


@dataclass
class _Shape:
    """What a memory's text takes on a line: words, characters, tokens (-1: not counted
    yet)."""

    words: int
    chars: int
    tokens: int = -1


class ContextBuilder:
    """Assembles Context blocks; keeps the reuse window, the channels' heat rankings and
    the token counts of memory texts (one tokenizer per server).

    Every method expects the caller to hold the channel's lock.
    """

    def __init__(self, cards: EntityCards) -> None:
        self._cards = cards
        self._lock = threading.Lock()  # the caches below are shared by every channel
        self._window: ReuseWindow[ContextResult] = ReuseWindow(_REUSE_ENTRIES, _REUSE_CHARS)
        self._heats: OrderedDict[str, _Heats] = OrderedDict()
        self._shapes: OrderedDict[tuple[str, int], _Shape] = OrderedDict()
        self._counted: dict[str, int] = {}

    def assemble(
        self,
        channel: Channel,
        query: ContextQuery,
        vector: np.ndarray | None,
        count_tokens: TokenCounter,
        max_nodes: int,
    ) -> ContextResult | None:
        """The block for a query: reused from the window when it may be, else built.

        Without ``vector`` (the message's embedding) only a reused block is answered;
        None means the caller embeds the message and asks again.
        """
        reused = self._window.get(
            channel, _reuse_key(channel, query, max_nodes), channel.clock.now()
        )
        if reused is not None:
            return replace(reused, reused=True)
        if vector is None:
            return None
        return self._build(channel, query, vector, count_tokens, max_nodes)

    def keep(
        self, channel: Channel, query: ContextQuery, max_nodes: int, result: ContextResult
    ) -> None:
        """Keep a block just built for ``query`` (with its recall id) in the reuse window:
        the same request gets it back, recall id included, while it stays current."""
        shown = [item.hit.record.id for item in result.items]
        key = _reuse_key(channel, query, max_nodes)
        self._window.put(channel, key, result, len(result.block), shown, channel.clock.now())

    # --- building ------------------------------------------------------------------

    def _build(
        self,
        channel: Channel,
        query: ContextQuery,
        vector: np.ndarray,
        count_tokens: TokenCounter,
        max_nodes: int,
    ) -> ContextResult:
        policy, clocks = channel.policy, channel.clocks()
        found: dict[str, str] = {}

        def find(ids: Iterable[str], signal: str) -> None:
            for memory_id in ids:
                held = found.get(memory_id)
                if held is None or SIGNALS.index(signal) < SIGNALS.index(held):
                    found[memory_id] = signal

        # Candidates in proportion to what the budget can hold; the semantic ones from
        # the pool a recall of ten searches (every candidate of it comes back ranked).
        lines = max(10, min(max_nodes, query.token_budget // _LINE_TOKENS))
        recall = RecallQuery(channel=channel.name, query=query.message, limit=10, peek=True)
        hits = rank_channel(
            (channel.index,), channel.records, policy, recall, vector, None, clocks, True
        )
        hits.sort(key=lambda h: (-h.score, h.record.id))
        evidence = {h.record.id: (h.similarity, h.keyword) for h in hits}
        # Only hits whose meaning is near (band mid or high) are relevant; the others may
        # still come in as hot, profile or related memories, and say so.
        semantic = [h.record.id for h in hits[:lines] if h.band != "low"]
        heats = self._heat_ranking(channel, clocks)
        named = self._named(channel, query.message)
        find(heats.hottest[: min(HOT_POOL, lines)], "hot")
        find(_neighbours(channel, [*named, *semantic[:_NEIGHBOUR_SEEDS]]), "neighbour")
        find(named, "entity")
        find(semantic, "semantic")
        core = [i for i in heats.profile if channel.records[i].memory_type == "core"]
        find(core, "profile")  # every core memory: identity and safety
        find(heats.profile[:lines], "profile")
        scored = _scored(channel, found, evidence, vector, clocks)
        return self._pack(channel, scored, query, count_tokens, max_nodes)

    def _named(self, channel: Channel, message: str) -> list[str]:
        """The memories of the entities a message names: each entity's card when it has
        one, else the latest memories naming it."""
        ids: list[str] = []
        # "Alice called." names Alice where the channel knows her.
        for entity in extract_entities(message, channel.knows_entity)[:_ENTITIES]:
            key = entity_key(entity)
            card = self._cards.card(channel, key)
            if card is not None:
                ids.extend(card.memory_ids)
            else:
                ids.extend(channel.entity_members.get(key, [])[-CARD_SIZE:])
        return list(dict.fromkeys(ids))

    def _heat_ranking(self, channel: Channel, clocks: Clocks) -> _Heats:
        """The channel's hottest memories and its profile, ranked by heat.

        Ranked in full at most once a minute; in between, a changed channel re-ranks
        only what was on the lists and the memories that changed (decay alone barely
        reorders memories in a minute, and the chosen ones are scored with their exact
        heat), so a store does not cost a pass over the whole channel.
        """
        with self._lock:
            cached = self._heats.get(channel.name)
        fresh = (
            cached is not None
            and cached.policy is channel.policy
            and 0.0 <= clocks.now - cached.at < _HEATS_FRESH
        )
        if cached is not None and fresh and cached.revision == channel.revision:
            return cached
        changed = channel.touched_since(cached.revision) if cached is not None and fresh else None
        if cached is not None and changed is not None:
            hottest = ranked(channel, clocks, [*cached.hottest, *changed])
            profile = ranked(channel, clocks, [*cached.profile, *changed], profile=True)
            at = cached.at
        else:
            hottest = ranked_all(channel, clocks)
            profile = ranked_all(channel, clocks, profile=True)
            at = clocks.now
        ranking = _Heats(channel.revision, at, channel.policy, hottest, profile)
        with self._lock:
            self._heats[channel.name] = ranking
            self._heats.move_to_end(channel.name)
            while len(self._heats) > _RANKED_CHANNELS:
                self._heats.popitem(last=False)
        return ranking

    # --- packing and rendering -----------------------------------------------------

    def _pack(
        self,
        channel: Channel,
        scored: list[ContextItem],
        query: ContextQuery,
        count_tokens: TokenCounter,
        max_nodes: int,
    ) -> ContextResult:
        """Fill the block best first within every limit, then check the rendered whole."""
        budget, max_chars = query.token_budget, query.max_chars
        order = sorted(
            scored,
            key=lambda i: (i.hit.record.memory_type != "core", -i.hit.score, i.hit.record.id),
        )
        distinct = Distinct(channel, channel.policy.ingest.near_duplicate_similarity)
        packed: list[ContextItem] = []
        opened: set[int] = set()
        tokens = chars = 0
        for item in order:
            if len(packed) == max_nodes or budget - tokens < 2:
                break  # a line takes at least two tokens ("-" and a word)
            record = item.hit.record
            shape, prefix = self._shape(record), _prefix(item)
            section = _SECTION_OF[item.signal]
            header = _HEADERS[section] if section not in opened else ""
            more_chars = len(prefix) + 1 + shape.chars + 1 + (len(header) + 1 if header else 0)
            if chars + more_chars > max_chars:
                continue
            # Every word is a token at least: a line that cannot fit is not counted.
            if tokens + len(prefix.split()) + shape.words + len(header.split()) > budget:
                continue
            if not distinct.admits(record):
                continue
            more_tokens = self._short(prefix, count_tokens) + self._text_tokens(
                shape, record, count_tokens
            )
            more_tokens += self._short(header, count_tokens) if header else 0
            if tokens + more_tokens > budget:
                continue
            distinct.admit(record)
            packed.append(item)
            opened.add(section)
            tokens, chars = tokens + more_tokens, chars + more_chars
        while packed:  # the whole block, as rendered, is what must fit
            block = _render(packed)
            used = count_tokens(block)
            if used <= budget and len(block) <= max_chars:
                return ContextResult(block, used, tuple(packed))
            packed.pop()
        return ContextResult()

    # A line is its prefix (band, date, type) and the memory's text on one line; the
    # tokenizer splits at whitespace, so their tokens add up (and the rendered block is
    # counted whole in the end regardless). Each text is measured once per server.

    def _shape(self, record: MemoryRecord) -> _Shape:
        """The words, characters and (once counted) tokens of a memory's text on a line."""
        key = (record.id, hash(record.text))
        with self._lock:
            shape = self._shapes.get(key)
            if shape is not None:
                self._shapes.move_to_end(key)
                return shape
        line = one_line(record.text)
        shape = _Shape(words=line.count(" ") + 1 if line else 0, chars=len(line))
        with self._lock:
            self._shapes[key] = shape
            while len(self._shapes) > _SHAPED_TEXTS:
                self._shapes.popitem(last=False)
        return shape

    def _text_tokens(self, shape: _Shape, record: MemoryRecord, count_tokens: TokenCounter) -> int:
        if shape.tokens < 0:
            shape.tokens = count_tokens(one_line(record.text))
        return shape.tokens

    def _short(self, text: str, count_tokens: TokenCounter) -> int:
        """The tokens of a short text (a prefix, a header), counted once per server."""
        with self._lock:
            counted = self._counted.get(text)
        if counted is None:
            counted = count_tokens(text)
            with self._lock:
                if len(self._counted) >= _COUNTED_SHORT:
                    self._counted.clear()
                self._counted[text] = counted
        return counted


def _reuse_key(channel: Channel, query: ContextQuery, max_nodes: int) -> ReuseKey:
    """What makes two Context requests the same request."""
    return (channel.name, query.message, query.token_budget, max_nodes, query.max_chars)


def _neighbours(channel: Channel, seeds: list[str]) -> list[str]:
    """The memories linked to the seeds (not the seeds), the strongest links first."""
    seeded = set(seeds)
    weight: dict[str, float] = {}
    for seed in seeds:
        for edge in channel.graph.edges(seed):
            if edge.to_id not in seeded:
                weight[edge.to_id] = max(weight.get(edge.to_id, 0.0), edge.weight)
    return heapq.nsmallest(_NEIGHBOURS, weight, key=lambda i: (-weight[i], i))


def _scored(
    channel: Channel,
    found: dict[str, str],
    evidence: dict[str, tuple[float, float]],
    vector: np.ndarray,
    clocks: Clocks,
) -> list[ContextItem]:
    """Every candidate a block may show, scored; the rest (not live, superseded, below
    the fidelity gate, unembedded) left out."""
    policy = channel.policy
    similarity = {i: sim for i, (sim, _) in evidence.items()}
    similarity.update(_similarities(channel, [i for i in found if i not in evidence], vector))
    items: list[ContextItem] = []
    for memory_id, signal in found.items():
        stored = channel.records.get(memory_id)
        if stored is None or memory_id not in similarity:
            continue
        record = channel.evolved(stored, clocks)
        heat = current_heat(record, policy, clocks)
        if record.state not in _LIVE or record.superseded or not fidelity_admits(policy, heat):
            continue
        keyword = evidence.get(memory_id, (0.0, 0.0))[1]
        items.append(
            _item(record.copy(), signal, similarity[memory_id], keyword, heat, policy, clocks)
        )
    return items


def _similarities(channel: Channel, ids: list[str], vector: np.ndarray) -> dict[str, float]:
    """The cosine of the message with each memory's indexed embedding."""
    rows = [(i, v) for i in ids if (v := channel.index.vector(i)) is not None]
    if not rows:
        return {}
    cosines = np.stack([v for _, v in rows]) @ vector.astype(np.float32)
    return {i: float(c) for (i, _), c in zip(rows, cosines, strict=True)}


def _item(
    record: MemoryRecord,
    signal: str,
    similarity: float,
    keyword: float,
    heat: float,
    policy: ChannelPolicy,
    clocks: Clocks,
) -> ContextItem:
    weights = policy.context
    recency = 0.5 ** (max(0.0, clocks.now - record.created_at) / _RECENCY_HALF_LIFE)
    trust = weights.source * SOURCE_TRUST.get(record.source, SOURCE_TRUST["agent"])
    score = (
        weights.similarity * max(0.0, similarity)
        + weights.heat * heat
        + weights.recency * recency
        + trust
    )
    confidence = band(similarity, keyword, policy.bands)
    hit = Hit(
        record,
        score,
        similarity,
        keyword,
        0.0,
        heat,
        0.0,
        source=trust,
        band=confidence,
        relevance=similarity,  # a context block weighs no words, and heat as it is
    )
    return ContextItem(hit, signal)


def _prefix(item: ContextItem) -> str:
    """What a line shows before the memory's text: its band, date and type."""
    record = item.hit.record
    return f"- [{item.hit.band}] {day(record.created_at)} {record.memory_type}:"


def _line(item: ContextItem) -> str:
    return f"{_prefix(item)} {one_line(item.hit.record.text)}"


def _render(items: list[ContextItem]) -> str:
    """The block: sections in a fixed order, lines by band (strongest first) then id."""
    lines: list[str] = []
    for section, header in enumerate(_HEADERS):
        members = [i for i in items if _SECTION_OF[i.signal] == section]
        if not members:
            continue
        members.sort(key=lambda i: (-BANDS.index(i.hit.band), i.hit.record.id))
        lines.append(header)
        lines.extend(_line(i) for i in members)
    return "\n".join(lines) + "\n" if lines else ""
