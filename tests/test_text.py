"""Type rules against labelled sentences, and the speed of all text analysis on bad input."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from calor.models.entities import extract_entities
from calor.models.text import classify_type
from calor.models.valence import valence

DATA = Path(__file__).resolve().parent / "data"
TYPES = ("preference", "procedural", "fact", "episodic", "semantic", "codebase")


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
