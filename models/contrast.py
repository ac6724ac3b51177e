"""Whether two close statements disagree, by rules: one negates what the other affirms, or
they give different numbers for the same thing. No model: a dream or an evaluation stays
fast."""

from __future__ import annotations

import re
from collections import defaultdict

from calor.models.entities import entity_key, extract_entities

__all__ = ["contradiction", "same_numbers"]

_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nobody|nothing|neither|nor|cannot|without)\b|n['\u2019]t\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_TOKEN = re.compile(r"\d+(?:[.,:]\d+)*|[^\W\d_]+|[^\w\s]")
_SCAN = 4_000

# Words around a number that do not name a thing: after one of these (or at the start),
# a number is a value ("is 3", "at 9am", "has 2 cats"), not a name ("ticket 12").
_FUNCTION_WORDS = frozenset(
    """
    a an the this that these those it its is are was were be been being am has have had
    do does did will would can could should may might must shall at to of for by on in
    into onto from with about around approximately roughly nearly almost over under
    above below than then and or but so as per each every only just exactly up down
    costs cost costing weighs weigh takes take took lasts last needs need needed gets
    got makes made equals reach reached reaches till until since after before between
    i you he she we they me him her us them my your his our their
    """.split()
)
# Verbs that take a quantity ("paid 30", "ran 5 km") besides the regular "-ed" ones.
_QUANTITY_VERBS = frozenset(
    """
    paid pay pays spent spend spends ran run runs bought buy buys sold sell sells won win
    lost lose ate eat drank drink drove drive flew fly slept sleep read write wrote saw
    see gave give kept keep left leave met meet sent send scored score owe owes earn earns
    earned grew grow set sets hit hits
    """.split()
)
_NAME_MARKERS = frozenset({"#", "no", "number", "nr", "id"})

_Slot = tuple[str, str]  # the words before and after a number


def _tokens(text: str) -> list[str]:
    return [t.lower() for t in _TOKEN.findall(text[:_SCAN])]


def _is_word(token: str) -> bool:
    return token.isalpha()


def _content(token: str) -> bool:
    """A word that names something (not a function word, not punctuation)."""
    return _is_word(token) and token not in _FUNCTION_WORDS


def _numbers(tokens: list[str]) -> list[tuple[int, str]]:
    return [(i, t.replace(",", "")) for i, t in enumerate(tokens) if _NUMBER.fullmatch(t)]


def _around(tokens: list[str], index: int) -> _Slot:
    before = tokens[index - 1] if index > 0 else ""
    after = tokens[index + 1] if index + 1 < len(tokens) else ""
    return before, after


def _names_a_thing(slot: _Slot) -> bool:
    """Whether a number in this slot is a name ("ticket 12", "order 5000 shipped", "#4"),
    not a quantity ("is 3", "paid 30 euros", "weighed 3 kg"): it follows a word that
    names something rather than a verb or a function word."""
    before = slot[0]
    if before in _NAME_MARKERS:
        return True
    verb = before in _QUANTITY_VERBS or before.endswith("ed")
    return _content(before) and not verb


def same_numbers(first: str, second: str) -> bool:
    """Whether two texts give the same numbers (none at all counts): a paraphrase does;
    "ticket 12" and "ticket 13" are two things, however alike the words."""
    ours = sorted(n for _, n in _numbers(_tokens(first)))
    theirs = sorted(n for _, n in _numbers(_tokens(second)))
    return ours == theirs


def contradiction(first: str, second: str) -> str | None:
    """Why two statements about the same thing disagree, or None if nothing shows it.

    Meant for pairs already known to be close in meaning. It looks for a negation
    present in one and not the other, or for a differing number that says something
    different about the same subject: in the same sentence apart from its numbers,
    a differing quantity ("is at 9am" / "is at 10am"); in different sentences, a
    quantity with the same unit or in the same words ("2 bar" / "3 bar") while the
    texts name the same entities. A differing number that names the thing ("ticket 12"
    / "ticket 13") means two subjects, not a conflict.
    """
    negated = bool(_NEGATION.search(first[:_SCAN])), bool(_NEGATION.search(second[:_SCAN]))
    if negated[0] != negated[1]:
        return "one negates the other"
    ours, theirs = _tokens(first), _tokens(second)
    our_numbers, their_numbers = _numbers(ours), _numbers(theirs)
    if not our_numbers or not their_numbers:
        return None
    if _masked(ours) == _masked(theirs):
        differing = _same_sentence(ours, theirs, our_numbers, their_numbers)
    else:
        differing = _same_quantity(first, second, ours, theirs, our_numbers, their_numbers)
    if not differing:
        return None
    mine = sorted({a for a, _ in differing})
    yours = sorted({b for _, b in differing})
    return f"different numbers: {', '.join(mine)} vs {', '.join(yours)}"


def _masked(tokens: list[str]) -> list[str]:
    return ["#" if _NUMBER.fullmatch(t) else t for t in tokens]


def _same_sentence(
    ours: list[str],
    theirs: list[str],
    our_numbers: list[tuple[int, str]],
    their_numbers: list[tuple[int, str]],
) -> list[tuple[str, str]]:
    """The differing quantities of one sentence written twice, or none when a differing
    number names the subject (then the two are about different things)."""
    differing: list[tuple[str, str]] = []
    for (index, mine), (_, yours) in zip(our_numbers, their_numbers, strict=True):
        if mine == yours:
            continue
        if _names_a_thing(_around(ours, index)):
            return []
        differing.append((mine, yours))
    return differing


def _same_quantity(
    first: str,
    second: str,
    ours: list[str],
    theirs: list[str],
    our_numbers: list[tuple[int, str]],
    their_numbers: list[tuple[int, str]],
) -> list[tuple[str, str]]:
    """Differing quantities in the same role in two different sentences about the same
    entities: the same unit after the number, or the same words around it."""
    our_entities, their_entities = _named(first), _named(second)
    if our_entities and their_entities and not our_entities & their_entities:
        return []
    mine, yours = _roles(ours, our_numbers), _roles(theirs, their_numbers)
    for role in mine.keys() & yours.keys():
        if role[0] == "name" and mine[role] != yours[role]:
            return []  # the same naming word with another number: another subject
    differing: list[tuple[str, str]] = []
    for role in sorted(mine.keys() & yours.keys()):
        if role[0] != "name" and not mine[role] & yours[role]:
            differing.extend((a, b) for a in sorted(mine[role]) for b in sorted(yours[role]))
    return differing


def _named(text: str) -> set[str]:
    """The entities a text names, leaving out the ones holding a number ("7am", "v2"):
    the number is what is compared."""
    return {
        entity_key(e) for e in extract_entities(text[:_SCAN]) if not any(c.isdigit() for c in e)
    }


def _roles(tokens: list[str], numbers: list[tuple[int, str]]) -> dict[tuple[str, ...], set[str]]:
    """Each number by the role it plays: a name (by its naming word), a quantity of a unit
    (by the unit), or a quantity between two words."""
    roles: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for index, value in numbers:
        before, after = slot = _around(tokens, index)
        if _names_a_thing(slot):
            roles[("name", before)].add(value)
        elif _content(after):
            roles[("unit", after)].add(value)
        else:
            roles[("between", before, after)].add(value)
    return roles
