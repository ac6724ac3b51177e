"""Hypothesis strategies for fuzzing Calor's RPCs: request messages built field by field
from their descriptors (tests/test_fuzz.py sends them).

Most fields of a message get a plausible value (or none): real channels, memory ids,
trigger ids and recall ids, prose, small numbers, known enum values, valid triggers and
settings to vary. Up to two get a hostile one: odd unicode, huge and empty strings,
numbers at their extremes, NaN and infinities, enum numbers the enum lacks, oversized
repeated fields and maps, bad timestamps, spoiled Markdown, or nothing at all.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import field_mask_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

ODD_STRINGS = (
    "",
    " ",
    "\x00",
    "\x00abc\x00",
    "\u202eevil\u202c",
    "\ufeff",
    "\U0010ffff",
    "🦜" * 40,
    "e\u0301" * 50,
    "a" * 40_000,
    "é" * 20_000,
    "../../etc/passwd",
    "*",
    "team-a/*",
    "%s%n%x",
    "\r\n\t",
    "{text}{{}}{0}",
    "(a+)+$",
    "[",
    "x" * 129,
    "SELECT * FROM m; --",
    "2026-01-05T09:00:00Z",
    "yesterday",
    "-1",
    "NaN",
)
URLS = (
    "http://169.254.169.254/latest/meta-data",
    "http://localhost:1/hook",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://[::1]:1/",
    "https://example.invalid/hook",
    "ftp://x",
    "not a url",
)
CONFIG_KEYS = ("url", "secret", "message", "delta", "key", "value", "trigger_id", "timeout")
BANDS = ("", "low", "mid", "high", "HIGH", "medium")
OVERSIZED = (65, 1_001, 10_001)
INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


class Pools:
    """Real names on the fuzzed server, so requests reach past validation."""

    def __init__(self) -> None:
        self.memory_ids: list[str] = []
        self.trigger_ids: list[str] = []
        self.recall_ids: list[str] = []
        # Valid messages (by full name) that fuzzed ones are varied from.
        self.templates: dict[str, list[Message]] = {}


def odd_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Any unicode text a protobuf string can carry, and some chosen to hurt."""
    anything = st.text(st.characters(exclude_categories=("Cs",)), max_size=max_size)
    return st.one_of(anything, st.sampled_from(ODD_STRINGS))


def numbers(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """Values of a numeric field: its extremes, small ones, anything between."""
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        width = 64 if field.type == FieldDescriptor.TYPE_DOUBLE else 32
        chosen = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, 1e308, -1.0, 0.5, 1.0, 2.0)
        if width == 32:
            chosen = tuple(v for v in chosen if not math.isfinite(v) or abs(v) < 3e38)
        return st.one_of(st.sampled_from(chosen), st.floats(width=width))
    low, high = INT_RANGES[field.type]
    edges = {low, high, 0, 1, 1000, 1001, 10_001, 2**31 - 1, -1, -(2**31)}
    edges = {n for n in edges if low <= n <= high}
    return st.one_of(st.sampled_from(sorted(edges)), st.integers(low, high))


