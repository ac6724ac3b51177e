"""The Markdown form of a channel's memories: rendered for ``Export``, parsed for ``Import``.

The format, as :func:`render_header` and :func:`render_memory` write it::

    # Calor export: agent-7

    Exported 2026-03-01T09:00:00Z · 2 memories

    ## Alice is allergic to peanuts
    - id: 01JNK3V7M8Q2W4X6Y8Z0A1B2C3
    - type: core
    - heat: 0.94
    - keystone: yes
    - state: active
    - created: 2026-03-01T09:00:00Z
    - tags: person=alice, topic=health
    - source: human
    - importance: 0.62
    - provenance: from=chat
    - heat0: 0.9412
    - t0: 2026-03-02T10:00:00.25Z
    - stability: 6.25
    - utility: 0.6180339887
    - recalls: 2
    - last_recalled: 2026-03-02T10:00:00.25Z
    - recall_times: 2026-03-01T18:00:00Z, 2026-03-02T10:00:00.25Z
    - updated: 2026-03-02T10:00:00.25Z
    - edges: 01JNK3V7M8Q2W4X6Y8Z0A1B2C4 semantic 0.8312, 01JNK3V7M8Q2W4X6Y8Z0A1B2C5 manual 1.0

    ```text
    Alice is allergic to peanuts.
    ```

The text is the fenced block, verbatim; its fence is one backtick longer than the longest
backtick run in the text (at least three), so no line of the text can close it. The title
is decoration, and so is ``heat`` (the heat when exported, rounded: ``heat0`` at ``t0`` is
what it is computed from). Numbers are written as the shortest text that reads back as the
same float, times in UTC with as many digits of a second as the float needs, so nothing is
rounded on the way. Keys are left out at their defaults: ``source`` (agent),
``confidence`` (observed), ``tags`` and ``provenance`` (none), ``recalls``,
``confirmations``, ``valence``, ``surprise``, ``importance_adjustment`` and
``interactions_since_t0`` (0), ``last_recalled``, ``recall_times``, ``session``,
``merged_into``, ``merged_from`` and ``edges`` (none), ``classifier`` (0: the type was
given).

**The carried state.** A section that names ``heat0`` and ``t0`` carries its memory's
whole state, and an import reproduces the memory (the same heat at every moment, in the
same state) instead of storing it anew. Of :class:`~calor.server.records.MemoryRecord`:

- carried: ``id``, ``text``, ``memory_type``, ``created_at``, ``updated_at``, ``heat0``,
  ``t0``, ``stability``, ``importance``, ``utility``, ``recall_count``,
  ``last_recalled_at``, ``recall_times``, ``confirmations``, ``valence`` (read from the
  text as first stored; a corrected text keeps it), ``surprise``,
  ``importance_adjustment``, ``keystone``, ``state``, ``tags``, ``source``,
  ``confidence``, ``provenance``, ``session``, ``merged_into``, ``merged_from``, and
  ``classifier_version`` as ``classifier`` (when the type was inferred: a newer server
  classifies it again in its next dream);
- ``interactions0`` as ``interactions_since_t0``: the channel's interaction count is the
  channel's own, so what is carried is the memory's age on that clock, rebased on the
  channel it is imported into;
- ``entities`` only when they are not what the extractor reads from the text alone (a
  word that opens a sentence, taken as a name because the channel knew it from
  elsewhere); otherwise they are read again on import;
- not carried: ``channel`` (the import names it); and
  ``idempotency_key``, which answers retries of one store call in the channel it was
  made in, and in another channel could only claim a key its own clients use.

Within one export each section also names its ``edges`` to the other memories of the
export (each edge appears under both of its ends); edges to memories left out (ghosts,
archived ones without ``include_archived``) are left out with them. Merged memories are
exported with the memory they were merged into. The channel's own state (settings,
cognitive heat, the interaction count, open conflicts) is not part of an export.

**Reading** is forgiving, for documents people write: a bullet outside a memory section
(``- note``, ``* note``, ``1. note``, continued by indented lines) is one memory without
metadata; a ``##`` heading with none of the keys older exports wrote (``id``, ``type``,
``keystone``, ``created``, ``tags``, ``source``, ``confidence``, ``importance``, ``heat``,
``state``) and no fenced block is a plain heading, its bullets notes; a section with
metadata but no fence takes the lines up to the next heading as its text. Any other prose
is ignored, as are unknown keys. A memory without ``heat0`` and ``t0`` (notes, older
exports) is stored anew, through the store pipeline; its state keys, like ``heat``, are
then only for people.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from calor.models.entities import extract_entities
from calor.server.commands import NewMemory
from calor.server.errors import InvalidArgumentError
from calor.server.records import MemoryRecord
from calor.server.storage.markdown_memory import CarriedState, LinkTo
from calor.server.storage.markdown_reader import MarkdownReader, ParsedMemory
from calor.server.storage.markdown_values import (
    format_edges,
    format_names,
    format_number,
    format_tags,
    format_text,
    format_time,
    format_times,
    title,
)
from calor.server.thermo.graph import Edge

__all__ = [
    "CarriedState",
    "LinkTo",
    "MarkdownReader",
    "ParsedMemory",
    "parse_markdown",
    "render_header",
    "render_memory",
    "to_new_memory",
]


# ---------------------------------------------------------------------------- rendering


def render_header(channel: str, exported_at: float, count: int) -> str:
    """The top of an export: a heading naming the channel and a line of metadata."""
    noun = "memory" if count == 1 else "memories"
    return f"# Calor export: {channel}\n\nExported {format_time(exported_at)} · {count} {noun}\n\n"


def render_memory(
    record: MemoryRecord,
    heat: float,
    state: str,
    *,
    edges: Sequence[Edge] = (),
    interactions: int = 0,
) -> str:
    """One memory as a ``##`` section: a title, a metadata list, and the text in a fence.

    Args:
        record: The memory, as it stands (its state evolved to now).
        heat: Its current heat (shown; ``heat0`` at ``t0`` is what is imported).
        state: Its current state name.
        edges: Its edges to other memories of the same export.
        interactions: The channel's interactions since the memory's ``t0``.
    """
    lines = [
        f"## {title(record.text)}",
        f"- id: {record.id}",
        f"- type: {record.memory_type}",
        f"- heat: {heat:.2f}",
        f"- keystone: {'yes' if record.keystone else 'no'}",
        f"- state: {state}",
        f"- created: {format_time(record.created_at)}",
    ]
    if record.tags:
        lines.append(f"- tags: {format_tags(record.tags)}")
    if record.source != "agent":
        lines.append(f"- source: {record.source}")
    if record.confidence != "observed":
        lines.append(f"- confidence: {record.confidence}")
    lines.append(f"- importance: {format_number(record.importance)}")
    lines += _state_lines(record, edges, interactions)
    longest = max((len(run) for run in re.findall(r"`+", record.text)), default=0)
    fence = "`" * max(3, longest + 1)
    lines += ["", f"{fence}text", record.text, fence, "", ""]
    return "\n".join(lines)


def _state_lines(record: MemoryRecord, edges: Sequence[Edge], interactions: int) -> list[str]:
    """The carried state's lines, those at their defaults left out."""
    lines = []
    if record.provenance:
        lines.append(f"- provenance: {format_tags(record.provenance)}")
    lines += [
        f"- heat0: {format_number(record.heat0)}",
        f"- t0: {format_time(record.t0)}",
        f"- stability: {format_number(record.stability)}",
        f"- utility: {format_number(record.utility)}",
    ]
    optional = [
        ("recalls", record.recall_count, str(record.recall_count)),
        ("last_recalled", record.last_recalled_at is not None, _time(record.last_recalled_at)),
        ("recall_times", record.recall_times, format_times(record.recall_times)),
        ("confirmations", record.confirmations, str(record.confirmations)),
        ("valence", record.valence, format_number(record.valence)),
        ("surprise", record.surprise, format_number(record.surprise)),
        (
            "importance_adjustment",
            record.importance_adjustment,
            format_number(record.importance_adjustment),
        ),
        ("interactions_since_t0", interactions, str(interactions)),
        ("session", record.session, format_text(record.session)),
        ("updated", True, format_time(record.updated_at)),
        ("merged_into", record.merged_into, record.merged_into),
        ("merged_from", record.merged_from, ", ".join(record.merged_from)),
        ("edges", edges, format_edges(edges)),
        ("classifier", record.classifier_version, str(record.classifier_version)),
        (
            "entities",
            record.entities != extract_entities(record.text),
            format_names(record.entities),
        ),
    ]
    lines += [f"- {key}: {text}" for key, present, text in optional if present]
    return lines


