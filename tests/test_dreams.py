"""Dreams end to end (DESIGN §6): merges, conflicts, keystones, offers, idempotence."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock, SystemClock
from calor.server.commands import NewMemory
from calor.server.engine.memory_engine import MemoryEngine
from calor.server.storage.store import MemoryStore
from calor.server.thermo.policy import ChannelPolicy
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, CrashAfter, store, texts

ManualServer = tuple[ServerThread, ManualClock, MemoryServiceStub]
MERGED = memory_pb2.MEMORY_STATE_MERGED
ACTIVE = memory_pb2.MEMORY_STATE_ACTIVE

PARAPHRASES = [
    "Our team standup meeting is at 9am every day.",
    "The daily team standup is at 9am.",
    "Every day at 9am we have the team standup.",
    "The team standup happens daily at 9am.",
    "Daily standup for the team: 9am.",
]
UNRELATED = [
    "The user's cat is called Miso.",
    "Quarterly revenue grew 12 percent.",
    "Deploys go out through the blue-green pipeline.",
    "The wifi password for guests is on the fridge.",
    "Ana prefers tea over coffee.",
    "The database backups run at midnight UTC.",
    "Lisbon is the capital of Portugal.",
    "The invoice template lives in the shared drive.",
    "Rust compile times improved after the upgrade.",
    "The garden needs watering twice a week.",
]
ZERO = pb.DreamResponse()


def counts(report: pb.DreamResponse) -> tuple[int, ...]:
    return (
        report.migrated,
        report.merged,
        report.keystoned,
        report.promoted,
        report.echoed,
        report.pruned,
        report.archived,
        report.conflicts,
    )


def test_paraphrases_merge_into_one_survivor_and_a_second_dream_changes_nothing(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    ids = [
        store(memories, channel_name, t, memory_type=memory_pb2.MEMORY_TYPE_FACT).id
        for t in PARAPHRASES
    ]
    for text in UNRELATED:
        store(memories, channel_name, text, memory_type=memory_pb2.MEMORY_TYPE_FACT)
    report = memories.Dream(pb.DreamRequest(channel=channel_name))
    assert report.merged == 4
    reply = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="when is the standup?", peek=True)
    )
    standups = [h.memory for h in reply.hits if "standup" in h.memory.text.lower()]
    assert len(standups) == 1
    survivor = standups[0]
    assert sorted(survivor.merged_from) == sorted(set(ids) - {survivor.id})
    absorbed = memories.Inspect(
        pb.InspectRequest(channel=channel_name, id=survivor.merged_from[0])
    ).memory
    assert absorbed.state == MERGED and absorbed.merged_into == survivor.id
    again = memories.Dream(pb.DreamRequest(channel=channel_name))
    assert counts(again) == counts(ZERO)
    restored = memories.Update(
        pb.UpdateRequest(channel=channel_name, id=absorbed.id, clear_merge=True)
    ).memory
    assert restored.state == ACTIVE and not restored.merged_into


def test_contradictions_open_a_conflict_and_never_merge(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    yes = store(memories, channel_name, "The office is open on Saturdays.")
    no = store(memories, channel_name, "The office is not open on Saturdays.")
    report = memories.Dream(pb.DreamRequest(channel=channel_name))
    assert (report.conflicts, report.merged) == (1, 0)
    identity = memories.Identity(pb.IdentityRequest(channel=channel_name))
    [conflict] = identity.conflicts
    assert {conflict.a_id, conflict.b_id} == {yes.id, no.id}
    assert "negat" in conflict.reason
    for memory in (yes, no):
        state = memories.Inspect(pb.InspectRequest(channel=channel_name, id=memory.id)).memory
        assert state.state == ACTIVE
    assert memories.Dream(pb.DreamRequest(channel=channel_name)).conflicts == 0
    memories.Forget(pb.ForgetRequest(channel=channel_name, ids=[no.id]))
    assert not memories.Identity(pb.IdentityRequest(channel=channel_name)).conflicts


def test_a_much_recalled_memory_becomes_a_keystone_and_stops_decaying(
    manual_server: ManualServer,
) -> None:
    _, clock, stub = manual_server
    memory = store(
        stub,
        "k",
        "The release train leaves every second Tuesday.",
        memory_type=memory_pb2.MEMORY_TYPE_EPISODIC,
    )
    for _ in range(6):
        stub.Recall(
            pb.RecallRequest(channel="k", query="when does the release train leave", limit=1)
        )
    report = stub.Dream(pb.DreamRequest(channel="k"))
    assert report.keystoned == 1
    pinned = stub.Inspect(pb.InspectRequest(channel="k", id=memory.id)).memory
    assert pinned.keystone
    clock.advance(30 * DAY)
    later = stub.Inspect(pb.InspectRequest(channel="k", id=memory.id)).memory
    assert later.heat == pytest.approx(pinned.heat, abs=1e-12)


def test_offered_entropy_dreams_in_that_channel_only(
    memories: MemoryServiceStub, grpc_channel: grpc.Channel, channel_name: str
) -> None:
    quiet = channel_name + "-quiet"
    for channel in (channel_name, quiet):
        for text in PARAPHRASES[:2]:
            store(memories, channel, text, memory_type=memory_pb2.MEMORY_TYPE_FACT)
    small = memories.Offer(pb.OfferRequest(channel=channel_name, entropy=b"x" * 3000))
    assert (small.accumulated, small.dreamed) == (3000, False)
    reply = memories.Offer(pb.OfferRequest(channel=channel_name, entropy=b"y" * 2000))
    assert reply.dreamed and reply.report.merged == 1 and reply.accumulated == 0
    assert memories.Identity(pb.IdentityRequest(channel=quiet)).total == 2
    SettingsServiceStub(grpc_channel).UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=quiet,
            settings=memory_pb2.ChannelSettings(entropy_threshold=10_000),
            update_mask=FieldMask(paths=["entropy_threshold"]),
        )
    )
    assert not memories.Offer(pb.OfferRequest(channel=quiet, entropy=b"z" * 5000)).dreamed


def test_dreams_promote_working_memory_and_cool_the_channel(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    store(
        memories,
        channel_name,
        "Scratch: the build number is 4411.",
        memory_type=memory_pb2.MEMORY_TYPE_WORKING,
    )
    memories.Recall(pb.RecallRequest(channel=channel_name, query="build number", peek=False))
    report = memories.Dream(pb.DreamRequest(channel=channel_name))
    assert report.promoted == 1
    assert report.channel_heat_after == pytest.approx(report.channel_heat_before / 2, rel=1e-3)
    assert texts(
        memories.Recall(
            pb.RecallRequest(
                channel=channel_name,
                query="build number",
                peek=True,
                memory_types=[memory_pb2.MEMORY_TYPE_EPISODIC],
            )
        )
    ) == ["Scratch: the build number is 4411."]


@pytest.mark.parametrize("budget", [0, 1, 2])
def test_a_dream_cut_short_leaves_the_channel_consistent_and_the_next_finishes(
    embedder: OnnxEmbedder, tmp_path: Path, budget: int
) -> None:
    store_ = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    engine = MemoryEngine.open(store_, SystemClock(), ChannelPolicy())
    groups = [
        PARAPHRASES,
        [
            "The user's cat is called Miso.",
            "The user has a cat named Miso.",
            "Miso is the name of the user's cat.",
        ],
    ]
    items = [NewMemory(channel="d", text=t, memory_type="fact") for g in groups for t in g]
    engine.store(items, embedder.embed_passages([i.text for i in items]))
    engine._store = CrashAfter(store_, budget=budget)  # type: ignore[assignment]
    engine._dreamer._store = engine._store  # type: ignore[assignment]
    with pytest.raises(OSError):
        engine.dream("d")
    store_.close()

    reopened = MemoryStore.open(tmp_path, model_id=embedder.model_id, dim=embedder.dim)
    again = MemoryEngine.open(reopened, SystemClock(), ChannelPolicy())
    records = {r.id: r for r in reopened.records("d")}
    merged_before = sum(r.state == "merged" for r in records.values())
    # 0: cut before any merge; 1: after one cluster of two (2 or 4 absorbed); 2: both.
    assert merged_before in ({0}, {2, 4}, {6})[budget]
    for record in records.values():
        if record.state == "merged":
            assert record.id in records[record.merged_into].merged_from
        for absorbed in record.merged_from:
            assert records[absorbed].state == "merged"
    report = again.dream("d")
    after = {r.id: r for r in reopened.records("d")}
    survivors = [r for r in after.values() if r.state != "merged"]
    assert len(survivors) == 2
    assert report.merged + merged_before == 6
    reopened.close()


def test_correcting_one_side_settles_a_conflict(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    store(memories, channel_name, "The gym opens at 6am on weekdays.")
    wrong = store(memories, channel_name, "The gym opens at 7am on weekdays.")
    assert memories.Dream(pb.DreamRequest(channel=channel_name)).conflicts == 1
    memories.Update(
        pb.UpdateRequest(
            channel=channel_name,
            id=wrong.id,
            text="The gym opens at 6am on weekdays, 8am on weekends.",
        )
    )
    assert not memories.Identity(pb.IdentityRequest(channel=channel_name)).conflicts
