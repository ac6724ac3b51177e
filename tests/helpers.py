"""Small builders shared by the end-to-end tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp

from calor.server.events import EventRecord
from calor.server.storage.batch import PendingBatch, put_ops
from calor.server.storage.ops import ChangeList
from calor.server.storage.store import MemoryStore
from calor.triggers.rules import TriggerRule
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub

EPISODIC = memory_pb2.MEMORY_TYPE_EPISODIC
FACT = memory_pb2.MEMORY_TYPE_FACT
CORE = memory_pb2.MEMORY_TYPE_CORE
SEMANTIC = memory_pb2.MEMORY_TYPE_SEMANTIC
DAY = 86_400.0
# ``calor`` run in-process by the ``calor`` fixture: (exit status, stdout, stderr).
Run = Callable[..., tuple[int, str, str]]
# Copies of ../shared/vectors (the seed tables of the design), so a clone alone runs the
# suite; test_seed_copies.py checks they still match the originals when those are there.
VECTORS = Path(__file__).resolve().parent / "data" / "vectors"


def ts(when: float | datetime) -> Timestamp:
    """A Timestamp from epoch seconds or an aware datetime."""
    stamp = Timestamp()
    seconds = when.timestamp() if isinstance(when, datetime) else when
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def utc(text: str) -> datetime:
    """An aware UTC datetime from ISO text."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def store(stub: MemoryServiceStub, channel: str, text: str, **fields: object) -> memory_pb2.Memory:
    """Store one memory and return it."""
    return stub.Store(pb.StoreRequest(channel=channel, text=text, **fields)).memory  # type: ignore[arg-type]


def update_settings(
    channel: grpc.Channel, name: str, **fields: object
) -> memory_pb2.ChannelSettings:
    """Set the ChannelSettings fields given (and only those) of channel ``name``; the
    settings that result."""
    return (
        SettingsServiceStub(channel)
        .UpdateSettings(
            spb.UpdateSettingsRequest(
                channel=name,
                settings=memory_pb2.ChannelSettings(**fields),  # type: ignore[arg-type]
                update_mask=FieldMask(paths=list(fields)),
            )
        )
        .settings
    )


def total(stub: MemoryServiceStub, channel: str) -> int:
    """How many live memories a channel holds."""
    return stub.Identity(pb.IdentityRequest(channel=channel)).total


def texts(response: pb.RecallResponse) -> list[str]:
    """The texts of the hits, best first."""
    return [hit.memory.text for hit in response.hits]


class CrashAfter:
    """Wraps a store so that after ``budget`` commits every batch fails: the process died
    there, and nothing it did afterwards reached the disk."""

    def __init__(self, store: MemoryStore, budget: int) -> None:
        self._store = store
        self.budget = budget
        self.refused = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def write(self, changes: Sequence[ChangeList]) -> list[EventRecord]:
        held = self._store.open_batch()
        for change in changes:
            put_ops(held, change)
        return self.write_batch(held)

    def write_batch(self, held: PendingBatch, *, synced: bool = True) -> list[EventRecord]:
        if self.budget <= 0:
            self.refused += 1
            raise OSError("injected crash")
        self.budget -= 1
        return self._store.write_batch(held, synced=synced)


def trigger_rule(**fields: Any) -> TriggerRule:
    """A notify-on-store rule with no filters or limits, with ``fields`` changed."""
    base = TriggerRule(
        id="trg_1",
        channel="team",
        event="on_store",
        action="notify",
        config={},
        filter_memory_type=None,
        filter_pattern="",
        filter_heat_above=None,
        filter_heat_below=None,
        max_fires=0,
        cooldown_seconds=0.0,
        threshold=None,
        created_at=0.0,
    )
    return dataclasses.replace(base, **fields)
