"""Tests for the Markdown export and import format."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from calor.models.entities import extract_entities
from calor.server.errors import FailedPreconditionError, InvalidArgumentError
from calor.server.ids import new_id
from calor.server.records import MemoryRecord
from calor.server.storage import markdown
from calor.server.storage.markdown import (
    CarriedState,
    LinkTo,
    MarkdownReader,
    ParsedMemory,
    parse_markdown,
    render_header,
    render_memory,
    to_new_memory,
)
from calor.server.thermo.graph import EDGE_KINDS, Edge
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


def _state(rng: random.Random, index: int, ids: list[str]) -> dict[str, object]:
    """Every field of the carried state, awkward values included, varied by index."""
    recalls = rng.choice([0, 0, 1, 2, 7, 40])
    times = sorted(_created(rng, index + k) for k in range(min(recalls, 32)))
    merged = index % 17 == 3
    return {
        "heat0": rng.choice([1.0, 0.0, 0.1 + 0.2, rng.random(), 5e-324]),
        "t0": _created(rng, index + 1),
        "stability": rng.choice([1.0, 4.0, 1.5**7, rng.uniform(0.1, 1e6)]),
        "utility": rng.random(),
        "recall_count": recalls,
        "last_recalled_at": times[-1] if times else None,
        "recall_times": times,
        "confirmations": rng.choice([0, 0, 3]),
        "valence": rng.choice([0.0, -1.0, 1.0, rng.uniform(-1, 1)]),
        "surprise": rng.choice([0.0, 1.0, rng.random()]),
        "importance_adjustment": rng.choice([0.0, -0.2, rng.uniform(-1, 1)]),
        "interactions0": rng.choice([0, 0, -5, 12]),
        "state": "merged" if merged else rng.choice(["active", "cold", "archived", "ghost"]),
        "session": rng.choice(["", "time:", "tag:" + rng.choice(TAG_WORDS)]),
        "merged_into": rng.choice(ids) if merged else "",
        "merged_from": rng.sample(ids, 2) if index % 17 == 4 else [],
        "updated_at": _created(rng, index + 2),
        "provenance": {"from": "chat", rng.choice(TAG_WORDS) + "k": rng.choice(TAG_WORDS)}
        if index % 3
        else {},
    }


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
    ids = [new_id() for _ in range(count)]
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
                id=ids[index],
                channel="agent-7",
                text=_text(rng),
                memory_type=MEMORY_TYPES[index % len(MEMORY_TYPES)],
                created_at=_created(rng, index),
                keystone=keystone,
                tags=tags,
                source=source,
                confidence=confidence,
                importance=rng.choice([0.5, 0.62, 1.0, 0.0, rng.random()]),
                **_state(rng, index, ids),  # type: ignore[arg-type]
            )
        )
        # As a store reads them; now and then with a name only the channel knew as one
        # (a word that opens a sentence), which the text alone does not say.
        text = records[-1].text
        known = (lambda key: True) if index % 5 == 0 else None
        records[-1].entities = extract_entities(text, known) + (
            ["Ölmühle"] if index % 9 == 0 else []
        )
    return records


def _edges(records: list[MemoryRecord]) -> dict[str, list[Edge]]:
    """Edges among the records, each under both ends, as an export writes them."""
    rng = random.Random(5)
    edges: dict[str, list[Edge]] = {r.id: [] for r in records}
    for _ in range(300 if len(records) > 1 else 0):
        a, b = rng.sample(records, 2)
        kind, weight = rng.choice(EDGE_KINDS), rng.choice([1.0, 0.75, rng.random()])
        edges[a.id].append(Edge(a.id, b.id, kind, weight))
        edges[b.id].append(Edge(b.id, a.id, kind, weight))
    return edges


def _section(record: MemoryRecord, edges: list[Edge] | None = None) -> str:
    """A record as an export of a channel at 20 interactions renders it."""
    interactions = 20 - record.interactions0
    return render_memory(record, 0.5, record.state, edges=edges or [], interactions=interactions)


def _export(records: list[MemoryRecord]) -> str:
    edges = _edges(records)
    body = "".join(_section(r, edges[r.id]) for r in records)
    return render_header("agent-7", MARCH_1, len(records)) + body


def _assert_matches(parsed: ParsedMemory, record: MemoryRecord) -> None:
    memory = to_new_memory(parsed, "agent-7")
    assert parsed.text == record.text
    assert parsed.memory_type == record.memory_type
    assert parsed.tags == record.tags
    assert parsed.keystone is record.keystone
    assert parsed.created_at == record.created_at  # exactly: no rounding on the way
    assert memory.source == record.source
    assert memory.confidence == record.confidence
    assert parsed.importance == record.importance
    assert parsed.original_id == record.id
    assert parsed.provenance == record.provenance
    assert memory.provenance == {**record.provenance, "imported_id": record.id}
    assert parsed.state == CarriedState(
        heat0=record.heat0,
        t0=record.t0,
        stability=record.stability,
        utility=record.utility,
        recall_count=record.recall_count,
        last_recalled_at=record.last_recalled_at,
        recall_times=tuple(record.recall_times),
        confirmations=record.confirmations,
        valence=record.valence,
        surprise=record.surprise,
        importance_adjustment=record.importance_adjustment,
        interactions=20 - record.interactions0,
        state=record.state,
        session=record.session,
        merged_into=record.merged_into,
        merged_from=tuple(record.merged_from),
        updated_at=record.updated_at,
        entities=None
        if record.entities == extract_entities(record.text)
        else tuple(record.entities),
    )


ID = "01JNK3V7M8Q2W4X6Y8Z0A1B2C3"
STATE = "- type: fact\n- heat0: 1\n- t0: 2026-03-01T09:00:00Z\n"  # lines 2 to 4 of a section
RECORDS = _records()
EXPORT = _export(RECORDS)


def test_export_round_trips_every_field_of_awkward_memories() -> None:
    parsed = parse_markdown(EXPORT, channel="agent-7")
    assert len(parsed) == len(RECORDS)
    edges = _edges(RECORDS)
    for memory, record in zip(parsed, RECORDS, strict=True):
        _assert_matches(memory, record)
        assert memory.edges == tuple(LinkTo(e.to_id, e.kind, e.weight) for e in edges[record.id])


def test_times_are_written_with_the_digits_their_float_needs() -> None:
    rng = random.Random(3)
    for at in [
        1_795_459_276.4744866,
        -0.25,
        0.1 + 0.2,
        *(rng.uniform(-6e10, 2.5e11) for _ in range(2000)),
    ]:
        record = replace(RECORDS[0], created_at=at, t0=at)
        (parsed,) = parse_markdown(render_memory(record, 0.5, "active"), channel="c")
        assert parsed.created_at == at
        assert parsed.state is not None and parsed.state.t0 == at
    section = render_memory(replace(RECORDS[0], created_at=1_795_459_276.4744866), 0, "cold")
    assert "- created: 2026-11-23T18:41:16.4744866Z\n" in section


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
        updated_at=MARCH_1 + 90_000.25,
        heat0=1.0,
        t0=MARCH_1 + 90_000.25,
        stability=6.25,
        utility=0.6180339887,
        recall_count=2,
        last_recalled_at=MARCH_1 + 90_000.25,
        recall_times=[MARCH_1 + 32_400, MARCH_1 + 90_000.25],
        keystone=True,
        tags={"person": "alice", "note": "a, b=c"},
        source="human",
        importance=0.62,
        provenance={"from": "chat"},
        interactions0=5,
        entities=["EpiPen"],
    )
    assert render_header("agent-7", MARCH_1 + 0.25, 1) == (
        "# Calor export: agent-7\n\nExported 2026-03-01T09:00:00.25Z · 1 memory\n\n"
    )
    edges = [
        Edge(record.id, "01JNK3V7M8Q2W4X6Y8Z0A1B2C4", "semantic", 0.8312),
        Edge(record.id, "01JNK3V7M8Q2W4X6Y8Z0A1B2C5", "manual", 1.0),
    ]
    assert render_memory(record, 0.9412, "active", edges=edges, interactions=3) == (
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
        "- provenance: from=chat\n"
        "- heat0: 1.0\n"
        "- t0: 2026-03-02T10:00:00.25Z\n"
        "- stability: 6.25\n"
        "- utility: 0.6180339887\n"
        "- recalls: 2\n"
        "- last_recalled: 2026-03-02T10:00:00.25Z\n"
        "- recall_times: 2026-03-01T18:00:00Z, 2026-03-02T10:00:00.25Z\n"
        "- interactions_since_t0: 3\n"
        "- updated: 2026-03-02T10:00:00.25Z\n"
        "- edges: 01JNK3V7M8Q2W4X6Y8Z0A1B2C4 semantic 0.8312,"
        " 01JNK3V7M8Q2W4X6Y8Z0A1B2C5 manual 1.0\n"
        "\n"
        "```text\n"
        "Alice is allergic to peanuts.\n"
        "She carries an EpiPen.\n"
        "```\n"
        "\n"
    )
    (parsed,) = parse_markdown(render_memory(record, 0.9, "active", interactions=3), channel="c")
    assert parsed.state == CarriedState(
        heat0=1.0,
        t0=record.t0,
        stability=6.25,
        utility=0.6180339887,
        recall_count=2,
        last_recalled_at=record.last_recalled_at,
        recall_times=tuple(record.recall_times),
        interactions=3,
        updated_at=record.updated_at,
    )


def test_defaults_are_left_out_and_the_fence_outgrows_the_text() -> None:
    plain = MemoryRecord(
        id=new_id(),
        channel="agent-7",
        text="a ````` run\n" + "b" * 90,
        memory_type="semantic",
        created_at=MARCH_1,
        updated_at=MARCH_1,
        heat0=0.5,
        t0=MARCH_1,
    )
    section = render_memory(plain, 0.1, "cold")
    keys = [line.split(":")[0] for line in section.split("\n") if line.startswith("- ")]
    assert keys == [
        "- id",
        "- type",
        "- heat",
        "- keystone",
        "- state",
        "- created",
        "- importance",
        "- heat0",
        "- t0",
        "- stability",
        "- utility",
        "- updated",
    ]
    assert "\n``````text\n" in section
    title = section.split("\n", 1)[0]
    assert title == "## a ````` run"
    long_title = render_memory(replace(plain, text="b" * 90), 0, "x")
    assert long_title.split("\n", 1)[0] == "## " + "b" * 59 + "…"
    (parsed,) = parse_markdown(section, channel="c")
    assert parsed.state == CarriedState(
        heat0=0.5, t0=MARCH_1, utility=0.5, state="cold", updated_at=MARCH_1
    )


def test_the_last_moment_a_timestamp_can_name_still_renders() -> None:
    record = replace(RECORDS[0], created_at=253_402_300_799.9999999)
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
    exported = _section(RECORDS[1])
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
        (f"## t\n- id: {ID}\n- heat0: 0.5\n```\nx\n```\n", 3, "both heat0 and t0 (t0 is"),
        ("## t\n- type: fact\n- t0: 2026-03-01\n```\nx\n```\n", 3, "(heat0 is missing)"),
        (f"## t\n{STATE}- heat0: 1.5\n```\nx\n```\n", 5, "1.5 is not a number in [0, 1]"),
        (f"## t\n{STATE}- stability: 0\n```\nx\n```\n", 5, "0 is not a number above 0"),
        (f"## t\n{STATE}- stability: inf\n```\nx\n```\n", 5, "inf is not a number above"),
        (f"## t\n{STATE}- recalls: -1\n```\nx\n```\n", 5, "recalls: -1 is below 0"),
        (f"## t\n{STATE}- recalls: 2.5\n```\nx\n```\n", 5, "'2.5' is not a whole number"),
        (f"## t\n{STATE}- valence: -2\n```\nx\n```\n", 5, "not a number in [-1, 1]"),
        (f"## t\n{STATE}- state: deleted\n```\nx\n```\n", 5, "'deleted' is not a state"),
        (f"## t\n{STATE}- recall_times: 1, 2\n```\nx\n```\n", 5, "'1' is not a time"),
        (f"## t\n{STATE}- merged_from: {ID}, 01J\n```\nx\n```\n", 5, "'01J' is not a memory"),
        (f"## t\n- type: fact\n- edges: {ID} friend 1\n```\nx\n```\n", 3, "not an edge kind"),
        (f"## t\n- type: fact\n- edges: {ID} manual\n```\nx\n```\n", 3, "write ID kind weight"),
        (f"## t\n- type: fact\n- edges: {ID} manual 2\n```\nx\n```\n", 3, "2 is not a number"),
        ("## t\n- type: fact\n- provenance: a\n```\nx\n```\n", 3, "'a' has no '='"),
    ],
)
def test_malformed_values_name_the_line(document: str, line: int, problem: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        parse_markdown(document, channel="c")
    assert raised.value.message.startswith(f"line {line}: ")
    assert problem in raised.value.message


def test_without_heat0_the_state_keys_are_for_people_and_alone_make_no_memory() -> None:
    document = (
        "## From an older export, annotated by hand\n"
        "- id: 01JNK3V7M8Q2W4X6Y8Z0A1B2C3\n"
        "- type: fact\n"
        "- heat: 0.31\n"
        "- state: whatever\n"
        "- stability: high\n"
        "- recalls: many\n"
        "- provenance: from=chat\n"
        "\n"
        "```text\nThe sky is blue.\n```\n"
        "## Plans\n"
        "- session: monday\n"
        "- utility: later\n"
    )
    first, *notes = parse_markdown(document, channel="c")
    assert first == ParsedMemory(
        text="The sky is blue.",
        memory_type="fact",
        original_id="01JNK3V7M8Q2W4X6Y8Z0A1B2C3",
        provenance={"from": "chat"},
    )
    assert first.state is None
    assert to_new_memory(first, "c").provenance == {
        "from": "chat",
        "imported_id": "01JNK3V7M8Q2W4X6Y8Z0A1B2C3",
    }
    assert [n.text for n in notes] == ["session: monday", "utility: later"]


def test_a_hand_written_state_takes_defaults_for_what_it_leaves_out() -> None:
    document = f"## t\n{STATE}- recalls: 3\n- merged_from: {ID},, \n\n```\nx\n```\n"
    (parsed,) = parse_markdown(document, channel="c")
    assert parsed.state == CarriedState(heat0=1.0, t0=MARCH_1, recall_count=3, merged_from=(ID,))
    assert parsed.created_at is None


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
        "CarriedState",
        "LinkTo",
        "MarkdownReader",
        "ParsedMemory",
        "parse_markdown",
        "render_header",
        "render_memory",
        "to_new_memory",
    ]
