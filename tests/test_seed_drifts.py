"""Rules of the design's seeds the service had drifted from (issue 34, point 8), each
checked through the protos: settled history reads COLD whatever its type, a zero entity
link limit makes no entity edges, every computed state change writes its moment and an
event, and a channel's status shows its hottest memories, its decay and whether the
feedback says the settings work."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from calor.server.clock import ManualClock
from calor.server.thermo.heat import DEFAULT_PROFILES, seconds_until
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import CORE, DAY, EPISODIC, FACT, store, update_settings

PREFERENCE = memory_pb2.MEMORY_TYPE_PREFERENCE
COLD = memory_pb2.MEMORY_STATE_COLD
ARCHIVED = memory_pb2.MEMORY_STATE_ARCHIVED


def inspect(stub: MemoryServiceStub, channel: str, memory_id: str) -> pb.InspectResponse:
    return stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id))


@pytest.mark.parametrize("memory_type", [FACT, PREFERENCE, CORE])
def test_superseded_history_reads_cold_whatever_its_types_floor(
    manual_server: tuple[ServerThread, ManualClock, MemoryServiceStub], memory_type: int
) -> None:
    _, clock, stub = manual_server
    channel = f"settled-{memory_type}"
    old = store(stub, channel, "The office is on Elm Street.", memory_type=memory_type)
    new = store(stub, channel, "The office moved to Harbour Road.", memory_type=memory_type)
    stub.Update(pb.UpdateRequest(channel=channel, id=new.id, supersedes=old.id))
    states = []
    for _ in range(3):  # at once, and as time goes by (floors no longer hold it up)
        settled = inspect(stub, channel, old.id).memory
        successor = inspect(stub, channel, new.id).memory
        states.append(settled.state)
        assert settled.heat < min(0.10, successor.heat)
        clock.advance(400 * DAY)
    # Cold at once; then, below the cold threshold for good, in cold storage (core
    # memories never move there: they stay cold).
    later = COLD if memory_type == CORE else ARCHIVED
    assert states == [COLD, later, later]
    asked = pb.RecallRequest(
        channel=channel, query="where is the office?", peek=True, states=[COLD, ARCHIVED]
    )
    assert new.id not in [hit.memory.id for hit in stub.Recall(asked).hits]  # only history
    found = [
        hit.memory.id
        for hit in stub.Recall(
            pb.RecallRequest(channel=channel, query="where is the office?", peek=True)
        ).hits
    ]
    assert found[0] == new.id and old.id not in found


def test_an_entity_link_limit_of_zero_makes_no_entity_edges(
    memories: MemoryServiceStub, grpc_channel: grpc.Channel
) -> None:
    texts = ("We hired Marguerite as the new designer.", "Lunch with Marguerite on Friday.")
    for name, limit in (("entities-none", 0), ("entities-some", 8)):
        update_settings(grpc_channel, name, entity_link_max=limit, semantic_link_max=0)
        first = store(memories, name, texts[0])
        second = store(memories, name, texts[1])
        edges = {(e.to_id, e.kind) for e in inspect(memories, name, second.id).edges}
        assert ((first.id, memory_pb2.EDGE_KIND_ENTITY) in edges) == (limit > 0), name


def events_of(channel: grpc.Channel, name: str, wanted: int, seconds: float) -> list[tpb.Event]:
    """The first ``wanted`` on_decay events of a channel, waiting up to ``seconds``."""
    stream = TriggerServiceStub(channel).Subscribe(
        tpb.SubscribeRequest(channels=[name], kinds=[tpb.EVENT_KIND_ON_DECAY]),
        timeout=seconds,
    )
    found: list[tpb.Event] = []
    try:
        for reply in stream:
            found.append(reply.event)
            if len(found) == wanted:
                break
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    stream.cancel()
    return found


def test_moving_to_cold_storage_writes_its_moment_and_logs_an_event(
    manual_server: tuple[ServerThread, ManualClock, MemoryServiceStub],
) -> None:
    server, clock, stub = manual_server
    memory = store(stub, "drifting", "Parked on level three.", memory_type=EPISODIC)
    t0 = memory.t0.ToDatetime().timestamp()
    episodic = DEFAULT_PROFILES["episodic"]
    half_life = episodic.half_life_seconds
    cold_at = t0 + seconds_until(0.10, memory.heat0, half_life)
    archived_at = t0 + seconds_until(episodic.floor, memory.heat0, half_life) + 7 * DAY
    with grpc.insecure_channel(server.target) as channel:
        clock.set(cold_at + 1.0)
        cold = events_of(channel, "drifting", 1, 30.0)  # returns as soon as it is logged
        assert len(cold) == 1, "turned cold before the clock moves on"
        clock.set(archived_at + DAY)
        both = events_of(channel, "drifting", 2, 30.0)
    assert [e.payload["state"] for e in both] == ["cold", "archived"]
    assert cold[0].payload["threshold"] == "0.1" and "threshold" not in both[1].payload
    assert cold[0].at.ToDatetime().timestamp() == pytest.approx(cold_at, abs=1e-3)
    assert both[1].at.ToDatetime().timestamp() == pytest.approx(archived_at, abs=1e-3)
    now = inspect(stub, "drifting", memory.id).memory
    assert now.state == ARCHIVED
    assert now.updated_at.ToDatetime().timestamp() == pytest.approx(archived_at, abs=1e-3)


def test_status_shows_the_hottest_memories_the_decay_and_working_feedback(
    start_server: Callable[..., ServerThread],
) -> None:
    server = start_server()
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        update_settings(channel, "status", decay_curve=memory_pb2.DECAY_CURVE_HUBER)
        for i, word in enumerate(("sky", "sea", "door", "car", "pen", "cup", "hat")):
            store(stub, "status", f"Fact number {i}: the {word} is blue.")
        for _ in range(2):
            stub.Recall(pb.RecallRequest(channel="status", query="the door is blue", limit=1))
        identity = stub.Identity(pb.IdentityRequest(channel="status"))
        assert len(identity.hottest) == 5
        heats = [m.heat for m in identity.hottest]
        assert heats == sorted(heats, reverse=True)
        assert identity.hottest[0].text == "Fact number 2: the door is blue."
        assert identity.feedback_summary == ""  # nothing rated yet
        for i in range(21):
            recall = stub.Recall(
                pb.RecallRequest(channel="status", query=f"what colour is the sky {i}", limit=1)
            )
            stub.Feedback(
                pb.FeedbackRequest(
                    channel="status",
                    recall_id=recall.recall_id,
                    rating=pb.FEEDBACK_RATING_HELPFUL,
                )
            )
        identity = stub.Identity(pb.IdentityRequest(channel="status"))
        assert "settings are working" in identity.feedback_summary
        assert all(not rated.hint for rated in identity.feedback)


def test_a_name_that_opens_a_sentence_counts_where_the_channel_knows_it(
    memories: MemoryServiceStub,
) -> None:
    alone = store(memories, "names-new", "Marguerite starts on Monday.")
    assert list(alone.entities) == [], "capitalised only because it opens the sentence?"
    assert list(store(memories, "names-new", "Invoices are due on Friday.").entities) == []
    hired = store(memories, "names-known", "We hired Marguerite as the new designer.")
    starts = store(memories, "names-known", "Marguerite starts on Monday.")
    assert list(starts.entities) == ["Marguerite"]
    edges = {(e.to_id, e.kind) for e in inspect(memories, "names-known", starts.id).edges}
    assert (hired.id, memory_pb2.EDGE_KIND_ENTITY) in edges
    shared = memories.Share(
        pb.ShareRequest(channel="names-known", id=hired.id, target_channel="names-shared")
    ).memory
    assert shared.text.startswith("[Shared by names-known]")
    assert list(shared.entities) == ["Marguerite"]  # not the channel the prefix names
    # An export carries what the text alone does not say, so an import elsewhere agrees.
    document = "".join(
        chunk.markdown for chunk in memories.Export(pb.ExportRequest(channel="names-known"))
    )
    memories.Import(iter([pb.ImportRequest(channel="names-copy", markdown=document)]))
    copy = inspect(memories, "names-copy", starts.id).memory
    assert list(copy.entities) == ["Marguerite"]
