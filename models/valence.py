"""Emotional valence without a model: a weighted lexicon with negation and intensifiers."""

from __future__ import annotations

import math
import re

from calor.models._lexicon import MAX_SCAN_CHARS, word_set

__all__ = ["valence"]


def _weighted(*groups: tuple[float, str]) -> dict[str, float]:
    return {word: weight for weight, words in groups for word in words.split()}


_SENTIMENT = _weighted(
    (
        3.0,
        "love loved loves amazing awesome excellent fantastic wonderful perfect thrilled "
        "delighted brilliant outstanding superb ecstatic overjoyed adore adored",
    ),
    (
        2.0,
        "great happy glad pleased excited enjoy enjoyed enjoys grateful thankful proud "
        "relieved beautiful best success successful succeeded win won celebrate celebrated "
        "congratulations yay impressive favourite favorite fun lovely",
    ),
    (
        1.0,
        "good nice like liked likes helpful useful thanks thank better improved works fixed "
        "solved resolved calm easy clean smooth reliable stable fine cool interesting hope "
        "hopeful promoted appreciate appreciated satisfied comfortable safe welcome",
    ),
    (
        -3.0,
        "hate hated hates terrible awful horrible disaster furious devastated miserable "
        "disgusting worst nightmare catastrophic panic heartbroken",
    ),
    (
        -2.0,
        "angry annoyed annoying frustrated frustrating upset sad disappointed disappointing "
        "worried anxious afraid scared stressed broken crash crashed crashes failure failed fail "
        "fails painful hurt sick lost dislike dislikes disliked regret unhappy rude hostile ugly "
        "worse bad",
    ),
    (
        -1.0,
        "bug bugs error errors wrong slow problem problems issue issues blocked stuck "
        "confusing confused difficult hard tired boring distracting stale flaky delayed outage "
        "leak regression timeout sorry unfortunately unfortunate concern concerned worry "
        "expensive missing lonely",
    ),
)
_INTENSIFIERS = _weighted(
    (1.8, "extremely incredibly"),
    (1.6, "absolutely"),
    (1.5, "very super deeply"),
    (1.4, "really totally highly truly"),
    (1.3, "so especially"),
    (1.2, "quite"),
    (0.8, "fairly"),
    (0.7, "kinda"),
    (0.6, "somewhat"),
    (0.5, "slightly mildly"),
)
_NEGATORS = word_set("not no never none nobody nothing neither nor without hardly barely cannot")
_NEGATION_FACTOR = -0.75  # "not good" is milder than "bad"
_NEGATION_WINDOW = 3  # a negator reaches the next sentiment word within this many words
_NORMALISER = 4.0  # s / sqrt(s² + α): one strong word ≈ 0.8, several saturate towards 1
_WORD = re.compile(r"[a-z]++(?:'[a-z]++)?+")


def valence(text: str) -> float:
    """The emotional charge of a text in [-1, 1], from a small lexicon (no model).

    Sentiment words are weighted, intensifiers ("very") scale the next one, and a negator
    ("not", "never", "-n't") flips the next sentiment word within three words, so
    "not bad" reads mildly positive. Utility uses the magnitude: charged memories matter.

    Args:
        text: The memory's text; only the first `MAX_SCAN_CHARS` characters are read.

    Returns:
        A score in [-1, 1]; 0 for neutral text.
    """
    lowered = text[:MAX_SCAN_CHARS].casefold().replace("’", "'")
    words = _WORD.findall(lowered)
    score = 0.0
    negate_until = -1
    scale = 1.0
    for index, word in enumerate(words):
        if word in _NEGATORS or word.endswith("n't"):
            if index + 1 < len(words) and words[index + 1] == "stand" and word != "not":
                score -= 2.0  # "can't stand"
            else:
                negate_until = index + _NEGATION_WINDOW
            continue
        if word in _INTENSIFIERS:
            scale = _INTENSIFIERS[word]
            continue
        weight = _SENTIMENT.get(word)
        if weight is None:
            continue
        if index <= negate_until:
            weight *= _NEGATION_FACTOR
            negate_until = -1
        score += weight * scale
        scale = 1.0
    if score and "!" in lowered:
        score *= 1.0 + 0.1 * min(lowered.count("!"), 3)
    return max(-1.0, min(1.0, score / math.sqrt(score * score + _NORMALISER)))
