"""Whether two close statements disagree, by rules: one negates what the other affirms, or
they give different numbers. No model: a dream or an evaluation stays fast."""

from __future__ import annotations

import re

__all__ = ["contradiction"]

_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nobody|nothing|neither|nor|cannot|without)\b|n['\u2019]t\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w.]*\d)")
_SCAN = 4_000


def _numbers(text: str) -> frozenset[str]:
    return frozenset(n.replace(",", "") for n in _NUMBER.findall(text[:_SCAN]))


def contradiction(first: str, second: str) -> str | None:
    """Why two statements about the same thing disagree, or None if nothing shows it.

    Meant for pairs already known to be close in meaning: it only looks for a
    negation present in one and not the other, or different numbers in each.
    """
    negated = bool(_NEGATION.search(first[:_SCAN])), bool(_NEGATION.search(second[:_SCAN]))
    if negated[0] != negated[1]:
        return "one negates the other"
    ours, theirs = _numbers(first), _numbers(second)
    if ours and theirs and ours != theirs:
        return f"different numbers: {', '.join(sorted(ours))} vs {', '.join(sorted(theirs))}"
    return None
