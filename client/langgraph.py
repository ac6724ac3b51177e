"""A LangGraph store kept in Calor (the ``calor[langgraph]`` extra).

Each namespace is a channel (its labels joined by ``.``), each item a memory whose text
is its value as JSON, keyed by the tag ``langgraph_key``. ``search`` with a query is a
Calor recall over every channel under the prefix, so what an agent keeps finding stays
warm and what it never uses cools, as every Calor memory does; without a query it lists
the items, newest first. Memories stored in those channels by other means are items
too: their key is the memory's id and their value ``{"text": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import unquote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from calor.client._credentials import PemSource
from calor.client.aio import AsyncCalorClient
from calor.client.client import CalorClient
from calor.client.errors import NotFoundError
from calor.v1 import memory_pb2

__all__ = ["KEY_TAG", "PUT_TAG", "CalorStore", "channel_of", "namespace_of"]

KEY_TAG = "langgraph_key"
"""The tag that holds an item's key on its memory."""
PUT_TAG = "langgraph_put_at"
"""The tag that holds when the item was last put (ISO 8601, the putting client's clock):
its ``updated_at``. A memory's own ``updated_at`` moves whenever Calor changes it (a
recall that warms it, a dream), which is not when its value changed."""

_HELD = ("active", "cold", "archived", "merged")  # not a ghost, not deleted
_HELD_STATES = frozenset(
    memory_pb2.MemoryState.Value(f"MEMORY_STATE_{state.upper()}") for state in _HELD
)
_PAGE = 1000
_MEMORY_ID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
_PLAIN = re.compile(r"[A-Za-z0-9_:@/-]")  # a channel name's characters but '.' and '+'
_ESCAPED = re.compile(r"\+([0-9A-F]{2})")
_T = TypeVar("_T")


def channel_of(namespace: tuple[str, ...]) -> str:
    """The channel that holds a namespace: its labels joined by ``.``, each character a
    channel name cannot hold written ``+XX`` (its UTF-8 bytes in hex).

    Raises:
        InvalidNamespaceError: The name would not start with a letter or digit, or is
            over 128 characters.
    """
    name = ".".join("".join(map(_escaped, label)) for label in namespace)
    if not name[:1].isascii() or not name[:1].isalnum() or len(name) > 128:
        raise InvalidNamespaceError(
            f"namespace {namespace!r} is not a Calor channel: it must start with a letter or "
            f"digit and take at most 128 characters once joined by '.' ({name[:40]!r})"
        )
    return name


def namespace_of(channel: str) -> tuple[str, ...]:
    """The namespace a channel holds (:func:`channel_of` read back)."""
    return tuple(_unescaped(label) for label in channel.split("."))


def _escaped(char: str) -> str:
    return char if _PLAIN.match(char) else "".join(f"+{b:02X}" for b in char.encode())


def _unescaped(label: str) -> str:
    return unquote(_ESCAPED.sub(r"%\1", label), errors="replace")  # no '%' in a channel


