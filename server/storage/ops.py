"""Operations: the plain, serialisable unit in which every change to a channel is said.

A change is a list of operations on one channel (a :class:`ChangeList`). The store
turns the list into keys of one atomic write batch; once that batch is durable, the
channel's in-memory view applies the same list. Nothing here touches either: these are
records, and :func:`encode` and :func:`decode` carry them as JSON (the form a
replicated log would hold).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calor.server.events import EventRecord
from calor.server.records import MemoryRecord
from calor.server.thermo.channel_state import ChannelState
from calor.server.thermo.policy import ChannelPolicy

__all__ = [
    "AddMemory",
    "ChangeList",
    "DeleteKey",
    "DeleteRange",
    "DropChannel",
    "DropVector",
    "Forget",
    "Link",
    "Log",
    "OpenConflict",
    "Operation",
    "PutKey",
    "PutMemory",
    "Quote",
    "SetHeat",
    "SetPolicy",
    "SetState",
    "SettleConflict",
    "StageVector",
    "Unlink",
    "decode",
    "encode",
    "vector_bytes",
    "vector_from",
]


@dataclass(frozen=True)
class AddMemory:
    """A new memory with its embedding (and its idempotency key, if it has one);
    ``staged`` when the embedding was written ahead (:class:`StageVector`)."""

    record: MemoryRecord
    vector: np.ndarray
    staged: bool = False


@dataclass(frozen=True)
class PutMemory:
    """A changed memory; ``vector`` when its embedding changed too."""

    record: MemoryRecord
    vector: np.ndarray | None = None


@dataclass(frozen=True)
class SetHeat:
    """Memories whose heat alone changed (resonance): each one's heat is materialised
    at ``at`` as ``heat0``, with the channel's interaction count then; nothing else
    about them changes. Kept beside the record (:mod:`calor.server.storage.heats`)
    until the record is written whole again.

    Only for heat that rises on memories that are ACTIVE and stay so: any other change
    (a state, a type) is a :class:`PutMemory`.
    """

    memory_ids: tuple[str, ...]
    heat0: tuple[float, ...]
    at: float
    interactions: int


@dataclass(frozen=True)
class Forget:
    """A memory becomes a tombstone: its record without text, and no embedding; whatever
    quoted its text (:class:`Quote`, logged events) is rewritten without it."""

    record: MemoryRecord


@dataclass(frozen=True)
class DropChannel:
    """The whole channel goes: every key it owns, and whatever quoted its memories' texts
    is rewritten without them."""


@dataclass(frozen=True)
class Link:
    """An undirected edge between two memories, made or re-weighted."""

    a: str
    b: str
    kind: str
    weight: float


@dataclass(frozen=True)
class Unlink:
    """An undirected edge dropped."""

    a: str
    b: str
    kind: str


@dataclass(frozen=True)
class OpenConflict:
    """Two memories found to contradict each other, and why."""

    a: str
    b: str
    reason: str


@dataclass(frozen=True)
class SettleConflict:
    """An open conflict between two memories closed."""

    a: str
    b: str


@dataclass(frozen=True)
class SetState:
    """The channel's own state (heat, interactions, entropy, sweeps) from now on."""

    state: ChannelState


@dataclass(frozen=True)
class SetPolicy:
    """The channel's settings from now on."""

    policy: ChannelPolicy


@dataclass(frozen=True)
class Log:
    """An event for the log; it is numbered when its batch commits."""

    event: EventRecord


@dataclass(frozen=True)
class StageVector:
    """An embedding written ahead of its memory's record (a bulk store's first part)."""

    memory_id: str
    vector: np.ndarray


@dataclass(frozen=True)
class DropVector:
    """An embedding whose memory was never written, dropped."""

    memory_id: str


@dataclass(frozen=True)
class PutKey:
    """Bookkeeping of another component (the trigger engine), under a key from
    :class:`calor.server.storage.store.Keys`."""

    key: bytes
    value: bytes


@dataclass(frozen=True)
class DeleteKey:
    """Bookkeeping of another component dropped."""

    key: bytes


@dataclass(frozen=True)
class DeleteRange:
    """Bookkeeping of another component dropped: every key from ``start`` up to, not
    including, ``end``."""

    start: bytes
    end: bytes


