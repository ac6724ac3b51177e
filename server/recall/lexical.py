"""An incrementally updated in-memory BM25 index over one channel's memories."""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Collection, Sequence
from functools import lru_cache

from calor.server.errors import InvalidArgumentError

__all__ = ["LexicalIndex", "keyword_overlap", "tokenize"]

_K1 = 1.2
_B = 0.75

# Function words that say nothing about what a memory is about. Kept short on purpose:
# words like "not", "before" or "after" can matter to a memory and stay searchable.
_STOPWORDS: frozenset[str] = frozenset(
    """
    a about am an and any are as at be been being but by can could did do does doing
    for from had has have having he her here hers him his how i if in into is it its
    itself just me my of on or our ours she so some such than that the their theirs
    them then there these they this those to too us was we were what when where which
    while who whom why will with would you your yours
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


def keyword_overlap(query_terms: Sequence[str], text: str) -> float:
    """Measure how many of the query's terms a text contains.

    Args:
        query_terms: Terms as ``tokenize`` returns them for the query.
        text: The memory's text; it is tokenized here.

    Returns:
        The fraction of distinct query terms found in the text, from 0 to 1; 0 when
        there are no query terms.
    """
    wanted = set(query_terms)
    if not wanted:
        return 0.0
    found = wanted.intersection(tokenize(text))
    return len(found) / len(wanted)


class LexicalIndex:
    """BM25 (k1=1.2, b=0.75) over one channel's memories, updated one memory at a time.

    Postings map each term to the documents holding it and their term counts, so a
    search touches only the documents that share a term with the query. Not
    thread-safe: the owner serializes writes against searches.
    """

    __slots__ = ("_doc_len", "_doc_terms", "_postings", "_total_len")

    def __init__(self) -> None:
        """Create an empty index."""
        self._postings: dict[str, dict[int, int]] = {}
        self._doc_terms: dict[int, tuple[str, ...]] = {}
        self._doc_len: dict[int, int] = {}
        self._total_len = 0

    def __len__(self) -> int:
        """Return the number of documents in the index."""
        return len(self._doc_len)

    def __contains__(self, doc_id: object) -> bool:
        """Return whether ``doc_id`` is in the index."""
        return doc_id in self._doc_len

    def add(self, doc_id: int, text: str) -> None:
        """Index a document, replacing any earlier text under the same id.

        Args:
            doc_id: The memory's id within the channel.
            text: The text to make searchable.
        """
        if doc_id in self._doc_len:
            self.remove(doc_id)
        terms = tokenize(text)
        counts = Counter(terms)
        for term, tf in counts.items():
            postings = self._postings.get(term)
            if postings is None:
                self._postings[term] = {doc_id: tf}
            else:
                postings[doc_id] = tf
        self._doc_terms[doc_id] = tuple(counts)
        self._doc_len[doc_id] = len(terms)
        self._total_len += len(terms)

    def remove(self, doc_id: int) -> None:
        """Drop a document from the index; an id that is not there is ignored.

        Args:
            doc_id: The memory's id within the channel.
        """
        length = self._doc_len.pop(doc_id, None)
        if length is None:
            return
        self._total_len -= length
        for term in self._doc_terms.pop(doc_id):
            postings = self._postings[term]
            del postings[doc_id]
            if not postings:
                del self._postings[term]

    def overlap(self, query_terms: Collection[str], doc_id: int) -> float:
        """The fraction of distinct query terms the document holds (0 if it is not indexed).

        The same measure as :func:`keyword_overlap`, read from the index instead of
        re-tokenizing the text.
        """
        wanted = set(query_terms)
        if not wanted:
            return 0.0
        return len(wanted.intersection(self._doc_terms.get(doc_id, ()))) / len(wanted)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Find the documents that best match a query.

        Each distinct query term counts once, however often the query repeats it.

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
        if k == 0 or not self._doc_len:
            return []
        scores: dict[int, float] = {}
        doc_len = self._doc_len
        base, per_len = self._length_norm()
        for postings, weight in self._query_terms(query):
            if not scores:
                # The first (longest) postings list fills the table in one comprehension.
                scores = {
                    doc_id: weight * tf / (tf + base + per_len * doc_len[doc_id])
                    for doc_id, tf in postings.items()
                }
                continue
            get = scores.get
            for doc_id, tf in postings.items():
                # tf·(k1+1) / (tf + k1·(1 − b + b·len/avglen)), with k1+1 folded into weight.
                scores[doc_id] = get(doc_id, 0.0) + weight * tf / (
                    tf + base + per_len * doc_len[doc_id]
                )
        return _top(scores, k)

    def score_docs(self, query: str, doc_ids: Sequence[int]) -> dict[int, float]:
        """Score chosen documents against a query, e.g. candidates found by vector search.

        Args:
            query: Free text; tokenized like the documents.
            doc_ids: The documents to score.

        Returns:
            The BM25 score of each requested id, on the same scale as ``search``;
            0.0 for ids that match no query term or are not in the index.
        """
        result = dict.fromkeys(doc_ids, 0.0)
        base, per_len = self._length_norm()
        for postings, weight in self._query_terms(query):
            for doc_id in result:
                tf = postings.get(doc_id)
                if tf is not None:
                    norm = base + per_len * self._doc_len[doc_id]
                    result[doc_id] += weight * tf / (tf + norm)
        return result

    def best_possible(self, query: str) -> float:
        """The BM25 score no document can reach for this query: every indexed query term
        at unbounded frequency. Dividing a score by it gives how fully, on 0..1, a
        document matches the query's words, comparable across queries."""
        return sum(weight for _, weight in self._query_terms(query))

    def _query_terms(self, query: str) -> list[tuple[dict[int, int], float]]:
        """Postings and weight, idf·(k1+1), of each distinct indexed query term.

        Longest postings first, then by term, so that a score is always summed in the
        same order and equal documents get bit-for-bit equal scores.
        """
        terms = [term for term in dict.fromkeys(tokenize(query)) if term in self._postings]
        terms.sort(key=lambda term: (-len(self._postings[term]), term))
        return [
            (self._postings[term], self._idf(len(self._postings[term])) * (_K1 + 1.0))
            for term in terms
        ]

    def _length_norm(self) -> tuple[float, float]:
        """The BM25 denominator's constant part and its factor on document length.

        k1·(1 − b + b·len/avglen) = k1·(1 − b) + (k1·b·N / total_len)·len.
        """
        if not self._total_len:
            return _K1 * (1.0 - _B), 0.0  # no document has a term; nothing will match
        return _K1 * (1.0 - _B), _K1 * _B * len(self._doc_len) / self._total_len

    def _idf(self, doc_freq: int) -> float:
        """BM25 idf, ln(1 + (N − n + 0.5) / (n + 0.5)); always positive."""
        return math.log(1.0 + (len(self._doc_len) - doc_freq + 0.5) / (doc_freq + 0.5))


def _top(scores: dict[int, float], k: int) -> list[tuple[int, float]]:
    """The k best positive scores, best first, equal scores by ascending id."""
    if len(scores) > k:
        # Find the k-th best score over bare floats (no key function, about three
        # times cheaper than ranking the pairs), then order only the documents at or
        # above it; ">=" keeps every tie at the cut, so ids decide which make it.
        cut = heapq.nlargest(k, scores.values())[-1]
        best = [(doc_id, score) for doc_id, score in scores.items() if score >= cut]
    else:
        best = list(scores.items())
    best.sort(key=lambda item: (-item[1], item[0]))
    return [(doc_id, score) for doc_id, score in best[:k] if score > 0.0]
