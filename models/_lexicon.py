"""Limits, word sets and patterns shared by the entity, type and valence analysers."""

from __future__ import annotations

import re

__all__ = ["DATE", "MAX_SCAN_CHARS", "MONTH", "word_set"]

MAX_SCAN_CHARS = 4_000
"""Only this many leading characters are analysed: a store must stay within milliseconds."""


def word_set(*groups: str) -> frozenset[str]:
    """The distinct words of whitespace-separated groups, as a lexicon to test membership in."""
    return frozenset(word for group in groups for word in group.split())


# Both patterns below are linear: quantifiers are possessive or bounded, and a repeated group
# always starts with a character its neighbour cannot match, so nothing backtracks far.
MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
DATE = re.compile(
    rf"\b(?:{MONTH}\.?[ ]\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?[ ]\d{{4}}\b)?"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?[ ](?:of[ ])?{MONTH}\b(?:,?[ ]\d{{4}}\b)?"
    rf"|\d{{4}}-\d{{2}}-\d{{2}}\b)"
)
