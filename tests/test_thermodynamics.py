"""The engine of DESIGN §3 through the API: resonance, graph, states, channel heat, gates."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from calor.models.embedder import OnnxEmbedder
from calor.server.clock import ManualClock, SystemClock
from calor.server.config import ServerConfig
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, store, ts

ManualServer = tuple[ServerThread, ManualClock, MemoryServiceStub]
ACTIVE = memory_pb2.MEMORY_STATE_ACTIVE
ARCHIVED = memory_pb2.MEMORY_STATE_ARCHIVED
GHOST = memory_pb2.MEMORY_STATE_GHOST
WORKING = memory_pb2.MEMORY_TYPE_WORKING


def inspect(stub: MemoryServiceStub, channel: str, memory_id: str) -> pb.InspectResponse:
    return stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id))


def heat(stub: MemoryServiceStub, channel: str, memory_id: str) -> float:
    return inspect(stub, channel, memory_id).memory.heat


def connect(stub: MemoryServiceStub, channel: str, a: str, b: str) -> None:
    stub.Connect(pb.ConnectRequest(channel=channel, from_id=a, to_id=b))


def test_resonance_spreads_a_recall_to_its_neighbours(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    now = time.time()
    ch = channel_name

    def episodic(text: str, days: float, session: str) -> str:
        return store(
            memories,
            ch,
            text,
            memory_type=EPISODIC,
            created_at=ts(now - days * DAY),
            tags={"session": session},
        ).id

    recalled = episodic("Booked the dentist appointment for the kids.", 1, "s1")
    neighbour = episodic("The quarterly tax filing went out on time.", 2, "s2")
    two_hop = episodic("Repainted the garden fence a dark green.", 2, "s3")
    gated = episodic("Watched a documentary about octopuses.", 4.644, "s4")
    connect(memories, ch, recalled, neighbour)
    connect(memories, ch, neighbour, two_hop)
    connect(memories, ch, recalled, gated)
    assert heat(memories, ch, neighbour) == pytest.approx(0.25, abs=0.005)
    assert heat(memories, ch, gated) == pytest.approx(0.04, abs=0.001)

    reply = memories.Recall(pb.RecallRequest(channel=ch, query="dentist appointment", limit=1))
    assert [h.memory.id for h in reply.hits] == [recalled]
    assert reply.hits[0].memory.heat == pytest.approx(0.65, abs=0.005)
    assert heat(memories, ch, neighbour) == pytest.approx(0.445, abs=0.01)
    assert heat(memories, ch, two_hop) == pytest.approx(0.25 + 0.195 / 2, abs=0.01)
    assert heat(memories, ch, gated) == pytest.approx(0.04, abs=0.001)


def test_peek_does_not_resonate(memories: MemoryServiceStub, channel_name: str) -> None:
    a = store(
        memories,
        channel_name,
        "Alpha notes on the compiler.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - DAY),
        tags={"session": "a"},
    ).id
    b = store(
        memories,
        channel_name,
        "Weekend hiking plans.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - DAY),
        tags={"session": "b"},
    ).id
    connect(memories, channel_name, a, b)
    memories.Recall(
        pb.RecallRequest(channel=channel_name, query="compiler notes", limit=1, peek=True)
    )
    assert heat(memories, channel_name, b) == pytest.approx(0.5, abs=0.005)


def test_archived_import_is_out_of_recall_but_comes_back_through_an_edge(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    old = store(
        memories,
        channel_name,
        "The old office had a rooftop garden.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - 30 * DAY),
    )
    assert inspect(memories, channel_name, old.id).memory.state == ARCHIVED
    miss = memories.Recall(pb.RecallRequest(channel=channel_name, query="rooftop garden office"))
    assert old.id not in [h.memory.id for h in miss.hits]
    attic = memories.Recall(
        pb.RecallRequest(
            channel=channel_name, query="rooftop garden office", include_archived=True, peek=True
        )
    )
    found = next(h for h in attic.hits if h.memory.id == old.id)
    assert found.heat == pytest.approx(0.01)
    fresh = store(memories, channel_name, "Plans for the new office move in spring.")
    connect(memories, channel_name, fresh.id, old.id)
    memories.Recall(pb.RecallRequest(channel=channel_name, query="new office move", limit=1))
    back = inspect(memories, channel_name, old.id).memory
    assert back.state == ACTIVE
    hits = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="rooftop garden office", peek=True)
    )
    assert old.id in [h.memory.id for h in hits.hits]


def test_a_memory_back_from_the_attic_passes_heat_on_as_the_formula_says(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    # A semantic memory rests in the attic at its floor 0.05: the thermal gate, so once
    # reached it passes heat on like any memory at that heat.
    old = store(
        memories,
        channel_name,
        "Photosynthesis turns sunlight into chemical energy.",
        memory_type=memory_pb2.MEMORY_TYPE_SEMANTIC,
        created_at=ts(time.time() - 200 * DAY),
    ).id
    beyond = store(
        memories,
        channel_name,
        "Booked a table at the harbour restaurant.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - DAY),
        tags={"session": "harbour"},
    ).id
    fresh = store(memories, channel_name, "Plans for the new office move in spring.").id
    connect(memories, channel_name, fresh, old)
    connect(memories, channel_name, old, beyond)
    assert inspect(memories, channel_name, old).memory.state == ARCHIVED
    assert heat(memories, channel_name, beyond) == pytest.approx(0.5, abs=0.005)

    reply = memories.Recall(
        pb.RecallRequest(channel=channel_name, query="new office move", limit=1)
    )

    assert [h.memory.id for h in reply.hits] == [fresh]
    back = inspect(memories, channel_name, old).memory
    assert back.state == ACTIVE
    assert back.heat == pytest.approx(0.05 + 0.30 * 1.0, abs=0.005)  # spread · H, H = 1.0
    assert heat(memories, channel_name, beyond) == pytest.approx(0.5 + 0.30 * 0.5, abs=0.01)


def test_recall_from_the_attic_returns_it_to_active(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    old = store(
        memories,
        channel_name,
        "Our first customer was a bakery in Porto.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - 40 * DAY),
    )
    reply = memories.Recall(
        pb.RecallRequest(
            channel=channel_name, query="first customer bakery", include_archived=True, limit=1
        )
    )
    assert reply.hits[0].memory.id == old.id
    assert reply.hits[0].memory.state == ACTIVE
    assert reply.hits[0].memory.heat == pytest.approx(0.16, abs=0.001)


def test_cold_migration_happens_at_the_analytic_moment(manual_server: ManualServer) -> None:
    _, clock, stub = manual_server
    memory = store(stub, "m", "Migrating episodic memory.", memory_type=EPISODIC)
    pinned = store(stub, "m", "A pinned episodic memory.", memory_type=EPISODIC, keystone=True)
    floor_at = 574029.175  # log2(100) days: episodic reaches its floor 0.01
    clock.advance(floor_at + 7 * DAY - 60)
    assert inspect(stub, "m", memory.id).memory.state == memory_pb2.MEMORY_STATE_COLD
    clock.advance(120)
    assert inspect(stub, "m", memory.id).memory.state == ARCHIVED
    assert inspect(stub, "m", pinned.id).memory.state == ACTIVE
    reply = stub.Recall(pb.RecallRequest(channel="m", query="Migrating episodic memory", peek=True))
    assert memory.id not in [h.memory.id for h in reply.hits]


def test_working_memory_promotes_after_30_minutes(
    manual_server: ManualServer,
) -> None:
    _, clock, stub = manual_server
    early = store(stub, "w", "Scratch: the build id is 4411.", memory_type=WORKING)
    clock.advance(31 * 60)
    promoted = inspect(stub, "w", early.id).memory
    assert promoted.memory_type == EPISODIC
    # Working decay (1 h half-life) for 30 minutes, then episodic (1 day) for one minute.
    assert promoted.heat == pytest.approx(2 ** (-30 / 60) * 2 ** (-60 / 86400), abs=1e-9)


def test_working_memory_promotes_after_two_recalls(manual_server: ManualServer) -> None:
    _, _, stub = manual_server
    memory = store(stub, "w2", "Scratch: the staging password rotates hourly.", memory_type=WORKING)
    for _ in range(2):
        stub.Recall(pb.RecallRequest(channel="w2", query="staging password", limit=1))
    assert inspect(stub, "w2", memory.id).memory.memory_type == EPISODIC


def test_floor_zero_memory_becomes_a_ghost_never_recalled(manual_server: ManualServer) -> None:
    server, clock, stub = manual_server
    settings = SettingsServiceStub(grpc.insecure_channel(server.target))
    update = spb.UpdateSettingsRequest(
        channel="g",
        settings=memory_pb2.ChannelSettings(working_promotion_seconds=1e9),
        update_mask=FieldMask(paths=["working_promotion_seconds"]),
    )
    settings.UpdateSettings(update)
    memory = store(stub, "g", "Scratch: temp file at /tmp/x1.", memory_type=WORKING)
    clock.advance(5 * 3600)  # 2^-5 ≈ 0.031 < survival gate 0.05
    assert inspect(stub, "g", memory.id).memory.state == GHOST
    for states in ([], [GHOST]):
        reply = stub.Recall(pb.RecallRequest(channel="g", query="temp file", states=states))
        assert memory.id not in [h.memory.id for h in reply.hits]


def test_graph_links_by_meaning_entity_and_sequence(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    ch = channel_name
    first = store(
        memories,
        ch,
        "Ada Lovelace wrote the first program.",
        memory_type=EPISODIC,
        tags={"session": "talk"},
    )
    second = store(
        memories,
        ch,
        "Ada Lovelace wrote the very first computer program.",
        memory_type=EPISODIC,
        tags={"session": "talk"},
    )
    third = store(
        memories,
        ch,
        "The hall was cold during the talk.",
        memory_type=EPISODIC,
        tags={"session": "talk"},
    )
    kinds = {(e.to_id, e.kind) for e in inspect(memories, ch, second.id).edges}
    assert (first.id, memory_pb2.EDGE_KIND_SEMANTIC) in kinds
    assert (first.id, memory_pb2.EDGE_KIND_ENTITY) in kinds
    assert (first.id, memory_pb2.EDGE_KIND_SEQUENCE) in kinds
    assert (second.id, memory_pb2.EDGE_KIND_SEQUENCE) in {
        (e.to_id, e.kind) for e in inspect(memories, ch, third.id).edges
    }
    memories.Forget(pb.ForgetRequest(channel=ch, ids=[second.id]))
    for other in (first.id, third.id):
        assert second.id not in [e.to_id for e in inspect(memories, ch, other).edges]


def test_novelty_and_near_duplicates(memories: MemoryServiceStub, channel_name: str) -> None:
    original = store(memories, channel_name, "The server room key is kept at reception.")
    duplicate = store(memories, channel_name, "The server room key is kept at reception.")
    novel = store(memories, channel_name, "Penguins can drink sea water.")
    assert duplicate.provenance["near_duplicate_of"] == original.id
    assert duplicate.importance < original.importance
    assert novel.importance > duplicate.importance
    assert inspect(memories, channel_name, original.id).memory.utility > original.utility


def test_explicit_importance_is_the_base_that_novelty_adjusts(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    text = "The spare office key hangs behind the kitchen door."
    first = store(memories, channel_name, text, importance=0.5)
    again = store(memories, channel_name, text, importance=0.5)
    assert (first.surprise, first.importance_adjustment) == (1.0, pytest.approx(0.30))
    assert first.importance == pytest.approx(0.80), "novel in an empty channel: + the bonus"
    assert again.provenance["near_duplicate_of"] == first.id
    assert again.surprise == pytest.approx(0.0, abs=1e-3)
    assert again.importance_adjustment == pytest.approx(-0.20)
    assert again.importance == pytest.approx(0.30), "a near-duplicate: − the penalty"
    shown = inspect(memories, channel_name, again.id).memory
    assert (shown.surprise, shown.importance) == (again.surprise, again.importance)


def test_inspect_shows_what_utility_is_made_of(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    memory = store(memories, channel_name, "The user's passport expires in March.", importance=0.6)
    memories.Recall(pb.RecallRequest(channel=channel_name, query="passport expiry"))
    shown = inspect(memories, channel_name, memory.id)
    factors = {f.name: (f.score, f.weight) for f in shown.utility_factors}
    assert list(factors) == [
        "importance",
        "frequency",
        "recency",
        "valence",
        "regularity",
        "type_boost",
        "trust",
        "confirmations",
        "activation",
    ]
    assert factors["importance"][0] == pytest.approx(shown.memory.importance)
    assert factors["frequency"][0] > 0.0, "recalled once"
    assert sum(w for _, w in factors.values()) == pytest.approx(1.0)
    blended = sum(score * weight for score, weight in factors.values())
    assert blended == pytest.approx(shown.memory.utility, abs=0.02), "utility is their blend"


def test_heat_ceiling_gate_refuses_with_a_retry_delay(
    memories: MemoryServiceStub, grpc_channel: grpc.Channel, channel_name: str
) -> None:
    settings = SettingsServiceStub(grpc_channel)
    settings.UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=channel_name,
            settings=memory_pb2.ChannelSettings(gate_heat_ceiling=True, heat_ceiling=0.2),
            update_mask=FieldMask(paths=["gate_heat_ceiling", "heat_ceiling"]),
        )
    )
    store(memories, channel_name, "Gate test memory.")
    store(memories, channel_name + "-free", "Gate test memory.")
    for _ in range(4):
        memories.Recall(pb.RecallRequest(channel=channel_name, query="gate test"))
    with pytest.raises(grpc.RpcError) as caught:
        memories.Recall(pb.RecallRequest(channel=channel_name, query="gate test"))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    status = rpc_status.from_call(caught.value)  # type: ignore[arg-type]
    assert status is not None
    retry = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(retry)
    assert retry.retry_delay.ToTimedelta().total_seconds() > 0
    for _ in range(6):
        memories.Recall(pb.RecallRequest(channel=channel_name + "-free", query="gate test"))
    identity = memories.Identity(pb.IdentityRequest(channel=channel_name))
    assert identity.channel_heat == pytest.approx(0.2, abs=0.001)
    assert list(identity.active_gates) == ["heat_ceiling"]


def test_fidelity_gate_hides_memories_below_the_survival_gate(
    memories: MemoryServiceStub, grpc_channel: grpc.Channel, channel_name: str
) -> None:
    faint = store(
        memories,
        channel_name,
        "A faint memory of the harbour.",
        memory_type=EPISODIC,
        created_at=ts(time.time() - 5 * DAY),
    )
    query = pb.RecallRequest(channel=channel_name, query="harbour", peek=True)
    assert faint.id in [h.memory.id for h in memories.Recall(query).hits]
    SettingsServiceStub(grpc_channel).UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=channel_name,
            settings=memory_pb2.ChannelSettings(gate_fidelity=True),
            update_mask=FieldMask(paths=["gate_fidelity"]),
        )
    )
    assert faint.id not in [h.memory.id for h in memories.Recall(query).hits]


def test_consolidation_sweep_runs_when_enough_memories_turn_cold(
    manual_server: ManualServer,
) -> None:
    _, clock, stub = manual_server
    for i in range(20):
        store(stub, "s", f"Episode {i} of the long project diary.", memory_type=EPISODIC)
    store(stub, "s", "A standing fact about the project.", memory_type=memory_pb2.MEMORY_TYPE_FACT)
    clock.advance(3.2 * DAY)  # heat 0.109: still above the cold threshold
    stub.Recall(pb.RecallRequest(channel="s", query="standing fact", limit=1))
    assert stub.Identity(pb.IdentityRequest(channel="s")).consolidation_sweeps == 0
    clock.advance(0.2 * DAY)  # every episode crossed 0.10
    stub.Recall(pb.RecallRequest(channel="s", query="standing fact", limit=1))
    identity = stub.Identity(pb.IdentityRequest(channel="s"))
    assert identity.consolidation_sweeps == 1
    assert identity.interactions == 23
    # The sweep (a dream over the cold, in the background) brings the channel back under
    # its trigger of 20 cold memories: the coldest goes to cold storage.
    deadline = time.monotonic() + 10
    while identity.by_state["MEMORY_STATE_COLD"] == 20 and time.monotonic() < deadline:
        time.sleep(0.05)
        identity = stub.Identity(pb.IdentityRequest(channel="s"))
    assert identity.by_state["MEMORY_STATE_COLD"] == 19
    assert identity.by_state["MEMORY_STATE_ARCHIVED"] == 1


def test_load_gate_reduces_recall_under_critical_load(
    memories: MemoryServiceStub, grpc_channel: grpc.Channel, channel_name: str
) -> None:
    for i in range(5):
        store(memories, channel_name, f"Load gate note {i}.")
    query = pb.RecallRequest(channel=channel_name, query="load gate note", limit=10, peek=True)
    assert len(memories.Recall(query).hits) == 5
    SettingsServiceStub(grpc_channel).UpdateSettings(
        spb.UpdateSettingsRequest(
            channel=channel_name,
            settings=memory_pb2.ChannelSettings(
                gate_load=True, load_inflight_critical=1, load_reduced_limit=2
            ),
            update_mask=FieldMask(
                paths=["gate_load", "load_inflight_critical", "load_reduced_limit"]
            ),
        )
    )
    assert len(memories.Recall(query).hits) == 2
    assert "load" in memories.Identity(pb.IdentityRequest(channel=channel_name)).active_gates


def test_interaction_mode_decays_with_use_not_time(manual_server: ManualServer) -> None:
    server, clock, stub = manual_server
    SettingsServiceStub(grpc.insecure_channel(server.target)).UpdateSettings(
        spb.UpdateSettingsRequest(
            channel="i",
            settings=memory_pb2.ChannelSettings(
                decay_mode=memory_pb2.DECAY_MODE_INTERACTION, interaction_unit_seconds=3600.0
            ),
            update_mask=FieldMask(paths=["decay_mode", "interaction_unit_seconds"]),
        )
    )
    memory = store(stub, "i", "An episode measured in interactions.", memory_type=EPISODIC)
    clock.advance(10 * DAY)
    assert heat(stub, "i", memory.id) == 1.0
    stub.StoreStream(
        iter(
            pb.StoreStreamRequest(store=pb.StoreRequest(channel="i", text=f"Filler number {n}."))
            for n in range(24)
        )
    )
    assert heat(stub, "i", memory.id) == pytest.approx(0.5, abs=1e-9)


def test_graph_heat_and_channel_state_survive_a_restart(
    embedder: OnnxEmbedder, tmp_path: Path
) -> None:
    config = ServerConfig(data_dir=tmp_path, port=0)
    first = ServerThread(config, SystemClock(), lambda: embedder)
    with grpc.insecure_channel(first.target) as channel:
        stub = MemoryServiceStub(channel)
        a = store(stub, "r", "Ada Lovelace wrote the first program.").id
        b = store(stub, "r", "Ada Lovelace worked with Charles Babbage.").id
        old = store(
            stub,
            "r",
            "An ancient episode.",
            memory_type=EPISODIC,
            created_at=ts(time.time() - 30 * DAY),
        ).id
        stub.Recall(pb.RecallRequest(channel="r", query="first program", limit=1))
        edges_before = {(e.to_id, e.kind) for e in inspect(stub, "r", a).edges}
        heat_before = stub.Identity(pb.IdentityRequest(channel="r")).channel_heat
    first.stop()
    second = ServerThread(config, SystemClock(), lambda: embedder)
    try:
        with grpc.insecure_channel(second.target) as channel:
            stub = MemoryServiceStub(channel)
            assert {(e.to_id, e.kind) for e in inspect(stub, "r", a).edges} == edges_before
            assert (b, memory_pb2.EDGE_KIND_ENTITY) in edges_before
            assert inspect(stub, "r", old).memory.state == ARCHIVED
            identity = stub.Identity(pb.IdentityRequest(channel="r"))
            assert identity.channel_heat == pytest.approx(heat_before, abs=0.01)
            assert identity.interactions == 4
    finally:
        second.stop()
