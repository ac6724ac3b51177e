"""An incrementally updated in-memory BM25 index over one channel's memories, searched
with numpy over packed postings."""

from __future__ import annotations

import math
import re
from array import array
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from calor.server.errors import InvalidArgumentError

__all__ = [
    "Corpus",
    "FUNCTION_WORDS",
    "LexicalIndex",
    "Match",
    "idf",
    "keyword_overlap",
    "tokenize",
]

_K1 = 1.2
_INT = "i"  # postings, counts and term ids are packed as 32-bit ints
# Full length normalisation (b = 1): a term's count in a memory is weighed against the
# memory's length wholly, so a long reply that names a subject among many others does
# not outscore a short memory about it.
_B = 1.0

# Function words that say nothing about what a memory is about: Lucene's English list
# without its negations ("no", "not": a memory that says the opposite must still be
# found). Pronouns and question words stay searchable: in a conversation "i", "my" and
# "you" say who did what.
_STOPWORDS: frozenset[str] = frozenset(
    """
    a an and are as at be but by for if in into is it of on or such that the their
    then there these they this to was will with
    """.split()
)

# Letters and digits in any script; "_" is a word character to re but a separator here.
_WORD = re.compile(r"[^\W_]+")
_APOSTROPHES = str.maketrans("", "", "'\u2019")
_VOWELS = frozenset("aeiouy")
_UNDOUBLE_KEEP = frozenset("lsz")  # "calling" -> "call", "passing" -> "pass", "buzzing" -> "buzz"