def _time(at: float | None) -> str:
    return "" if at is None else format_time(at)


# ---------------------------------------------------------------------------- reading


def parse_markdown(document: str, *, channel: str) -> list[ParsedMemory]:
    """Every memory in a Markdown document: an export, a list of notes, or a mix.

    Args:
        document: The whole document.
        channel: The channel the memories are bound for; it must be named.

    Raises:
        InvalidArgumentError: A known metadata value is malformed, a memory's text is
            missing or empty, or a fenced block never closes; the message names the line.
    """
    if not channel:
        raise InvalidArgumentError("channel: a channel name is required")
    reader = MarkdownReader()
    return reader.feed(document) + reader.finish()


def to_new_memory(parsed: ParsedMemory, channel: str) -> NewMemory:
    """A parsed memory as a store command (a memory stored anew, whatever state the
    section carries); the caller still checks it against its limits.

    The exported id, when there is one, is kept as ``provenance["imported_id"]``.
    """
    provenance = dict(parsed.provenance)
    if parsed.original_id:
        provenance["imported_id"] = parsed.original_id
    return NewMemory(
        channel=channel,
        text=parsed.text,
        memory_type=parsed.memory_type,
        importance=parsed.importance,
        keystone=parsed.keystone,
        tags=dict(parsed.tags),
        source=parsed.source or "agent",
        confidence=parsed.confidence or "observed",
        idempotency_key="",
        created_at=parsed.created_at,
        provenance=provenance,
    )
