"""A curator that runs itself (issue 34, point 2): with ``dream_interval_seconds`` set, a
channel dreams that long after its last dream, with no request to prompt it (off, the
default, it never does by itself); a dream summarises each long enough session in its
most central sentences, and classifies again what an older classifier typed."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from calor.models.embedder import OnnxEmbedder
from calor.models.text import CLASSIFIER_VERSION
from calor.server.clock import ManualClock
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, FACT, SEMANTIC, store, ts, update_settings

HOUR = 3600.0
PREFERENCE = memory_pb2.MEMORY_TYPE_PREFERENCE


def dreams(channel: grpc.Channel, name: str, seconds: float) -> list[tpb.Event]:
    """The channel's dream events (sweeps aside) logged within ``seconds`` from now on
    (and before)."""
    stream = TriggerServiceStub(channel).Subscribe(
        tpb.SubscribeRequest(channels=[name], kinds=[tpb.EVENT_KIND_DREAM]), timeout=seconds
    )
    found = []
    try:
        for reply in stream:
            if reply.event.payload.get("sweep") == "false":
                found.append(reply.event)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return found


def test_a_channel_dreams_on_its_schedule_and_not_without_one(
    start_server: Callable[..., ServerThread],
) -> None:
    clock = ManualClock(1_780_000_000.0)
    server = start_server(clock=clock)
    with grpc.insecure_channel(server.target) as channel:
        stub = MemoryServiceStub(channel)
        update_settings(channel, "curated", dream_interval_seconds=HOUR)
        for name in ("curated", "left-alone"):
            store(stub, name, "The spare key is under the blue flowerpot.")
            store(stub, name, "The spare key is under the blue flowerpot!")
        clock.advance(HOUR - 60)
        assert dreams(channel, "curated", 1.5) == [], "not before its hour"
        clock.advance(61)
        first = dreams(channel, "curated", 3.0)
        assert len(first) == 1
        assert first[0].at.ToDatetime().timestamp() >= 1_780_000_000.0 + HOUR
        assert first[0].payload["merged"] == "1"  # a real dream: the twins were merged
        clock.advance(HOUR + 1)
        assert len(dreams(channel, "curated", 3.0)) == 2, "and again an hour later"
        assert dreams(channel, "left-alone", 0.5) == [], "off by default"
        deadline = time.monotonic() + 5
        while (
            stub.Identity(pb.IdentityRequest(channel="curated")).by_state.get(
                "MEMORY_STATE_MERGED", 0
            )
            != 1
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)


# --- episode summaries --------------------------------------------------------------

# One trip told in eight episodic memories, and one aside that has nothing to do with it.
TRIP = [
    "We landed in Lisbon just after noon. The taxi queue at the airport was long.",
    "We checked into the small hotel in Alfama. The room looked over the river.",
    "In the afternoon we walked up to the castle in Lisbon. The view over the city was wide.",
    "We ate grilled sardines in Lisbon for dinner. The waiter suggested a green wine.",
    "My phone charger stopped working that night. I ordered a new cable online.",
    "The next morning we took the old yellow tram through Lisbon. It rattled up the hills.",
    "We spent the afternoon at the tile museum in Lisbon. The blue tiles were beautiful.",
    "On our last evening in Lisbon we heard fado in a tiny bar. The singer was superb.",
]
# How the same session went on.
ONWARD = [
    "We caught the morning train north to Porto. It was full of students.",
    "Our guesthouse in Porto sat above a bakery. The smell of bread woke us up.",
    "We crossed the iron bridge on foot in Porto. The wind off the river was cold.",
    "A port cellar tour took most of the afternoon. We bought two bottles to bring home.",
    "We found a bookshop with a red staircase in Porto. The queue went round the block.",
    "Dinner was a huge sandwich covered in sauce. Nobody could finish it.",
    "It rained all of our third day in Porto. We stayed in and played cards.",
    "We flew home from Porto on Sunday evening. The flight was delayed an hour.",
]
ASIDE = "My phone charger stopped working that night."
SUMMARY = memory_pb2.EDGE_KIND_SUMMARY


def _trip(stub: MemoryServiceStub, channel: str, texts: list[str], start: float) -> list[str]:
    return [
        store(
            stub, channel, text, memory_type=EPISODIC, tags={"session": "lisbon"},
            created_at=ts(start + 600 * i),
        ).id
        for i, text in enumerate(texts)
    ]  # fmt: skip


def _sentences(texts: list[str]) -> list[str]:
    return [s.strip() for text in texts for s in text.replace(". ", ".\n").splitlines()]


def test_a_dream_summarises_an_episode_in_its_most_central_sentences(
    manual_server: tuple[ServerThread, ManualClock, MemoryServiceStub], embedder: OnnxEmbedder
) -> None:
    _, clock, stub = manual_server
    sources = _trip(stub, "travel", TRIP, clock.now() - 3 * HOUR)
    clock.advance(HOUR)
    before = {i: stub.Inspect(pb.InspectRequest(channel="travel", id=i)).memory for i in sources}

    report = stub.Dream(pb.DreamRequest(channel="travel"))

    assert (report.summarised, len(report.summary_ids)) == (1, 1)
    summary = stub.Inspect(pb.InspectRequest(channel="travel", id=report.summary_ids[0]))
    memory = summary.memory
    assert memory.memory_type == SEMANTIC
    assert (memory.source, memory.confidence) == (
        memory_pb2.SOURCE_EXTRACTED,
        memory_pb2.CONFIDENCE_INFERRED,
    )
    assert dict(memory.tags) == {"episode_summary": "8", "session": "lisbon"}
    # Extractive: three of the episode's own sentences, in the order they were said.
    said = _sentences(TRIP)
    chosen = _sentences([memory.text])
    assert len(chosen) == 3 and all(s in said for s in chosen)
    assert [said.index(s) for s in chosen] == sorted(said.index(s) for s in chosen)
    # The sentence nearest the episode's centre is among them; the aside is not.
    centre = embedder.embed_passages(TRIP).mean(axis=0)
    nearest = said[int(np.argmax(embedder.embed_passages(said) @ centre))]
    assert nearest in chosen and ASIDE not in chosen
    # Linked to each source by a summary edge; each source, tagged with the summary's id,
    # keeps half its heat.
    assert {e.to_id for e in summary.edges if e.kind == SUMMARY} == set(sources)
    for memory_id in sources:
        after = stub.Inspect(pb.InspectRequest(channel="travel", id=memory_id)).memory
        assert after.heat == pytest.approx(before[memory_id].heat / 2, rel=1e-9)
        assert after.tags["summarised_in"] == memory.id

    # Nothing new: nothing to summarise. Eight more of the same session: one more summary,
    # of those eight only.
    assert stub.Dream(pb.DreamRequest(channel="travel")).summarised == 0
    more = _trip(stub, "travel", ONWARD, clock.now() - 2 * HOUR)
    second = stub.Dream(pb.DreamRequest(channel="travel"))
    assert second.summarised == 1
    edges = stub.Inspect(pb.InspectRequest(channel="travel", id=second.summary_ids[0])).edges
    assert {e.to_id for e in edges if e.kind == SUMMARY} == set(more)


def test_forgetting_a_quoted_source_takes_its_summary_along(
    memories: MemoryServiceStub, channel_name: str
) -> None:
    sources = _trip(memories, channel_name, TRIP, time.time() - 2 * HOUR)
    summary_id = memories.Dream(pb.DreamRequest(channel=channel_name)).summary_ids[0]
    text = memories.Inspect(pb.InspectRequest(channel=channel_name, id=summary_id)).memory.text
    quoted = [i for i, t in zip(sources, TRIP, strict=True) if _sentences([t])[0] in text]
    unquoted = [i for i, t in zip(sources, TRIP, strict=True) if not any(
        s in text for s in _sentences([t]))]  # fmt: skip
    assert quoted and unquoted

    forgot = memories.Forget(pb.ForgetRequest(channel=channel_name, ids=[unquoted[0]]))
    assert forgot.forgotten == 1, "a source the summary does not quote leaves it be"
    forgot = memories.Forget(pb.ForgetRequest(channel=channel_name, ids=[quoted[0]]))
    assert forgot.forgotten == 2, "the summary holds a sentence of it: it goes too"
    gone = memories.Inspect(pb.InspectRequest(channel=channel_name, id=summary_id)).memory
    assert (gone.state, gone.text) == (memory_pb2.MEMORY_STATE_DELETED, "")
    # Six sources are left, under the eight an episode needs: no new summary.
    assert memories.Dream(pb.DreamRequest(channel=channel_name)).summarised == 0
    # Two more make eight again: one new summary of them all, which cools only the two
    # (the six gave up their share of heat to the first summary already).
    left = [i for i in sources if i not in (quoted[0], unquoted[0])]
    heat = {i: _memory(memories, channel_name, i).heat for i in left}
    added = _trip(memories, channel_name, ONWARD[:2], time.time() - HOUR)
    heat.update({i: _memory(memories, channel_name, i).heat for i in added})
    again = memories.Dream(pb.DreamRequest(channel=channel_name)).summary_ids
    assert len(again) == 1
    for memory_id, before in heat.items():
        after = _memory(memories, channel_name, memory_id)
        assert after.tags["summarised_in"] == again[0]
        cooled = 0.5 if memory_id in added else 1.0
        assert after.heat == pytest.approx(before * cooled, rel=1e-3)


def _memory(stub: MemoryServiceStub, channel: str, memory_id: str) -> memory_pb2.Memory:
    return stub.Inspect(pb.InspectRequest(channel=channel, id=memory_id)).memory


def test_short_sessions_and_a_channel_that_turned_summaries_off_get_none(
    grpc_channel: grpc.Channel, memories: MemoryServiceStub, channel_name: str
) -> None:
    _trip(memories, channel_name, TRIP[:7], time.time() - 2 * HOUR)
    assert memories.Dream(pb.DreamRequest(channel=channel_name)).summarised == 0
    off = channel_name + "-off"
    update_settings(grpc_channel, off, dream_episode_min=0)
    _trip(memories, off, TRIP, time.time() - 2 * HOUR)
    assert memories.Dream(pb.DreamRequest(channel=off)).summarised == 0
    update_settings(grpc_channel, off, dream_episode_min=8)
    assert memories.Dream(pb.DreamRequest(channel=off)).summarised == 1
    with pytest.raises(grpc.RpcError) as refused:
        update_settings(grpc_channel, off, dream_episode_min=1)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dream_episode_min" in (refused.value.details() or "")


# --- re-classification ------------------------------------------------------------------


def test_a_type_an_older_classifier_inferred_is_classified_again_in_a_dream(
    manual_server: tuple[ServerThread, ManualClock, MemoryServiceStub],
) -> None:
    _, clock, stub = manual_server
    inferred = store(stub, "old", "The user prefers green tea over coffee.")
    given = store(stub, "old", "The user prefers the window seat.", memory_type=FACT)
    assert (inferred.memory_type, inferred.classifier_version) == (PREFERENCE, CLASSIFIER_VERSION)
    assert given.classifier_version == 0, "a type the caller gave is never read again"
    # An export from a Calor whose older classifier read the first as a fact.
    document = "".join(c.markdown for c in stub.Export(pb.ExportRequest(channel="old")))
    older = document.replace(f"- classifier: {CLASSIFIER_VERSION}", "- classifier: 1")
    older = older.replace("- type: preference", "- type: fact")
    assert older.count("- classifier: 1") == 1 and "preference" not in older
    stub.Import(iter([pb.ImportRequest(channel="new", markdown=older)]))
    clock.advance(3 * DAY)
    heat = {m.id: m.heat for m in stub.ListMemories(pb.ListMemoriesRequest(channel="new")).memories}

    report = stub.Dream(pb.DreamRequest(channel="new"))

    assert report.reclassified == 1
    now = {m.id: m for m in stub.ListMemories(pb.ListMemoriesRequest(channel="new")).memories}
    retyped = now[inferred.id]
    assert (retyped.memory_type, retyped.classifier_version) == (PREFERENCE, CLASSIFIER_VERSION)
    assert retyped.heat == pytest.approx(heat[inferred.id], rel=1e-12), "no jump in heat"
    kept = now[given.id]
    assert (kept.memory_type, kept.classifier_version) == (FACT, 0)
    assert stub.Dream(pb.DreamRequest(channel="new")).reclassified == 0
    # A type given later is the caller's: never classified again.
    updated = stub.Update(pb.UpdateRequest(channel="new", id=inferred.id, memory_type=FACT))
    assert updated.memory.classifier_version == 0


def test_a_source_boosted_while_its_episode_is_embedded_is_cooled_as_of_then(
    manual_server: tuple[ServerThread, ManualClock, MemoryServiceStub], embedder: OnnxEmbedder
) -> None:
    """A dream embeds its episodes without the channel's lock; a source boosted meanwhile
    (a minute later, by the clock) keeps half the heat it had when it was cooled, not
    half of a heat dated back to when the dream began."""
    server, clock, stub = manual_server
    sources = _trip(stub, "travel", TRIP, clock.now() - 3 * HOUR)
    engine = server.server.runtime.engine
    boosted: list[float] = []

    def embed_then_boost(texts: list[str]) -> np.ndarray:
        vectors = embedder.embed_passages(texts)
        if not boosted:
            clock.advance(60)
            boosted.append(engine.edits.boost("travel", sources[0], -0.3).heat)
        return vectors

    engine.use_model(embed_then_boost)
    assert stub.Dream(pb.DreamRequest(channel="travel")).summarised == 1
    after = stub.Inspect(pb.InspectRequest(channel="travel", id=sources[0])).memory
    assert after.tags["summarised_in"]
    assert after.heat == pytest.approx(boosted[0] / 2, rel=1e-9)
