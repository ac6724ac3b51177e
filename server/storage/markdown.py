"""The Markdown form of a channel's memories: rendered for ``Export``, parsed for ``Import``."""

# The format, as ``render_header`` and ``render_memory`` write it:
#
#     # Calor export: agent-7
#
#     Exported 2026-03-01T09:00:00Z · 2 memories
#
#     ## Alice is allergic to peanuts
#     - id: 01JNK3V7M8Q2W4X6Y8Z0A1B2C3
#     - type: core
#     - heat: 0.94
#     - keystone: yes
#     - state: active
#     - created: 2026-03-01T09:00:00Z
#     - tags: person=alice, topic=health
#     - source: human
#     - importance: 0.62
#
#     ```text
#     Alice is allergic to peanuts.
#     ```
#
# The text is the fenced block, verbatim; its fence is one backtick longer than the longest
# backtick run in the text (at least three), so no line of the text can close it. The title
# is decoration. ``heat`` and ``state`` are informative. ``source``, ``confidence`` and
# ``tags`` are left out at their defaults (agent, observed, none).
#
# Reading is forgiving, for documents people write: a bullet outside a memory section
# (``- note``, ``* note``, ``1. note``, continued by indented lines) is one memory without
# metadata; a ``##`` heading with no known metadata key and no fenced block is a plain
# heading, its bullets notes; a section with metadata but no fence takes the lines up to the
# next heading as its text. Any other prose is ignored.

from __future__ import annotations

import re

from calor.server.commands import NewMemory
from calor.server.errors import InvalidArgumentError
from calor.server.records import MemoryRecord
from calor.server.storage.markdown_reader import MarkdownReader, ParsedMemory
from calor.server.storage.markdown_values import format_tags, format_time, title

__all__ = [
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


def render_memory(record: MemoryRecord, heat: float, state: str) -> str:
    """One memory as a ``##`` section: a title, a metadata list, and the text in a fence.

    Args:
        record: The memory.
        heat: Its current heat (shown, not imported).
        state: Its current state name (shown, not imported).
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
    lines.append(f"- importance: {float(record.importance)!r}")
    longest = max((len(run) for run in re.findall(r"`+", record.text)), default=0)
    fence = "`" * max(3, longest + 1)
    lines += ["", f"{fence}text", record.text, fence, "", ""]
    return "\n".join(lines)


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
    """A parsed memory as a store command; the caller still checks it against its limits.

    The exported id, when there is one, is kept as ``provenance["imported_id"]``.
    """
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
        provenance={"imported_id": parsed.original_id} if parsed.original_id else {},
    )
