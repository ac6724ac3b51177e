"""Text analysis without a model: the rule-based memory-type classifier."""

from __future__ import annotations

import re

__all__ = ["classify_type"]

_PREFERENCE = re.compile(
    r"\b(prefers?|preferred|likes?|loves?|hates?|dislikes?|enjoys?|favou?rite|rather|"
    r"wants?|would like|can't stand|cannot stand|fond of|into)\b",
    re.IGNORECASE,
)
_PROCEDURAL = re.compile(
    r"(\bhow to\b|\bsteps?\b|\bfirst\b.*\bthen\b|\bto (deploy|install|build|run|set up|"
    r"configure|release)\b|^(run|use|call|open|click|install|deploy|build|restart)\b|"
    r"\bworkflow\b|\bprocess:|\brecipe\b|->|→)",
    re.IGNORECASE,
)
_EPISODIC = re.compile(
    r"\b(yesterday|today|tonight|this morning|last (night|week|month|year|monday|tuesday|"
    r"wednesday|thursday|friday|saturday|sunday)|ago|just now|earlier|met|went|visited|"
    r"happened|attended|called|had (a|an|the)|we (did|had|talked|discussed|decided)|"
    r"on (monday|tuesday|wednesday|thursday|friday|saturday|sunday))\b",
    re.IGNORECASE,
)
_FACT = re.compile(
    r"\b(is|are|has|have|born|lives? in|works? (at|for)|allergic|located|"
    r"consists of|equals|contains)\b",
    re.IGNORECASE,
)


def classify_type(text: str) -> str:
    """The memory type the text most likely is, by rules tried in a fixed order.

    Preference, then procedural, then fact, then episodic, else semantic (DESIGN §4);
    a sentence with a time cue is an event, not a standing fact.
    """
    if _PREFERENCE.search(text):
        return "preference"
    if _PROCEDURAL.search(text):
        return "procedural"
    if _FACT.search(text) and not _EPISODIC.search(text) and len(text) <= 200:
        return "fact"
    if _EPISODIC.search(text):
        return "episodic"
    return "semantic"
