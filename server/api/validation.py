"""Turn API requests into validated commands; bad input raises InvalidArgumentError.

Nothing here touches storage, so a rejected request changes nothing.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping

from google.protobuf.timestamp_pb2 import Timestamp

from calor.models.entities import entity_key
from calor.server.api.wire import Enum, decode_page_token, enum_name, seconds_of
from calor.server.clock import Clock
from calor.server.commands import (
    HEAT_POSITION,
    ListQuery,
    NewMemory,
    RecallQuery,
    TagFilter,
    UpdateChange,
)
from calor.server.config import Limits
from calor.server.engine.context import ContextQuery
from calor.server.errors import InvalidArgumentError
from calor.server.ids import is_valid_id
from calor.server.storage.markdown import CarriedState
from calor.server.thermo.policy import BANDS
from calor.v1 import memory_pb2, memory_service_pb2

__all__ = [
    "Validator",
    "says_nothing",
]

_CHANNEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/+-]*$")
_MIN_TS = -62_135_596_800  # 0001-01-01
_MAX_TS = 253_402_300_799  # 9999-12-31
# A Context request's limits: (default for 0, the most a request may ask for).
_CONTEXT_TOKENS = (1_000, 100_000)
_CONTEXT_NODES = (200, 1_000)
_CONTEXT_CHARS = (50_000, 1_000_000)
_MAX_ENTITY_CHARS = 200


def _is_heat_position(position: str) -> bool:
    digits = position[len(HEAT_POSITION) :]
    return position.startswith(HEAT_POSITION) and digits.isdigit() and len(digits) <= 12


def _enum_name(enum: Enum, value: int, field: str, prefix: str) -> str:
    name = enum_name(enum, prefix, value)
    if name is None:
        raise InvalidArgumentError(f"{field}: unknown value {value}")
    return name


# Characters that show nothing: controls (NUL…), format characters (zero-width spaces and
# joiners, bidi marks, the BOM), separators, and the other default-ignorable code points
# (Hangul fillers, variation selectors, tag characters), plus the blank Braille cell.
_SILENT_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
_SILENT_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def _silent(char: str) -> bool:
    if unicodedata.category(char) in _SILENT_CATEGORIES:
        return True
    point = ord(char)
    return any(low <= point <= high for low, high in _SILENT_RANGES)


def says_nothing(text: str) -> bool:
    """Whether a text shows nothing at all: empty, or only whitespace, control characters
    (NUL) and invisible ones (zero-width spaces, the BOM, fillers).

    Such a text has no meaning to embed or recall, so it is refused as empty text is.
    """
    return all(_silent(char) for char in text)


class Validator:
    """Checks requests against the server's limits and builds commands from them."""

    def __init__(self, limits: Limits, clock: Clock) -> None:
        self.limits = limits
        self._clock = clock

    def channel(self, value: str, field: str = "channel") -> str:
        """A channel name: 1..128 characters of letters, digits and ``_.:@/+-``."""
        if not value:
            raise InvalidArgumentError(f"{field}: a channel name is required")
        if len(value) > self.limits.max_channel_chars or not _CHANNEL_RE.match(value):
            raise InvalidArgumentError(
                f"{field}: {value[:40]!r} is not a channel name (1-{self.limits.max_channel_chars}"
                " letters, digits or _.:@/+-, starting with a letter or digit)"
            )
        return value

    def is_channel(self, value: str) -> bool:
        """Whether ``value`` is a channel name (as :meth:`channel` accepts)."""
        return len(value) <= self.limits.max_channel_chars and bool(_CHANNEL_RE.match(value))

    def memory_id(self, value: str, field: str = "id") -> str:
        """A memory id as the server hands them out."""
        if not value:
            raise InvalidArgumentError(f"{field}: a memory id is required")
        if not is_valid_id(value):
            raise InvalidArgumentError(f"{field}: {value[:40]!r} is not a memory id")
        return value

    def text(self, value: str, field: str = "text") -> str:
        """Text that shows something, of at most ``max_text_bytes`` UTF-8 bytes."""
        size = len(value.encode())
        if size > self.limits.max_text_bytes:  # first, so the scan below stays short
            raise InvalidArgumentError(
                f"{field}: {size} bytes is over the limit of {self.limits.max_text_bytes}"
            )
        if says_nothing(value):
            raise InvalidArgumentError(
                f"{field}: must not be empty, blank or only invisible characters (NUL, zero-width)"
            )
        return value

    def unit(self, value: float, field: str) -> float:
        """A finite number in [0, 1]."""
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise InvalidArgumentError(f"{field}: {value} is not a number in [0, 1]")
        return value

    def memory_type(self, value: int, field: str = "memory_type") -> str | None:
        """A memory type name, or None for MEMORY_TYPE_UNSPECIFIED."""
        if value == memory_pb2.MEMORY_TYPE_UNSPECIFIED:
            _enum_name(memory_pb2.MemoryType, value, field, "MEMORY_TYPE_")
            return None
        return _enum_name(memory_pb2.MemoryType, value, field, "MEMORY_TYPE_")

    def memory_types(self, values: Iterable[int]) -> frozenset[str]:
        """A set of memory types to filter by; UNSPECIFIED is not one."""
        names = set()
        for value in values:
            name = self.memory_type(value, "memory_types")
            if name is None:
                raise InvalidArgumentError("memory_types: MEMORY_TYPE_UNSPECIFIED is not a type")
            names.add(name)
        return frozenset(names)

    def states(self, values: Iterable[int]) -> frozenset[str]:
        """A set of states to filter by."""
        names = set()
        for value in values:
            name = _enum_name(memory_pb2.MemoryState, value, "states", "MEMORY_STATE_")
            if name == "unspecified":
                raise InvalidArgumentError("states: MEMORY_STATE_UNSPECIFIED is not a state")
            names.add(name)
        return frozenset(names)

    def tags(self, values: Mapping[str, str], field: str = "tags") -> dict[str, str]:
        """At most ``max_tags`` non-empty keys; keys and values within ``max_tag_bytes``."""
        if len(values) > self.limits.max_tags:
            raise InvalidArgumentError(
                f"{field}: {len(values)} entries is over the limit of {self.limits.max_tags}"
            )
        for key, value in values.items():
            if says_nothing(key):
                raise InvalidArgumentError(f"{field}: keys must not be empty or invisible")
            if max(len(key.encode()), len(value.encode())) > self.limits.max_tag_bytes:
                raise InvalidArgumentError(
                    f"{field}: {key[:40]!r} is over {self.limits.max_tag_bytes} bytes"
                )
        return dict(values)

    def tag_filter(self, values: Mapping[str, str]) -> TagFilter:
        """Tags a memory must all carry to match."""
        return tuple(sorted(self.tags(values).items()))

    def timestamp(self, value: Timestamp, field: str) -> float:
        """Seconds since the epoch from a Timestamp within years 1..9999."""
        if not _MIN_TS <= value.seconds <= _MAX_TS or not 0 <= value.nanos < 1_000_000_000:
            raise InvalidArgumentError(f"{field}: not a valid timestamp")
        return seconds_of(value)

    def store(self, request: memory_service_pb2.StoreRequest) -> NewMemory:
        """A store request as a command."""
        importance = None
        if request.HasField("importance"):
            importance = self.unit(request.importance, "importance")
        created_at = None
        if request.HasField("created_at"):
            created_at = self.timestamp(request.created_at, "created_at")
            now = self._clock.now()
            if created_at > now + self.limits.max_future_skew_seconds:
                raise InvalidArgumentError("created_at: must not be in the future")
        key = request.idempotency_key
        if len(key.encode()) > self.limits.max_idempotency_key_bytes:
            raise InvalidArgumentError(
                f"idempotency_key: over {self.limits.max_idempotency_key_bytes} bytes"
            )
        source = _enum_name(memory_pb2.Source, request.source, "source", "SOURCE_")
        confidence = _enum_name(
            memory_pb2.Confidence, request.confidence, "confidence", "CONFIDENCE_"
        )
        return NewMemory(
            channel=self.channel(request.channel),
            text=self.text(request.text),
            memory_type=self.memory_type(request.memory_type),
            importance=importance,
            keystone=request.keystone,
            tags=self.tags(request.tags),
            source="agent" if source == "unspecified" else source,
            confidence="observed" if confidence == "unspecified" else confidence,
            idempotency_key=key,
            created_at=created_at,
            provenance=self.tags(request.provenance, "provenance"),
        )

    def imported(self, item: NewMemory, line: int, state: CarriedState | None = None) -> NewMemory:
        """A memory read from imported Markdown, held to the same limits as a store; the
        times of the state it carries, if any, are not in the future either."""
        latest = self._clock.now() + self.limits.max_future_skew_seconds
        times = [("created_at", item.created_at)]
        if state is not None:
            times += [("t0", state.t0), ("last_recalled", state.last_recalled_at)]
            times += [("updated", state.updated_at)]
            times += [("recall_times", at) for at in state.recall_times]
        try:
            self.text(item.text)
            self.tags(item.tags)
            self.tags(item.provenance, "provenance")
            for name, at in times:
                if at is not None and at > latest:
                    raise InvalidArgumentError(f"{name}: must not be in the future")
        except InvalidArgumentError as error:
            raise InvalidArgumentError(f"line {line}: {error.message}") from None
        return item

    def limit(self, value: int, field: str, default: int, cap: int) -> int:
        """A count in 1..cap; 0 means ``default``."""
        if value < 0 or value > cap:
            raise InvalidArgumentError(f"{field}: {value} is outside 0..{cap}")
        return value or default

    def recall(self, request: memory_service_pb2.RecallRequest) -> RecallQuery:
        """A recall request as a command."""
        channel = self.channel(request.channel)
        extra = tuple(
            dict.fromkeys(self.channel(c, "channels") for c in request.channels if c != channel)
        )
        time_from = (
            self.timestamp(request.time_from, "time_from")
            if request.HasField("time_from")
            else None
        )
        time_to = (
            self.timestamp(request.time_to, "time_to") if request.HasField("time_to") else None
        )
        if time_from is not None and time_to is not None and time_from > time_to:
            raise InvalidArgumentError("time_from: must not be after time_to")
        return RecallQuery(
            channel=channel,
            query=self.text(request.query, "query"),
            limit=self.limit(
                request.limit, "limit", self.limits.default_limit, self.limits.max_limit
            ),
            channels=extra,
            memory_types=self.memory_types(request.memory_types),
            states=self.states(request.states),
            tags=self.tag_filter(request.tags),
            time_from=time_from,
            time_to=time_to,
            min_heat=self.unit(request.min_heat, "min_heat"),
            peek=request.peek,
            include_archived=request.include_archived,
            as_of=self.timestamp(request.as_of, "as_of") if request.HasField("as_of") else None,
            min_band=self.band(request.min_band, "min_band"),
        )

    def band(self, value: str, field: str) -> str:
        """A confidence band to filter by, or ``""`` for none."""
        if value and value not in BANDS:
            allowed = ", ".join(repr(b) for b in ("", *BANDS))
            raise InvalidArgumentError(f"{field}: must be one of {allowed}, got {value[:40]!r}")
        return value

    def list_query(self, request: memory_service_pb2.ListMemoriesRequest) -> ListQuery:
        """A listing request as a command."""
        order = _enum_name(memory_service_pb2.MemoryOrder, request.order, "order", "MEMORY_ORDER_")
        by_heat = order == "heat"
        position = decode_page_token(request.page_token, valid=_is_heat_position) if by_heat else ""
        return ListQuery(
            order="heat" if by_heat else "id",
            sparklines=request.heat_sparklines,
            position=int(position[len(HEAT_POSITION) :]) if position else 0,
            channel=self.channel(request.channel),
            page_size=self.limit(
                request.page_size,
                "page_size",
                self.limits.default_page_size,
                self.limits.max_page_size,
            ),
            after_id="" if by_heat else decode_page_token(request.page_token),
            memory_types=self.memory_types(request.memory_types),
            states=self.states(request.states),
            tags=self.tag_filter(request.tags),
            time_from=(
                self.timestamp(request.time_from, "time_from")
                if request.HasField("time_from")
                else None
            ),
            time_to=(
                self.timestamp(request.time_to, "time_to") if request.HasField("time_to") else None
            ),
        )

    def update(self, request: memory_service_pb2.UpdateRequest) -> UpdateChange:
        """An update request as a command; ``update_mask`` names the fields to apply."""
        allowed = {"text", "memory_type", "tags", "importance"}
        paths = set(request.update_mask.paths)
        unknown = paths - allowed
        if unknown:
            raise InvalidArgumentError(
                f"update_mask: unknown field(s) {sorted(unknown)}; use {sorted(allowed)}"
            )
        if not paths:
            paths = {p for p in ("text", "importance") if request.HasField(p)}
            if request.memory_type:
                paths.add("memory_type")
            if request.tags:
                paths.add("tags")
        if not paths and not request.supersedes and not request.clear_merge:
            raise InvalidArgumentError("update: nothing to change")
        memory_type = None
        if "memory_type" in paths:
            memory_type = self.memory_type(request.memory_type)
            if memory_type is None:
                raise InvalidArgumentError("memory_type: give the type to change to")
        return UpdateChange(
            channel=self.channel(request.channel),
            memory_id=self.memory_id(request.id),
            text=self.text(request.text) if "text" in paths else None,
            memory_type=memory_type,
            tags=self.tags(request.tags) if "tags" in paths else None,
            importance=self.unit(request.importance, "importance")
            if "importance" in paths
            else None,
            supersedes=self.memory_id(request.supersedes, "supersedes")
            if request.supersedes
            else "",
            clear_merge=request.clear_merge,
        )

    def evaluate(self, request: memory_service_pb2.EvaluateRequest) -> tuple[str, str]:
        """An evaluate request as (channel, text)."""
        return self.channel(request.channel), self.text(request.text)

    def share(self, request: memory_service_pb2.ShareRequest) -> tuple[str, str, str]:
        """A share request as (source channel, memory id, target channel); a memory is
        shared into another channel, never its own."""
        channel = self.channel(request.channel)
        memory_id = self.memory_id(request.id)
        target = self.channel(request.target_channel, "target_channel")
        if target == channel:
            raise InvalidArgumentError(
                f"target_channel: {target!r} is the memory's own channel; share into another"
            )
        return channel, memory_id, target

    def feedback(
        self, request: memory_service_pb2.FeedbackRequest
    ) -> tuple[str, str, str, list[str]]:
        """A feedback request as (channel, recall id, rating, memory ids named once each)."""
        channel = self.channel(request.channel)
        if not request.recall_id:
            raise InvalidArgumentError("recall_id: give the recall_id a recall returned")
        if not is_valid_id(request.recall_id):
            raise InvalidArgumentError(f"recall_id: {request.recall_id[:40]!r} is not a recall id")
        rating = _enum_name(
            memory_service_pb2.FeedbackRating, request.rating, "rating", "FEEDBACK_RATING_"
        )
        if rating == "unspecified":
            raise InvalidArgumentError("rating: say helpful, unhelpful or partial")
        if len(request.memory_ids) > self.limits.max_limit:
            raise InvalidArgumentError(
                f"memory_ids: more than {self.limits.max_limit} (the most hits a recall has)"
            )
        ids = [self.memory_id(i, "memory_ids") for i in request.memory_ids]
        return channel, request.recall_id, rating, list(dict.fromkeys(ids))

    def context(self, request: memory_service_pb2.ContextRequest) -> ContextQuery:
        """A Context request as a query; 0 means the default of each limit."""
        return ContextQuery(
            channel=self.channel(request.channel),
            message=self.text(request.message, "message"),
            token_budget=self.limit(request.token_budget, "token_budget", *_CONTEXT_TOKENS),
            max_nodes=self.limit(request.max_nodes, "max_nodes", *_CONTEXT_NODES),
            max_chars=self.limit(request.max_chars, "max_chars", *_CONTEXT_CHARS),
            heat=request.heat,
        )

    def entity(self, value: str) -> str:
        """An entity's name as a memory would spell it (case and spacing aside)."""
        self.text(value, "entity")
        if len(value) > _MAX_ENTITY_CHARS:
            raise InvalidArgumentError(
                f"entity: {len(value)} characters is over the limit of {_MAX_ENTITY_CHARS}"
            )
        if not entity_key(value):
            raise InvalidArgumentError(f"entity: {value[:40]!r} names nothing")
        return value

    def delta(self, value: float) -> float:
        """A heat delta in [-1, 1]."""
        if not math.isfinite(value) or not -1.0 <= value <= 1.0:
            raise InvalidArgumentError(f"delta: {value} is not a number in [-1, 1]")
        return value
