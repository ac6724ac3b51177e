"""Text analysis: type rules against labelled sentences, entity extraction, valence, speed."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from calor.models.text import classify_type, entity_key, extract_entities, valence

DATA = Path(__file__).resolve().parent / "data"
TYPES = ("preference", "procedural", "fact", "episodic", "semantic")


def _labelled(name: str) -> list[tuple[str, str]]:
    lines = (DATA / name).read_text(encoding="utf-8").splitlines()
    return [(row["text"], row["type"]) for row in map(json.loads, lines) if row]


def _confusion(rows: list[tuple[str, str]]) -> tuple[float, str]:
    """Accuracy and a printable confusion table (rows: truth, columns: predicted)."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    misses: list[str] = []
    for text, truth in rows:
        predicted = classify_type(text)
        table[truth][predicted] += 1
        if predicted != truth:
            misses.append(f"  {truth:>10} -> {predicted:<10} {text}")
    correct = sum(table[t][t] for t in table)
    header = "truth \\ predicted " + " ".join(f"{t[:6]:>6}" for t in TYPES)
    lines = [header] + [
        f"{truth:>17} " + " ".join(f"{table[truth][p]:>6}" for p in TYPES) for truth in TYPES
    ]
    return correct / len(rows), "\n".join(lines + ["misses:"] + misses)


@pytest.mark.parametrize(
    ("name", "floor", "minimum"),
    [("type_labels.jsonl", 0.80, 80), ("type_labels_heldout.jsonl", 0.70, 30)],
)
def test_classification_accuracy(name: str, floor: float, minimum: int) -> None:
    rows = _labelled(name)
    assert len(rows) >= minimum
    assert {label for _, label in rows} == set(TYPES)
    accuracy, report = _confusion(rows)
    assert accuracy >= floor, f"{name}: accuracy {accuracy:.3f} < {floor}\n{report}"


def test_labelled_set_is_balanced() -> None:
    counts = Counter(label for _, label in _labelled("type_labels.jsonl"))
    assert max(counts.values()) - min(counts.values()) <= 2, counts


def test_classify_returns_a_known_type_for_anything() -> None:
    for text in ("", "   ", "!!!", "x" * 10_000, "Ünïcödé façade naïve"):
        assert classify_type(text) in TYPES


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Ada Lovelace worked with Charles Babbage.", ["Ada Lovelace", "Charles Babbage"]),
        ("Priya moved from Toronto to New York last year.", ["Priya", "Toronto", "New York"]),
        (
            "Tom works at Acme Corp with the University of Toronto.",
            ["Tom", "Acme Corp", "University of Toronto"],
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
        ("Jordan's birthday is on July 14.", ["Jordan", "July 14"]),
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


def test_valence_signs() -> None:
    assert valence("I love this, it works perfectly and I'm so happy!") > 0.5
    assert valence("This is terrible, the deploy failed and I'm frustrated.") < -0.5
    assert valence("The meeting is at 3pm in room 4.") == 0.0


def test_valence_negation_flips_the_next_word() -> None:
    assert valence("good") > 0 > valence("not good")
    assert valence("bad") < 0 < valence("not bad")
    assert valence("it didn't work, never helpful") < 0
    assert valence("I can't stand verbose logs") < 0


def test_valence_intensifiers_and_bounds() -> None:
    assert valence("very good") > valence("good") > valence("slightly good") > 0
    for text in ("love " * 500, "hate " * 500, "!" * 100):
        assert -1.0 <= valence(text) <= 1.0


PATHOLOGICAL = [
    "a" * 50_000 + "!",
    "Aaaa " * 20_000,
    "." * 50_000,
    "a." * 25_000,
    "J. " * 20_000,
    "1," * 25_000,
    "a@" + "b." * 25_000,
    "a/" * 25_000,
    "a_" * 25_000,
    "`" * 50_000,
    "http://" + "a" * 50_000,
    "To " + "x " * 25_000,
    "first " * 10_000,
]


@pytest.mark.parametrize("text", PATHOLOGICAL, ids=lambda t: repr(t[:8]))
def test_pathological_input_is_fast(text: str) -> None:
    started = time.perf_counter()
    extract_entities(text)
    classify_type(text)
    valence(text)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.1, f"{elapsed * 1000:.1f} ms"
