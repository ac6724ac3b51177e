"""Evaluate (DESIGN §8): a text an agent is about to say, checked against a channel's memories.

No model beyond the embedding: the text is embedded like a memory, its nearest memories
in the channel are read, and rules judge each close one — a contradiction (a negation
in one and not the other, or different numbers: the rule dreams use for conflicts),
preference drift (a preference the text negates or feels the opposite about), or a
stale reference (the text matches a memory that a newer one supersedes). Reading only:
nothing is heated or counted. The issues found can be stored as episodic memories
(:func:`findings`), through the normal store pipeline.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

import numpy as np

from calor.models.contrast import contradiction
from calor.models.valence import valence
from calor.server.commands import NewMemory
from calor.server.engine.channel import Channel
from calor.server.recall.lexical import FUNCTION_WORDS, tokenize
from calor.server.records import ACTIVE, COLD, MemoryRecord

__all__ = [
    "CONTRADICTION",
    "FINDING_TAG",
    "PREFERENCE_DRIFT",
    "STALE_REFERENCE",
    "Evaluation",
    "EvaluationTuning",
    "Issue",
    "ALIGNED",
    "CONFLICT",
    "REVIEW",
    "evaluate",
    "findings",
]

CONTRADICTION = "contradiction"
PREFERENCE_DRIFT = "preference_drift"
STALE_REFERENCE = "stale_reference"

FINDING_TAG = "evaluation"
"""The tag a stored finding carries (its value is the issue's kind). Evaluate passes
over findings: a note about an earlier text is not a memory of the world."""

_LIVE = frozenset({ACTIVE, COLD})
# Words that make a statement say the opposite; left out when comparing subjects.
_NEGATIONS = frozenset(
    tokenize(
        "not no never none nobody nothing neither nor cannot without "
        "don't doesn't didn't isn't aren't wasn't weren't won't can't"
    )
)
# Who a statement is by or about; two statements are compared by their subjects alone.
_PRONOUNS = frozenset(
    tokenize(
        "i me my mine myself you your yours yourself we us our ours he him his she her hers "
        "they them their theirs"
    )
)
# Words that state a preference and whose it is, and words that give advice: left out
# when comparing what a recommendation and a preference are about.
_PREFERRING = frozenset(
    tokenize("user prefer preferred preference like love favourite favorite want always usually")
)
_ADVISING = frozenset(
    tokenize("use should recommend suggest try choose pick go switch stick let lets we'll")
)
# "<verb> THING for PURPOSE": a choice for a purpose, advised or preferred.
_CHOICE = r"\s+(?P<thing>[\w.+#-]+(?:\s+[\w.+#-]+)?)\s+(?:for|in|when)\s+(?P<purpose>[^.;!?]+)"
_ADVICE = re.compile(
    r"(?i)\b(?:use|try|choose|pick|recommend|suggest|switch\s+to|go\s+with|stick\s+with)" + _CHOICE
)
_PREFERENCE = re.compile(
    r"(?i)\b(?:prefers?|preferred|likes?|loves?|wants?|uses?|always\s+uses?)" + _CHOICE
)
_QUOTED = 300  # characters of a text quoted in a message or a finding
_PROVENANCE_BYTES = 200  # of the evaluated text kept in a finding's provenance


@dataclass(frozen=True)
class EvaluationTuning:
    """How close a memory must be for Evaluate to judge a text against it.

    A contradiction needs the channel's ``dreams.conflict_similarity`` (0.80), the
    closeness at which a dream opens a conflict, so what Evaluate calls a contradiction
    is what a dream would flag had the text been stored.

    Attributes:
        candidates: Nearest memories read for each text.
        preference_similarity: Cosine a preference needs: a statement about what the
            agent is doing is worded further from the preference it touches.
        choice_similarity: Cosine a preference needs for advice that names another
            choice for its purpose to drift from it: "Use TypeScript for scripting." is
            0.66 from "The user prefers Python for scripting.", and the rule asks for
            a shared purpose and a different thing on each side besides.
        stale_similarity: Cosine at which a text refers to a superseded memory.
        shared_subject: Share of the shorter text's words (stopwords and negations
            left out) the two texts must share. Sentences about the user sit close
            in meaning whatever they say ("allergic to peanuts" and "does not like
            spicy food" are 0.8 apart), so closeness alone does not make one subject.
        valence: Least emotional charge, each side, for opposite feelings to count
            as drift from a preference.
    """

    candidates: int = 32
    preference_similarity: float = 0.70
    choice_similarity: float = 0.60
    stale_similarity: float = 0.75
    shared_subject: float = 0.5
    valence: float = 0.3


@dataclass(frozen=True)
class Issue:
    """One problem with the text, the memory behind it, and ``correction``: what the
    channel holds instead (the memory contradicted or the preference drifted from, or
    what superseded a stale memory; "" when nothing did)."""

    kind: str
    memory_id: str
    message: str
    similarity: float
    correction: str = ""


ALIGNED, REVIEW, CONFLICT = "aligned", "review", "conflict"


@dataclass(frozen=True)
class Evaluation:
    """How well a text agrees with a channel's memories.

    ``alignment`` is in [0, 1]: 1.0 when no issue is found; otherwise the product over
    the issues of (1 − similarity), so each issue pulls it toward 0, the more so the
    closer the memory the text goes against. ``findings`` are the issues as memories
    ready to store (:func:`findings`).
    """

    alignment: float
    issues: list[Issue] = field(default_factory=list)
    findings: list[NewMemory] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``conflict`` when the text contradicts a memory, ``review`` when it has other
        issues (drift from a preference, a stale reference), else ``aligned``."""
        if any(issue.kind == CONTRADICTION for issue in self.issues):
            return CONFLICT
        return REVIEW if self.issues else ALIGNED


def evaluate(
    channel: Channel,
    text: str,
    vector: np.ndarray,
    conflict_similarity: float,
    tuning: EvaluationTuning | None = None,
) -> Evaluation:
    """Check ``text`` (embedded as ``vector``, like a memory) against a channel's memories.

    The caller holds the channel's lock; nothing is written. Each memory gives at most
    one issue; issues come closest first.
    """
    tuning = tuning or EvaluationTuning()
    subject = _subject(text) - _PREFERRING - _ADVISING
    clocks = channel.clocks()
    labels, sims = channel.index.dense(vector, tuning.candidates)
    issues: list[Issue] = []
    for label, similarity in zip(labels.tolist(), sims.tolist(), strict=True):
        record = channel.evolved(channel.records[channel.index.memory_id(label)], clocks)
        if record.state not in _LIVE or FINDING_TAG in record.tags:
            continue
        if (
            _overlap(subject, _subject(record.text) - _PREFERRING - _ADVISING)
            < tuning.shared_subject
        ):
            continue
        issue = _judge(channel, text, vector, record, similarity, conflict_similarity, tuning)
        if issue is not None:
            issues.append(issue)
    issues.sort(key=lambda i: (-i.similarity, i.memory_id))
    alignment = math.prod(min(1.0, max(0.0, 1.0 - i.similarity)) for i in issues)
    return Evaluation(alignment, issues, findings(channel.name, text, issues))


def _judge(
    channel: Channel,
    text: str,
    vector: np.ndarray,
    record: MemoryRecord,
    similarity: float,
    conflict_similarity: float,
    tuning: EvaluationTuning,
) -> Issue | None:
    """The issue ``text`` has with one close memory, if any."""
    quoted = _quote(record.text)
    if record.superseded:
        if similarity < tuning.stale_similarity or contradiction(text, record.text):
            return None  # unrelated, or saying the old memory holds no more: up to date
        newer = _successor(channel, record)
        if newer is not None:
            newer_record, newer_vector = newer
            if float(vector @ newer_vector) >= similarity:
                return None  # the text is closer to what replaced it: it is up to date
            message = f'refers to "{quoted}", superseded by "{_quote(newer_record.text)}"'
            return Issue(STALE_REFERENCE, record.id, message, similarity, newer_record.text)
        message = f'refers to "{quoted}", which is deprecated'
        return Issue(STALE_REFERENCE, record.id, message, similarity)
    if record.memory_type == "preference":
        reason = None
        if similarity >= tuning.preference_similarity:
            reason = contradiction(text, record.text) or _opposite_feeling(text, record, tuning)
        if reason is None and similarity >= tuning.choice_similarity:
            reason = _other_choice(text, record)
        if reason is None:
            return None
        message = f'goes against the preference "{quoted}" ({reason})'
        return Issue(PREFERENCE_DRIFT, record.id, message, similarity, record.text)
    if similarity < conflict_similarity:
        return None
    reason = contradiction(text, record.text)
    if reason is None:
        return None
    message = f'contradicts the memory "{quoted}" ({reason})'
    return Issue(CONTRADICTION, record.id, message, similarity, record.text)


def _other_choice(text: str, record: MemoryRecord) -> str | None:
    """Why advice names another choice than a preference for the same purpose ("Use
    TypeScript for scripting." against "The user prefers Python for scripting."), if it
    does: each says "<verb> THING for PURPOSE", the purposes share a word, the things do
    not."""
    advice, preference = _ADVICE.search(text), _PREFERENCE.search(record.text)
    if advice is None or preference is None:
        return None
    ours, theirs = _stems(advice["thing"]), _stems(preference["thing"])
    if ours & theirs or not _stems(advice["purpose"]) & _stems(preference["purpose"]):
        return None
    return f"recommends {advice['thing']}, not {preference['thing']}, for {advice['purpose']}"


def _stems(words: str) -> frozenset[str]:
    return frozenset(tokenize(words)) - FUNCTION_WORDS


def _successor(channel: Channel, record: MemoryRecord) -> tuple[MemoryRecord, np.ndarray] | None:
    """The live memory that superseded ``record``, with its embedding, if it is known."""
    newer = channel.records.get(record.tags.get("superseded_by", ""))
    if newer is None:
        return None
    found = channel.index.vector(newer.id)  # searchable: live, or archived in the attic
    if found is None:
        found = channel.attic.vector(newer.id)
    return None if found is None else (newer, found)


def _opposite_feeling(text: str, record: MemoryRecord, tuning: EvaluationTuning) -> str | None:
    """Why the text feels the opposite of a preference ("hates" against "loves"), if it does."""
    ours, theirs = valence(text), record.valence
    if min(abs(ours), abs(theirs)) >= tuning.valence and (ours > 0) != (theirs > 0):
        return "the opposite feeling"
    return None


def _subject(text: str) -> frozenset[str]:
    """What a text is about, as its terms without function words, pronouns or the words
    that negate it."""
    return frozenset(tokenize(text)) - _NEGATIONS - FUNCTION_WORDS - _PRONOUNS


def _overlap(first: frozenset[str], second: frozenset[str]) -> float:
    """The share of the shorter term set the other holds too."""
    shorter = min(len(first), len(second))
    return len(first & second) / shorter if shorter else 0.0


def _quote(text: str) -> str:
    """A text cut for quoting, on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _QUOTED else flat[: _QUOTED - 1] + "…"


def _clip_bytes(text: str, limit: int) -> str:
    """A prefix of ``text`` of at most ``limit`` UTF-8 bytes, cut between characters."""
    return text.encode()[:limit].decode(errors="ignore")


def findings(channel: str, text: str, issues: list[Issue]) -> list[NewMemory]:
    """The issues as episodic memories of the channel, one each, ready for the store
    pipeline. Each names the evaluated text and its issue in its provenance, and keys
    itself on both, so evaluating the same text again stores nothing new."""
    out: list[NewMemory] = []
    for issue in issues:
        digest = hashlib.sha256(f"{text}\0{issue.kind}\0{issue.memory_id}".encode()).hexdigest()
        out.append(
            NewMemory(
                channel=channel,
                text=f'Evaluated "{_quote(text)}": it {issue.message}.',
                memory_type="episodic",
                tags={FINDING_TAG: issue.kind},
                source="agent",
                confidence="inferred",
                idempotency_key=f"evaluate:{digest[:40]}",
                provenance={
                    "evaluated_text": _clip_bytes(text, _PROVENANCE_BYTES),
                    "issue": issue.kind,
                    "issue_memory_id": issue.memory_id,
                    "issue_similarity": f"{issue.similarity:.3f}",
                },
            )
        )
    return out
