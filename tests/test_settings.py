"""SettingsService end to end: per-channel policies read, changed, validated and kept."""

from __future__ import annotations

import json
import math
import time
from dataclasses import fields
from pathlib import Path

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calor.models.embedder import OnnxEmbedder
from calor.server.api.settings import apply_settings, settings_message
from calor.server.clock import SystemClock
from calor.server.config import ServerConfig
from calor.server.thermo.heat import TypeProfile
from calor.server.thermo.policy import (
    ChannelPolicy,
    ConfidenceBands,
    ContextWeights,
    DreamThresholds,
    IngestTuning,
    RecallWeights,
)
from calor.v1 import memory_pb2
from calor.v1 import memory_service_pb2 as mpb
from calor.v1 import settings_service_pb2 as pb
from calor.v1.memory_service_pb2_grpc import MemoryServiceStub
from calor.v1.settings_service_pb2_grpc import SettingsServiceStub
from tests.conftest import ServerThread
from tests.helpers import DAY, EPISODIC, FACT, store, ts

SEMANTIC, PROCEDURAL, CORE = (
    memory_pb2.MEMORY_TYPE_SEMANTIC,
    memory_pb2.MEMORY_TYPE_PROCEDURAL,
    memory_pb2.MEMORY_TYPE_CORE,
)

Settings = memory_pb2.ChannelSettings
Profile = memory_pb2.TypeProfile

TYPES = [
    memory_pb2.MemoryType.Value(v.name)
    for v in memory_pb2.MemoryType.DESCRIPTOR.values
    if v.number != memory_pb2.MEMORY_TYPE_UNSPECIFIED
]


@pytest.fixture(scope="session")
def settings(grpc_channel: grpc.Channel) -> SettingsServiceStub:
    """A SettingsService stub on the shared server."""
    return SettingsServiceStub(grpc_channel)


def get(stub: SettingsServiceStub, channel: str) -> Settings:
    return stub.GetSettings(pb.GetSettingsRequest(channel=channel)).settings


def update(stub: SettingsServiceStub, channel: str, paths: list[str], **values: object) -> Settings:
    request = pb.UpdateSettingsRequest(
        channel=channel,
        settings=Settings(**values),  # type: ignore[arg-type]
        update_mask=FieldMask(paths=paths),
    )
    return stub.UpdateSettings(request).settings


def profiles(settings: Settings) -> dict[int, Profile]:
    return {p.memory_type: p for p in settings.profiles}


def heat(stub: MemoryServiceStub, channel: str, memory_id: str) -> float:
    return stub.Inspect(mpb.InspectRequest(channel=channel, id=memory_id)).memory.heat


def test_a_new_channel_has_the_design_defaults(
    settings: SettingsServiceStub, channel_name: str
) -> None:
    got = get(settings, channel_name)
    assert [p.memory_type for p in got.profiles] == TYPES
    by_type = profiles(got)
    assert (by_type[EPISODIC].half_life_seconds, by_type[EPISODIC].floor) == (DAY, 0.01)
    assert by_type[EPISODIC].stability_gain == 1.5
    assert (by_type[FACT].half_life_seconds, by_type[FACT].floor) == (365 * DAY, 0.15)
    assert by_type[FACT].stability_gain == 2.5
    assert got.decay_mode == memory_pb2.DECAY_MODE_TIME
    assert got.cold_threshold == pytest.approx(0.10)
    assert (got.resonance_spread, got.resonance_damping, got.resonance_depth) == (0.30, 0.50, 2)
    assert (got.thermal_gate, got.recall_heat, got.entropy_threshold) == (0.05, 0.05, 4096)
    weights = (
        got.weight_similarity,
        got.weight_heat,
        got.weight_keyword,
        got.weight_temporal,
        got.weight_own_channel,
    )
    assert weights == (0.70, 0.30, 0.15, 0.40, 0.10)
    assert not (got.gate_fidelity or got.gate_heat_ceiling or got.gate_load)
    assert (got.semantic_link_threshold, got.semantic_link_max) == (0.75, 8)
    assert (got.session_gap_seconds, got.working_promotion_recalls) == (1800.0, 2)
    bands = (
        got.confidence_high,
        got.confidence_mid,
        got.confidence_keyword_similarity,
        got.confidence_keyword_overlap,
    )
    assert bands == (0.65, 0.50, 0.45, 0.50)
    assert (got.dream_conflict_similarity, got.dream_merge_similarity) == (0.80, 0.85)
    assert (got.dream_keystone_recalls, got.dream_keystone_heat) == (5, 0.70)
    assert (got.dream_semantic_importance, got.dream_semantic_recalls) == (0.70, 5)
    archive = (
        got.dream_archive_age_days,
        got.dream_archive_heat,
        got.dream_archive_importance,
        got.dream_archive_recalls,
    )
    assert archive == (90.0, 0.15, 0.30, 3)
    assert list(got.dream_archive_exempt_types) == [SEMANTIC, PROCEDURAL, CORE]
    assert (got.dream_prune_heat, got.dream_channel_cooling) == (1e-3, 0.50)
    assert got.heat_min_band == "mid"
    context = (
        got.context_weight_similarity,
        got.context_weight_heat,
        got.context_weight_recency,
        got.context_weight_source,
        got.context_reuse_seconds,
    )
    assert context == (0.40, 0.30, 0.20, 0.10, 300.0)
    ingest = (
        got.ingest_near_duplicate_similarity,
        got.ingest_near_duplicate_penalty,
        got.ingest_novelty_neighbours,
        got.ingest_novelty_bonus,
        got.ingest_familiar_similarity,
        got.ingest_novel_similarity,
        got.ingest_entity_hub,
    )
    assert ingest == (0.95, 0.20, 5, 0.30, 0.85, 0.50, 50)


