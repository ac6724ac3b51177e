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
COLD = memory_pb2.MEMORY_STATE_COLD
SUPERSEDES = memory_pb2.EDGE_KIND_SUPERSEDES

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
    assert restored.tags["kept_apart_from"] == survivor.id
    for _ in range(2):  # a pair a user separated stays apart
        assert memories.Dream(pb.DreamRequest(channel=channel_name)).merged == 0
    after = memories.Inspect(pb.InspectRequest(channel=channel_name, id=absorbed.id)).memory
    assert after.state == ACTIVE and not after.merged_into
    kept = memories.Inspect(pb.InspectRequest(channel=channel_name, id=survivor.id)).memory
    assert absorbed.id not in kept.merged_from


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


def test_superseding_settles_the_conflict_and_the_new_memory_outranks_the_old(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    old = store(memories, channel_name, "The gym opens at 7am on weekdays.")
    for _ in range(3):  # the old one is warm: recalled often
        memories.Recall(pb.RecallRequest(channel=channel_name, query="gym opening hours"))
    new = store(memories, channel_name, "The gym opens at 6am on weekdays now.")
    assert memories.Dream(pb.DreamRequest(channel=channel_name)).conflicts == 1

    memories.Update(pb.UpdateRequest(channel=channel_name, id=new.id, supersedes=old.id))

    assert not memories.Identity(pb.IdentityRequest(channel=channel_name)).conflicts
    assert memories.Dream(pb.DreamRequest(channel=channel_name)).conflicts == 0
    assert not memories.Identity(pb.IdentityRequest(channel=channel_name)).conflicts
    older = memories.Inspect(pb.InspectRequest(channel=channel_name, id=old.id))
    newer = memories.Inspect(pb.InspectRequest(channel=channel_name, id=new.id)).memory
    assert (older.memory.tags["superseded_by"], older.memory.tags["settled"]) == (new.id, new.id)
    assert (newer.tags["supersedes"], newer.tags["settled"]) == (old.id, old.id)
    assert older.memory.state == COLD, "cooled"
    links = [{e.from_id, e.to_id} for e in older.edges if e.kind == SUPERSEDES]
    assert links == [{old.id, new.id}], "linked to its successor"
    question = "When does the gym open?"
    reply = memories.Recall(pb.RecallRequest(channel=channel_name, query=question, peek=True))
    assert new.id in [h.memory.id for h in reply.hits]
    assert old.id not in [h.memory.id for h in reply.hits], "out of default recall"
    asked = memories.Recall(
        pb.RecallRequest(channel=channel_name, query=question, peek=True, states=[ACTIVE, COLD])
    )
    ranked = [h.memory.id for h in asked.hits]
    assert ranked.index(new.id) < ranked.index(old.id), "a states filter finds it, below"


def test_templated_memories_that_differ_in_a_name_number_open_no_conflict(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    texts = [f"Ticket {n + 100} is assigned to the support queue." for n in range(56)]
    requests = [
        pb.StoreStreamRequest(store=pb.StoreRequest(channel=channel_name, text=t)) for t in texts
    ]
    memories.StoreStream(iter(requests))
    report = memories.Dream(pb.DreamRequest(channel=channel_name))
    assert (report.conflicts, report.conflicts_unopened) == (0, 0)
    assert not memories.Identity(pb.IdentityRequest(channel=channel_name)).conflicts


def test_a_dream_opens_at_most_the_channels_cap_of_conflicts_closest_first(
    memories: MemoryServiceStub, grpc_channel: grpc.Channel, channel_name: str
) -> None:
    SettingsServiceStub(grpc_channel).UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=channel_name,
            settings=memory_pb2.ChannelSettings(dream_max_conflicts=2),
            update_mask=FieldMask(paths=["dream_max_conflicts"]),
        )
    )
    for yes, no in (
        ("The office is open on Saturdays.", "The office is not open on Saturdays."),
        ("The gym opens at 7am.", "The gym does not open at 7am."),
        ("The user likes jazz.", "The user does not like jazz."),
        ("The car has winter tyres fitted.", "The car has no winter tyres fitted."),
    ):
        store(memories, channel_name, yes)
        store(memories, channel_name, no)
    report = memories.Dream(pb.DreamRequest(channel=channel_name))
    assert (report.conflicts, report.conflicts_unopened) == (2, 2)
    assert len(memories.Identity(pb.IdentityRequest(channel=channel_name)).conflicts) == 2
    again = memories.Dream(pb.DreamRequest(channel=channel_name))
    assert (again.conflicts, again.conflicts_unopened) == (2, 0), "the rest open next time"
    assert again.merged == 0, "a contradiction seen but not opened is never merged"


def test_the_channel_keeps_its_latest_dream_reports_newest_first(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    for text in PARAPHRASES:
        store(memories, channel_name, text, memory_type=memory_pb2.MEMORY_TYPE_FACT)
    reports = [memories.Dream(pb.DreamRequest(channel=channel_name)) for _ in range(7)]
    recent = memories.Identity(pb.IdentityRequest(channel=channel_name)).recent_dreams
    assert len(recent) == 5  # the five latest of seven
    assert [record.report.merged for record in recent] == [0, 0, 0, 0, 0]
    times = [record.at.ToNanoseconds() for record in recent]
    assert times == sorted(times, reverse=True)
    assert not any(record.sweep for record in recent)
    first = memories.Identity(pb.IdentityRequest(channel=channel_name + "-one"))
    assert not first.recent_dreams  # a channel that never dreamt
    assert counts(recent[0].report) == counts(reports[-1])
    assert recent[0].report.channel_heat_after == pytest.approx(reports[-1].channel_heat_after)
    assert reports[0].merged == len(PARAPHRASES) - 1 and not recent[0].report.merged_ids
