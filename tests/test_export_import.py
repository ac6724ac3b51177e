"""Export → Import through the protos reproduces a channel (DESIGN §6, §9): every
memory's heat to 1e-9 at any moment, its stability, recalls, provenance and state, and
the edges among the exported memories."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc
import pytest

from calor.client import AlreadyExistsError, AsyncCalorClient, CalorClient
from calor.server.clock import ManualClock
from calor.server.storage.markdown import parse_markdown
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from tests.conftest import ServerThread
from tests.helpers import CORE, DAY, EPISODIC, FACT, SEMANTIC, Run, store, ts

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
        assert new.created_at == old.created_at
        assert (new.id, new.heat0, new.t0, new.stability, new.state, new.utility) == (
            old.id,
            old.heat0,
            old.t0,
            old.stability,
            old.state,
            old.utility,
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


# --- the whole state --------------------------------------------------------------

START = 1_780_000_000.0
PARAPHRASES = [
    "Our team standup meeting is at 9am every day.",
    "The daily team standup is at 9am.",
    "Every day at 9am we have the team standup.",
    "The team standup happens daily at 9am.",
    "Daily standup for the team: 9am.",
]
OTHERS = [
    "The user's cat is called Miso.",
    "Deploys go out through the blue-green pipeline.",
    "The wifi password for guests is on the fridge.",
    "Lisbon is the capital of Portugal.",
]
COMPARED = (
    "text",
    "classifier_version",
    "memory_type",
    "stability",
    "importance",
    "utility",
    "recall_count",
    "keystone",
    "state",
    "entities",
    "created_at",
    "updated_at",
    "last_recalled_at",
    "source",
    "confidence",
    "heat0",
    "t0",
    "surprise",
    "importance_adjustment",
)
Stub = MemoryServiceStub
Start = Callable[..., ServerThread]


def _channel_with_history(stub: Stub, clock: ManualClock, channel: str) -> dict[str, str]:
    """A channel with merged paraphrases, a keystone, recalled memories with provenance,
    cold and archived ones, a manual edge and a superseded memory; its ids by role."""
    for text in PARAPHRASES:
        store(stub, channel, text, memory_type=FACT)
    for text in OTHERS:
        store(stub, channel, text, memory_type=SEMANTIC)
    assert stub.Dream(pb.DreamRequest(channel=channel)).merged == 4
    ids = {
        "keystone": store(stub, channel, "Alice is allergic to peanuts.", memory_type=CORE,
                          keystone=True).id,
        "recalled": store(stub, channel, "The user prefers green tea in the morning.",
                          memory_type=SEMANTIC, provenance={"from": "chat"}).id,
        "archived": store(stub, channel, "We hiked the ridge trail in the fog.",
                          memory_type=EPISODIC, created_at=ts(START - 30 * DAY)).id,
        "cold": store(stub, channel, "The plumber came by to fix the kitchen sink.",
                      memory_type=EPISODIC, created_at=ts(START - 5 * DAY)).id,
        "old": store(stub, channel, "The office moved to the fourth floor.").id,
    }  # fmt: skip
    for _ in range(2):
        hit = stub.Recall(pb.RecallRequest(channel=channel, query="green tea", limit=1)).hits[0]
        assert hit.memory.id == ids["recalled"]
    recalled = _inspect(stub, channel, ids["recalled"]).memory
    assert (recalled.stability, recalled.recall_count, recalled.heat) == (4.0, 2, 1.0)
    ids["new"] = store(stub, channel, "The office moved to the fifth floor.").id
    stub.Update(pb.UpdateRequest(channel=channel, id=ids["new"], supersedes=ids["old"]))
    stub.Connect(
        pb.ConnectRequest(channel=channel, from_id=ids["keystone"], to_id=ids["cold"], weight=0.6)
    )
    states = {role: _inspect(stub, channel, i).memory.state for role, i in ids.items()}
    assert states["archived"] == memory_pb2.MEMORY_STATE_ARCHIVED
    assert states["cold"] == memory_pb2.MEMORY_STATE_COLD
    assert _inspect(stub, channel, ids["old"]).memory.tags["superseded_by"] == ids["new"]
    clock.advance(2 * DAY + 0.123456789)
    return ids


def _inspect(stub: Stub, channel: str, memory_id: str) -> pb.InspectResponse:
    return stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id))


def _export(stub: Stub, channel: str) -> str:
    chunks = stub.Export(pb.ExportRequest(channel=channel, include_archived=True))
    return "".join(c.markdown for c in chunks)


def _import(stub: Stub, channel: str, document: str, remap_ids: bool = False) -> list[str]:
    pieces = [document[i : i + 1000] for i in range(0, len(document), 1000)]
    first = pb.ImportRequest(channel=channel, markdown=pieces[0], remap_ids=remap_ids)
    rest = [pb.ImportRequest(markdown=p) for p in pieces[1:]]
    return list(stub.Import(iter([first, *rest])).ids)


def _exported_ids(document: str) -> list[str]:
    return [p.original_id or "" for p in parse_markdown(document, channel="c")]


def _assert_same(
    a: tuple[Stub, str], b: tuple[Stub, str], ids: Sequence[str], to: Mapping[str, str]
) -> None:
    """Each memory of ``a`` and its copy in ``b`` (``to`` names it) read the same now:
    heat, state, counts, provenance, references and the edges among the copies."""
    copies = set(to.values())
    for memory_id in ids:
        one, other = _inspect(*a, memory_id), _inspect(*b, to[memory_id])
        first, second = one.memory, other.memory
        assert second.heat == pytest.approx(first.heat, abs=1e-9), first.text
        for name in COMPARED:
            assert getattr(second, name) == getattr(first, name), (name, first.text)
        assert dict(second.provenance) == {k: to.get(v, v) for k, v in first.provenance.items()}
        assert dict(second.tags) == {k: to.get(v, v) for k, v in first.tags.items()}
        assert second.merged_into == to.get(first.merged_into, first.merged_into)
        assert list(second.merged_from) == [to[i] for i in first.merged_from]
        edges = {(to[e.to_id], e.kind, e.weight) for e in one.edges if e.to_id in to}
        assert {(e.to_id, e.kind, e.weight) for e in other.edges if e.to_id in copies} == edges


def _states(stub: Stub, channel: str) -> dict[str, int]:
    return dict(stub.Identity(pb.IdentityRequest(channel=channel)).by_state)


def test_an_export_imports_as_it_was_into_a_fresh_channel_and_a_fresh_server(
    start_server: Start,
) -> None:
    clock = ManualClock(START)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as wire:
        stub = MemoryServiceStub(wire)
        roles = _channel_with_history(stub, clock, "agent-7")
        document = _export(stub, "agent-7")
        ids = _exported_ids(document)
        assert set(roles.values()) <= set(ids) and len(ids) == 15  # merged ones included
        assert _import(stub, "agent-8", document) == ids  # the exported ids, in order
        same = {i: i for i in ids}
        _assert_same((stub, "agent-7"), (stub, "agent-8"), ids, same)
        assert _states(stub, "agent-8") == _states(stub, "agent-7")
        copy = _inspect(stub, "agent-8", roles["recalled"]).memory
        assert (copy.stability, copy.recall_count) == (4.0, 2)
        assert dict(copy.provenance) == {"from": "chat"}
        clock.advance(40 * DAY)  # the same trajectories: still the same heat, later
        _assert_same((stub, "agent-7"), (stub, "agent-8"), ids, same)
        hits = stub.Recall(pb.RecallRequest(channel="agent-8", query="when is standup?", peek=True))
        assert "standup" in hits.hits[0].memory.text  # embedded and indexed
        elsewhere = start_server(clock=clock)
        with grpc.insecure_channel(elsewhere.target) as other_wire:
            other = MemoryServiceStub(other_wire)
            assert _import(other, "agent-7", document) == ids
            _assert_same((stub, "agent-7"), (other, "agent-7"), ids, same)


def test_an_id_the_channel_holds_is_refused_unless_the_ids_are_remapped(
    start_server: Start,
) -> None:
    clock = ManualClock(START)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as wire:
        stub = MemoryServiceStub(wire)
        roles = _channel_with_history(stub, clock, "agent-7")
        document = _export(stub, "agent-7")
        ids = _exported_ids(document)
        before = _states(stub, "agent-7")
        with pytest.raises(grpc.RpcError) as refused:
            _import(stub, "agent-7", document + "- and a new note\n")
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert ids[0] in (refused.value.details() or "")
        assert "remap_ids" in (refused.value.details() or "")
        assert _states(stub, "agent-7") == before  # nothing imported, not even the note
        new = _import(stub, "agent-7", document, remap_ids=True)
        assert len(new) == len(ids) and not set(new) & set(ids)
        to = dict(zip(ids, new, strict=True))
        _assert_same((stub, "agent-7"), (stub, "agent-7"), ids, to)
        copy = _inspect(stub, "agent-7", to[roles["old"]]).memory
        assert copy.tags["superseded_by"] == to[roles["new"]]
        doubled = _states(stub, "agent-7")
        assert doubled == {state: 2 * n for state, n in before.items()}
        # A copy is linked to the channel's own memories, as a store would link it.
        edges = _inspect(stub, "agent-7", to[roles["recalled"]]).edges
        assert (roles["recalled"], memory_pb2.EDGE_KIND_SEMANTIC) in {
            (e.to_id, e.kind) for e in edges
        }


def test_an_export_without_the_state_is_stored_anew(memories: Stub, channel_name: str) -> None:
    older = (
        "# Calor export: agent-7\n\n"
        "## The boiler is serviced every October.\n"
        "- id: 01JNK3V7M8Q2W4X6Y8Z0A1B2C3\n"
        "- type: fact\n"
        "- heat: 0.42\n"
        "- keystone: no\n"
        "- state: active\n"
        "- created: 2026-01-05T09:00:00Z\n"
        "- importance: 0.62\n"
        "\n"
        "```text\nThe boiler is serviced every October.\n```\n"
    )
    [new_id] = _import(memories, channel_name, older)
    memory = _inspect(memories, channel_name, new_id).memory
    assert new_id != "01JNK3V7M8Q2W4X6Y8Z0A1B2C3"
    assert dict(memory.provenance) == {"imported_id": "01JNK3V7M8Q2W4X6Y8Z0A1B2C3"}
    assert (memory.heat0, memory.stability, memory.recall_count) == (1.0, 1.0, 0)
    assert memory.surprise == 1.0  # through the store pipeline: novelty in an empty channel
    assert memory.importance == pytest.approx(0.62 + memory.importance_adjustment)
    # Imported again, it is stored anew again: no id is kept, so none is refused.
    assert _import(memories, channel_name, older) != [new_id]


def test_state_in_the_future_or_an_id_named_twice_imports_nothing(
    memories: Stub, channel_name: str
) -> None:
    section = "## x\n- id: 01JNK3V7M8Q2W4X6Y8Z0A1B2C3\n- heat0: 1\n- t0: {t0}\n\n```\nx\n```\n"
    future = section.format(t0="2999-01-01T00:00:00Z")
    twice = section.format(t0="2026-01-01T00:00:00Z") * 2
    refusals = [
        (future, "line 1: t0: must not be in the future"),
        (twice, "line 9: id 01JNK3V7M8Q2W4X6Y8Z0A1B2C3 is named again (first at line 1)"),
    ]
    for document, problem in refusals:
        with pytest.raises(grpc.RpcError) as refused:
            _import(memories, channel_name, document)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert problem in (refused.value.details() or "")
    assert memories.Identity(pb.IdentityRequest(channel=channel_name)).total == 0


def test_calor_import_remap_ids(calor: Run, tmp_path: Path) -> None:
    assert calor("store", "The spare key is under the blue pot.")[0] == 0
    out = f"{tmp_path}/export.md"
    assert calor("export", "--out", out)[0] == 0
    status, _, err = calor("import", out)
    assert status != 0 and "already exists" in err
    status, text, _ = calor("import", out, "--remap-ids")
    assert (status, text.strip()) == (0, "imported 1 memory")
    status, text, _ = calor("--json", "list")
    assert status == 0 and text.count("The spare key is under the blue pot.") == 2


def test_the_interaction_clock_is_carried_as_the_age_of_each_memory(start_server: Start) -> None:
    clock = ManualClock(START)
    server = start_server(clock=clock)
    with (
        grpc.insecure_channel(server.target) as wire,
        CalorClient(server.target, channel="busy") as busy,
        CalorClient(server.target, channel="quiet") as quiet,
    ):
        stub = MemoryServiceStub(wire)
        for calor in (busy, quiet):
            calor.update_settings(decay_mode="interaction", interaction_unit_seconds=3600.0)
        for n in range(6):
            busy.store(f"Step {n} of the runbook: restart worker {n}.", memory_type="episodic")
            if n == 2:  # materialises the first ones (resonance) at this interaction
                busy.recall("restart worker 2", limit=1)
        quiet.store("The quiet channel holds one memory already.")
        document = _export(stub, "busy")
        ids = _import(stub, "quiet", document)
        same = {i: i for i in ids}
        heats = [_inspect(stub, "busy", i).memory.heat for i in ids]
        assert len(set(heats)) >= 4  # ages apart on the interaction clock
        _assert_same((stub, "busy"), (stub, "quiet"), ids, same)
        busy.store("One more interaction in each channel.")
        quiet.store("One more interaction in each channel.")
        _assert_same((stub, "busy"), (stub, "quiet"), ids, same)


def test_the_async_client_remaps_ids(calor_target: str, client: CalorClient) -> None:
    first = client.store("The bike lock code is 3141.").id
    document = "".join(chunk.markdown for chunk in client.export())

    async def again() -> list[str]:
        async with AsyncCalorClient(calor_target, channel=client.channel) as calor:
            return await calor.import_markdown(document, remap_ids=True)

    [copy] = asyncio.run(again())
    assert copy != first
    assert client.inspect(copy).memory.text == "The bike lock code is 3141."
    with pytest.raises(AlreadyExistsError) as taken:  # without remapping: the id is taken
        client.import_markdown(document)
    assert first in taken.value.details