def test_halving_the_episodic_half_life_changes_heat_at_once_in_that_channel_only(
    memories: MemoryServiceStub, settings: SettingsServiceStub, channel_name: str
) -> None:
    a, b = f"{channel_name}-a", f"{channel_name}-b"
    day_ago = ts(time.time() - DAY)
    in_a = store(memories, a, "We had the kickoff.", memory_type=EPISODIC, created_at=day_ago)
    in_b = store(memories, b, "We had the kickoff.", memory_type=EPISODIC, created_at=day_ago)
    assert heat(memories, a, in_a.id) == pytest.approx(0.50, abs=0.005)
    assert heat(memories, b, in_b.id) == pytest.approx(0.50, abs=0.005)

    halved = Profile(
        memory_type=EPISODIC, half_life_seconds=DAY / 2, floor=0.01, stability_gain=1.5
    )
    answer = update(settings, a, ["profiles"], profiles=[halved])

    assert profiles(answer)[EPISODIC].half_life_seconds == DAY / 2
    assert heat(memories, a, in_a.id) == pytest.approx(0.25, abs=0.005)
    assert heat(memories, b, in_b.id) == pytest.approx(0.50, abs=0.005)
    assert profiles(get(settings, b))[EPISODIC].half_life_seconds == DAY


def test_a_listed_profile_replaces_only_its_type(
    settings: SettingsServiceStub, channel_name: str
) -> None:
    before = get(settings, channel_name)
    fact = Profile(memory_type=FACT, half_life_seconds=1000.0, floor=0.2, stability_gain=3.0)
    answer = update(settings, channel_name, ["profiles"], profiles=[fact])
    assert answer == get(settings, channel_name)
    assert [p.memory_type for p in answer.profiles] == TYPES
    for memory_type in TYPES:
        expected = fact if memory_type == FACT else profiles(before)[memory_type]
        assert profiles(answer)[memory_type] == expected
    rest = [f.name for f in Settings.DESCRIPTOR.fields if f.name != "profiles"]
    assert all(getattr(answer, name) == getattr(before, name) for name in rest)


def test_only_masked_fields_change(settings: SettingsServiceStub, channel_name: str) -> None:
    before = get(settings, channel_name)
    answer = update(
        settings,
        channel_name,
        [
            "decay_mode",
            "weight_temporal",
            "resonance_depth",
            "gate_fidelity",
            "session_gap_seconds",
        ],
        decay_mode=memory_pb2.DECAY_MODE_HYBRID,
        weight_temporal=0.5,
        resonance_depth=3,
        gate_fidelity=True,
        session_gap_seconds=600.0,
        cold_threshold=0.9,  # not in the mask: ignored
    )
    assert answer.decay_mode == memory_pb2.DECAY_MODE_HYBRID
    assert (answer.weight_temporal, answer.resonance_depth) == (0.5, 3)
    assert answer.gate_fidelity and answer.session_gap_seconds == 600.0
    assert answer.cold_threshold == before.cold_threshold
    assert answer.profiles == before.profiles
    assert get(settings, channel_name) == answer


