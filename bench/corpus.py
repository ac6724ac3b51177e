"""The benchmark's corpus: LongMemEval turns and questions, topped up with generated text.

Memory texts are LongMemEval user/assistant turns (``role: content``, capped at 1,000
characters, deduplicated, in file order) from ``../shared/data``: the oracle split
first, topped up from the ``_s`` split when the oracle runs short, and from generated
sentences when neither file is there. Recall queries are the LongMemEval questions.

``build_short_corpus`` does the same with short memories (``bench/peers.py``): one or
two sentences cut from the turns' content, 40 to 250 characters each.
"""

from __future__ import annotations

import gc
import gzip
import json
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
ORACLE = DATA / "longmemeval_oracle.json"
LONGMEMEVAL_S = DATA / "longmemeval_s_498.json.gz"

MAX_CHARS = 1000
SHORT_MIN_CHARS = 40
SHORT_MAX_CHARS = 250
# A short piece is joined with the sentence after it while it is shorter than this.
SHORT_JOIN_BELOW = 120

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_LINE_MARKUP = re.compile(r"^\s*(?:[#>*\-\u2022]+|\d+[.)])\s*")

Json = dict[str, Any]


@dataclass
class Corpus:
    """The texts to store, the queries to recall with, and where the texts came from."""

    texts: list[str]
    queries: list[str]
    sources: dict[str, int] = field(default_factory=dict)

    def describe(self) -> Json:
        lengths = [len(text) for text in self.texts]
        return {
            "texts": len(self.texts),
            "queries": len(self.queries),
            "sources": self.sources,
            "mean_chars": round(float(np.mean(lengths)), 1) if lengths else 0.0,
            "median_chars": float(np.median(lengths)) if lengths else 0.0,
        }


def load_questions(path: Path) -> list[Json]:
    """The LongMemEval questions in a file (plain or gzipped JSON); [] when it is missing."""
    if not path.is_file():
        return []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        questions: list[Json] = json.load(f)
    return questions


def turn_texts(questions: Iterable[Json]) -> Iterator[str]:
    """Every turn of every haystack session, as ``role: content``, capped, in order."""
    for question in questions:
        for session in question.get("haystack_sessions", []):
            for turn in session:
                text = f"{turn['role']}: {turn['content']}"[:MAX_CHARS].strip()
                if text:
                    yield text


def generated_sentences(seed: int = 7) -> Iterator[str]:
    """An endless supply of plausible memory-sized texts, 1 to 6 sentences each."""
    rng = random.Random(seed)
    subjects = ["The user", "Maya", "Our team", "The agent", "My sister", "The landlord"]
    verbs = ["prefers", "booked", "mentioned", "cancelled", "is planning", "asked about"]
    objects = [
        "a window seat on the morning flight",
        "oat milk in every coffee",
        "the quarterly budget review",
        "a hiking trip to the Dolomites",
        "a refund for the broken blender",
        "moving the standup to 9:30",
        "learning Portuguese before July",
    ]
    times = ["yesterday", "last week", "on Friday", "every morning", "in March", "twice"]
    while True:
        sentences = [
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} "
            f"{rng.choice(times)} (note {rng.randrange(10**6)})."
            for _ in range(rng.randint(1, 6))
        ]
        yield " ".join(sentences)


def sentences(content: str) -> Iterator[str]:
    """The sentences of a turn's content, line by line, without Markdown list and
    heading markers or bold markers, whitespace collapsed."""
    for line in content.splitlines():
        line = _LINE_MARKUP.sub("", line.replace("**", "")).strip()
        for sentence in _SENTENCE_END.split(line):
            sentence = " ".join(sentence.split())
            if sentence:
                yield sentence


def sentence_texts(questions: Iterable[Json]) -> Iterator[str]:
    """Short memories from every turn of every haystack session, in order: one
    sentence, or two when the first is shorter than ``SHORT_JOIN_BELOW`` characters and
    both fit; only pieces of ``SHORT_MIN_CHARS`` to ``SHORT_MAX_CHARS`` characters."""
    for question in questions:
        for session in question.get("haystack_sessions", []):
            for turn in session:
                yield from _short_pieces(list(sentences(str(turn["content"]))))


def _short_pieces(parts: list[str]) -> Iterator[str]:
    i = 0
    while i < len(parts):
        piece = parts[i]
        i += 1
        if i < len(parts) and len(piece) < SHORT_JOIN_BELOW:
            joined = f"{piece} {parts[i]}"
            if len(joined) <= SHORT_MAX_CHARS:
                piece = joined
                i += 1
        if SHORT_MIN_CHARS <= len(piece) <= SHORT_MAX_CHARS:
            yield piece


def generated_short(seed: int = 7) -> Iterator[str]:
    """Generated memory texts of at most ``SHORT_MAX_CHARS`` characters."""
    return (text for text in generated_sentences(seed) if len(text) <= SHORT_MAX_CHARS)


def generated_queries() -> Iterator[str]:
    """An endless supply of recall questions for when no LongMemEval file is there."""
    for text in generated_sentences(seed=11):
        yield "What do I know about " + text.split(" (note")[0].lower() + "?"


def take_unique(
    supply: Iterable[str], want: int, seen: set[str], into: list[str], source: str
) -> dict[str, int]:
    """Append unseen texts from ``supply`` to ``into`` until it holds ``want``."""
    added = 0
    for text in supply:
        if len(into) >= want:
            break
        if text not in seen:
            seen.add(text)
            into.append(text)
            added += 1
    return {source: added} if added else {}


def build_corpus(memories: int, queries: int) -> Corpus:
    """N memory texts and Q queries, LongMemEval first, generated only to fill a gap."""
    return _build(memories, queries, turn_texts, generated_sentences())


def build_short_corpus(memories: int, queries: int) -> Corpus:
    """N short memories (one or two sentences of a LongMemEval turn, 40 to 250
    characters) and Q queries, LongMemEval first, generated only to fill a gap."""
    return _build(memories, queries, sentence_texts, generated_short())


def _build(
    memories: int,
    queries: int,
    pieces: Callable[[Iterable[Json]], Iterator[str]],
    generated: Iterable[str],
) -> Corpus:
    """N unique texts cut by ``pieces`` from the oracle split, then the ``_s`` split,
    then ``generated``; Q queries from the oracle's questions, then generated ones."""
    texts: list[str] = []
    seen: set[str] = set()
    oracle = load_questions(ORACLE)
    sources = take_unique(pieces(oracle), memories, seen, texts, "longmemeval_oracle")
    if len(texts) < memories:
        extra = load_questions(LONGMEMEVAL_S)  # about 1.6 GB parsed; freed right after
        sources |= take_unique(pieces(extra), memories, seen, texts, "longmemeval_s")
        del extra
        gc.collect()
    sources |= take_unique(generated, memories, seen, texts, "generated")
    asked: list[str] = []
    questions = (str(q["question"]).strip() for q in oracle if q.get("question"))
    take_unique(questions, queries, set(), asked, "questions")
    take_unique(generated_queries(), queries, set(asked), asked, "generated")
    return Corpus(texts, asked, sources)
