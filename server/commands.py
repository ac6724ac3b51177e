"""Validated requests, as plain frozen records the engine acts on (no protobuf below here)."""

from __future__ import annotations

import bisect
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import overload

from calor.models.entities import entity_key, extract_entities, read_entities
from calor.models.text import classify_type
from calor.models.valence import valence
from calor.server.records import ACTIVE, DELETED, MERGED, MemoryRecord

__all__ = [
    "HEAT_POSITION",
    "ListQuery",
    "NewMemory",
    "PackedItems",
    "RecallQuery",
    "TagFilter",
    "TextReading",
    "UpdateChange",
    "read_text",
]

TagFilter = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TextReading:
    """What a memory's text says by itself, whichever channel it goes to: the type it
    reads as, the entities it names (each with whether it is only a candidate, see
    :func:`~calor.models.entities.read_entities`) and its valence (see :func:`read_text`)."""

    memory_type: str
    names: list[tuple[str, bool]]
    valence: float

    def entities(self, known: Callable[[str], bool]) -> list[str]:
        """The entities it names in a channel where ``known`` tells which entity keys name
        something already: a candidate counts only there."""
        return [name for name, candidate in self.names if not candidate or known(entity_key(name))]


def read_text(text: str, memory_type: str | None = None) -> TextReading:
    """Read a text for storing; ``memory_type`` given is kept, else the text is classified."""
    return TextReading(memory_type or classify_type(text), read_entities(text), valence(text))


@dataclass(frozen=True)
class NewMemory:
    """A memory to store; ``memory_type`` None means classify it. ``reading`` is the
    text's :class:`TextReading` when it was read ahead (a stream reads each chunk while
    later ones arrive), else it is read when stored."""

    channel: str
    text: str
    memory_type: str | None = None
    importance: float | None = None
    keystone: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    source: str = "agent"
    confidence: str = "observed"
    idempotency_key: str = ""
    created_at: float | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    reading: TextReading | None = None

    def read(self) -> NewMemory:
        """This item with its text read (see :func:`read_text`)."""
        return replace(self, reading=read_text(self.text, self.memory_type))


class PackedItems(Sequence[NewMemory]):
    """Many items to store, held compactly while more arrive: each chunk of them as one
    pickled string, decoded again when read (the chunk read last is kept decoded).

    A stream of 100,000 items held as objects until it is stored (about 1 KB each) fills
    the small-object heap; what the store then keeps lands among them, and once they
    are gone the heap cannot give back the pages it pins (measured through a server:
    1.4 KB a memory of empty pools).
    """

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._ends: list[int] = []  # how many items the chunks up to each one hold
        self._decoded: tuple[int, list[NewMemory]] = (-1, [])

    @staticmethod
    def pack(items: Sequence[NewMemory]) -> bytes:
        """One chunk's items as :meth:`add` takes them."""
        return pickle.dumps(list(items), protocol=pickle.HIGHEST_PROTOCOL)

    def add(self, packed: bytes, count: int) -> None:
        """Append a chunk of ``count`` items packed by :meth:`pack`."""
        if count:
            self._chunks.append(packed)
            self._ends.append(len(self) + count)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, index: int) -> NewMemory: ...

    @overload
    def __getitem__(self, index: slice) -> list[NewMemory]: ...

    def __getitem__(self, index: int | slice) -> NewMemory | list[NewMemory]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"item {index} of {len(self)}")
        chunk = bisect.bisect_right(self._ends, index)
        start = self._ends[chunk - 1] if chunk else 0
        return self._chunk(chunk)[index - start]

    def __iter__(self) -> Iterator[NewMemory]:
        for chunk in range(len(self._chunks)):
            yield from self._chunk(chunk)

    def _chunk(self, chunk: int) -> list[NewMemory]:
        if self._decoded[0] != chunk:
            self._decoded = (chunk, pickle.loads(self._chunks[chunk]))
        return self._decoded[1]


@dataclass(frozen=True)
class RecallQuery:
    """What to look for, where, and whether the recall counts (``peek`` off)."""

    channel: str
    query: str
    limit: int = 10
    channels: tuple[str, ...] = ()
    memory_types: frozenset[str] = frozenset()
    states: frozenset[str] = frozenset()
    tags: TagFilter = ()
    time_from: float | None = None
    time_to: float | None = None
    min_heat: float = 0.0
    peek: bool = False
    include_archived: bool = False
    as_of: float | None = None
    min_band: str = ""  # the least confidence band a hit needs; "" keeps all


HEAT_POSITION = "h"
"""What a position in the heat order starts with (``h120``: from the 121st hottest on),
so a page token of one order is never read as one of the other."""


@dataclass(frozen=True)
class ListQuery:
    """A page of a channel's memories, oldest id first or (``order`` "heat") hottest
    first, resuming after a memory id or at a position of the heat order."""

    channel: str
    page_size: int = 100
    after_id: str = ""
    order: str = "id"
    position: int = 0
    sparklines: bool = False
    memory_types: frozenset[str] = frozenset()
    states: frozenset[str] = frozenset()
    tags: TagFilter = ()
    time_from: float | None = None
    time_to: float | None = None

    def matches(self, record: MemoryRecord) -> bool:
        """Whether a record (as it stands now) belongs in this listing.

        Forgotten memories are listed only when their state is asked for.
        """
        if self.states:
            if record.state not in self.states:
                return False
        elif record.state == DELETED:
            return False
        if self.memory_types and record.memory_type not in self.memory_types:
            return False
        if self.time_from is not None and record.created_at < self.time_from:
            return False
        if self.time_to is not None and record.created_at > self.time_to:
            return False
        return all(record.tags.get(key) == value for key, value in self.tags)


@dataclass(frozen=True)
class UpdateChange:
    """A correction to one memory; None leaves a field as it is."""

    channel: str
    memory_id: str
    text: str | None = None
    memory_type: str | None = None
    tags: dict[str, str] | None = None
    importance: float | None = None
    supersedes: str = ""
    clear_merge: bool = False

    def apply(
        self, record: MemoryRecord, now: float, known: Callable[[str], bool] | None = None
    ) -> None:
        """Apply the correction to a (copied) record; a restored merge starts warm again.
        ``known`` tells which entity keys name something in the channel already."""
        if self.clear_merge and record.state == MERGED:
            record.state, record.merged_into = ACTIVE, ""
            record.heat0, record.t0 = 1.0, now
        if self.text is not None:
            record.text = self.text
            record.entities = extract_entities(self.text, known)
        if self.memory_type is not None:
            record.memory_type = self.memory_type
            record.classifier_version = 0  # given now: never classified again
        if self.tags is not None:
            record.tags = dict(self.tags)
        if self.importance is not None:
            record.importance = self.importance