def _profile(**values: float) -> Profile:
    fields_ = {"half_life_seconds": DAY, "floor": 0.01, "stability_gain": 1.5} | values
    return Profile(memory_type=EPISODIC, **fields_)


INVALID: dict[str, tuple[list[str], dict[str, object]]] = {
    "negative half-life": (["profiles"], {"profiles": [_profile(half_life_seconds=-1.0)]}),
    "floor 1.5": (["profiles"], {"profiles": [_profile(floor=1.5)]}),
    "Stab+ below 1": (["profiles"], {"profiles": [_profile(stability_gain=0.5)]}),
    "NaN weight": (["weight_heat"], {"weight_heat": math.nan}),
    "infinite half-life": (["profiles"], {"profiles": [_profile(half_life_seconds=math.inf)]}),
    "unknown mask path": (["weight_bogus"], {}),
    "empty mask": ([], {"cold_threshold": 0.2}),
    "UNSPECIFIED decay mode": (["decay_mode"], {}),
    "unknown decay mode": (["decay_mode"], {"decay_mode": 42}),
    "unknown profile type": (["profiles"], {"profiles": [Profile(memory_type=99)]}),  # type: ignore[arg-type]
    "UNSPECIFIED profile type": (["profiles"], {"profiles": [Profile(half_life_seconds=DAY)]}),
    "weight_temporal above 1": (["weight_temporal"], {"weight_temporal": 1.5}),
    "negative weight": (["weight_keyword"], {"weight_keyword": -0.1}),
    "cold threshold above 1": (["cold_threshold"], {"cold_threshold": 1.01}),
    "zero entropy threshold": (["entropy_threshold"], {}),
    "resonance depth 9": (["resonance_depth"], {"resonance_depth": 9}),
    "merge similarity above 1": (["dream_merge_similarity"], {"dream_merge_similarity": 1.2}),
    "negative keystone recalls": (["dream_keystone_recalls"], {"dream_keystone_recalls": -1}),
    "zero archive age": (["dream_archive_age_days"], {}),
    "NaN cooling": (["dream_channel_cooling"], {"dream_channel_cooling": math.nan}),
    "unknown exempt type": (["dream_archive_exempt_types"], {"dream_archive_exempt_types": [99]}),
    "UNSPECIFIED exempt type": (
        ["dream_archive_exempt_types"],
        {"dream_archive_exempt_types": [0]},
    ),
    "no novelty neighbours": (["ingest_novelty_neighbours"], {}),
    "novel at familiar": (["ingest_novel_similarity"], {"ingest_novel_similarity": 0.85}),
    "familiar under novel": (
        ["ingest_familiar_similarity"],
        {"ingest_familiar_similarity": 0.4},
    ),
    "mid band above high": (["confidence_mid"], {"confidence_mid": 0.7}),
    "negative band": (["confidence_high"], {"confidence_high": -0.1}),
    "unknown heat band": (["heat_min_band"], {"heat_min_band": "medium"}),
    "empty heat band": (["heat_min_band"], {}),
    "context weight above 1": (["context_weight_heat"], {"context_weight_heat": 1.5}),
    "negative reuse window": (["context_reuse_seconds"], {"context_reuse_seconds": -1.0}),
    "one bad among good": (
        ["cold_threshold", "profiles", "channel_heat_half_life_seconds"],
        {"cold_threshold": 0.2, "profiles": [_profile(half_life_seconds=10.0)]},
    ),
}
NAMED = {
    "negative half-life": "half_life_seconds",
    "floor 1.5": "floor",
    "Stab+ below 1": "stability_gain",
    "NaN weight": "weight_heat",
    "infinite half-life": "half_life_seconds",
    "unknown mask path": "weight_bogus",
    "empty mask": "update_mask",
    "UNSPECIFIED decay mode": "decay_mode",
    "unknown decay mode": "decay_mode",
    "unknown profile type": "memory_type",
    "UNSPECIFIED profile type": "memory_type",
    "weight_temporal above 1": "weight_temporal",
    "negative weight": "weight_keyword",
    "cold threshold above 1": "cold_threshold",
    "zero entropy threshold": "entropy_threshold",
    "resonance depth 9": "resonance_depth",
    "merge similarity above 1": "dream_merge_similarity",
    "negative keystone recalls": "dream_keystone_recalls",
    "zero archive age": "dream_archive_age_days",
    "NaN cooling": "dream_channel_cooling",
    "unknown exempt type": "dream_archive_exempt_types",
    "UNSPECIFIED exempt type": "dream_archive_exempt_types",
    "no novelty neighbours": "ingest_novelty_neighbours",
    "novel at familiar": "ingest_novel_similarity: must be below ingest_familiar_similarity",
    "familiar under novel": "ingest_novel_similarity: must be below ingest_familiar_similarity",
    "mid band above high": "confidence_mid: must be at most confidence_high (0.65), got 0.7",
    "negative band": "confidence_high",
    "unknown heat band": "heat_min_band: must be one of 'low', 'mid', 'high', got 'medium'",
    "empty heat band": "heat_min_band",
    "context weight above 1": "context_weight_heat",
    "negative reuse window": "context_reuse_seconds",
    "one bad among good": "channel_heat_half_life_seconds",
}


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_update_is_rejected_and_changes_nothing(
    settings: SettingsServiceStub, channel_name: str, case: str
) -> None:
    update(settings, channel_name, ["cold_threshold"], cold_threshold=0.12)
    before = get(settings, channel_name)
    paths, values = INVALID[case]
    with pytest.raises(grpc.RpcError) as caught:
        update(settings, channel_name, paths, **values)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert NAMED[case] in (caught.value.details() or "")
    assert get(settings, channel_name) == before


