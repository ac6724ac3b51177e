"""Memory-type classification without a model: ordered rules over a text's opening."""

from __future__ import annotations

import re

from calor.models._lexicon import DATE, MONTH

__all__ = ["CLASSIFIER_VERSION", "classify_type"]

CLASSIFIER_VERSION = 2
"""The version of :func:`classify_type`'s rules: raise it whenever a change to them can give
another type for some text. A memory whose type was inferred records the version that
inferred it, and a dream classifies it again once this is higher. (Version 1 was the
classifier before versions were recorded; memories stored then carry none, since whether
their type was inferred is not known, and keep their type.)"""

_CLASSIFY_CHARS = 1_000  # a memory's type shows in its opening; long texts are read no further
_CLASSIFY_SENTENCES = 12

# Every pattern below is linear: quantifiers are possessive or bounded, and a repeated group
# always starts with a character its neighbour cannot match, so nothing backtracks far.

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
    rf"|\b(?i:in|on) {MONTH}\b|{DATE.pattern}"
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

# Code: a source path, a call signature, or a folder beside a code word, said with a verb
# that describes what code does ("src/app.py defines serve()"), not one that asks for it.
_CODE_EXTENSIONS = (
    r"py|pyi|js|jsx|mjs|ts|tsx|go|rs|rb|java|kt|kts|c|h|cc|cpp|hpp|cs|php|swift|scala|sh|"
    r"sql|proto|toml|ya?ml|json|ex|exs|erl|hs|lua|dart|vue|svelte|ipynb|tf|gradle"
)
_CODE_PATH = re.compile(
    rf"(?<![\w/.])(?:[\w.-]{{1,64}}/){{0,12}}[\w-]{{1,64}}\.(?:{_CODE_EXTENSIONS})\b"
)
_FOLDER = re.compile(r"(?<![\w/.:])(?:[\w.-]{1,64}/){1,12}")
_SIGNATURE = re.compile(r"(?<![\w.])[A-Za-z_][\w.]{0,63}\((?:[^()\n]{0,80})\)")
_CODE_WORDS = re.compile(
    r"\b(?:class|struct|module|package|function|method|hook|component|fixture|endpoint|"
    r"interface|trait|enum|dataclass|stubs?|helpers?|repository|migrations?|entry point|"
    r"subcommands?|target|tests?)\b",
    re.IGNORECASE,
)
_CODE_VERBS = re.compile(
    r"\b(?:defines?|declares?|(?:re-)?exports?|implements?|contains?|holds?|returns?|"
    r"calls?|imports?|wraps?|exposes?|registers?|handles?|provides?|owns?|maps?|reads?|"
    r"writes?|parses?|renders?|loads?|consumes?|regenerates?|lives? in|(?:is|are) "
    r"(?:defined|declared|used|applied|called) (?:in|by|at)|turns?)\b",
    re.IGNORECASE,
)


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


def _is_code(text: str, sentences: list[str]) -> bool:
    """A description of code: where it lives, what it defines, what it does."""
    if sentences and (_IMPERATIVE.match(sentences[0]) or _PURPOSE.match(sentences[0])):
        return False  # "run tests/test_x.py", "to add a type, edit heat.py": steps
    anchored = (
        _CODE_PATH.search(text) is not None
        or _SIGNATURE.search(text) is not None
        or (_FOLDER.search(text) is not None and _CODE_WORDS.search(text) is not None)
    )
    return anchored and (
        _CODE_VERBS.search(text) is not None or _CODE_WORDS.search(text) is not None
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
    codebase (a source path, a call signature or a code folder, described: "src/app.py
    defines serve()"), procedural (imperatives, steps, "to X, do Y"), fact (a standing
    attribute of someone or something specific), episodic (a time reference or a past
    event), else semantic (general knowledge).

    Args:
        text: The memory's text; only its opening (1,000 characters, 12 sentences) is read.

    Returns:
        One of ``preference``, ``codebase``, ``procedural``, ``fact``, ``episodic`` or
        ``semantic``.
    """
    text = text[:_CLASSIFY_CHARS].replace("’", "'")
    sentences = _sentences(text)
    if _is_preference(text, sentences):
        return "preference"
    if _is_code(text, sentences):
        return "codebase"
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
