"""What the sync and async clients share for ``Export`` and ``Import``.

``Export`` streams a channel out as Markdown: first a header whose text counts the
memories (``· 3 memories``), then chunks of rendered sections, each message saying how
many sections it holds. ``Import`` takes Markdown in as a client stream: the first
message names the channel (and asks to remap ids, if it does), the rest carry only
text, and the server imports everything or nothing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, Generic, TypeVar

import grpc

from calor.client.errors import InvalidArgumentError
from calor.v1 import memory_service_pb2

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "Chunker",
    "GuardedRequests",
    "MarkdownSource",
    "aimport_requests",
    "export_request",
    "export_total",
    "import_requests",
]

DEFAULT_CHUNK_CHARS = 65_536
"""Characters of Markdown per ``ImportRequest``: at most 256 KiB of UTF-8, far below
gRPC's 4 MiB message limit."""

MarkdownSource = str | Iterable[str]
"""Markdown to import: the whole text, or pieces of it in order (a text file's lines)."""

_TOTAL_RE = re.compile(r"·\s*(\d[\d,]*)\s+memor(?:y|ies)\b")

_R = TypeVar("_R")


def export_request(channel: str, include_archived: bool) -> memory_service_pb2.ExportRequest:
    """The ``ExportRequest`` for a channel; archived memories only when asked."""
    return memory_service_pb2.ExportRequest(channel=channel, include_archived=include_archived)


def export_total(header: str) -> int | None:
    """How many memories an export holds, read from its header message.

    The header reads ``Exported 2026-03-01T09:00:00Z · 2 memories``; None when the
    text holds no such count.
    """
    match = _TOTAL_RE.search(header)
    return int(match.group(1).replace(",", "")) if match else None


class Chunker:
    """Cuts text that comes in pieces of any size into chunks of exactly ``chunk_chars``
    characters (the last one shorter): small pieces are joined, long ones split.

    Args:
        chunk_chars: The characters per chunk, at least 1.

    Raises:
        InvalidArgumentError: ``chunk_chars`` is less than 1.
    """

    def __init__(self, chunk_chars: int) -> None:
        if chunk_chars < 1:
            raise InvalidArgumentError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"chunk_chars must be 1 or more, got {chunk_chars}",
            )
        self._size = chunk_chars
        self._pending: list[str] = []
        self._length = 0

    def feed(self, piece: str) -> Iterator[str]:
        """The chunks that ``piece`` completes; exhaust it before the next feed."""
        start = 0
        while start < len(piece):
            # Slicing by offsets copies each character once, even out of a huge piece.
            head = piece[start : start + self._size - self._length]
            start += len(head)
            self._pending.append(head)
            self._length += len(head)
            if self._length == self._size:
                yield self._take()

    def finish(self) -> Iterator[str]:
        """The last, short chunk, if any text is left."""
        if self._pending:
            yield self._take()

    def chunks(self, source: MarkdownSource) -> Iterator[str]:
        """Every chunk of ``source``, a whole text or its pieces in order."""
        for piece in (source,) if isinstance(source, str) else source:
            yield from self.feed(piece)
        yield from self.finish()

    async def achunks(self, source: MarkdownSource | AsyncIterable[str]) -> AsyncIterator[str]:
        """Every chunk of ``source``, which may also be an async iterable of pieces."""
        if isinstance(source, AsyncIterable):
            async for piece in source:
                for chunk in self.feed(piece):
                    yield chunk
            for chunk in self.finish():
                yield chunk
        else:
            for chunk in self.chunks(source):
                yield chunk

    def _take(self) -> str:
        chunk = "".join(self._pending)
        self._pending, self._length = [], 0
        return chunk


def _request(
    channel: str, chunk: str, first: bool, remap_ids: bool, progress_token: str
) -> memory_service_pb2.ImportRequest:
    """One message of an import: only the first names the channel, asks to remap ids and
    names the progress token."""
    if not first:
        return memory_service_pb2.ImportRequest(markdown=chunk)
    return memory_service_pb2.ImportRequest(
        channel=channel, markdown=chunk, remap_ids=remap_ids, progress_token=progress_token
    )


def import_requests(
    channel: str,
    source: MarkdownSource,
    chunk_chars: int,
    remap_ids: bool = False,
    progress_token: str = "",
) -> Iterator[memory_service_pb2.ImportRequest]:
    """The messages of one ``Import`` call, made as the stream pulls them.

    An empty source still sends one message naming the channel, so that the server
    answers for it (an import of nothing is refused).

    Raises:
        InvalidArgumentError: ``chunk_chars`` is less than 1 (at once, not when iterated).
    """
    chunker = Chunker(chunk_chars)

    def requests() -> Iterator[memory_service_pb2.ImportRequest]:
        first = True
        for chunk in chunker.chunks(source):
            yield _request(channel, chunk, first, remap_ids, progress_token)
            first = False
        if first:
            yield _request(channel, "", first, remap_ids, progress_token)

    return requests()


def aimport_requests(
    channel: str,
    source: MarkdownSource | AsyncIterable[str],
    chunk_chars: int,
    remap_ids: bool = False,
    progress_token: str = "",
) -> AsyncGenerator[memory_service_pb2.ImportRequest, None]:
    """:func:`import_requests` for the async client, whose source may be async too.

    Raises:
        InvalidArgumentError: ``chunk_chars`` is less than 1 (at once, not when iterated).
    """
    chunker = Chunker(chunk_chars)

    async def requests() -> AsyncGenerator[memory_service_pb2.ImportRequest, None]:
        first = True
        async for chunk in chunker.achunks(source):
            yield _request(channel, chunk, first, remap_ids, progress_token)
            first = False
        if first:
            yield _request(channel, "", first, remap_ids, progress_token)

    return requests()


class GuardedRequests(Generic[_R]):
    """The request iterator of a blocking client-streaming call, guarded against its source.

    gRPC pulls the requests on a thread of its own; when pulling raises (a file that is
    not UTF-8, a disk error), gRPC would log the error and end the call as UNKNOWN. This
    wrapper keeps the exception in :attr:`error` and cancels the call instead, so that
    the caller's thread can raise the exception itself.

    Usage: make the call with ``.future(guarded, …)``, then :meth:`attach` the future.

    Attributes:
        error: What the source raised, if it raised.
    """

    def __init__(self, requests: Iterator[_R]) -> None:
        self._requests = requests
        self._call: grpc.Future[Any] | None = None
        self._attached = threading.Event()
        self.error: Exception | None = None

    def attach(self, call: grpc.Future[Any]) -> None:
        """Name the call to cancel should the source fail."""
        self._call = call
        self._attached.set()

    def __iter__(self) -> GuardedRequests[_R]:
        return self

    def __next__(self) -> _R:
        try:
            return next(self._requests)
        except StopIteration:
            raise
        except Exception as err:  # whatever the source raised, for the caller to raise
            self.error = err
            # gRPC's thread may pull before .future() has returned the call to attach.
            self._attached.wait()
            assert self._call is not None
            self._call.cancel()  # cancelled first, so ending the stream cannot commit it
            raise StopIteration from None
