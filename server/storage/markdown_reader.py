"""Reading the Markdown format as it streams in: ``MarkdownReader`` yields ``ParsedMemory``s.

The format, and how forgiving reading is, are described in :mod:`calor.server.storage.markdown`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from calor.server.errors import FailedPreconditionError, InvalidArgumentError
from calor.server.storage.markdown_memory import MEMORY_KEYS, ParsedMemory, read_fields

__all__ = ["MarkdownReader", "ParsedMemory"]

_HEADING_RE = re.compile(r"^#{1,6}(?:[ \t]|$)")
_SECTION_RE = re.compile(r"^##(?:[ \t]|$)")
_FENCE_RE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_BULLET_RE = re.compile(
    r"^(?P<indent> {0,3})(?P<marker>[-*+]|[0-9]{1,9}[.)])(?P<gap>[ \t]+|$)(?P<rest>.*)$"
)
_META_RE = re.compile(
    r"^ {0,3}[-*+][ \t]+(?P<key>[A-Za-z][A-Za-z0-9_-]*)[ \t]*:(?:[ \t](?P<value>.*))?$"
)


@dataclass(frozen=True)
class _Fence:
    """An open fenced block: its character and length, and whether its lines end in CR LF."""

    char: str
    length: int
    crlf: bool = False

    def closes(self, line: str) -> bool:
        """Whether ``line`` is a closing fence for this block (CommonMark's rule)."""
        body = line.lstrip(" ")
        if len(line) - len(body) > 3:
            return False
        run = len(body) - len(body.lstrip(self.char))
        return run >= self.length and not body[run:].strip(" \t")


def _open_fence(line: str, crlf: bool = False) -> _Fence | None:
    match = _FENCE_RE.match(line)
    if match is None or (match["fence"][0] == "`" and "`" in match["info"]):
        return None
    return _Fence(match["fence"][0], len(match["fence"]), crlf)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


@dataclass
class _Note:
    """A bullet being read: where its marker and its text start, and its lines so far."""

    line: int
    marker: int
    content: int
    lines: list[str]
    blanks: int = 0


class _NoteReader:
    """Bullets outside memory sections: each top-level bullet, with its indented lines, is one.

    A deeper-indented line (nested bullets included) continues the open bullet, blank lines
    inside it kept; a bullet at the same or a shallower indent starts the next one; any other
    line ends it. Fenced blocks outside bullets are skipped whole.
    """

    def __init__(self, max_chars: int) -> None:
        self._max = max_chars
        self._note: _Note | None = None
        self._chars = 0
        self._skipping: _Fence | None = None
        self._skip_line = 0

    @property
    def in_fence(self) -> bool:
        """Whether a skipped fenced block is open (headings inside it are not headings)."""
        return self._skipping is not None

    def line(self, number: int, line: str) -> ParsedMemory | None:
        """Read one line; returns a note it completed, if any."""
        if self._skipping is not None:
            if self._skipping.closes(line):
                self._skipping = None
            return None
        text = line.expandtabs(4)
        note = self._note
        if not text.strip():
            if note is not None:
                note.blanks += 1
            return None
        if note is not None and _indent(text) > note.marker:
            self._continue(note, number, text)
            return None
        done = self.close()
        bullet = _BULLET_RE.match(text)
        if bullet is not None:
            gap = len(bullet["gap"])
            start = len(bullet["indent"]) + len(bullet["marker"])
            content = start + (gap if 1 <= gap <= 4 else 1)
            self._note = _Note(number, len(bullet["indent"]), content, [bullet["rest"].rstrip()])
            self._count(number, len(text))
        elif (fence := _open_fence(text)) is not None:
            self._skipping, self._skip_line = fence, number
        return done

    def _continue(self, note: _Note, number: int, text: str) -> None:
        note.lines += [""] * note.blanks
        note.blanks = 0
        note.lines.append(text[min(_indent(text), note.content) :].rstrip())
        self._count(number, len(text))

    def _count(self, number: int, chars: int) -> None:
        self._chars += chars + 1
        if self._chars > self._max:
            raise InvalidArgumentError(f"line {number}: a note runs past {self._max} characters")

    def close(self) -> ParsedMemory | None:
        """End the open bullet (a heading or the end came); returns it unless it is blank."""
        note, self._note, self._chars = self._note, None, 0
        if note is None:
            return None
        text = "\n".join(note.lines).strip("\n")
        return ParsedMemory(text=text, line=note.line) if text.strip() else None

    def finish(self) -> ParsedMemory | None:
        """The last bullet; a skipped fenced block still open hides the rest, so it is an error."""
        if self._skipping is not None:
            raise InvalidArgumentError(
                f"line {self._skip_line}: the fenced block opened here is never closed"
            )
        return self.close()


class _Mode(Enum):
    LOOSE = "loose"  # outside a memory section: bullets are notes, prose is ignored
    META = "meta"  # under a ## heading, reading "- key: value" lines
    FENCE = "fence"  # inside a memory's fenced text
    BODY = "body"  # a hand-written section's unfenced text, up to the next heading


class MarkdownReader:
    """Reads Markdown as it streams in and hands back each memory once it is complete.

    Chunks may split the document anywhere. A section is complete when its fenced text
    closes, when the next heading starts, or at :meth:`finish`; a bullet when the next
    line that does not continue it arrives. Malformed metadata raises
    :class:`InvalidArgumentError` naming the line.

    Args:
        max_block_chars: The most characters one memory (its metadata and text) or one line
            may take while it is being read, so a stream cannot grow the reader without bound.
    """

    def __init__(self, *, max_block_chars: int = 1 << 20) -> None:
        self._max = max_block_chars
        self._pieces: list[str] = []
        self._pending = 0
        self._line_no = 0
        self._finished = False
        self._out: list[ParsedMemory] = []
        self._mode = _Mode.LOOSE
        self._notes = _NoteReader(max_block_chars)
        self._section_line = 0
        self._meta: list[tuple[int, str]] = []
        self._known = False
        self._bulleted = False
        self._fields: dict[str, Any] = {}
        self._fence: _Fence | None = None
        self._fence_line = 0
        self._block: list[str] = []
        self._held = 0

    def feed(self, chunk: str) -> list[ParsedMemory]:
        """Read a chunk; returns the memories it completed, in document order."""
        if self._finished:
            raise FailedPreconditionError("markdown: the reader has already finished")
        if "\n" not in chunk:
            self._pieces.append(chunk)
            self._pending += len(chunk)
            if self._pending > self._max:
                raise InvalidArgumentError(
                    f"line {self._line_no + 1}: longer than {self._max} characters"
                )
            return []
        lines = ("".join(self._pieces) + chunk).split("\n")
        tail = lines.pop()
        self._pieces, self._pending = [tail], len(tail)
        for line in lines:
            self._read_line(line)
        return self._take()

    def finish(self) -> list[ParsedMemory]:
        """End the document; returns the memories still open. Calling it again returns []."""
        if not self._finished:
            self._finished = True
            tail = "".join(self._pieces)
            self._pieces = []
            if tail:
                self._read_line(tail)
            self._end_block()
            self._emit(self._notes.finish())
        return self._take()

    def _take(self) -> list[ParsedMemory]:
        out, self._out = self._out, []
        return out

    def _emit(self, memory: ParsedMemory | None) -> None:
        if memory is not None:
            self._out.append(memory)

    def _hold(self, line: str) -> None:
        self._held += len(line) + 1
        if self._held > self._max:
            raise InvalidArgumentError(
                f"line {self._line_no}: the memory runs past {self._max} characters"
            )

    def _read_line(self, raw: str) -> None:
        self._line_no += 1
        if self._mode is _Mode.FENCE and self._fence is not None:
            self._fence_text(self._fence, raw)
            return
        line = raw.removesuffix("\r")
        nested_fence = self._notes.in_fence or (
            self._mode is _Mode.BODY and self._fence is not None
        )
        if not nested_fence and _HEADING_RE.match(line):
            self._heading(line)
        elif self._mode is _Mode.META:
            self._meta_line(line, raw.endswith("\r"))
        elif self._mode is _Mode.BODY:
            self._body_line(line)
        else:
            self._emit(self._notes.line(self._line_no, line))

    def _heading(self, line: str) -> None:
        self._end_block()
        self._emit(self._notes.close())
        if _SECTION_RE.match(line):
            self._mode = _Mode.META
            self._section_line = self._line_no
            self._meta, self._known, self._bulleted, self._held = [], False, False, 0
        else:
            self._mode = _Mode.LOOSE

    def _end_block(self) -> None:
        """Close what a heading or the end of the document interrupts."""
        if self._mode is _Mode.FENCE:
            raise InvalidArgumentError(
                f"line {self._fence_line}: the text block opened here is never closed"
            )
        if self._mode is _Mode.META:
            if self._known:
                raise InvalidArgumentError(
                    f"line {self._section_line}: the memory under this heading has no text"
                    " (put it in a ```text block after the metadata)"
                )
            self._replay_meta()
        elif self._mode is _Mode.BODY:
            while self._block and not self._block[-1].strip():
                self._block.pop()
            self._emit_memory("\n".join(self._block))
        self._mode = _Mode.LOOSE

    def _meta_line(self, line: str, crlf: bool) -> None:
        fence = _open_fence(line, crlf)
        meta = _META_RE.match(line)
        if fence is not None:
            self._fields = self._parse_meta()
            self._mode, self._fence, self._fence_line = _Mode.FENCE, fence, self._line_no
            self._block, self._held = [], 0
        elif self._opening(line, meta):
            # Kept until the section shows whether it is a memory or a plain heading over notes.
            if meta is not None:
                self._bulleted = True
                self._known = self._known or meta["key"] in MEMORY_KEYS
            self._hold(line)
            self._meta.append((self._line_no, line))
        elif self._known:
            self._fields = self._parse_meta()
            self._mode, self._fence, self._block = _Mode.BODY, None, []
            self._body_line(line)
        else:
            self._replay_meta()
            self._mode = _Mode.LOOSE
            self._emit(self._notes.line(self._line_no, line))

    def _opening(self, line: str, meta: re.Match[str] | None) -> bool:
        """Whether a line is metadata, blank, prose before the first bullet, or a continuation."""
        if meta is not None or not line.strip():
            return True
        if not self._bulleted:
            return _BULLET_RE.match(line) is None
        return line[:1] in " \t"

    def _replay_meta(self) -> None:
        """A plain heading after all: its bullets are notes."""
        for number, line in self._meta:
            self._emit(self._notes.line(number, line))
        self._meta = []

    def _parse_meta(self) -> dict[str, Any]:
        entries = [
            (number, match["key"], match["value"] or "")
            for number, line in self._meta
            if (match := _META_RE.match(line)) is not None
        ]
        self._meta = []
        return read_fields(entries)

    def _fence_text(self, fence: _Fence, raw: str) -> None:
        if fence.closes(raw.removesuffix("\r")):
            self._emit_memory("\n".join(self._block))
            self._mode, self._fence = _Mode.LOOSE, None
            return
        # A document saved with CR LF endings: its text lines carry one CR more than the text.
        line = raw.removesuffix("\r") if fence.crlf else raw
        self._hold(line)
        self._block.append(line)

    def _body_line(self, line: str) -> None:
        if self._fence is None:
            self._fence = _open_fence(line)
        elif self._fence.closes(line):
            self._fence = None
        self._hold(line)
        self._block.append(line)

    def _emit_memory(self, text: str) -> None:
        if not text.strip():
            raise InvalidArgumentError(
                f"line {self._section_line}: the memory under this heading has empty text"
            )
        self._out.append(ParsedMemory(text=text, line=self._section_line, **self._fields))
        self._block, self._fields, self._held = [], {}, 0
