"""Tests for the Markdown export and import format."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import pytest

from calor.server.errors import FailedPreconditionError, InvalidArgumentError
from calor.server.ids import new_id
from calor.server.records import MemoryRecord
from calor.server.storage import markdown
from calor.server.storage.markdown import (
    MarkdownReader,
    ParsedMemory,
    parse_markdown,
    render_header,
    render_memory,
    to_new_memory,
)
from calor.server.thermo.heat import MEMORY_TYPES

MARCH_1 = 1_772_355_600.0  # 2026-03-01T09:00:00Z
PIECES = [
    "```",
    "```python",
    "````text",
    "  ```  ",
    "~~~",
    "# a heading",
    "## not a section",
    "###",
    "- a bullet",
    "- id: 01JNK3V7M8Q2W4X6Y8Z0A1B2C3",
    "- type: nonsense",
    "* star",
    "1. numbered",
    "2) numbered",
    "",
    "   ",
    "\t",
    "trailing spaces   ",
    "tab\tinside\t",
    "ünïcödé 日本語 🎉 ∑",
    "line\u2028separator and \x85 next-line and \x0c form feed",
    "carriage\rreturn",
    "crlf\r",
    "> a quote",
    "| a | table |",
    "<!-- a comment -->",
    "back\\slash \\` \\n",
    "    indented code",
    "inline `code` and ``more``",
    "***",
    "---",
    "x" * 5000,
]
TAG_WORDS = [
    "a",
    "k,ey",
    "x=y",
    "back\\slash",
    " lead",
    "trail ",
    "new\nline",
    "ünï",
    "=",
    ",",
    "\\",
]
TAG_WORDS += ["tab\t", " ", "cr\r", "\\ ", "plain value"]


def _text(rng: random.Random) -> str:
    parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 8))]
    if rng.random() < 0.3:
        parts.append("`" * rng.randint(3, 10))
    if rng.random() < 0.2:
        parts.insert(rng.randrange(len(parts) + 1), "a `" + "`" * rng.randint(2, 9) + " run")
    text = "\n".join(parts)
    if rng.random() < 0.2:
        text = "\n" + text
    if rng.random() < 0.2:
        text += "\n"
    return text if text.strip() else text + "x"


def _created(rng: random.Random, index: int) -> float:
    kind = index % 6
    if kind == 0:
        return MARCH_1 + rng.randint(-(10**8), 10**8)  # whole seconds
    if kind == 1:
        return MARCH_1 + rng.randint(0, 10**8) + rng.randint(1, 999_999) / 1e6  # microseconds
    if kind == 2:
        return MARCH_1 + rng.uniform(-1e8, 1e8)  # any float
    if kind == 3:
        return rng.uniform(-62_135_596_800, 0)  # before 1970
    if kind == 4:
        return rng.choice([-62_135_596_800.0, 253_402_300_799.0, 0.0, 0.5, -0.25])
    return MARCH_1 + 0.000001


def _records(count: int = 200) -> list[MemoryRecord]:
    rng = random.Random(20260301)
    combos = list(
        itertools.product(
            ["agent", "human", "extracted", "ingest"],
            ["observed", "inferred", "asserted"],
            [False, True],
            [False, True],
        )
    )
    records = []
    for index in range(count):
        source, confidence, keystone, tagged = combos[index % len(combos)]
        tags = {}
        if tagged:
            for _ in range(rng.randint(1, 4)):
                key = rng.choice(TAG_WORDS) + rng.choice(["", "k"])
                tags[key if key.strip() else key + "k"] = rng.choice(TAG_WORDS + [""])
        records.append(
            MemoryRecord(
                id=new_id(),
                channel="agent-7",
                text=_text(rng),
                memory_type=MEMORY_TYPES[index % len(MEMORY_TYPES)],
                created_at=_created(rng, index),
                updated_at=MARCH_1,
                heat0=1.0,
                t0=MARCH_1,
                keystone=keystone,
                tags=tags,
                source=source,
                confidence=confidence,
                importance=rng.choice([0.5, 0.62, 1.0, 0.0, rng.random()]),
            )
        )
    return records


def _export(records: list[MemoryRecord]) -> str:
    body = "".join(render_memory(r, heat=0.5, state="active") for r in records)
    return render_header("agent-7", MARCH_1, len(records)) + body


def _micros(at: float) -> timedelta:
    return timedelta(seconds=at)  # rounds to the microsecond, as the export does


def _assert_matches(parsed: ParsedMemory, record: MemoryRecord) -> None:
    memory = to_new_memory(parsed, "agent-7")
    assert parsed.text == record.text
    assert parsed.memory_type == record.memory_type
    assert parsed.tags == record.tags
    assert parsed.keystone is record.keystone
    assert parsed.created_at is not None
    # Exactly the record's time rounded to the microsecond, as near as a float holds it;
    # within a few centuries of 1970 a float holds microseconds, so they match.
    assert parsed.created_at == _micros(record.created_at) / timedelta(seconds=1)
    if abs(record.created_at) < 4e9:
        assert _micros(parsed.created_at) == _micros(record.created_at)
    assert memory.source == record.source
    assert memory.confidence == record.confidence
    assert parsed.importance == record.importance
    assert parsed.original_id == record.id
    assert memory.provenance == {"imported_id": record.id}


RECORDS = _records()
EXPORT = _export(RECORDS)


def test_export_round_trips_every_field_of_awkward_memories() -> None:
    parsed = parse_markdown(EXPORT, channel="agent-7")
    assert len(parsed) == len(RECORDS)
    for memory, record in zip(parsed, RECORDS, strict=True):
        _assert_matches(memory, record)


def test_whole_second_times_round_trip_exactly() -> None:
    record = RECORDS[0]
    assert record.created_at == int(record.created_at)
    (parsed,) = parse_markdown(_export([record]), channel="c")
    assert parsed.created_at == record.created_at


def test_chunks_split_anywhere_read_the_same() -> None:
    whole = parse_markdown(EXPORT, channel="agent-7")
    rng = random.Random(7)
    for _ in range(5):
        cuts = sorted(rng.sample(range(len(EXPORT)), 400))
        reader = MarkdownReader()
        streamed: list[ParsedMemory] = []
        for start, end in itertools.pairwise([0, *cuts, len(EXPORT)]):
            streamed += reader.feed(EXPORT[start:end])
        streamed += reader.finish()
        assert streamed == whole
        assert [m.line for m in streamed] == [m.line for m in whole]


def test_one_character_at_a_time_and_memories_arrive_as_they_complete() -> None:
    document = _export(RECORDS[:6])
    reader = MarkdownReader()
    seen: list[tuple[int, ParsedMemory]] = []
    for index, char in enumerate(document):
        seen += [(index, m) for m in reader.feed(char)]
    assert reader.finish() == []
    assert [m for _, m in seen] == parse_markdown(document, channel="c")
    # Each memory is handed back when its closing fence's line ends, not at the end.
    first_close = document.index("\n\n## ", 1 + document.index("## "))
    assert seen[0][0] < first_close + 1


def test_a_crlf_document_reads_the_same() -> None:
    crlf = EXPORT.replace("\n", "\r\n")
    assert parse_markdown(crlf, channel="agent-7") == parse_markdown(EXPORT, channel="agent-7")


def test_the_format_reads_like_the_example() -> None:
    record = MemoryRecord(
        id="01JNK3V7M8Q2W4X6Y8Z0A1B2C3",
        channel="agent-7",
        text="Alice is allergic to peanuts.\nShe carries an EpiPen.",
        memory_type="core",
        created_at=MARCH_1,
        updated_at=MARCH_1,
        heat0=1.0,
        t0=MARCH_1,
        keystone=True,
        tags={"person": "alice", "note": "a, b=c"},
        source="human",
        importance=0.62,
    )
    assert render_header("agent-7", MARCH_1 + 0.25, 1) == (
        "# Calor export: agent-7\n\nExported 2026-03-01T09:00:00.250000Z · 1 memory\n\n"
    )
    assert render_memory(record, 0.9412, "active") == (
        "## Alice is allergic to peanuts.\n"
        "- id: 01JNK3V7M8Q2W4X6Y8Z0A1B2C3\n"
        "- type: core\n"
        "- heat: 0.94\n"
        "- keystone: yes\n"
        "- state: active\n"
        "- created: 2026-03-01T09:00:00Z\n"
        "- tags: person=alice, note=a\\, b\\=c\n"
        "- source: human\n"
        "- importance: 0.62\n"
        "\n"
        "```text\n"
        "Alice is allergic to peanuts.\n"
        "She carries an EpiPen.\n"
        "```\n"
        "\n"
    )


def test_defaults_are_left_out_and_the_fence_outgrows_the_text() -> None:
    record = RECORDS[0]
    plain = MemoryRecord(**{**record.__dict__, "tags": {}, "text": "a ````` run\n" + "b" * 90})
    section = render_memory(plain, 0.1, "cold")
    assert "- tags:" not in section
    assert "- source:" not in section
    assert "- confidence:" not in section
    assert "\n``````text\n" in section
    title = section.split("\n", 1)[0]
    assert title == "## a ````` run"
    long_title = render_memory(MemoryRecord(**{**plain.__dict__, "text": "b" * 90}), 0, "x")
    assert long_title.split("\n", 1)[0] == "## " + "b" * 59 + "…"


def test_the_last_moment_a_timestamp_can_name_still_renders() -> None:
    record = MemoryRecord(**{**RECORDS[0].__dict__, "created_at": 253_402_300_799.9999999})
    assert "- created: 9999-12-31T23:59:59.999999Z\n" in render_memory(record, 0.5, "active")


def test_the_header_alone_holds_no_memories() -> None:
    assert parse_markdown(render_header("agent-7", MARCH_1, 0), channel="agent-7") == []
    assert parse_markdown("", channel="agent-7") == []


def test_a_bullet_list_of_notes() -> None:
    document = (
        "# My notes\n"
        "Some prose that is not a memory.\n"
        "\n"
        "- buy milk\n"
        "* call Bob\n"
        "  about the invoice\n"
        "    - nested detail\n"
        "\tand a tabbed line\n"
        "1. first numbered\n"
        "2) second numbered\n"
        "\n"
        "   continued after a blank line\n"
        "+ plus note   \n"
        "-not a bullet\n"
        "- \n"
        "Closing prose.\n"
        "  indented prose outside any bullet\n"
    )
    notes = parse_markdown(document, channel="c")
    assert [n.text for n in notes] == [
        "buy milk",
        "call Bob\nabout the invoice\n  - nested detail\n  and a tabbed line",
        "first numbered",
        "second numbered\n\ncontinued after a blank line",
        "plus note",
    ]
    assert [n.line for n in notes] == [4, 5, 9, 10, 13]
    assert all(n == ParsedMemory(text=n.text) for n in notes)
    memory = to_new_memory(notes[0], "c")
    assert (memory.source, memory.confidence, memory.provenance) == ("agent", "observed", {})
    assert memory.memory_type is None and memory.created_at is None


def test_mixed_documents() -> None:
    exported = render_memory(RECORDS[1], 0.5, "active")
    document = (
        render_header("agent-7", MARCH_1, 1)
        + "- a stray note before the sections\n\n"
        + exported
        + "- a stray note after a section\n"
        + "Prose after it.\n\n"
        + "## Shopping\n"
        + "This week:\n"
        + "- Note: eggs\n"
        + "- milk\n"
        + "\n"
        + "## Written by hand\n"
        + "A line of prose under the heading.\n"
        + "- type: fact\n"
        + "- tags: topic=sky\n"
        + "- mood: sunny\n"
        + "\n"
        + "The sky is blue.\n"
        + "\n"
        + "```\n"
        + "## not a heading inside a code block\n"
        + "```\n"
        + "\n"
        + "### Sub-heading\n"
        + "- a note under a sub-heading\n"
        + "## Only a fence\n"
        + "prose first\n"
        + "~~~\n"
        + "fenced with tildes\n"
        + "~~~\n"
    )
    parsed = parse_markdown(document, channel="agent-7")
    texts = [m.text for m in parsed]
    assert texts == [
        "a stray note before the sections",
        RECORDS[1].text,
        "a stray note after a section",
        "Note: eggs",
        "milk",
        "The sky is blue.\n\n```\n## not a heading inside a code block\n```",
        "a note under a sub-heading",
        "fenced with tildes",
    ]
    _assert_matches(parsed[1], RECORDS[1])
    hand = parsed[5]
    assert (hand.memory_type, hand.tags, hand.keystone) == ("fact", {"topic": "sky"}, False)
    assert parsed[7] == ParsedMemory(text="fenced with tildes")


def test_lenient_values() -> None:
    document = (
        "## x\n"
        "- type: MEMORY_TYPE_Fact\n"
        "- keystone: True\n"
        "- created: 2026-03-01T11:00:00.5+02:00\n"
        "- tags: a = 1 ,, b=\n"
        "- source: SOURCE_INGEST\n"
        "- confidence:\n"
        "- importance: 1\n"
        "- heat: very hot\n"
        "- state: whatever\n"
        "\n"
        "```\ntext\n```\n"
        "## naive time means UTC\n"
        "- created: 2026-03-01\n"
        "```\nmore\n```"
    )
    first, second = parse_markdown(document, channel="c")
    assert first == ParsedMemory(
        text="text",
        memory_type="fact",
        keystone=True,
        tags={"a": "1", "b": ""},
        created_at=MARCH_1 + 0.5,
        source="ingest",
        importance=1.0,
    )
    assert second.created_at == MARCH_1 - 9 * 3600


@pytest.mark.parametrize(
    ("document", "line", "problem"),
    [
        ("## t\n- type: factoid\n```\nx\n```\n", 2, "'factoid' is not a memory type"),
        ("# h\n\n## t\n- created: yesterday\n```\nx\n```\n", 4, "'yesterday' is not a time"),
        ("## t\n- id: 01J\n- keystone: maybe\n```\nx\n```\n", 2, "'01J' is not a memory id"),
        ("## t\n- keystone: maybe\n```\nx\n```\n", 2, "'maybe' is not yes or no"),
        ("## t\n- importance: 2\n```\nx\n```\n", 2, "not a number in [0, 1]"),
        ("## t\n- importance: nan\n```\nx\n```\n", 2, "not a number in [0, 1]"),
        ("## t\n- source: robot\n```\nx\n```\n", 2, "'robot' is not one of human"),
        ("## t\n- tags: a=1, b\n```\nx\n```\n", 2, "'b' has no '='"),
        ("## t\n- tags: =1\n```\nx\n```\n", 2, "a tag key is empty"),
        ("## t\n- tags: a=1\\\n```\nx\n```\n", 2, "a backslash at the end"),
        ("- a\n\n## t\n- type: fact\n\n```text\nx\n", 6, "never closed"),
        ("## t\n- type: fact\n\n```text\n   \n```\n", 1, "empty text"),
        ("## t\n- type: fact\n## u\n", 1, "has no text"),
        ("intro\n```\n## hidden\n", 2, "never closed"),
    ],
)
def test_malformed_values_name_the_line(document: str, line: int, problem: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        parse_markdown(document, channel="c")
    assert raised.value.message.startswith(f"line {line}: ")
    assert problem in raised.value.message


def test_a_channel_is_required() -> None:
    with pytest.raises(InvalidArgumentError, match="channel"):
        parse_markdown("- x\n", channel="")


def test_the_reader_bounds_what_it_holds() -> None:
    with pytest.raises(InvalidArgumentError, match="line 1: longer than 100"):
        MarkdownReader(max_block_chars=100).feed("x" * 60 + "y" * 60)
    reader = MarkdownReader(max_block_chars=100)
    with pytest.raises(InvalidArgumentError, match="line 5: the memory runs past 100"):
        reader.feed("## t\n- type: fact\n```\n" + "x" * 60 + "\n" + "y" * 60 + "\n")
    with pytest.raises(InvalidArgumentError, match="line 2: a note runs past 100"):
        MarkdownReader(max_block_chars=100).feed("- " + "x" * 60 + "\n  " + "y" * 60 + "\n")


def test_a_finished_reader_takes_no_more() -> None:
    reader = MarkdownReader()
    assert reader.feed("- last note") == []
    assert reader.finish() == [ParsedMemory(text="last note")]
    assert reader.finish() == []
    with pytest.raises(FailedPreconditionError):
        reader.feed("- more\n")


def test_to_new_memory_carries_every_field() -> None:
    parsed = ParsedMemory(
        text="t",
        memory_type="fact",
        keystone=True,
        tags={"a": "b"},
        created_at=MARCH_1,
        source="human",
        confidence="inferred",
        importance=0.25,
        original_id="01JNK3V7M8Q2W4X6Y8Z0A1B2C3",
    )
    memory = to_new_memory(parsed, "agent-7")
    assert memory.channel == "agent-7"
    assert (memory.text, memory.memory_type, memory.keystone) == ("t", "fact", True)
    assert (memory.tags, memory.created_at, memory.importance) == ({"a": "b"}, MARCH_1, 0.25)
    assert (memory.source, memory.confidence) == ("human", "inferred")
    assert memory.idempotency_key == ""
    assert memory.provenance == {"imported_id": "01JNK3V7M8Q2W4X6Y8Z0A1B2C3"}


def test_public_surface() -> None:
    assert markdown.__all__ == [
        "MarkdownReader",
        "ParsedMemory",
        "parse_markdown",
        "render_header",
        "render_memory",
        "to_new_memory",
    ]