class Requests:
    """Hypothesis strategies for request messages, built from their descriptors.

    Most fields of a message get a plausible value (or none); up to two get a hostile
    one. So a good share of requests is valid and reaches the engine, and the rest are
    valid but for a field or two, which is where validation has to hold.
    """

    def __init__(self, pools: Pools, channels: tuple[str, ...]) -> None:
        self.pools = pools
        self.channels = channels

    def message(self, descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
        cls = GetMessageClass(descriptor)
        if descriptor.full_name == "google.protobuf.Timestamp":
            return st.one_of(self.timestamp(cls, plausible=True), self.timestamp(cls, False))
        if depth > 3:
            return st.builds(cls)
        fields = list(descriptor.fields)
        # A field that names something (a channel, a memory, a text) is always given a
        # plausible value; leaving it out is one of the hostile choices.
        plausible = {
            f.name: self.plausible(f, depth)
            if f.name in NAMING
            else st.none() | self.plausible(f, depth)
            for f in fields
        }
        hostile = {f.name: st.none() | self.hostile(f, depth) for f in fields}
        names = [f.name for f in fields]
        templates = self.pools.templates.get(descriptor.full_name, [])

        @st.composite
        def build(draw: st.DrawFn) -> Message:
            most = 1 if len(names) <= 4 else 2
            bad = draw(st.sets(st.sampled_from(names), max_size=most)) if names else set()
            if templates:  # a valid one (a trigger, a channel's settings) with a few changes
                message = cls()
                message.CopyFrom(draw(st.sampled_from(templates)))
                varied = draw(st.sets(st.sampled_from(names), max_size=2)) if names else set()
                values = {n: draw(plausible[n]) for n in sorted(varied - bad)}
            else:
                message = cls()
                values = {n: draw(plausible[n]) for n in names if n not in bad}
            values.update({n: draw(hostile[n]) for n in sorted(bad)})
            for name, value in values.items():
                _set(message, descriptor.fields_by_name[name], value)
            return message

        return build()

    def timestamp(self, cls: type[Message], plausible: bool) -> st.SearchStrategy[Message]:
        if plausible:
            return st.builds(cls, seconds=st.integers(1_700_000_000, 1_800_000_000))
        seconds = st.one_of(
            st.sampled_from([0, -1, -62_135_596_801, 253_402_300_800]),
            st.integers(-(2**63), 2**63 - 1),
        )
        return st.builds(cls, seconds=seconds, nanos=st.integers(-(2**31), 2**31 - 1))

    # --- plausible values ------------------------------------------------------------

    def plausible(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        if field.message_type is not None and field.message_type.name == "FieldMask":
            return _mask(field)
        if _is_map(field):
            key_field, value_field = field.message_type.fields
            if field.name == "config":
                return st.sampled_from(CONFIGS)
            keys = st.sampled_from(["team", "session", "topic"])
            return st.dictionaries(keys, self.plausible_one(value_field, depth), max_size=2)
        one = self.plausible_one(field, depth)
        return st.lists(one, max_size=3) if field.is_repeated else one

    def plausible_one(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        kind = field.type
        if kind == FieldDescriptor.TYPE_MESSAGE:
            return self.message(field.message_type, depth + 1)
        if kind == FieldDescriptor.TYPE_ENUM:
            return st.sampled_from([v.number for v in field.enum_type.values])
        if kind == FieldDescriptor.TYPE_BYTES:
            return st.binary(max_size=64)
        if kind == FieldDescriptor.TYPE_STRING:
            name = field.name
            if name == "id" and "Trigger" in field.containing_type.name:
                name = "trigger_id"  # DeleteTriggerRequest.id, Trigger.id
            return self.name_or(name, st.sampled_from(["team", "infra", "x1", "Ana"]))
        if kind == FieldDescriptor.TYPE_BOOL:
            return st.booleans()
        if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return st.floats(0.0, 1.0)
        return st.integers(0, 50)

    def name_or(self, name: str, other: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        """A real name when the field names one (a channel, a memory, a trigger, ...)."""
        pools = self.pools
        if name in ("channel", "channels", "target_channel"):
            return st.sampled_from(self.channels)
        if name in ("id", "ids", "memory_id", "memory_ids", "from_id", "to_id", "supersedes"):
            return st.sampled_from(pools.memory_ids)
        if name in ("trigger_id", "trigger_ids"):
            return st.sampled_from(pools.trigger_ids)
        if name == "recall_id":
            return st.sampled_from(pools.recall_ids)
        if name == "min_band":
            return st.sampled_from(BANDS[:4])
        if name == "markdown":
            return st.sampled_from([SECTION, *PROSE])
        if name in ("text", "query", "message", "entity", "filter_pattern"):
            return st.sampled_from(PROSE)
        if name in ("page_token", "service"):
            return st.just("")
        return other

    # --- hostile values --------------------------------------------------------------

    def hostile(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        if _is_map(field):
            return self.hostile_map(field, depth)
        one = self.hostile_one(field, depth)
        if not field.is_repeated:
            return one
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            many = st.tuples(one, st.sampled_from(OVERSIZED[:2])).map(lambda t: [t[0]] * t[1])
        else:
            small = (
                self.plausible_one(field, depth)
                if field.type != FieldDescriptor.TYPE_STRING
                else (st.text(max_size=12))
            )
            many = st.tuples(small, st.sampled_from(OVERSIZED)).map(lambda t: [t[0]] * t[1])
        return st.one_of(st.lists(one, min_size=1, max_size=4), many)

    def hostile_map(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        key_field, value_field = field.message_type.fields
        keys = st.one_of(st.sampled_from(CONFIG_KEYS), odd_text())
        values = (
            st.one_of(st.sampled_from(URLS), odd_text())
            if value_field.type == FieldDescriptor.TYPE_STRING
            else self.hostile_one(value_field, depth)
        )
        if key_field.type != FieldDescriptor.TYPE_STRING:
            keys = self.hostile_one(key_field, depth)
        many = st.sampled_from(OVERSIZED[:2]).map(
            lambda n: {f"k{i}": _zero(value_field) for i in range(n)}
        )
        return st.one_of(st.dictionaries(keys, values, min_size=1, max_size=4), many)

    def hostile_one(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        kind = field.type
        if kind == FieldDescriptor.TYPE_MESSAGE:
            return self.message(field.message_type, depth + 1)
        if kind == FieldDescriptor.TYPE_ENUM:
            known = {v.number for v in field.enum_type.values}
            unknown = st.integers(-(2**31), 2**31 - 1).filter(lambda n: n not in known)
            return st.one_of(st.sampled_from([-1, max(known) + 1, 99, 2**31 - 1]), unknown)
        if kind == FieldDescriptor.TYPE_BYTES:
            huge = st.sampled_from([2**20 + 1, 4 * 2**20]).map(lambda n: b"\xff" * n)
            return st.one_of(st.binary(min_size=65, max_size=4096), huge)
        if kind == FieldDescriptor.TYPE_STRING and field.name == "markdown":
            return st.one_of(odd_text(), odd_sections())
        if kind == FieldDescriptor.TYPE_STRING:
            return odd_text()
        return numbers(field)


def odd_sections() -> st.SearchStrategy[str]:
    """An exported memory with one metadata line gone wrong, or cut short."""
    lines = SECTION.splitlines(keepends=True)
    meta = [n for n, line in enumerate(lines) if line.startswith("- ")]

    def spoil(at: int, key: str, value: str) -> str:
        spoiled = list(lines)
        spoiled[at] = f"- {key}: {value}\n"
        return "".join(spoiled)

    spoiled = st.builds(
        spoil,
        st.sampled_from(meta),
        st.sampled_from(METADATA_KEYS),
        st.one_of(st.sampled_from(ODD_VALUES), odd_text()),
    )
    cut = st.integers(1, len(SECTION) - 1).map(lambda n: SECTION[:n])
    return st.one_of(spoiled, cut, spoiled.map(lambda text: text * 3))


NAMING = frozenset(
    {
        "channel",
        "target_channel",
        "id",
        "from_id",
        "to_id",
        "trigger_id",
        "recall_id",
        "text",
        "query",
        "message",
        "markdown",
        "entity",
        "store",
        "trigger",
        "settings",
    }
)
# One memory as Export writes it (server/storage/markdown.py), and ways to spoil it.
SECTION = """## Alice is allergic to peanuts
- id: 01JNK3V7M8Q2W4X6Y8Z0A1B2C3
- type: core
- heat: 0.94
- keystone: yes
- state: active
- created: 2026-03-01T09:00:00Z
- tags: person=alice, topic=health
- source: human
- importance: 0.62

```text
Alice is allergic to peanuts.
```
"""
METADATA_KEYS = (
    "id", "type", "heat", "keystone", "state", "created", "updated", "tags", "source",
    "confidence", "importance", "stability", "recalls", "provenance", "merged_into",
)  # fmt: skip
ODD_VALUES = (
    "", "nan", "inf", "-inf", "-1", "1e309", "0x10", "yes please", "=", "a=b=c, ,=, =x",
    "9999-99-99T99:99:99Z", "0001-01-01T00:00:00Z", "99999-01-01T00:00:00Z",
    "2026-03-01T09:00:00+99:00", "1780000000", "x" * 300, "\x00", "```",
)  # fmt: skip
PROSE = (
    "The user is allergic to peanuts.",
    "Ana moved to Lisbon last week.",
    "- Met Ana at the pier yesterday.\n- Ana works on compilers.",
    "what happened yesterday?",
    "Ana",
    "invoice",
)
CONFIGS = (
    {"message": "saw {text}"},
    {"delta": "0.1"},
    {"key": "seen", "value": "yes"},
    {"url": "http://127.0.0.1:9/hook", "secret": "s3cret"},
    {"trigger_id": "trg_missing"},
    {},
)


def _mask(field: FieldDescriptor) -> st.SearchStrategy[Message]:
    """A field mask naming fields of what it masks: the message its request carries
    (the settings of UpdateSettings), else the request's own fields."""
    request = field.containing_type
    carried = [f.message_type for f in request.fields if f.type == FieldDescriptor.TYPE_MESSAGE]
    carried = [m for m in carried if m.full_name.startswith("calor.")]
    names = [f.name for f in (carried[0] if carried else request).fields]
    paths = st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)
    return paths.map(lambda chosen: field_mask_pb2.FieldMask(paths=chosen))


def _is_map(field: FieldDescriptor) -> bool:
    message = field.message_type
    return message is not None and message.GetOptions().map_entry


def _zero(field: FieldDescriptor) -> Any:
    """A field's default value (None for a message: an empty one)."""
    return None if field.type == FieldDescriptor.TYPE_MESSAGE else field.default_value


def _set(message: Message, field: FieldDescriptor, value: Any) -> None:
    """Give a field of ``message`` this value; None leaves it unset."""
    message.ClearField(field.name)
    if value is None:
        return
    target = getattr(message, field.name)
    if _is_map(field):
        for key, item in value.items():
            if isinstance(item, Message):
                target[key].CopyFrom(item)
            elif item is None:
                target[key].SetInParent()
            else:
                target[key] = item
    elif field.is_repeated:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value:
                target.add().CopyFrom(item)
        else:
            target.extend(value)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        target.CopyFrom(value)
    else:
        setattr(message, field.name, value)