def test_an_empty_mask_says_what_to_do(settings: SettingsServiceStub, channel_name: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        update(settings, channel_name, [])
    assert caught.value.details() == "update_mask: name the fields to change"


def test_a_bad_channel_name_is_rejected(settings: SettingsServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        get(settings, "")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_concurrent_updates_of_one_channel_are_all_kept(
    settings: SettingsServiceStub, channel_name: str
) -> None:
    changed = {
        t: Profile(memory_type=t, half_life_seconds=1000.0 + t, stability_gain=1.0) for t in TYPES
    }
    calls = [
        settings.UpdateSettings.future(
            pb.UpdateSettingsRequest(
                channel=channel_name,
                settings=Settings(profiles=[profile]),
                update_mask=FieldMask(paths=["profiles"]),
            )
        )
        for profile in changed.values()
    ]
    for call in calls:
        call.result(timeout=30)
    assert profiles(get(settings, channel_name)) == changed


def test_settings_service_is_served_and_healthy(grpc_channel: grpc.Channel) -> None:
    name = pb.DESCRIPTOR.services_by_name["SettingsService"].full_name
    check = health_pb2_grpc.HealthStub(grpc_channel).Check(
        health_pb2.HealthCheckRequest(service=name)
    )
    assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_settings_survive_a_restart(embedder: OnnxEmbedder, tmp_path: Path) -> None:
    # ServerThreads of our own rather than ``start_server``: that fixture stops every
    # server it started at the end of the session, and a server cannot be stopped twice.
    config = ServerConfig(data_dir=tmp_path, port=0)
    first = ServerThread(config, SystemClock(), lambda: embedder)
    with grpc.insecure_channel(first.target) as channel:
        changed = update(
            SettingsServiceStub(channel),
            "home",
            ["profiles", "decay_mode", "entropy_threshold"],
            profiles=[_profile(half_life_seconds=DAY / 2)],
            decay_mode=memory_pb2.DECAY_MODE_INTERACTION,
            entropy_threshold=1024,
        )
    first.stop()
    second = ServerThread(config, SystemClock(), lambda: embedder)
    try:
        with grpc.insecure_channel(second.target) as channel:
            stub = SettingsServiceStub(channel)
            assert get(stub, "home") == changed
            assert get(stub, "elsewhere") == settings_message(ChannelPolicy())
    finally:
        second.stop()


def test_every_policy_field_is_in_the_api_and_round_trips() -> None:
    policy = ChannelPolicy(
        profiles={**ChannelPolicy().profiles, "core": TypeProfile(7.0, 0.7, 3.0)},
        decay_mode="hybrid",
        weights=RecallWeights(
            similarity=0.1,
            heat=0.2,
            keyword=0.3,
            lexical=0.45,
            source=0.5,
            temporal=0.6,
            own_channel=0.7,
            temporal_fade_days=8.0,
        ),
        resonance_depth=5,
        gate_load=True,
        load_reduced_limit=7,
        default_importance=0.25,
        bands=ConfidenceBands(high=0.8, mid=0.6, keyword_similarity=0.4, keyword_overlap=0.7),
        dreams=DreamThresholds(
            conflict_similarity=0.7,
            merge_similarity=0.9,
            keystone_recalls=3,
            keystone_heat=0.6,
            semantic_importance=0.5,
            semantic_recalls=2,
            archive_age_days=30.0,
            archive_heat=0.2,
            archive_importance=0.4,
            archive_recalls=1,
            archive_exempt_types=("episodic", "fact"),
            prune_heat=0.01,
            channel_cooling=0.25,
            max_conflicts=7,
            interval_seconds=7200.0,
            episode_min=12,
            episode_cooling=0.3,
        ),
        ingest=IngestTuning(
            near_duplicate_similarity=0.9,
            near_duplicate_penalty=0.1,
            novelty_neighbours=3,
            novelty_bonus=0.2,
            familiar_similarity=0.8,
            novel_similarity=0.4,
            entity_hub=20,
        ),
        heat_min_band="high",
        decay_curve="elastic",
        trigger_min_precision=0.3,
        trigger_auto_pause=True,
        context=ContextWeights(
            similarity=0.5, heat=0.2, recency=0.1, source=0.3, reuse_seconds=60.0
        ),
    )
    groups = {
        "weights": "weight_",
        "bands": "confidence_",
        "dreams": "dream_",
        "ingest": "ingest_",
        "context": "context_weight_",
    }
    for group, prefix in groups.items():  # every value above differs from its default
        for f in fields(getattr(policy, group)):
            assert getattr(getattr(policy, group), f.name) != f.default, f"{prefix}{f.name}"
    message = settings_message(policy)
    every = FieldMask(paths=[f.name for f in Settings.DESCRIPTOR.fields])
    assert apply_settings(ChannelPolicy(), message, every) == policy
    assert ChannelPolicy.from_json(policy.to_json()) == policy
    api = {f.name for f in Settings.DESCRIPTOR.fields}
    assert {f.name for f in fields(ChannelPolicy)} - api == set(groups)
    named = {
        f"{prefix}{f.name}" for g, prefix in groups.items() for f in fields(getattr(policy, g))
    }
    # Two group values go by shorter names in the API.
    assert named - api == {"weight_temporal_fade_days", "context_weight_reuse_seconds"}
    assert {"temporal_fade_days", "context_reuse_seconds"} <= api
    grouped = {name for name in api if name.startswith(tuple(groups.values()))}
    assert grouped - named == set()


def test_a_policy_stored_before_the_settings_groups_loads_with_their_defaults() -> None:
    stored = json.loads(ChannelPolicy(decay_mode="hybrid").to_json())
    for group in ("bands", "dreams", "ingest"):
        del stored[group]
    stored["weights"] = {"similarity": 0.5}  # a group missing fields
    stored["retired_setting"] = 1  # a field no longer known
    policy = ChannelPolicy.from_json(json.dumps(stored).encode())
    assert policy == ChannelPolicy(decay_mode="hybrid", weights=RecallWeights(similarity=0.5))
    assert policy.dreams.archive_exempt_types == ("semantic", "procedural", "core")


def test_the_archive_exempt_types_are_replaced_as_a_whole(
    settings: SettingsServiceStub, channel_name: str
) -> None:
    path = ["dream_archive_exempt_types"]
    answer = update(settings, channel_name, path, dream_archive_exempt_types=[CORE, FACT, CORE])
    assert list(answer.dream_archive_exempt_types) == [FACT, CORE]  # the enum's order, once
    assert list(get(settings, channel_name).dream_archive_exempt_types) == [FACT, CORE]
    assert not update(settings, channel_name, path).dream_archive_exempt_types  # none exempt
