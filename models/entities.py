"""Entity extraction without a model: names, emails, URLs, dates, quantities and code."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from calor.models._lexicon import DATE, MAX_SCAN_CHARS, word_set

__all__ = ["MAX_SCAN_CHARS", "entity_key", "extract_entities", "read_entities"]

_MAX_ENTITY_CHARS = 120
_MAX_NAME_WORDS = 6  # longer capitalised runs are headings or shouting, not names

# Every pattern below is linear: quantifiers are possessive or bounded, and a repeated group
# always starts with a character its neighbour cannot match, so nothing backtracks far.


# ---------------------------------------------------------------- lexicons

_CALENDAR = word_set(
    "monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs "
    "fri sat sun january february march april may june july august september october november "
    "december jan feb mar apr jun jul aug sep sept oct nov dec"
)
# Capitalised only because they open a sentence (or a heading): never a name on their own.
_FUNCTION = _CALENDAR | word_set(
    "a an the this that these those my our your his her its their i we you he she it they me "
    "us them who what when where why how which whose whom there here some any all each every "
    "no none both either neither many much few more most other another such one two three",
    "in on at by for with about against between into through during before after above below "
    "to from up down over under again further once of off out than since until till within "
    "without upon via per across along around behind beyond near toward towards among despite "
    "and but or nor so yet if because although though while whereas unless whether as",
    "is are was were be been being am do does did have has had will would shall should can "
    "could may might must don't doesn't didn't isn't aren't wasn't can't won't i'm i'd i've "
    "i'll we're we've they're it's that's there's let's he's she's you're",
    "also just only even still already now then today yesterday tomorrow tonight soon later "
    "earlier recently always never often sometimes usually maybe perhaps please yes not very "
    "really quite too first next finally last lately meanwhile however therefore thus hence "
    "instead otherwise overall actually basically anyway hi hello hey thanks thank dear ok "
    "okay note morning afternoon evening night week month year day weekend",
    "run use install open click restart set add create clear delete remove check ensure make "
    "generate update call deploy build push pull merge copy move enter press select go log "
    "sign configure enable disable start stop kill export import download upload edit change "
    "rename replace bump commit write read review test try wait reboot connect paste submit "
    "apply verify keep avoid ask tell email send meet remember see let get put take give find",
)
# Everyday words that open generic sentences; a lone sentence-initial one is not a name.
_COMMON = _FUNCTION | word_set(
    "user users people person team teams client clients customer customers developer "
    "developers engineer engineers agent agents assistant model models memory memories data "
    "code tests test file files function functions service services server servers system "
    "systems database databases index indexes query queries request requests response "
    "responses error errors bug bugs issue issues problem problems change changes version "
    "versions release releases project projects task tasks time times thing things way ways",
    "good bad new old big small large long short high low fast slow easy hard simple "
    "important common regular technical general different same early late best better worse "
    "most many true false real full free open clear main key local global static dynamic "
    "every each default custom public private basic",
    "caching logging testing training learning writing reading sharing storing spaced "
    "event events cache logs log note notes idea ideas practice practices rule rules",
    "docs documentation latency throughput performance speed cost price revenue sales budget "
    "deadline meeting standup deploy deployment pipeline config configuration settings "
    "metrics dashboard alert alerts traffic load storage disk network security auth login "
    "password backup migration schema table queue worker job branch design library package "
    "dependency framework frontend backend search result results feedback support growth "
    "usage output input update updates upgrade fix fixes feature features report reports "
    "summary plan plans goal goals step steps process workflow history context source "
    "sources status state value values number numbers list lists type types word words",
    "coffee lunch dinner breakfast food weather travel trip family kids children parents "
    "friends work home office money health sleep music movies books holiday holidays "
    "vacation school class weekend birthday",
    "recent previous current final initial quick great nice happy sad useful helpful "
    "faster smaller larger older newer several various certain similar entire whole major "
    "minor critical urgent optional required available possible likely actual specific "
    "particular latest earliest fine ready done",
)
_CONNECTORS = word_set("of de da di du del der van von la le y &")
_DETERMINERS = word_set("a an the this that these those")
_HONORIFICS = word_set("dr mr mrs ms prof st sr jr mt")
_NOT_NAME_SUFFIX = re.compile(
    r"(?:ing|ed|ly|tion|sion|ment|ness|ity|ies|ous|ive|ful|less|able|ible|ism|ence|ance|ical|"
    r"ics)s?$"
)

# ---------------------------------------------------------------- entity patterns

_BACKTICK = re.compile(r"`([^`\n]{1,200})`")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"'`]++")
_EMAIL = re.compile(r"(?<![\w.%+-])[\w.%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})++")
_UNITS = (
    r"per[ ]cent|percent|pct|km|kms|cm|mm|m|mi|miles?|kilomet(?:er|re)s?|met(?:er|re)s?|ft|feet|"
    r"inch(?:es)?|kg|mg|g|lbs?|pounds?|oz|ml|litres?|liters?|ms|secs?|seconds?|s|mins?|minutes?|"
    r"hrs?|hours?|h|days?|weeks?|months?|years?|bytes?|[kmgtp]i?b|bits?|[kmg]bps|[kmg]?hz|px|"
    r"dpi|degrees?|°[cf]|usd|eur|gbp|dollars?|euros?|cents?|k|tokens?|requests?|rps|qps|cores?|"
    r"threads?|vcpus?|dims?|dimensions?"
)
_QUANTITY = re.compile(
    r"(?<![\w.,$€£¥])(?:"
    r"[$€£¥][ ]?\d++(?:,\d{3})*+(?:\.\d++)?+(?:[ ]?(?:k|m|bn|million|billion|thousand)\b)?+"
    r"|\d{1,2}(?::\d{2})?+[ ]?(?:am|pm|a\.m\.|p\.m\.)(?!\w)"
    rf"|\d++(?:,\d{{3}})*+(?:\.\d++)?+(?:[ ]?%|-?[ ]?(?:{_UNITS})\b))",
    re.IGNORECASE,
)
_TOKEN = re.compile(r"\S++")
_FLAG = re.compile(r"--[A-Za-z0-9][\w-]*+")
_PATH = re.compile(r"(?:~|\.{1,2})?/?[\w.@+-]++(?:/[\w.@+-]++)*+/?")
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,7}$")
_DOTTED = re.compile(r"[A-Za-z_][\w-]*+(?:\.[A-Za-z_][\w-]*+)++")
_SNAKE = re.compile(r"_*+[A-Za-z][A-Za-z0-9]*+(?:_++[A-Za-z0-9]++)++_*+|__[A-Za-z][A-Za-z0-9]*+__")
_CAMEL = re.compile(r"[a-z][a-z0-9]*+(?:[A-Z][a-z0-9]*+)++")
_CAPWORD = re.compile(r"[A-Z][A-Za-z0-9]*+(?:['’&.-][A-Za-z0-9]++)*+")
_TITLE_WORD = re.compile(r"[A-Z][a-z]++")
_BULLET = re.compile(r"[-*•]|\d{1,3}[.)]")
_SPACE_RUN = re.compile(r"\s++")
# What a Share puts before the copied text: where it came from, not what it names.
_SHARED_PREFIX = re.compile(r"\A\s*\[Shared by [^\]\n]*\]")
_DIGIT_UNIT_GAP = re.compile(r"(?<=\d)\s++(?=[^\W\d_])")

_LEADING = "\"'([{<“‘*"
_TRAILING = "\"'.,;:!?()[]{}<>”’*"
_URL_TRAILING = _TRAILING.replace(")", "")  # ")" is trimmed only when unbalanced


def entity_key(entity: str) -> str:
    """The key two mentions of one entity share, for linking memories through it.

    Case-folded with whitespace collapsed, so ``"Acme Corp"`` and ``"acme  corp"`` (and
    ``"5 km"`` and ``"5km"``) link.
    """
    key = _SPACE_RUN.sub(" ", entity.casefold()).strip().strip(_TRAILING)
    return _DIGIT_UNIT_GAP.sub("", key)


def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    """The text with each span blanked, so later passes neither see nor re-split it."""
    pieces: list[str] = []
    cursor = 0
    for start, end in spans:
        pieces.append(text[cursor:start])
        pieces.append(" " * (end - start))
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces)


def _trim_url(url: str) -> str:
    """The URL without sentence punctuation after it; a ")" stays only if it closes a "("."""
    url = url.rstrip(_URL_TRAILING)
    while url.endswith(")") and url.count(")") > url.count("("):
        url = url[:-1].rstrip(_URL_TRAILING)
    return url


def _spans(text: str) -> tuple[list[tuple[int, str]], str]:
    """Entities found by whole-span patterns (code spans, URLs, emails, dates, quantities)."""
    found: list[tuple[int, str]] = []
    for pattern in (_BACKTICK, _URL, _EMAIL, DATE, _QUANTITY):
        spans: list[tuple[int, int]] = []
        for match in pattern.finditer(text):
            start, end = match.span()
            value = match.group()
            if pattern is _BACKTICK:
                value = match.group(1).strip()
            elif pattern is _URL:
                value = _trim_url(value)
                end = start + len(value)
            elif pattern is _EMAIL:
                value = value.casefold()
            if value:
                found.append((start, _SPACE_RUN.sub(" ", value)))
            spans.append((start, end))
        text = _mask(text, spans)
    return found, text


def _code_token(core: str) -> str | None:
    """The token as a code entity (flag, path, dotted name, snake or camel case), if it is one."""
    if _FLAG.fullmatch(core):
        return core
    if "/" in core and _PATH.fullmatch(core):
        if (
            core.startswith(("/", "./", "../", "~/"))
            or core.endswith("/")
            or core.count("/") >= 2
            or _EXTENSION.search(core)
        ):
            return core
        return None
    if "." in core and _DOTTED.fullmatch(core):
        parts = core.split(".")
        if all(len(part) == 1 for part in parts):
            return None  # e.g, i.e, U.S
        if parts[0].islower() and any(_TITLE_WORD.fullmatch(p) for p in parts[1:]):
            return None  # a missing space after a full stop, not a module path
        return core
    if _SNAKE.fullmatch(core) or _CAMEL.fullmatch(core):
        return core
    return None


@dataclass
class _Run:
    """A run of capitalised words being gathered into one name."""

    start: int = 0
    initial: bool = False
    words: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # connectors kept only if a word follows

    def add(self, word: str, position: int, initial: bool) -> None:
        if not self.words:
            self.start, self.initial = position, initial
        self.words.extend(self.pending)
        self.pending.clear()
        self.words.append(word)

    def flush(self, out: list[tuple[int, str, bool]]) -> None:
        named = _name(self.words, self.initial)
        if named is not None:
            out.append((self.start, *named))
        self.words = []
        self.pending.clear()


def _lone_word_is_name(word: str) -> bool:
    """Whether a single capitalised word that opens a sentence is a name, not just a word."""
    lowered = word.casefold()
    if lowered in _COMMON or (lowered.endswith("s") and lowered[:-1] in _COMMON):
        return False
    if word.isupper() or any(ch.isdigit() for ch in word):
        return True  # acronyms and product codes: HNSW, BM25
    if "-" in word and not word.split("-")[-1][:1].isupper():
        return False  # Retrieval-augmented
    return _NOT_NAME_SUFFIX.search(lowered) is None


def _name(words: list[str], initial: bool) -> tuple[str, bool] | None:
    """The display form of a capitalised run and whether it only opens a sentence (a
    lone word that may be capitalised for that alone); None when it is not a name.
    Leading determiners go ("The Crown" is "Crown"), and at a sentence's start every
    leading function word ("After Berlin" is "Berlin")."""
    dropped = 0
    while dropped < len(words) and (
        words[dropped].casefold() in _DETERMINERS
        or (initial and words[dropped].casefold() in _FUNCTION)
    ):
        dropped += 1
    words = words[dropped:]
    if not words or len(words) > _MAX_NAME_WORDS:
        return None
    words[-1] = words[-1].rstrip(".")  # "Plan B." ends a sentence, not a name
    lowered = [word.casefold().rstrip(".") for word in words]
    if all(word in _FUNCTION or word in _CONNECTORS or word in _HONORIFICS for word in lowered):
        return None  # weekday or month alone, a capitalised "Please", a bare "Dr."
    opener = initial and dropped == 0 and len(words) == 1
    if opener and not _lone_word_is_name(words[0]):
        return None
    unambiguous = words[0].isupper() or any(ch.isdigit() for ch in words[0])
    return " ".join(words)[:_MAX_ENTITY_CHARS], opener and not unambiguous


def _split_token(raw: str) -> tuple[str, str, str]:
    """A token as (leading punctuation, core, trailing punctuation), possessive dropped."""
    core = raw.lstrip(_LEADING)
    lead = raw[: len(raw) - len(core)]
    stripped = core.rstrip(_TRAILING)
    tail = core[len(stripped) :]
    if stripped.endswith(("'s", "’s")) and len(stripped) > 2:
        stripped, tail = stripped[:-2], stripped[-2:] + tail
    return lead, stripped, tail


def _token_entities(text: str) -> Iterator[tuple[int, str, bool]]:
    """Code tokens and capitalised names, scanning the (masked) text token by token:
    (position, entity, whether it is a lone word that only opens a sentence)."""
    names: list[tuple[int, str, bool]] = []
    run = _Run()
    at_start = True
    after_abbreviation = False
    previous_end = 0
    for match in _TOKEN.finditer(text):
        position = match.start()
        if "\n" in text[previous_end:position]:
            run.flush(names)
            at_start = True
        previous_end = match.end()
        raw = match.group()
        if raw.isalpha() and raw.islower() and raw not in _CONNECTORS:
            run.flush(names)  # the common case: a plain lowercase word
            at_start = False
            continue
        lead, core, tail = _split_token(raw)
        if lead:
            run.flush(names)
        code = _code_token(core) if core else None
        if code is not None:
            run.flush(names)
            yield position + len(lead), code[:_MAX_ENTITY_CHARS], False
        elif core in ("I", "I'm", "I'd", "I've", "I'll") or not core:
            run.flush(names)
        elif _CAPWORD.fullmatch(core):
            if after_abbreviation and core.casefold() in _FUNCTION:
                run.flush(names)  # "Plan B. The …": the initial did end a sentence
                at_start = True
            after_abbreviation = tail.startswith(".") and (
                len(core) == 1 or core.casefold() in _HONORIFICS
            )
            word = core + "." if after_abbreviation else core
            run.add(word, position + len(lead), at_start)
            if after_abbreviation:
                continue  # "Dr." and "J." neither end the sentence nor the name
            if tail:
                run.flush(names)
        elif core.casefold() in _CONNECTORS and run.words and not tail:
            run.pending.append(core)
            continue
        else:
            run.flush(names)
        at_start = any(ch in ".!?:" for ch in tail) or _BULLET.fullmatch(raw) is not None
    run.flush(names)
    yield from names


def read_entities(text: str) -> list[tuple[str, bool]]:
    """The named things a memory mentions, each with whether it is only a candidate.

    Finds people, places and organisations (capitalised runs such as "Ada Lovelace" or
    "Acme Corp", without leading determiners), emails, URLs, dates, quantities with units
    ("12 percent", "$300", "3.5 GB", "10am") and code identifiers (backticked spans,
    paths, dotted module names, snake_case, camelCase, CLI flags). A lone capitalised word
    that opens a sentence ("Invoices are due", "Alice moved") may be capitalised for that
    alone: it comes as a candidate (True), a name only where the word is known as one
    (see :func:`extract_entities`); acronyms and product codes (HNSW, BM25) are names
    wherever they stand. A share's ``[Shared by CHANNEL]`` prefix is not read. Only the
    first `MAX_SCAN_CHARS` characters are read.

    Returns:
        (entity, candidate) in order of first appearance, deduplicated by `entity_key`
        (a name that also appears mid-sentence is no candidate); names keep their case,
        emails are lower-cased.
    """
    text = _SHARED_PREFIX.sub(lambda prefix: " " * len(prefix.group()), text[:MAX_SCAN_CHARS])
    found, masked = _spans(text)
    every = [(position, entity, False) for position, entity in found]
    every.extend(_token_entities(masked))
    every.sort(key=lambda item: item[0])
    confirmed = {entity_key(entity) for _, entity, candidate in every if not candidate}
    seen: set[str] = set()
    entities: list[tuple[str, bool]] = []
    for _, entity, candidate in every:
        key = entity_key(entity)
        if key and key not in seen:
            seen.add(key)
            entities.append((entity.strip(), candidate and key not in confirmed))
    return entities


def extract_entities(text: str, known: Callable[[str], bool] | None = None) -> list[str]:
    """The named things a memory mentions, for entity edges and entity cards
    (:func:`read_entities`): a candidate counts only when ``known`` says its
    `entity_key` names something already (seen capitalised mid-sentence elsewhere in the
    channel, say); without ``known``, never."""
    return [
        entity
        for entity, candidate in read_entities(text)
        if not candidate or (known is not None and known(entity_key(entity)))
    ]
