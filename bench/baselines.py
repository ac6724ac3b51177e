"""Plain retrieval over the same turns, outside Calor: dense, BM25, and their fusion.

* ``dense``: cosine between the question and each turn, with Calor's own model
  (BGE-small, the query prefix on the question), vectors from :mod:`vectors`.
* ``bm25``: ``bm25s`` (Lucene BM25, k1 = 1.5, b = 0.75) over the turn texts, English
  stopwords removed and Snowball-stemmed (PyStemmer).
* ``rrf``: reciprocal-rank fusion of the two, ``Σ 1 / (60 + rank)``.

Each returns every turn index, best first (ties broken by turn order).
"""

from __future__ import annotations

from collections.abc import Sequence

import bm25s
import numpy as np
import numpy.typing as npt
import Stemmer
from longmemeval import Question
from vectors import VectorCache

RRF_K = 60
NAMES = ("dense", "bm25", "rrf")

_STEMMER = Stemmer.Stemmer("english")


def _order(scores: npt.NDArray[np.floating]) -> list[int]:
    ranked: list[int] = np.argsort(-scores, kind="stable").tolist()
    return ranked


def dense(
    turn_vectors: npt.NDArray[np.float32], query_vector: npt.NDArray[np.float32]
) -> list[int]:
    """Turns by cosine to the question (the vectors are unit length)."""
    return _order(turn_vectors @ query_vector)


def bm25(texts: Sequence[str], query: str) -> list[int]:
    """Turns by BM25 score for the question."""
    corpus = bm25s.tokenize(list(texts), stopwords="en", stemmer=_STEMMER, show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    tokens = bm25s.tokenize(
        [query], stopwords="en", stemmer=_STEMMER, return_ids=False, show_progress=False
    )
    return _order(np.asarray(retriever.get_scores(tokens[0]), dtype=np.float64))


def rrf(*rankings: Sequence[int]) -> list[int]:
    """Reciprocal-rank fusion of full rankings of the same items."""
    size = len(rankings[0])
    fused = np.zeros(size, dtype=np.float64)
    for ranking in rankings:
        fused[np.asarray(ranking)] += 1.0 / (RRF_K + np.arange(1, size + 1))
    return _order(fused)


def rank_all(
    texts: Sequence[str],
    query: str,
    turn_vectors: npt.NDArray[np.float32],
    query_vector: npt.NDArray[np.float32],
) -> dict[str, list[int]]:
    """The three baseline rankings for one question."""
    by_meaning = dense(turn_vectors, query_vector)
    by_words = bm25(texts, query)
    return {"dense": by_meaning, "bm25": by_words, "rrf": rrf(by_meaning, by_words)}


def rank_questions(
    questions: Sequence[Question], cache: VectorCache, depth: int | None = None
) -> dict[str, list[list[int]]]:
    """Each baseline's ranking of every question's turns, cut to ``depth`` if given."""
    systems: dict[str, list[list[int]]] = {name: [] for name in NAMES}
    for question in questions:
        turn_vectors, query_vector = cache.get(question)
        texts = [turn.text for turn in question.turns]
        for name, ranking in rank_all(texts, question.text, turn_vectors, query_vector).items():
            systems[name].append(ranking[:depth])
    return systems
