"""Tests for the tokenizer, the BM25 lexical index and keyword overlap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calor.server.errors import InvalidArgumentError
from calor.server.recall import lexical
from calor.server.recall.lexical import LexicalIndex, keyword_overlap, tokenize


def _index(*texts: str) -> LexicalIndex:
    index = LexicalIndex()
    for doc_id, text in enumerate(texts, start=1):
        index.add(doc_id, text)
    return index


def test_public_surface() -> None:
    assert lexical.__all__ == sorted(lexical.__all__)
    assert lexical.__all__ == [
        "Corpus",
        "FUNCTION_WORDS",
        "LexicalIndex",
        "Match",
        "idf",
        "keyword_overlap",
        "tokenize",
    ]


def test_tokenize_lowercases_drops_stopwords_and_apostrophes() -> None:
    assert tokenize("The Server's config is in /etc/calor.toml") == [
        "server",
        "config",
        "etc",
        "calor",
        "toml",
    ]
    # "on" is a stopword; "_" separates like punctuation.
    assert tokenize("Don't deploy v1.5 on_friday") == ["dont", "deploy", "v1", "5", "friday"]
    assert tokenize("") == []
    assert tokenize("the and of it") == []


def test_who_said_it_and_negations_stay_searchable() -> None:
    """In a conversation the pronouns say whose words a text holds, and a negation
    says the opposite: neither is dropped as a stopword."""
    assert tokenize("I did not say you were late") == [
        "i",
        "did",
        "not",
        "say",
        "you",
        "were",
        "late",
    ]
    index = _index(
        "Your sister moved to Lisbon in spring.",
        "My sister moved to Lisbon last spring.",
        "The ferry to Lisbon was late.",
    )
    assert [label for label, _ in index.search("where did my sister move", k=3)][:1] == [2]


def test_tokenize_keeps_letters_of_any_script() -> None:
    assert tokenize("Café Zürich мост") == ["café", "zürich", "мост"]


@pytest.mark.parametrize(
    ("word", "stem"),
    [
        ("deploys", "deploy"),
        ("deployed", "deploy"),
        ("deploying", "deploy"),
        ("meetings", "meet"),
        ("policies", "policy"),
        ("classes", "class"),
        ("stopped", "stop"),
        ("calling", "call"),
        ("status", "status"),
        ("analysis", "analysis"),
        ("class", "class"),
        ("string", "string"),
        ("thing", "thing"),
        ("speed", "speed"),
        ("used", "used"),
        ("bus", "bus"),
        ("v2", "v2"),
    ],
)
def test_stemming_is_light(word: str, stem: str) -> None:
    assert tokenize(word) == [stem]


def test_rare_terms_rank_first() -> None:
    index = _index(
        "the server restarted after the deploy",
        "the server was slow during the deploy",
        "kubernetes ingress certificate expired on the server",
        "lunch with the team",
    )
    results = index.search("server certificate expired", k=10)
    assert results[0][0] == 3
    assert {doc_id for doc_id, _ in results} == {1, 2, 3}
    assert all(score > 0 for _, score in results)
    scores = [score for _, score in results]
    assert scores == sorted(scores, reverse=True)


def test_scores_match_the_bm25_formula() -> None:
    index = _index("alpha beta", "beta gamma gamma", "delta")
    n_docs, avg_len = 3, 6 / 3

    def part(tf: int, doc_len: int, doc_freq: int) -> float:
        idf = math.log(1 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5))
        b = 1.0  # full length normalisation
        return idf * tf * 2.2 / (tf + 1.2 * (1 - b + b * doc_len / avg_len))

    results = dict(index.search("gamma beta", k=10))
    assert results[2] == pytest.approx(part(2, 3, 1) + part(1, 3, 2))
    assert results[1] == pytest.approx(part(1, 2, 2))
    assert 3 not in results


def test_k_limits_and_validates() -> None:
    index = _index("deploy one", "deploy two", "deploy three")
    assert len(index.search("deploy", k=2)) == 2
    assert index.search("deploy", k=0) == []
    with pytest.raises(InvalidArgumentError):
        index.search("deploy", k=-1)


def test_no_match_and_empty_index() -> None:
    assert LexicalIndex().search("anything", k=5) == []
    index = _index("deploy the server")
    assert index.search("lunch", k=5) == []
    assert index.search("the of and", k=5) == []


def test_ties_break_by_ascending_id() -> None:
    index = LexicalIndex()
    for doc_id in (30, 10, 20):
        index.add(doc_id, "release notes")
    results = index.search("release", k=3)
    assert [doc_id for doc_id, _ in results] == [10, 20, 30]
    assert results[0][1] == results[1][1] == results[2][1]
    assert [doc_id for doc_id, _ in index.search("release", k=2)] == [10, 20]


def test_remove() -> None:
    index = _index("deploy the server", "restart the server")
    index.remove(1)
    assert 1 not in index
    assert len(index) == 1
    assert index.search("deploy", k=5) == []
    assert [doc_id for doc_id, _ in index.search("server", k=5)] == [2]
    index.remove(1)  # already gone: ignored
    index.remove(99)
    index.remove(2)
    assert len(index) == 0
    assert index.search("server", k=5) == []


def test_remove_restores_scores() -> None:
    index = _index("alpha beta", "beta gamma")
    before = index.search("beta", k=5)
    index.add(3, "beta beta beta delta epsilon")
    index.remove(3)
    assert index.search("beta", k=5) == before


def test_add_replaces_existing_text() -> None:
    index = _index("deploy the server", "restart the server")
    index.add(1, "lunch with the team")
    assert len(index) == 2
    assert 1 in index
    assert index.search("deploy", k=5) == []
    assert [doc_id for doc_id, _ in index.search("lunch", k=5)] == [1]
    fresh = _index("lunch with the team", "restart the server")
    assert index.search("team server", k=5) == fresh.search("team server", k=5)


def test_stopwords_are_ignored() -> None:
    index = _index("the and of it", "deploy server")
    assert index.search("the deploy", k=5) == index.search("deploy", k=5)
    assert 1 in index


def test_stemming_matches_inflections() -> None:
    index = _index("Deploys go out on Friday", "we are deploying the server", "lunch")
    found = {doc_id for doc_id, _ in index.search("deploy", k=5)}
    assert found == {1, 2}
    # Same term frequency, so the shorter memory (two terms against four) ranks first.
    assert [doc_id for doc_id, _ in index.search("deployed", k=5)] == [2, 1]


def test_repeated_query_terms_count_once() -> None:
    index = _index("deploy server", "server logs")
    assert index.search("deploy deploy deploy", k=5) == index.search("deploy", k=5)


def test_score_docs_agrees_with_search() -> None:
    index = _index("deploy the server", "restart the server", "lunch", "server server deploy")
    searched = dict(index.search("deploy server", k=10))
    scored = index.score_docs("deploy server", [4, 1, 3, 99])
    assert list(scored) == [4, 1, 3, 99]
    assert scored[4] == pytest.approx(searched[4])
    assert scored[1] == pytest.approx(searched[1])
    assert scored[3] == 0.0
    assert scored[99] == 0.0
    assert LexicalIndex().score_docs("deploy", [1]) == {1: 0.0}


@pytest.mark.parametrize(
    ("query", "text", "expected"),
    [
        ("deploy server", "We deployed the server on Friday", 1.0),
        ("deploy server friday lunch", "We deployed the server on Friday", 0.75),
        ("deploy server", "lunch with the team", 0.0),
        ("deploy deploy server", "deploys", 0.5),
        ("the of", "the of", 0.0),
        ("deploy", "", 0.0),
        # a question's wording echoed is not overlap; who it is about is
        ("which platform does train 12 leave from", "Which platform does train 21 leave?", 0.75),
        ("which platform does train 12 leave from", "Train 12 will leave from platform 4", 1.0),
        ("what did I do", "What did you do?", 0.0),
    ],
)
def test_keyword_overlap(query: str, text: str, expected: float) -> None:
    assert keyword_overlap(tokenize(query), text) == pytest.approx(expected)


def test_keyword_overlap_without_terms() -> None:
    assert keyword_overlap([], "anything at all") == 0.0


def test_overlap_reads_the_index_like_keyword_overlap() -> None:
    index = LexicalIndex()
    index.add(1, "The nightly build failed with error code E4021.")
    query = "error E4021 in the build pipeline"
    overlap = index.match(query).overlap(np.array([1, 2, 99]))
    assert overlap[0] == keyword_overlap(
        tokenize(query), "The nightly build failed with error code E4021."
    )
    assert overlap.tolist() == [0.75, 0.0, 0.0]
    assert index.match("the of and").overlap(np.array([1])).tolist() == [0.0]
    index.add(2, "Which platform does train 21 leave from?")
    query = "which platform does train 12 leave from"
    assert index.match(query).overlap(np.array([2]))[0] == keyword_overlap(
        tokenize(query), "Which platform does train 21 leave from?"
    )


def test_the_ceiling_is_every_indexed_query_term_at_full_weight() -> None:
    index = _index("deploy the server", "deploy again", "lunch")
    match = index.match("deploy server nowhere")
    ceiling = sum(
        math.log(1 + (3 - n + 0.5) / (n + 0.5)) * 2.2 for n in (2, 1)
    )  # deploy in 2 of 3, server in 1; "nowhere" is in none
    assert match.ceiling == pytest.approx(ceiling)
    assert match.scores(np.array([1, 2, 3])).max() < match.ceiling


_WORDS = ["deploy", "server", "coffee", "berlin", "train", "keys", "blue", "the", "ran", "zz9"]


def _reference(texts: dict[int, str], query: str) -> dict[int, float]:
    """BM25 straight from its formula, over every document at once."""
    k1, b = 1.2, 1.0
    terms = {doc_id: tokenize(text) for doc_id, text in texts.items()}
    total = sum(len(words) for words in terms.values())
    if not total:
        return {}
    average = total / len(terms)
    scores: dict[int, float] = {}
    for term in dict.fromkeys(tokenize(query)):
        holding = [doc_id for doc_id, words in terms.items() if term in words]
        if not holding:
            continue
        n = len(holding)
        idf = math.log(1 + (len(terms) - n + 0.5) / (n + 0.5))
        for doc_id in holding:
            tf = terms[doc_id].count(term)
            norm = k1 * (1 - b + b * len(terms[doc_id]) / average)
            scores[doc_id] = scores.get(doc_id, 0.0) + idf * tf * (k1 + 1) / (tf + norm)
    return scores


_texts = st.lists(st.sampled_from(_WORDS), min_size=0, max_size=8).map(" ".join)
_steps = st.lists(
    st.tuples(st.booleans(), st.integers(min_value=0, max_value=12), _texts), max_size=40
)


@settings(max_examples=150, deadline=None)
@given(steps=_steps, query=_texts)
def test_the_index_agrees_with_the_formula_through_adds_and_removes(
    steps: list[tuple[bool, int, str]], query: str
) -> None:
    """Any mix of adds, re-adds and removes (which leave dead postings, purge and
    compact them): the scores, the ranking and the overlap are the formula's."""
    index, texts = LexicalIndex(), {}
    for adding, doc_id, text in steps:
        if adding:
            index.add(doc_id, text)
            texts[doc_id] = text
        else:
            index.remove(doc_id)
            texts.pop(doc_id, None)
    assert len(index) == len(texts)
    expected = _reference(texts, query)
    got = index.score_docs(query, list(range(14)))
    for doc_id in range(14):
        assert got[doc_id] == pytest.approx(expected.get(doc_id, 0.0), rel=1e-9, abs=1e-12)
    ranked = sorted(expected.items(), key=lambda item: (-round(item[1], 9), item[0]))[:5]
    found = index.search(query, 5)
    assert [doc_id for doc_id, _ in found] == [doc_id for doc_id, _ in ranked]
    terms = tokenize(query)
    match = index.match(query)
    overlaps = match.overlap(np.arange(14))
    for doc_id in range(14):
        wanted = keyword_overlap(terms, texts[doc_id]) if doc_id in texts else 0.0
        assert overlaps[doc_id] == pytest.approx(wanted)


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.tuples(st.booleans(), _texts), min_size=1, max_size=16), query=_texts)
def test_indexes_searched_together_score_as_one(texts: list[tuple[bool, str]], query: str) -> None:
    """A channel's live memories and its attic are two indexes: weighed by the sum of
    their statistics, each memory scores as it would in one index holding them all."""
    live, attic, every = LexicalIndex(), LexicalIndex(), {}
    for doc_id, (archived, text) in enumerate(texts):
        (attic if archived else live).add(doc_id, text)
        every[doc_id] = text
    corpus = live.corpus(query) + attic.corpus(query)
    expected = _reference(every, query)
    ids = np.arange(len(texts))
    scores = live.match(query, corpus).scores(ids) + attic.match(query, corpus).scores(ids)
    for doc_id in range(len(texts)):
        assert scores[doc_id] == pytest.approx(expected.get(doc_id, 0.0), rel=1e-9, abs=1e-12)
    whole = _index_at(every).match(query)
    for half in (live, attic):
        assert half.match(query, corpus).ceiling == pytest.approx(whole.ceiling)


def _index_at(texts: dict[int, str]) -> LexicalIndex:
    index = LexicalIndex()
    for doc_id, text in texts.items():
        index.add(doc_id, text)
    return index


def test_compaction_keeps_every_live_score() -> None:
    """Removing most documents compacts the postings; what is left scores as before."""
    index, texts = LexicalIndex(), {}
    for doc_id in range(12):
        texts[doc_id] = " ".join(["deploy"] * (doc_id % 5 + 1) + ["server"] * (doc_id % 3))
        index.add(doc_id, texts[doc_id])
    for doc_id in range(0, 12, 2):
        index.remove(doc_id)
        del texts[doc_id]
    index.remove(1)
    del texts[1]
    expected = _reference(texts, "deploy server")
    got = index.score_docs("deploy server", list(range(12)))
    assert got == pytest.approx({doc_id: expected.get(doc_id, 0.0) for doc_id in range(12)})
    index.add(4, "server server server")  # an id used before, indexed again after compaction
    texts[4] = "server server server"
    expected = _reference(texts, "server")
    assert index.score_docs("server", list(range(12))) == pytest.approx(
        {doc_id: expected.get(doc_id, 0.0) for doc_id in range(12)}
    )
