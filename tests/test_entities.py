"""Entity extraction: each kind of entity, deduplication, and the key that links mentions."""

from __future__ import annotations

import pytest

from calor.models.entities import entity_key, extract_entities, read_entities


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Ada Lovelace worked with Charles Babbage.", ["Ada Lovelace", "Charles Babbage"]),
        ("Priya moved from Toronto to New York last year.", ["Toronto", "New York"]),
        (
            "Tom works at Acme Corp with the University of Toronto.",
            ["Acme Corp", "University of Toronto"],
        ),
        ("Write to Maria.Lopez@Example.COM today.", ["maria.lopez@example.com"]),
        (
            "Docs at https://calor.dev/docs/recall, mirror at www.example.org.",
            ["https://calor.dev/docs/recall", "www.example.org"],
        ),
        (
            "Latency fell 12 percent to 200ms; the disk has 3.5 GB, the run cost $300.",
            ["12 percent", "200ms", "3.5 GB", "$300"],
        ),
        ("the walk is 5 km and starts at 10am", ["5 km", "10am"]),
        (
            "call classify_type and getUserName from calor.models.text",
            ["classify_type", "getUserName", "calor.models.text"],
        ),
        ("set CALOR_MODEL_DIR or pass --model-dir", ["CALOR_MODEL_DIR", "--model-dir"]),
        (
            "edit server/app.py, then ./scripts/run.sh and ~/.calor/",
            ["server/app.py", "./scripts/run.sh", "~/.calor/"],
        ),
        ("run `pytest -q tests/` first", ["pytest -q tests/"]),
        ("Dr. Jane Goodall met J. R. R. Tolkien.", ["Dr. Jane Goodall", "J. R. R. Tolkien"]),
        ("Jordan's birthday is on July 14.", ["July 14"]),
        ("We chose Plan B. The rest failed.", ["Plan B"]),
        (
            "See https://en.wikipedia.org/wiki/Foo_(bar)).",
            ["https://en.wikipedia.org/wiki/Foo_(bar)"],
        ),
    ],
)
def test_extract_entities_by_kind(text: str, expected: list[str]) -> None:
    assert extract_entities(text) == expected


def test_entities_are_deduplicated_in_order_of_first_appearance() -> None:
    text = "Maria met ACME Corp. Then maria emailed acme corp and Maria again; Acme Corp replied."
    assert extract_entities(text) == ["Maria", "ACME Corp"]


def test_plain_lowercase_text_has_no_entities() -> None:
    assert extract_entities("the quick brown fox jumps over the lazy dog, twice.") == []
    assert extract_entities("") == []


def test_sentence_initial_common_words_are_not_entities() -> None:
    assert extract_entities("The meeting moved. It was long. We left. I agree.") == []
    assert extract_entities("The Acme team shipped it.") == ["Acme"]
    assert extract_entities("Yesterday Maria called.") == ["Maria"]


def test_weekday_and_month_names_alone_are_not_entities() -> None:
    assert extract_entities("See you on Monday or in March, maybe Friday.") == []


def test_entity_key_links_spellings_of_one_entity() -> None:
    assert entity_key("Acme  Corp") == entity_key("acme corp") == "acme corp"
    assert entity_key("5 km") == entity_key("5km")
    assert entity_key("Straße") == entity_key("STRASSE")


def test_a_word_that_opens_a_sentence_is_a_name_only_where_it_is_known_as_one() -> None:
    # Capitalised because it opens the sentence, or because it is a name? A candidate.
    assert read_entities("Invoices are due on Friday.") == [("Invoices", True)]
    assert read_entities("Alice moved to Berlin.") == [("Alice", True), ("Berlin", False)]
    assert extract_entities("Invoices are due on Friday.") == []
    assert extract_entities("Alice moved to Berlin.", known={"alice"}.__contains__) == [
        "Alice",
        "Berlin",
    ]
    # Capitalised mid-sentence in the same text settles it; acronyms are names anywhere.
    assert extract_entities("Alice called. I told Alice.") == ["Alice"]
    assert extract_entities("HNSW is fast. BM25 is too.") == ["HNSW", "BM25"]


def test_determiners_and_a_share_prefix_are_not_part_of_a_name() -> None:
    assert extract_entities("We met Bob at The Crown last night.") == ["Bob", "Crown"]
    assert extract_entities("The Peregrine launched in May.") == ["Peregrine"]
    assert extract_entities("[Shared by agentA] We met Bob in Oslo.") == ["Bob", "Oslo"]
