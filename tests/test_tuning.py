"""The numbers the design gives are settings: a channel's dream thresholds, store tuning and
confidence bands change what they govern, and ``--max-chain-depth`` bounds trigger chains."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from calor.client.cli import main
from calor.server.config import ServerConfig
from calor.server.engine.ingest import novelty_adjustment
from calor.server.recall.ranking import band
from calor.server.thermo.policy import ConfidenceBands, IngestTuning
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as pb
from calor.v1 import settings_service_pb2 as spb
from calor.v1 import trigger_service_pb2 as tpb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from calor.v1.trigger_service_pb2_grpc import TriggerServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, store, ts

PREFERENCE = memory_pb2.MEMORY_TYPE_PREFERENCE
# Cosine ≈ 0.92: merged by a default dream, a near-duplicate only below 0.95.
STANDUP = ("Our team standup meeting is at 9am every day.", "The daily team standup is at 9am.")
# Cosine ≈ 0.77: below the default merge similarity (0.85) and conflict similarity (0.80).
DEPLOYS = (
    "Deploys go out through the blue-green pipeline.",
    "We ship releases with a blue-green deployment.",
)


@pytest.fixture(scope="module")
def settings(grpc_channel: grpc.Channel) -> SettingsServiceStub:
    return SettingsServiceStub(grpc_channel)


def tune(stub: SettingsServiceStub, channel: str, **values: Any) -> memory_pb2.ChannelSettings:
    request = spb.UpdateSettingsRequest(
        channel=channel,
        settings=memory_pb2.ChannelSettings(**values),
        update_mask=FieldMask(paths=list(values)),
    )
    return stub.UpdateSettings(request).settings


def dream(stub: MemoryServiceStub, channel: str) -> pb.DreamResponse:
    return stub.Dream(pb.DreamRequest(channel=channel))


def test_the_merge_similarity_decides_what_a_dream_merges(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    default, strict, loose = (f"{channel_name}-{n}" for n in ("default", "strict", "loose"))
    for channel in (default, strict):
        for text in STANDUP:
            store(memories, channel, text)
    for text in DEPLOYS:
        store(memories, loose, text)
    tune(settings, strict, dream_merge_similarity=0.999)

    assert dream(memories, default).merged == 1
    assert dream(memories, strict).merged == 0  # the near-duplicate pair stays apart
    assert dream(memories, loose).merged == 0  # too far apart for the default
    tune(settings, loose, dream_merge_similarity=0.70)
    assert dream(memories, loose).merged == 1
    tune(settings, strict, dream_merge_similarity=0.85)
    assert dream(memories, strict).merged == 1


def test_keystone_recalls_and_channel_cooling_are_channel_settings(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    default, tuned = f"{channel_name}-default", f"{channel_name}-tuned"
    for channel in (default, tuned):
        store(memories, channel, "The fire exit is behind the kitchen.")
        assert memories.Recall(pb.RecallRequest(channel=channel, query="fire exit")).hits
    tune(settings, tuned, dream_keystone_recalls=1, dream_channel_cooling=1.0)

    usual, changed = dream(memories, default), dream(memories, tuned)

    assert (usual.keystoned, changed.keystoned) == (0, 1)
    assert usual.channel_heat_after == pytest.approx(usual.channel_heat_before / 2)
    assert changed.channel_heat_before > 0.0 and changed.channel_heat_after == 0.0


def test_archival_age_and_exempt_types_are_channel_settings(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    channels = {n: f"{channel_name}-{n}" for n in ("default", "younger", "exempt")}
    old = ts(time.time() - 400 * DAY)  # at its floor, 0.10: below the archive heat 0.15
    for channel in channels.values():
        # Importance stays 0.1, under the archive importance 0.3: no bonus for novelty.
        tune(settings, channel, ingest_novelty_bonus=0.0)
        store(
            memories,
            channel,
            "I like the window seat on trains.",
            memory_type=PREFERENCE,
            importance=0.1,
            created_at=old,
        )
    tune(settings, channels["younger"], dream_archive_age_days=1000.0)
    tune(settings, channels["exempt"], dream_archive_exempt_types=[PREFERENCE])

    archived = {n: dream(memories, c).archived for n, c in channels.items()}

    assert archived == {"default": 1, "younger": 0, "exempt": 0}


def test_the_near_duplicate_similarity_is_a_channel_setting(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    default, tuned = f"{channel_name}-default", f"{channel_name}-tuned"
    tune(settings, tuned, ingest_near_duplicate_similarity=0.90, ingest_near_duplicate_penalty=0.3)
    found = {}
    for channel in (default, tuned):
        first = store(memories, channel, STANDUP[0])
        found[channel] = (first, store(memories, channel, STANDUP[1]))

    first, second = found[default]
    assert "near_duplicate_of" not in second.provenance
    first, second = found[tuned]
    assert second.provenance["near_duplicate_of"] == first.id
    assert second.importance == pytest.approx(0.5 * 0.7 - 0.3)  # default × agent trust − penalty


def test_the_novelty_formula_reads_its_tuning() -> None:
    usual = IngestTuning()
    assert novelty_adjustment(0.96, usual) == -0.2  # a near-duplicate
    assert novelty_adjustment(0.90, usual) == 0.0  # familiar: no bonus
    assert novelty_adjustment(0.675, usual) == pytest.approx(0.15)  # halfway: half of it
    assert novelty_adjustment(0.10, usual) == pytest.approx(0.3)  # novel: all of it
    tuned = IngestTuning(
        near_duplicate_similarity=0.9,
        near_duplicate_penalty=0.1,
        novelty_bonus=0.2,
        familiar_similarity=0.8,
        novel_similarity=0.6,
    )
    assert novelty_adjustment(0.90, tuned) == -0.1
    assert novelty_adjustment(0.70, tuned) == pytest.approx(0.1)
    assert novelty_adjustment(0.60, tuned) == pytest.approx(0.2)


def test_the_band_rule_reads_its_bounds() -> None:
    usual = ConfidenceBands()
    assert [band(s, 0.0, usual) for s in (0.65, 0.64, 0.50, 0.49)] == ["high", "mid", "mid", "low"]
    assert (band(0.45, 0.5, usual), band(0.45, 0.49, usual), band(0.44, 1.0, usual)) == (
        "mid",
        "low",
        "low",
    )
    tuned = ConfidenceBands(high=0.9, mid=0.7, keyword_similarity=0.3, keyword_overlap=0.8)
    assert [band(s, 0.0, tuned) for s in (0.9, 0.8, 0.6)] == ["high", "mid", "low"]
    assert (band(0.3, 0.8, tuned), band(0.3, 0.7, tuned)) == ("mid", "low")


def test_confidence_bands_are_channel_settings(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    store(memories, channel_name, "The spare key is under the blue flower pot.")

    def band() -> str:
        query = pb.RecallRequest(channel=channel_name, query="where is the spare key?", peek=True)
        [hit] = memories.Recall(query).hits
        assert 0.0 < hit.similarity < 1.0 and hit.keyword > 0.0
        return hit.band

    tune(settings, channel_name, confidence_high=0.0, confidence_mid=0.0)
    assert band() == "high"
    tune(settings, channel_name, confidence_high=1.0)
    assert band() == "mid"
    tune(settings, channel_name, confidence_mid=1.0, confidence_keyword_similarity=1.0)
    assert band() == "low"
    tune(settings, channel_name, confidence_keyword_similarity=0.0, confidence_keyword_overlap=0.0)
    assert band() == "mid"  # moderate meaning backed by the query's words


def _chain_of_four(stub: TriggerServiceStub, channel: str) -> list[str]:
    """c1 (on store) chains to c2, c2 to c3, c3 to c4, which notifies; c2..c4 fire only
    through the chain. Returns their ids, in order."""
    ids = [f"{channel}-c{i}"[-60:] for i in range(1, 5)]
    for i, trigger_id in enumerate(ids):
        last = i == len(ids) - 1
        trigger = tpb.Trigger(
            id=trigger_id,
            channel=channel,
            event=tpb.EVENT_KIND_ON_STORE if i == 0 else tpb.EVENT_KIND_ON_RECALL,
            action=tpb.ACTION_KIND_NOTIFY if last else tpb.ACTION_KIND_CHAIN,
            config={} if last else {"trigger_id": ids[i + 1]},
        )
        stub.CreateTrigger(tpb.CreateTriggerRequest(trigger=trigger))
    return ids


def _fires_once_settled(
    stub: TriggerServiceStub, channel: str, ids: list[str], last_to_fire: str
) -> list[int]:
    deadline = time.time() + 10
    while time.time() < deadline:
        fires = {
            t.id: t.fires
            for t in stub.ListTriggers(tpb.ListTriggersRequest(channel=channel)).triggers
        }
        if fires.get(last_to_fire):
            break
        time.sleep(0.05)
    time.sleep(0.5)  # long enough for anything further down the chain to fire
    listed = stub.ListTriggers(tpb.ListTriggersRequest(channel=channel)).triggers
    fires = {t.id: t.fires for t in listed}
    return [fires[i] for i in ids]


def test_max_chain_depth_stops_a_chain_at_that_depth(
    start_server: Callable[..., ServerThread],
    grpc_channel: grpc.Channel,
    channel_name: str,
) -> None:
    server = start_server(max_chain_depth=3)
    with grpc.insecure_channel(server.target) as channel:
        triggers = TriggerServiceStub(channel)
        ids = _chain_of_four(triggers, channel_name)
        store(MemoryServiceStub(channel), channel_name, "One store starts the chain.")
        assert _fires_once_settled(triggers, channel_name, ids, ids[2]) == [1, 1, 1, 0]
        history = triggers.TriggerHistory(tpb.TriggerHistoryRequest(trigger_id=ids[2]))
        assert [f.outcome for f in history.firings] == [
            f"chain to {ids[3]} stopped (cycle or depth 3)"
        ]
    # The shared server keeps the default depth, 8: the same chain runs to its end.
    triggers = TriggerServiceStub(grpc_channel)
    ids = _chain_of_four(triggers, channel_name)
    store(MemoryServiceStub(grpc_channel), channel_name, "One store starts the chain.")
    assert _fires_once_settled(triggers, channel_name, ids, ids[3]) == [1, 1, 1, 1]


def test_serve_passes_max_chain_depth_and_refuses_less_than_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    served: list[ServerConfig] = []
    monkeypatch.setattr("calor.server.app.serve", served.append)
    assert main(["serve", "--port", "0", "--max-chain-depth", "3"]) == 0
    assert main(["serve", "--port", "0"]) == 0
    assert [config.max_chain_depth for config in served] == [3, ServerConfig().max_chain_depth]
    assert ServerConfig().max_chain_depth == 8
    for bad in ("0", "two"):
        assert main(["serve", "--max-chain-depth", bad]) == 2
        assert "--max-chain-depth" in capsys.readouterr().err
    assert len(served) == 2
