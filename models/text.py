"""Text analysis without a model: entities, memory-type rules and emotional valence."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["MAX_SCAN_CHARS", "classify_type", "entity_key", "extract_entities", "valence"]

MAX_SCAN_CHARS = 4_000
"""Only this many leading characters are analysed: a store must stay within milliseconds."""

_CLASSIFY_CHARS = 1_000  # a memory's type shows in its opening; long texts are read no further
_CLASSIFY_SENTENCES = 12
_MAX_ENTITY_CHARS = 120
_MAX_NAME_WORDS = 6  # longer capitalised runs are headings or shouting, not names

# Every pattern below is linear: quantifiers are possessive or bounded, and a repeated group
# always starts with a character its neighbour cannot match, so nothing backtracks far.


def _words(*groups: str) -> frozenset[str]:
    return frozenset(word for group in groups for word in group.split())


# ---------------------------------------------------------------- lexicons

_CALENDAR = _words(
    "monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur thurs "
    "fri sat sun january february march april may june july august september october november "
    "december jan feb mar apr jun jul aug sep sept oct nov dec"
)
# Capitalised only because they open a sentence (or a heading): never a name on their own.
_FUNCTION = _CALENDAR | _words(
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
_COMMON = _FUNCTION | _words(
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
_CONNECTORS = _words("of de da di du del der van von la le y &")
_HONORIFICS = _words("dr mr mrs ms prof st sr jr mt")
_NOT_NAME_SUFFIX = re.compile(
    r"(?:ing|ed|ly|tion|sion|ment|ness|ity|ies|ous|ive|ful|less|able|ible|ism|ence|ance|ical|"
    r"ics)s?$"
)

# ---------------------------------------------------------------- entity patterns

_BACKTICK = re.compile(r"`([^`\n]{1,200})`")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"'`]++")
_EMAIL = re.compile(r"(?<![\w.%+-])[\w.%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})++")
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_DATE = re.compile(
    rf"\b(?:{_MONTH}\.?[ ]\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?[ ]\d{{4}}\b)?"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?[ ](?:of[ ])?{_MONTH}\b(?:,?[ ]\d{{4}}\b)?"
    rf"|\d{{4}}-\d{{2}}-\d{{2}}\b)"
)
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
    for pattern in (_BACKTICK, _URL, _EMAIL, _DATE, _QUANTITY):
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

    def flush(self, out: list[tuple[int, str]]) -> None:
        name = _name(self.words, self.initial)
        if name is not None:
            out.append((self.start, name))
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


def _name(words: list[str], initial: bool) -> str | None:
    """The display form of a capitalised run, or None when it is not a name."""
    dropped = 0
    if initial:
        while dropped < len(words) and words[dropped].casefold() in _FUNCTION:
            dropped += 1
    words = words[dropped:]
    if not words or len(words) > _MAX_NAME_WORDS:
        return None
    words[-1] = words[-1].rstrip(".")  # "Plan B." ends a sentence, not a name
    lowered = [word.casefold().rstrip(".") for word in words]
    if all(word in _FUNCTION or word in _CONNECTORS or word in _HONORIFICS for word in lowered):
        return None  # weekday or month alone, a capitalised "Please", a bare "Dr."
    if initial and dropped == 0 and len(words) == 1 and not _lone_word_is_name(words[0]):
        return None
    return " ".join(words)[:_MAX_ENTITY_CHARS]


def _split_token(raw: str) -> tuple[str, str, str]:
    """A token as (leading punctuation, core, trailing punctuation), possessive dropped."""
    core = raw.lstrip(_LEADING)
    lead = raw[: len(raw) - len(core)]
    stripped = core.rstrip(_TRAILING)
    tail = core[len(stripped) :]
    if stripped.endswith(("'s", "’s")) and len(stripped) > 2:
        stripped, tail = stripped[:-2], stripped[-2:] + tail
    return lead, stripped, tail


def _token_entities(text: str) -> Iterator[tuple[int, str]]:
    """Code tokens and capitalised names, scanning the (masked) text token by token."""
    names: list[tuple[int, str]] = []
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
            yield position + len(lead), code[:_MAX_ENTITY_CHARS]
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


def extract_entities(text: str) -> list[str]:
    """The named things a memory mentions, for entity edges and entity cards.

    Finds people, places and organisations (capitalised runs such as "Ada Lovelace" or
    "Acme Corp", skipping words capitalised only because they open a sentence), emails,
    URLs, dates, quantities with units ("12 percent", "$300", "3.5 GB", "10am") and code
    identifiers (backticked spans, paths, dotted module names, snake_case, camelCase, CLI
    flags). Only the first `MAX_SCAN_CHARS` characters are read.

    Args:
        text: The memory's text.

    Returns:
        Entities in order of first appearance, deduplicated by `entity_key`; names keep
        their case, emails are lower-cased.
    """
    found, masked = _spans(text[:MAX_SCAN_CHARS])
    found.extend(_token_entities(masked))
    found.sort(key=lambda item: item[0])
    seen: set[str] = set()
    entities: list[str] = []
    for _, entity in found:
        key = entity_key(entity)
        if key and key not in seen:
            seen.add(key)
            entities.append(entity.strip())
    return entities


# ---------------------------------------------------------------- memory type rules

_STYLE_NOUNS = (
    r"answers?|responses?|replies|reply|tone|style|formatting|spelling|units|language|emojis?|"
    r"verbose|verbosity|concise|brief|formal|casual|jargon|explanations?|bullet points?|"
    r"dark mode|light mode|font|theme|notifications?"
)
_PREFERENCE = re.compile(
    r"\b(?:prefer(?:s|red|ring|ences?)?|(?:dis)?likes|(?:dis)?liked|dislike|loves?|loved|"
    r"hates?|hated|enjoys?|enjoyed|favou?rites?|favou?rs|fan of|fond of|keen on|"
    r"(?:would|'d|had) rather|can'?t stand|cannot stand|wants|wishes|"
    r"(?:would|'d|do|does|don't|doesn't|not|really|also|i|we|they|you) like|"
    r"tends? to (?:pick|choose|order|go for|prefer|buy|wear|eat|"
    r"drink|read|watch|listen)|finds? (?:it|them|that|this) (?:annoying|distracting|"
    r"confusing|helpful|useful|irritating|tedious))\b",
    re.IGNORECASE,
)
_STYLE = re.compile(rf"\b(?:{_STYLE_NOUNS})\b", re.IGNORECASE)
_DIRECTIVE = re.compile(
    r"^(?:please|always|never|don'?t|do not|avoid)\b|\b(?:should|must)\b", re.IGNORECASE
)

_STRICT_VERBS = (
    r"run|install|restart|click|use|ensure|make sure|navigate|enable|disable|rerun|re-run|"
    r"paste|reboot|preheat|uninstall|reinstall|activate|cd|configure|deploy|execute|invoke|"
    r"press|tap|log in|sign in|download|upload|remember to|don't forget to|be sure to"
)
_LOOSE_VERBS = (
    r"open|set|add|create|clear|delete|remove|check|generate|update|call|build|push|pull|"
    r"merge|rebase|copy|move|go to|start|stop|kill|export|import|edit|change|rename|replace|"
    r"tag|bump|commit|write|review|try|wait|connect|submit|apply|drop|verify|compile|mix|"
    r"stir|pour|bake|fold|whisk|chop|back up|save|close|reload|refresh|clone|fetch|upgrade|"
    r"revert|reset|rotate|restore|extend|send|ask|tell|email|file|test|keep|put|take|get|"
    r"follow|read|stage|schedule|register|mount|attach|pin"
)
_OBJECT = (
    r"the|a|an|it|them|this|that|these|those|your|my|our|all|each|every|both|any|some|its|"
    r"his|her|their|up|down|out|off|in|on|over|back|with"
)
_IMPERATIVE = re.compile(
    rf"^(?:(?:please|always|never|then|now|first|next|finally),?[ ]+)?"
    rf"(?:(?:{_STRICT_VERBS})\b|(?:{_LOOSE_VERBS})(?:[ ]+(?:{_OBJECT})\b|[ ]+[`\"'-]))",
    re.IGNORECASE,
)
_PURPOSE = re.compile(r"^to[ ][^,;:]{1,120},[ ]*+(?!(?:" + _OBJECT + r")\b)[a-z]", re.I)
_CONDITION = re.compile(
    rf"^(?:if|when|whenever|before|after|once|for|in case)\b[^,;:]{{1,120}},[ ]*+"
    rf"(?:then[ ]+)?(?:{_STRICT_VERBS}|{_LOOSE_VERBS})\b",
    re.IGNORECASE,
)
_PROCEDURE = re.compile(
    rf"\b(?:how to|how do (?:i|you|we)|steps? (?:to|for)|step \d|make sure to|remember to|"
    rf"be sure to|don'?t forget to|(?:you|one) (?:need|have|must|should) to|"
    rf"first\b[^.]{{0,200}}\bthen|then[ ]+(?:{_STRICT_VERBS}|{_LOOSE_VERBS})\b)\b|"
    rf"\b(?:process|procedure|workflow|recipe|steps|instructions|checklist|runbook|playbook)"
    rf"\b[^.:]{{0,60}}:|->|→",
    re.IGNORECASE,
)

_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_TIME_EVENT = re.compile(
    rf"\b(?:yesterday|today|today's|tonight|tomorrow|next (?:week|weekend|month|year|"
    rf"{_WEEKDAY})|this (?:morning|afternoon|evening|week|weekend|"
    rf"month|year)|last (?:night|week|weekend|month|year|time|session|conversation|meeting|"
    rf"call|chat|sprint|quarter|{_WEEKDAY})|(?:\d+|a|an|one|two|three|four|five|six|seven|"
    rf"eight|nine|ten|a few|a couple of|several) (?:seconds?|minutes?|hours?|days?|weeks?|"
    rf"months?|years?) ago|just now|earlier (?:today|this)|overnight|recently|the other day|"
    rf"on {_WEEKDAY}|{_WEEKDAY}(?:'s)? (?:standup|meeting|call|session|sync|demo|review|"
    rf"retro|class))\b",
    re.IGNORECASE,
)
_PAST_EVENT = re.compile(
    r"\b(?:(?i:i|we|he|she|they|you|user|assistant|team|everyone|nobody)|[A-Z][a-z]+)[ ]+"
    r"(?i:(?!\w*eed\b)\w+ed|said|told|asked|met|went|got|had|made|took|gave|came|left|sent|"
    r"saw|found|wrote|ran|did|began|broke|bought|brought|built|chose|felt|forgot|heard|"
    r"kept|knew|lost|paid|spent|thought|won|agreed|shipped)\b"
    r"|\b(?i:during|at) (?i:the|our|today's|yesterday's|that|this) "
    rf"|\b(?i:in|on) {_MONTH}\b|{_DATE.pattern}"
)
_FACT = re.compile(
    r"\b(?:(?:first |last |full |middle |maiden |nick)?name is|(?:is|are) called|is named|"
    r"named|lives? in|lived in|resides in|works? (?:at|for|as|on)|born (?:in|on)|allergic|"
    r"intoleran(?:t|ce)|birthday|anniversary|speaks?|is married|married to|is from|"
    r"comes from|based in|located in|headquartered|founded (?:in|by)|licensed under|"
    r"phone number|email (?:address )?is|address is|by default|defaults? to|is set to|"
    r"runs on|written in|(?:is|are) (?:vegan|vegetarian|diabetic|pregnant)|years old|"
    r"aged \d|is the (?:\w+ ){0,2}(?:lead|owner|manager|maintainer|author|ceo|cto|founder|"
    r"head|director|contact)|is (?:a|an) (?:\w+ ){0,2}(?:engineer|developer|designer|"
    r"manager|doctor|teacher|student|nurse|lawyer|scientist|researcher))\b",
    re.IGNORECASE,
)
_COPULA = re.compile(
    r"\b(?:is|are|has|have|uses|runs|owns|outputs|supports|listens|requires|depends on|"
    r"contains|costs|weighs|holds)\b",
    re.IGNORECASE,
)
_GENERIC = re.compile(
    r"^(?:a|an|any|every|each|most|many|some|all)\b|\b(?:can|could|may|might|tends? to|"
    r"often|usually|generally|typically|in general|sometimes|rarely)\b",
    re.IGNORECASE,
)
_SPECIFIC = re.compile(
    r"\b(?:my|our|your|his|her|their|we|i)\b|\w['’]s\b|(?-i:(?<=\s)[A-Z]|^[A-Z]\w*+[ ]*+$)"
    r"|^the (?:[\w-]+ ){0,3}?(?:user|team|project|repo|repository|company|client|customer|"
    r"service|server|app|application|api|database|db|cluster|model|codebase|branch|pipeline|"
    r"bucket|backend|frontend|website|site|office|account|product|system|library|package|"
    r"module|endpoint|config|limit|key|machine|laptop|deployment|instance|workspace|channel)s?\b",
    re.IGNORECASE,
)
# "was"/"were" in a main clause is an event ("the build was red"); inside a subordinate
# clause it is part of a general statement ("explain why a change was made").
_WAS = re.compile(
    r"^(?:(?!\b(?:why|how|what|whether|which|that|who|if|when|because|unless)\b)[^,])*?"
    r"\b(?:was|were)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?;\n]++")


def _sentences(text: str) -> list[str]:
    sentences: list[str] = []
    for match in _SENTENCE.finditer(text):
        sentence = match.group().strip()
        if sentence:
            sentences.append(sentence)
            if len(sentences) == _CLASSIFY_SENTENCES:
                break
    return sentences


def _is_preference(text: str, sentences: list[str]) -> bool:
    if _PREFERENCE.search(text):
        return True
    return _STYLE.search(text) is not None and any(
        _DIRECTIVE.search(s) or _IMPERATIVE.match(s) for s in sentences
    )


def _is_procedural(text: str, sentences: list[str]) -> bool:
    if _PROCEDURE.search(text):
        return True
    return any(_IMPERATIVE.match(s) or _PURPOSE.match(s) or _CONDITION.match(s) for s in sentences)


def _is_fact(text: str) -> bool:
    """A standing fact about something specific (not general knowledge); no time cue."""
    if _FACT.search(text):
        return True
    copula = _COPULA.search(text)
    if copula is None or _GENERIC.search(text):
        return False
    return _SPECIFIC.search(text[: copula.start()].strip()) is not None


def classify_type(text: str) -> str:
    """The memory type a text most likely is, when the caller gave none.

    Rules are tried in DESIGN §4's order: preference (likes, wants, style directives),
    procedural (imperatives, steps, "to X, do Y"), fact (a standing attribute of someone or
    something specific), episodic (a time reference or a past event), else semantic (general
    knowledge).

    Args:
        text: The memory's text; only its opening (1,000 characters, 12 sentences) is read.

    Returns:
        One of ``preference``, ``procedural``, ``fact``, ``episodic`` or ``semantic``.
    """
    text = text[:_CLASSIFY_CHARS].replace("’", "'")
    sentences = _sentences(text)
    if _is_preference(text, sentences):
        return "preference"
    if _is_procedural(text, sentences):
        return "procedural"
    timed = _TIME_EVENT.search(text) is not None  # an event, never a standing fact
    if not timed and _is_fact(text):
        return "fact"
    if timed or _PAST_EVENT.search(text):
        return "episodic"
    if any(_WAS.match(sentence) for sentence in sentences):
        return "episodic"
    return "semantic"


# ---------------------------------------------------------------- valence


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
_NEGATORS = _words("not no never none nobody nothing neither nor without hardly barely cannot")
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