def tokenize(text: str) -> list[str]:
    """Split text into the terms the index matches on.

    Text is casefolded, apostrophes are dropped ("don't" -> "dont", "team's" -> "teams"),
    it is cut into runs of letters and digits, stopwords are removed and each word is
    lightly stemmed (see ``_stem``) so that "deploys", "deployed" and "deploying" all
    match "deploy".

    Args:
        text: Any text: a memory's content or a query.

    Returns:
        The terms in text order, with repeats.
    """
    words = _WORD.findall(text.casefold().translate(_APOSTROPHES))
    return [_stem(word) for word in words if word not in _STOPWORDS]


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    """Strip one plural and one -ing/-ed ending, conservatively.

    A tiny deterministic stemmer, not Porter: it only has to make a query and a memory
    that use different inflections of a word meet. Words of three characters or less
    and words without letters are left alone. Plurals: "-ies" -> "-y", "-sses" ->
    "-ss", a final "s" is dropped unless the word ends in "ss", "us" or "is" ("class",
    "status", "analysis"). Then "-ing" / "-ed" are dropped when at least three
    characters holding a vowel remain ("deploying" -> "deploy", but "string" and
    "need" stay), and a doubled final consonant left behind is undoubled ("stopped" ->
    "stop"). Stems need not be English words; both sides of a match get the same one.
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    word = _strip_plural(word)
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and not word.endswith("eed"):
            stem = word[: -len(suffix)]
            if len(stem) >= 3 and not _VOWELS.isdisjoint(stem):
                return _undouble(stem)
    return word


def _strip_plural(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _undouble(stem: str) -> str:
    last = stem[-1]
    if stem[-2] == last and last not in _VOWELS and last not in _UNDOUBLE_KEEP:
        return stem[:-1]
    return stem


FUNCTION_WORDS: frozenset[str] = frozenset(
    tokenize(
        "a about am an and any are as at be been being but by can could did do does doing "
        "for from had has have having here how if in into is it its itself just of on or "
        "so some such than that the then there these this those to too was were what "
        "when where which while who whom why will with would"
    )
)
"""Terms that frame a sentence rather than say what or who it is about (auxiliaries,
question words, connectives). BM25 weighs them like any term (a rare one counts); the
keyword overlap counts only the others, so a memory that echoes a question's wording
is not more about it. Pronouns are not among them: "my" or "you" says whose it is."""


def keyword_overlap(query_terms: Sequence[str], text: str) -> float:
    """Measure how many of the query's terms a text contains.

    Args:
        query_terms: Terms as ``tokenize`` returns them for the query.
        text: The memory's text; it is tokenized here.

    Returns:
        The fraction of distinct query terms found in the text, from 0 to 1; 0 when
        there are no query terms.
    """
    wanted = set(query_terms) - FUNCTION_WORDS
    if not wanted:
        return 0.0
    found = wanted.intersection(tokenize(text))
    return len(found) / len(wanted)


@dataclass(frozen=True)
class Corpus:
    """What BM25 weighs a query's terms by: how many documents there are, their total
    length, and how many hold each term. One index's own, or the sum over several
    searched together (a channel's live memories and its attic), so that their scores
    mean the same."""

    docs: int
    total_len: int
    df: Mapping[str, int]

    def ceiling(self) -> float:
        """The BM25 score no document can reach here: every query term some document
        holds, at unbounded frequency (summed most common first, then by term)."""
        held = sorted((-n, term) for term, n in self.df.items() if n > 0)
        return sum(idf(self.docs, -negative) * (_K1 + 1.0) for negative, _ in held)

    def __add__(self, other: Corpus) -> Corpus:
        terms = self.df.keys() | other.df.keys()
        return Corpus(
            self.docs + other.docs,
            self.total_len + other.total_len,
            {term: self.df.get(term, 0) + other.df.get(term, 0) for term in terms},
        )


class LexicalIndex:
    """BM25 (k1=1.2, b=0.75) over one channel's memories, updated one memory at a time.

    Postings are packed arrays (each term's documents and term counts), so a search is a
    few vectorised passes over the postings of the query's terms, and a memory costs a
    few bytes per distinct term. A removed document's postings stay until the dead ones
    make up half of all postings; searches skip them meanwhile. Document ids are
    non-negative 32-bit integers (a channel's labels, handed out from 0). Not
    thread-safe: the owner serializes writes against searches.
    """

    __slots__ = (
        "_alive",
        "_dead_postings",
        "_df",
        "_doc_len",
        "_doc_terms",
        "_docs",
        "_post_docs",
        "_post_tf",
        "_postings",
        "_term_ids",
        "_terms_at",
        "_total_len",
    )

    def __init__(self) -> None:
        """Create an empty index."""
        self._term_ids: dict[str, int] = {}
        self._post_docs: list[array[int]] = []  # per term id: document ids, ascending adds
        self._post_tf: list[array[int]] = []  # per term id: the term's count in each
        self._df: array[int] = array(_INT)  # per term id: live documents holding it
        self._doc_len: array[int] = array(_INT)  # per document id: terms, 0 if absent
        self._alive = bytearray()  # per document id: 1 while indexed
        self._terms_at: array[int] = array(_INT)  # per document id: where its terms start
        self._doc_terms: array[int] = array(_INT)  # distinct term ids, document after document
        self._docs = 0
        self._total_len = 0
        self._postings = 0  # postings held, dead ones included
        self._dead_postings = 0

    def __len__(self) -> int:
        """Return the number of documents in the index."""
        return self._docs

    def __contains__(self, doc_id: object) -> bool:
        """Return whether ``doc_id`` is in the index."""
        return (
            isinstance(doc_id, int) and 0 <= doc_id < len(self._alive) and bool(self._alive[doc_id])
        )

    def add(self, doc_id: int, text: str) -> None:
        """Index a document, replacing any earlier text under the same id.

        Args:
            doc_id: The memory's id within the channel (a non-negative integer).
            text: The text to make searchable.
        """
        if doc_id < 0:
            raise InvalidArgumentError(f"document ids are not negative, got {doc_id}")
        if doc_id < len(self._alive):
            self.remove(doc_id)
            self._purge(doc_id)  # its old postings must not count for the new text
        else:
            grow = doc_id + 1 - len(self._alive)
            self._alive.extend(bytes(grow))
            self._doc_len.extend([0] * grow)
            self._terms_at.extend([-1] * grow)
        terms = tokenize(text)
        counts = Counter(terms)
        post_docs, post_tf, df, term_ids = self._post_docs, self._post_tf, self._df, self._term_ids
        held = []
        for term, tf in counts.items():
            term_id = term_ids.get(term)
            if term_id is None:
                term_id = term_ids[term] = len(post_docs)
                post_docs.append(array(_INT))
                post_tf.append(array(_INT))
                df.append(0)
            post_docs[term_id].append(doc_id)
            post_tf[term_id].append(tf)
            df[term_id] += 1
            held.append(term_id)
        self._terms_at[doc_id] = len(self._doc_terms)
        self._doc_terms.append(len(held))
        self._doc_terms.extend(held)
        self._postings += len(counts)
        self._alive[doc_id] = 1
        self._doc_len[doc_id] = len(terms)
        self._docs += 1
        self._total_len += len(terms)

    def remove(self, doc_id: int) -> None:
        """Drop a document from the index; an id that is not there is ignored.

        Args:
            doc_id: The memory's id within the channel.
        """
        if doc_id not in self:
            return
        self._alive[doc_id] = 0
        self._docs -= 1
        self._total_len -= self._doc_len[doc_id]
        self._doc_len[doc_id] = 0
        held = self._held_terms(doc_id)
        for term_id in held:
            self._df[term_id] -= 1
        self._dead_postings += len(held)
        if self._dead_postings * 2 > self._postings:
            self._compact()

    def corpus(self, query: str) -> Corpus:
        """This index's :class:`Corpus` for the terms of ``query``."""
        df = {}
        for term in dict.fromkeys(tokenize(query)):
            term_id = self._term_ids.get(term)
            if term_id is not None and self._df[term_id] > 0:
                df[term] = self._df[term_id]
        return Corpus(self._docs, self._total_len, df)

    def match(self, query: str, corpus: Corpus | None = None) -> Match:
        """Score every document against a query in one pass (see :class:`Match`).

        Each distinct query term counts once, however often the query repeats it.

        Args:
            query: Free text; tokenized like the documents.
            corpus: The statistics to weigh terms by, when this index is searched
                together with others (see :class:`Corpus`); this index's own if None.
        """
        wanted = dict.fromkeys(tokenize(query))
        counted = wanted.keys() - FUNCTION_WORDS  # the terms the keyword overlap counts
        scores = np.zeros(len(self._alive), dtype=np.float64)
        holds = np.zeros(len(self._alive), dtype=np.int32)
        if corpus is None:
            corpus = self.corpus(query)
        base, per_len = _length_norm(corpus)
        lengths = np.frombuffer(self._doc_len, dtype=np.int32)
        for term, term_id, weight in self._query_terms(wanted, corpus):
            docs = self._postings_of(term_id)
            tf = np.frombuffer(self._post_tf[term_id], dtype=np.int32).astype(np.float64)
            # tf·(k1+1) / (tf + k1·(1 − b + b·len/avglen)), with k1+1 folded into weight.
            scores[docs] += weight * tf / (tf + base + per_len * lengths[docs])
            if term in counted:
                holds[docs] += 1
        if self._dead_postings:
            dead = np.frombuffer(self._alive, dtype=np.uint8) == 0
            scores[dead] = 0.0
            holds[dead] = 0
        return Match(scores, holds, corpus.ceiling(), len(counted))

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Find the documents that best match a query.

        Args:
            query: Free text; tokenized like the documents.
            k: How many results at most.

        Returns:
            Up to ``k`` ``(doc_id, score)`` pairs with a positive score, best first,
            equal scores by ascending id.

        Raises:
            InvalidArgumentError: If ``k`` is negative.
        """
        if k < 0:
            raise InvalidArgumentError(f"k must not be negative, got {k}")
        ids, scores = self.match(query).top(k)
        return list(zip(ids.tolist(), scores.tolist(), strict=True))

    def score_docs(self, query: str, doc_ids: Sequence[int]) -> dict[int, float]:
        """Score chosen documents against a query, e.g. candidates found by vector search.

        Returns:
            The BM25 score of each requested id, on the same scale as ``search``;
            0.0 for ids that match no query term or are not in the index.
        """
        ids = np.fromiter(doc_ids, dtype=np.int64, count=len(doc_ids))
        return dict(zip(ids.tolist(), self.match(query).scores(ids).tolist(), strict=True))

    def _held_terms(self, doc_id: int) -> array[int]:
        """The distinct term ids of a document, live or removed (not yet purged)."""
        at = self._terms_at[doc_id]
        if at < 0:
            return array(_INT)
        return self._doc_terms[at + 1 : at + 1 + self._doc_terms[at]]

    def _purge(self, doc_id: int) -> None:
        """Take a removed document's postings out of its terms' lists (before its id is
        indexed again)."""
        held = self._held_terms(doc_id)
        for term_id in held:
            self._keep_postings(term_id, self._postings_of(term_id) != doc_id)
        self._postings -= len(held)
        self._dead_postings -= len(held)
        self._terms_at[doc_id] = -1

    def _postings_of(self, term_id: int) -> npt.NDArray[np.int32]:
        """The documents a term's postings name (a view: drop it before the next write)."""
        return np.frombuffer(self._post_docs[term_id], dtype=np.int32)

    def _keep_postings(self, term_id: int, keep: npt.NDArray[np.bool_]) -> None:
        """Keep only the postings of a term that ``keep`` marks."""
        tf = np.frombuffer(self._post_tf[term_id], dtype=np.int32)[keep]
        docs = self._postings_of(term_id)[keep]
        self._post_tf[term_id] = array(_INT, tf.tobytes())
        self._post_docs[term_id] = array(_INT, docs.tobytes())

    def _compact(self) -> None:
        """Drop every dead posting, and the term lists of removed documents."""
        alive = np.frombuffer(self._alive, dtype=np.uint8).astype(bool)
        for term_id in range(len(self._post_docs)):
            keep = alive[self._postings_of(term_id)]
            if not keep.all():
                self._keep_postings(term_id, keep)
        terms_at = array(_INT, [-1]) * len(self._alive)
        doc_terms: array[int] = array(_INT)
        for doc_id in np.flatnonzero(alive).tolist():
            terms_at[doc_id] = len(doc_terms)
            at = self._terms_at[doc_id]
            doc_terms.extend(self._doc_terms[at : at + 1 + self._doc_terms[at]])
        self._terms_at, self._doc_terms = terms_at, doc_terms
        self._postings -= self._dead_postings
        self._dead_postings = 0

    def _query_terms(self, terms: Collection[str], corpus: Corpus) -> list[tuple[str, int, float]]:
        """Term, id and weight, idf·(k1+1) in ``corpus``, of each of the (distinct) query
        terms some document here holds. Most common first, then by term, so that a score
        is always summed in the same order and equal documents get bit-for-bit equal
        scores."""
        found = []
        for term in terms:
            term_id = self._term_ids.get(term)
            if term_id is not None and self._df[term_id] > 0:
                found.append((-corpus.df.get(term, 0), term, term_id))
        found.sort()
        return [
            (term, term_id, idf(corpus.docs, -negative_df) * (_K1 + 1.0))
            for negative_df, term, term_id in found
        ]


def _length_norm(corpus: Corpus) -> tuple[float, float]:
    """The BM25 denominator's constant part and its factor on document length.

    k1·(1 − b + b·len/avglen) = k1·(1 − b) + (k1·b·N / total_len)·len.
    """
    if not corpus.total_len:
        return _K1 * (1.0 - _B), 0.0  # no document has a term; nothing will match
    return _K1 * (1.0 - _B), _K1 * _B * corpus.docs / corpus.total_len


def idf(docs: int, doc_freq: int) -> float:
    """The BM25 idf of a term that ``doc_freq`` of ``docs`` documents hold,
    ln(1 + (N − n + 0.5) / (n + 0.5)); always positive."""
    return math.log(1.0 + (docs - doc_freq + 0.5) / (doc_freq + 0.5))


class Match:
    """Every document's BM25 score for one query, and how many of its terms each holds
    (terms that are not :data:`FUNCTION_WORDS`)."""

    __slots__ = ("_holds", "_scores", "_terms", "ceiling")

    def __init__(
        self,
        scores: npt.NDArray[np.float64],
        holds: npt.NDArray[np.int32],
        ceiling: float,
        terms: int,
    ) -> None:
        self._scores, self._holds, self._terms = scores, holds, terms
        self.ceiling = ceiling
        """The score no document can reach: every indexed query term at unbounded
        frequency. A score divided by it says how fully, on 0..1, a document matches the
        query's words, comparable across queries."""

    def top(self, k: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """The ``k`` best documents with a positive score, best first, equal scores by
        ascending id: (ids, scores)."""
        ids = np.flatnonzero(self._scores > 0.0)
        if k <= 0 or ids.size == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
        scores = self._scores[ids]
        if ids.size > k:
            # ">=" the k-th best keeps every tie at the cut, so ids decide which make it.
            cut = np.partition(scores, ids.size - k)[ids.size - k]
            keep = scores >= cut
            ids, scores = ids[keep], scores[keep]
        order = np.lexsort((ids, -scores))[:k]
        return ids[order].astype(np.int64), scores[order]

    def scores(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The score of each id (0.0 for one not indexed or matching no term)."""
        return _gather(self._scores, ids).astype(np.float64)

    def overlap(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The fraction of the query's distinct terms each id holds (see
        :func:`keyword_overlap`)."""
        if not self._terms:
            return np.zeros(ids.shape[0], dtype=np.float64)
        return _gather(self._holds, ids) / self._terms


def _gather(values: npt.NDArray[Any], ids: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
    """``values[ids]``, with 0 for an id outside ``values``."""
    out = np.zeros(ids.shape[0], dtype=values.dtype)
    inside = (ids >= 0) & (ids < values.size)
    out[inside] = values[ids[inside]]
    return out
