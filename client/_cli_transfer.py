"""The ``calor export`` and ``calor import`` commands: a channel to Markdown and back.

Both move whole channels, so they run without the per-call deadline, and draw a
progress bar on stderr when it is a terminal. Files are read and written as UTF-8
without newline translation, so a lone ``"\\r"`` in a memory's text survives the trip.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TextIO

import grpc
from google.protobuf.message import Message

from calor.client._progress import Progress, following, polled
from calor.client._transfer import DEFAULT_CHUNK_CHARS, export_total
from calor.client.client import CalorClient
from calor.client.errors import InvalidArgumentError
from calor.v1 import memory_service_pb2

__all__ = ["add_transfer_commands"]

_Handler = Callable[[CalorClient, argparse.Namespace], tuple[Message, str] | None]


def _export(client: CalorClient, args: argparse.Namespace) -> None:
    """Write the channel's Markdown to ``--out`` (or stdout), counting memories as they come.

    With ``--out FILE`` a one-line summary (or JSON) follows on stdout; a failed export
    removes the part of FILE it wrote, so no truncated export is left to import.
    """
    chunks = client.export(include_archived=args.include_archived)
    count = 0
    with Progress(label="export") as progress:
        # The header comes first: a refused call fails here, before FILE is touched.
        header = next(chunks, None)
        if header is not None:
            progress.set_total(export_total(header.markdown))
        with _output(args.out) as out:
            if header is not None:
                out.write(header.markdown)
            for chunk in chunks:
                out.write(chunk.markdown)
                count += chunk.memories
                progress.update(chunk.memories)
    if args.out in (None, "-"):
        return
    if args.json:
        print(json.dumps({"memories": count, "out": args.out}))
    else:
        print(f"exported {count} {_memories(count)} to {args.out}")


def _import(client: CalorClient, args: argparse.Namespace) -> tuple[Message, str]:
    """Send FILE (``-``: stdin) to the server in chunks; on a terminal, a bar follows the
    server's own count of the memories it has read, embedded and stored."""
    name = "stdin" if args.file == "-" else args.file
    token = secrets.token_urlsafe(12)
    with _input(args.file) as stream, Progress(label="import") as bar:
        with following(bar, polled(lambda: client.progress(token), _embedded)):
            ids = client.import_markdown(
                _blocks(stream, name, args.chunk_chars),
                chunk_chars=args.chunk_chars,
                remap_ids=args.remap_ids,
                progress_token=token,
            )
        bar.show(len(ids), len(ids), "done")
    response = memory_service_pb2.ImportResponse(ids=ids)
    return response, f"imported {len(ids)} {_memories(len(ids))}"


def _embedded(progress: memory_service_pb2.ProgressResponse) -> tuple[int, int, str]:
    """How far a write has come: embedded of the items it holds (of those received
    while the stream runs), and its phase."""
    return progress.embedded, progress.total or progress.received, progress.phase


def _memories(count: int) -> str:
    return "memory" if count == 1 else "memories"


def _blocks(stream: TextIO, name: str, chars: int) -> Iterator[str]:
    """The text of ``stream`` in blocks of ``chars`` characters.

    Raises:
        InvalidArgumentError: The file is not UTF-8 text.
    """
    while True:
        try:
            block = stream.read(chars)
        except UnicodeDecodeError as err:
            raise InvalidArgumentError(
                grpc.StatusCode.INVALID_ARGUMENT, f"{name} is not UTF-8 text ({err.reason})"
            ) from err
        if not block:
            return
        yield block


def _size(stream: TextIO) -> int | None:
    """The size in bytes of the file behind ``stream``; None for a pipe or a terminal."""
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):  # no file descriptor (a StringIO in its place)
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


@contextmanager
def _input(path: str) -> Iterator[TextIO]:
    """FILE, or stdin for ``-``, opened as UTF-8 (a byte-order mark skipped), newlines kept."""
    if path == "-":
        with _standard(sys.stdin, "r") as stream:
            yield stream
        return
    with open(path, encoding="utf-8-sig", newline="") as stream:
        yield stream


@contextmanager
def _output(path: str | None) -> Iterator[TextIO]:
    """FILE, or stdout for None or ``-``, for UTF-8 text with newlines kept.

    FILE is removed again if the block fails (or is interrupted).
    """
    if path in (None, "-"):
        with _standard(sys.stdout, "w") as stream:
            yield stream
        return
    assert path is not None
    with open(path, "w", encoding="utf-8", newline="") as stream:
        try:
            yield stream
        except BaseException:
            stream.close()
            Path(path).unlink(missing_ok=True)
            raise


@contextmanager
def _standard(stream: TextIO, mode: Literal["r", "w"]) -> Iterator[TextIO]:
    """stdin or stdout reopened on its descriptor as UTF-8 without newline translation.

    The descriptor stays open afterwards. A stream with no descriptor (a test's
    StringIO) is used as it is.
    """
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError):
        yield stream
        return
    if mode == "w":
        stream.flush()  # what was printed before goes first
    encoding = "utf-8-sig" if mode == "r" else "utf-8"
    with open(descriptor, mode, encoding=encoding, newline="", closefd=False) as reopened:
        yield reopened


def _chunk_chars(text: str) -> int:
    """A ``--chunk-chars`` argument: a whole number of characters, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def add_transfer_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], shared: argparse.ArgumentParser
) -> None:
    """Add ``calor export`` and ``calor import`` to the top-level commands.

    Args:
        commands: The top-level subparsers.
        shared: The parser of the global options, a parent of every command so that
            ``--channel``, ``--json`` and the others may follow the command too.
    """

    def command(name: str, handler: _Handler, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[shared], help=summary, description=summary)
        # A whole channel may take longer than one call's usual deadline.
        sub.set_defaults(handler=handler, call_timeout=None)
        return sub

    export = command("export", _export, "write the channel's memories out as Markdown")
    export.add_argument("--out", metavar="FILE", help="write to FILE ('-' or left out: stdout)")
    export.add_argument("--include-archived", action="store_true", help="archived memories too")

    imports = command(
        "import", _import, "store the memories of a Markdown file (an export, or a list of notes)"
    )
    imports.add_argument("file", metavar="FILE", help="the Markdown; '-' reads stdin")
    imports.add_argument(
        "--chunk-chars",
        type=_chunk_chars,
        default=DEFAULT_CHUNK_CHARS,
        metavar="N",
        help=f"characters per message sent (default {DEFAULT_CHUNK_CHARS})",
    )
    imports.add_argument(
        "--remap-ids",
        action="store_true",
        help="give the imported memories new ids (needed to import into a channel that"
        " holds the exported ones, e.g. its own)",
    )