@dataclass(frozen=True)
class Quote:
    """Bookkeeping that carries a memory's text (a webhook delivery): written as ``value``,
    and as ``scrubbed`` once the memory of ``channel`` is forgotten (at once, if it is by
    the time this commits)."""

    channel: str
    memory_id: str
    key: bytes
    value: bytes
    scrubbed: bytes


Operation = (
    AddMemory
    | PutMemory
    | SetHeat
    | Forget
    | Link
    | Unlink
    | OpenConflict
    | SettleConflict
    | SetState
    | SetPolicy
    | Log
    | StageVector
    | DropVector
    | PutKey
    | DeleteKey
    | DeleteRange
    | Quote
    | DropChannel
)


@dataclass
class ChangeList:
    """The operations of one change to one channel, in the order they were said.

    ``channel`` is "" for bookkeeping that belongs to no channel.
    """

    channel: str
    ops: list[Operation] = field(default_factory=list)


# --- JSON ----------------------------------------------------------------------------

_NAMES: dict[type, str] = {
    AddMemory: "add_memory",
    PutMemory: "put_memory",
    SetHeat: "set_heat",
    Forget: "forget",
    Link: "link",
    Unlink: "unlink",
    OpenConflict: "open_conflict",
    SettleConflict: "settle_conflict",
    SetState: "set_state",
    SetPolicy: "set_policy",
    Log: "log",
    StageVector: "stage_vector",
    DropVector: "drop_vector",
    PutKey: "put_key",
    DeleteKey: "delete_key",
    DeleteRange: "delete_range",
    Quote: "quote",
    DropChannel: "drop_channel",
}
_TYPES = {name: kind for kind, name in _NAMES.items()}
_BYTES = frozenset({"key", "value", "scrubbed", "start", "end"})  # carried in base64


def vector_bytes(vector: np.ndarray) -> bytes:
    """An embedding as stored and carried: float32, little-endian."""
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


def vector_from(data: bytes) -> np.ndarray:
    """An embedding from :func:`vector_bytes`."""
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def _vector_out(vector: np.ndarray | None) -> str | None:
    if vector is None:
        return None
    return base64.b64encode(vector_bytes(vector)).decode()


def _vector_in(text: str | None) -> np.ndarray | None:
    if text is None:
        return None
    return vector_from(base64.b64decode(text))


def _bytes_out(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _op_out(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {"op": _NAMES[type(op)]}
    for name, value in op.__dict__.items():
        if isinstance(value, MemoryRecord | EventRecord | ChannelState | ChannelPolicy):
            out[name] = json.loads(value.to_json())
        elif isinstance(value, np.ndarray):
            out[name] = _vector_out(value)
        elif isinstance(value, bytes):
            out[name] = _bytes_out(value)
        else:
            out[name] = value
    return out


def _op_in(raw: dict[str, Any]) -> Operation:
    kind = _TYPES[raw.pop("op")]
    fields: dict[str, Any] = {}
    for name, value in raw.items():
        if name == "record":
            fields[name] = MemoryRecord.from_json(json.dumps(value).encode())
        elif name == "event":
            fields[name] = EventRecord.from_json(json.dumps(value).encode())
        elif name == "state":
            fields[name] = ChannelState.from_json(json.dumps(value).encode())
        elif name == "policy":
            fields[name] = ChannelPolicy.from_json(json.dumps(value).encode())
        elif name == "vector":
            fields[name] = _vector_in(value)
        elif name in _BYTES:
            fields[name] = base64.b64decode(value)
        elif isinstance(value, list):
            fields[name] = tuple(value)
        else:
            fields[name] = value
    op: Operation = kind(**fields)
    return op


def encode(change: ChangeList) -> bytes:
    """A change list as JSON (embeddings and keys in base64)."""
    ops = [_op_out(op) for op in change.ops]
    return json.dumps({"channel": change.channel, "ops": ops}, separators=(",", ":")).encode()


def decode(data: bytes) -> ChangeList:
    """A change list from :func:`encode`."""
    raw = json.loads(data)
    return ChangeList(raw["channel"], [_op_in(op) for op in raw["ops"]])