@dataclass
class _Call:
    """One client call a plan asks for: the method of both clients, and its arguments."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


_Plan = Generator[_Call, Any, _T]
"""The calls an operation makes, each answered by the client's reply (or its error,
thrown in), and what the operation returns: one plan for the sync and async stores."""


class CalorStore(BaseStore):
    """A LangGraph ``BaseStore`` on a Calor server: namespaces are channels, items are
    memories, and ``search(query=...)`` ranks by meaning and heat.

    Args:
        target: The server (default ``CALOR_TARGET``, else ``localhost:50051``).
        api_key: The key to call with (default ``CALOR_API_KEY``).
        tls, tls_ca, tls_cert, tls_key: As :class:`~calor.client.CalorClient` takes them.
        timeout: Seconds per call.
        peek: Search without warming what it finds (default False: a search is a recall).
        min_band: Leave out search hits whose band is below this (``"low"``, ``"mid"``,
            ``"high"``; default ``""`` keeps all).

    Items are embedded whole (their value's JSON): ``index`` is accepted and not used,
    and TTLs are not supported (heat is Calor's own forgetting).
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        api_key: str | None = None,
        tls: bool = False,
        tls_ca: PemSource | None = None,
        tls_cert: PemSource | None = None,
        tls_key: PemSource | None = None,
        timeout: float | None = 30.0,
        peek: bool = False,
        min_band: str = "",
    ) -> None:
        self._connection: dict[str, Any] = {
            "api_key": api_key,
            "tls": tls,
            "tls_ca": tls_ca,
            "tls_cert": tls_cert,
            "tls_key": tls_key,
            "timeout": timeout,
        }
        self._client = CalorClient(target, **self._connection)
        self._target = self._client.target
        self._async: tuple[asyncio.AbstractEventLoop, AsyncCalorClient] | None = None
        self._peek = peek
        self._min_band = min_band

    def close(self) -> None:
        """Close the connection of the sync calls (the async one closes with its loop)."""
        self._client.close()

    def __enter__(self) -> CalorStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order, each through the Calor server."""
        return [self._drive(self._plan(op)) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order, each through the Calor server, without blocking."""
        return [await self._adrive(self._plan(op)) for op in ops]

    def _drive(self, plan: _Plan[_T]) -> _T:
        reply: Any = None
        error: Exception | None = None
        try:
            while True:
                call = plan.throw(error) if error is not None else plan.send(reply)
                error = None
                try:
                    reply = getattr(self._client, call.method)(*call.args, **call.kwargs)
                except NotFoundError as missing:
                    error = missing
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _adrive(self, plan: _Plan[_T]) -> _T:
        client = self._async_client()
        reply: Any = None
        error: Exception | None = None
        try:
            while True:
                call = plan.throw(error) if error is not None else plan.send(reply)
                error = None
                try:
                    reply = await getattr(client, call.method)(*call.args, **call.kwargs)
                except NotFoundError as missing:
                    error = missing
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _async_client(self) -> AsyncCalorClient:
        """The async client of the running event loop (made on its first call there)."""
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            self._async = (loop, AsyncCalorClient(self._target, **self._connection))
        return self._async[1]

    def _plan(self, op: Op) -> _Plan[Result]:
        if isinstance(op, GetOp):
            return self._get(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, PutOp):
            return self._put(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        raise TypeError(f"CalorStore does not know the operation {type(op).__name__}")

    def _get(self, op: GetOp) -> _Plan[Item | None]:
        found = yield from _held(channel_of(op.namespace), op.key)
        return _item(found[0]) if found else None

    def _put(self, op: PutOp) -> _Plan[None]:
        channel = channel_of(op.namespace)
        found = yield from _held(channel, op.key)
        if op.value is None:
            if found:
                yield _Call("forget", ([memory.id for memory in found],), {"channel": channel})
            return None
        text = json.dumps(op.value, ensure_ascii=False)
        tags = {KEY_TAG: op.key, PUT_TAG: datetime.now(UTC).isoformat()}
        keyed = [memory for memory in found if memory.tags.get(KEY_TAG) == op.key]
        if not keyed:
            yield _Call("store", (text,), {"channel": channel, "tags": tags})
            return None
        newest, *older = keyed  # two puts of a new key at once made two: keep the newest
        tags = {**newest.tags, **tags}  # tags given through Calor stay
        yield _Call("update", (newest.id,), {"channel": channel, "text": text, "tags": tags})
        if older:
            yield _Call("forget", ([memory.id for memory in older],), {"channel": channel})
        return None

    def _search(self, op: SearchOp) -> _Plan[list[SearchItem]]:
        channels = yield from _channels_under(op.namespace_prefix)
        if not channels:
            return []
        wanted = op.offset + op.limit
        scored: list[tuple[memory_pb2.Memory, float | None]]
        if op.query:
            limit = min(wanted * 4 if op.filter else wanted, 1000)
            options = {"limit": limit, "peek": self._peek, "min_band": self._min_band}
            extra = {"channel": channels[0], "channels": channels[1:], **options}
            response = yield _Call("recall", (op.query,), extra)
            scored = [(hit.memory, hit.score) for hit in response.hits]
        else:
            memories: list[memory_pb2.Memory] = []
            for channel in channels:
                memories += yield from _listed(channel, {})
            memories.sort(key=_put_at, reverse=True)
            scored = [(memory, None) for memory in memories]
        items = (_search_item(memory, score) for memory, score in scored)
        matching = [item for item in items if _matches(item.value, op.filter or {})]
        return matching[op.offset : wanted]

    def _list_namespaces(self, op: ListNamespacesOp) -> _Plan[list[tuple[str, ...]]]:
        names = yield _Call("list_channels")
        conditions = op.match_conditions or ()
        every = (namespace_of(name) for name in names)
        shown = [ns for ns in every if all(_namespace_matches(c, ns) for c in conditions)]
        if op.max_depth is not None:
            shown = sorted({ns[: op.max_depth] for ns in shown})
        return shown[op.offset : op.offset + op.limit]


def _held(channel: str, key: str) -> _Plan[list[memory_pb2.Memory]]:
    """The memories that hold the item ``key`` of ``channel``, newest first: those tagged
    with it, or the memory whose id it is."""
    found = yield from _listed(channel, {KEY_TAG: key})
    if found or not _MEMORY_ID.match(key):
        return found
    try:
        inspected = yield _Call("inspect", (key,), {"channel": channel})
    except NotFoundError:
        return []
    memory = inspected.memory
    held = memory.state in _HELD_STATES and KEY_TAG not in memory.tags
    return [memory] if held else []


def _listed(channel: str, tags: Mapping[str, str]) -> _Plan[list[memory_pb2.Memory]]:
    """Every memory of a channel not forgotten with ``tags``, newest first."""
    memories: list[memory_pb2.Memory] = []
    token = ""
    while True:
        options = {"channel": channel, "tags": tags, "states": _HELD, "page_size": _PAGE}
        try:
            page = yield _Call("list_memories", (), {**options, "page_token": token})
        except NotFoundError:  # no such channel: nothing in it
            return []
        memories += page.memories
        token = page.next_page_token
        if not token:
            return sorted(memories, key=_put_at, reverse=True)


def _channels_under(prefix: tuple[str, ...]) -> _Plan[list[str]]:
    """The readable channels whose namespaces start with ``prefix``."""
    names = yield _Call("list_channels", (channel_of(prefix) if prefix else "",))
    return [name for name in names if namespace_of(name)[: len(prefix)] == prefix]


def _item(memory: memory_pb2.Memory) -> Item:
    key, value = _key_and_value(memory)
    created = memory.created_at.ToDatetime(tzinfo=UTC)
    return Item(
        value=value,
        key=key,
        namespace=namespace_of(memory.channel),
        created_at=created,
        updated_at=max(created, _put_at(memory)),
    )


def _search_item(memory: memory_pb2.Memory, score: float | None) -> SearchItem:
    item = _item(memory)
    return SearchItem(item.namespace, item.key, item.value, item.created_at, item.updated_at, score)


def _put_at(memory: memory_pb2.Memory) -> datetime:
    """When an item was last put; for a memory the store did not put, when it last
    changed."""
    try:
        return datetime.fromisoformat(memory.tags[PUT_TAG])
    except (KeyError, ValueError):
        return memory.updated_at.ToDatetime(tzinfo=UTC)


def _key_and_value(memory: memory_pb2.Memory) -> tuple[str, dict[str, Any]]:
    """An item's key and value: those the store put, or a plain memory's id and text."""
    key = memory.tags.get(KEY_TAG)
    if key is not None:
        try:
            value = json.loads(memory.text)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return key, value
    return key or memory.id, {"text": memory.text}


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether a namespace starts (``prefix``) or ends (``suffix``) with the condition's
    path, ``*`` matching any one label."""
    path = tuple(condition.path)
    if not path:
        return True
    if len(namespace) < len(path):
        return False
    labels = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(want in ("*", label) for want, label in zip(path, labels, strict=True))


def _matches(value: Any, condition: Any) -> bool:
    """Whether a value satisfies a search filter: equal values, nested dicts matched key
    by key, and the operators ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``."""
    if isinstance(condition, dict):
        if any(str(key).startswith("$") for key in condition):
            return all(_compared(value, op, operand) for op, operand in condition.items())
        return isinstance(value, dict) and all(
            _matches(value.get(key), wanted) for key, wanted in condition.items()
        )
    if isinstance(condition, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(condition)
            and all(_matches(v, c) for v, c in zip(value, condition, strict=True))
        )
    return bool(value == condition)


_ORDERED = {
    "$gt": lambda left, right: left > right,
    "$gte": lambda left, right: left >= right,
    "$lt": lambda left, right: left < right,
    "$lte": lambda left, right: left <= right,
}


def _compared(value: Any, operator: str, operand: Any) -> bool:
    """One ``$`` operator of a filter applied to a value (numbers compared as numbers)."""
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    if operator not in _ORDERED:
        raise ValueError(f"filter: unknown operator {operator!r} ($eq $ne $gt $gte $lt $lte)")
    try:
        return bool(_ORDERED[operator](float(value), float(operand)))
    except (TypeError, ValueError):
        return False
