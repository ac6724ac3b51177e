"""Export → Import through the protos reproduces a channel (DESIGN §6, §9)."""

from __future__ import annotations

import random
import time

import grpc
import pytest

from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.helpers import ts

TYPES = [
    memory_pb2.MEMORY_TYPE_EPISODIC,
    memory_pb2.MEMORY_TYPE_SEMANTIC,
    memory_pb2.MEMORY_TYPE_FACT,
    memory_pb2.MEMORY_TYPE_PREFERENCE,
    memory_pb2.MEMORY_TYPE_PROCEDURAL,
    memory_pb2.MEMORY_TYPE_CORE,
]
WORDS = "amber basil cedar delta ember fjord grove harbor iris juniper kelp lumen".split()


def everything(stub: MemoryServiceStub, channel: str) -> dict[str, memory_pb2.Memory]:
    found: dict[str, memory_pb2.Memory] = {}
    token = ""
    while True:
        page = stub.ListMemories(
            pb.ListMemoriesRequest(channel=channel, page_size=1000, page_token=token)
        )
        found.update({m.text: m for m in page.memories})
        token = page.next_page_token
        if not token:
            return found


def test_export_then_import_round_trips_a_thousand_memories(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    rng = random.Random(7)
    now = time.time()
    requests = []
    for n in range(1000):
        text = f"Note {n}: {' '.join(rng.sample(WORDS, 4))}."
        if n % 97 == 0:
            text += "\n\n```python\nprint('fenced')\n```\n- a line that looks like a bullet"
        store = pb.StoreRequest(
            channel=channel_name,
            text=text,
            memory_type=rng.choice(TYPES),
            keystone=n % 11 == 0,
            tags={"batch": str(n % 5), "odd,key": "a=b"} if n % 3 else {},
            created_at=ts(now - rng.uniform(0, 60 * 86_400) - 0.123456),
        )
        requests.append(pb.StoreStreamRequest(store=store))
    memories.StoreStream(iter(requests))
    chunks = list(memories.Export(pb.ExportRequest(channel=channel_name, include_archived=True)))
    assert sum(c.memories for c in chunks) == 1000
    document = "".join(c.markdown for c in chunks)
    assert document.startswith(f"# Calor export: {channel_name}")
    target = channel_name + "-copy"
    pieces = [document[i : i + 4096] for i in range(0, len(document), 4096)]
    reply = memories.Import(
        iter(
            [pb.ImportRequest(channel=target, markdown=pieces[0])]
            + [pb.ImportRequest(markdown=p) for p in pieces[1:]]
        )
    )
    assert len(reply.ids) == 1000
    before, after = everything(memories, channel_name), everything(memories, target)
    assert set(after) == set(before)
    for text, old in before.items():
        new = after[text]
        assert (new.memory_type, dict(new.tags), new.keystone) == (
            old.memory_type,
            dict(old.tags),
            old.keystone,
        )
        assert new.created_at.ToMicroseconds() == pytest.approx(
            old.created_at.ToMicroseconds(), abs=1
        )


def test_a_plain_list_of_notes_imports_one_memory_per_bullet(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    notes = (
        "Some intro text.\n\n- Buy oat milk\n- Call the plumber\n  about the leak\n"
        "* Renew the passport\n"
    )
    reply = memories.Import(iter([pb.ImportRequest(channel=channel_name, markdown=notes)]))
    assert len(reply.ids) == 3
    texts = sorted(everything(memories, channel_name))
    assert texts == ["Buy oat milk", "Call the plumber\nabout the leak", "Renew the passport"]


def test_bad_markdown_imports_nothing(memories: MemoryServiceStub, channel_name: str) -> None:
    bad = "## A memory\n- type: gossip\n\n```text\nhello\n```\n"
    with pytest.raises(grpc.RpcError) as caught:
        memories.Import(iter([pb.ImportRequest(channel=channel_name, markdown="- fine\n" + bad)]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "line" in (caught.value.details() or "")
    assert memories.Identity(pb.IdentityRequest(channel=channel_name)).total == 0
