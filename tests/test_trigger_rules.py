"""Trigger rules: validated on registration with clear messages, evaluated by pure functions."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
from typing import Any

import pytest

from calor.server.errors import InvalidArgumentError
from calor.triggers.rules import (
    ACTIONS,
    EVENTS,
    TriggerRule,
    compile_pattern,
    matches,
    rule_from_message,
    rule_message,
)
from calor.triggers.templates import MESSAGE_FIELDS, render_message
from calor.v1 import memory_pb2
from calor.v1 import trigger_service_pb2 as tpb
from tests.helpers import trigger_rule

NOW = 1_700_000_000.25


def checked_channel(channel: str) -> str:
    if not channel:
        raise InvalidArgumentError("channel: must not be empty")
    return channel


def trigger(**fields: Any) -> tpb.Trigger:
    base: dict[str, Any] = dict(
        channel="team",
        event=tpb.EVENT_KIND_ON_STORE,
        action=tpb.ACTION_KIND_NOTIFY,
    )
    base.update(fields)
    return tpb.Trigger(**base)


def build(**fields: Any) -> TriggerRule:
    return rule_from_message(
        trigger(**fields), trigger_id="trg_1", now=NOW, validate_channel=checked_channel
    )


def rule(**overrides: Any) -> TriggerRule:
    return trigger_rule(**{"created_at": NOW, **overrides})


def test_constants() -> None:
    assert ACTIONS == ("notify", "boost", "pin", "tag", "deprecate", "webhook", "chain")
    assert EVENTS == ("on_store", "on_recall", "on_boost", "on_decay")


def test_a_minimal_trigger_is_valid() -> None:
    got = build()
    assert got == rule()
    assert got.config_value("message", "default") == "default"


@pytest.mark.parametrize(
    ("event", "name"),
    [
        (tpb.EVENT_KIND_ON_STORE, "on_store"),
        (tpb.EVENT_KIND_ON_RECALL, "on_recall"),
        (tpb.EVENT_KIND_ON_BOOST, "on_boost"),
        (tpb.EVENT_KIND_ON_DECAY, "on_decay"),
    ],
)
def test_each_event(event: int, name: str) -> None:
    assert build(event=event).event == name


@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_with_its_config(action: str) -> None:
    configs = {
        "tag": {"key": "status", "value": ""},
        "webhook": {"url": "https://hooks.example.com/x"},
        "chain": {"trigger_id": "trg_0"},
    }
    config = configs.get(action, {})
    got = build(action=tpb.ActionKind.Value("ACTION_KIND_" + action.upper()), config=config)
    assert got.action == action
    assert dict(got.config) == config


BAD_TRIGGERS: dict[str, tuple[dict[str, Any], str]] = {
    "unspecified event": (dict(event=tpb.EVENT_KIND_UNSPECIFIED), "event"),
    "streamed-only event": (dict(event=tpb.EVENT_KIND_NOTIFY), "EVENT_KIND_NOTIFY"),
    "unknown event": (dict(event=99), "event"),
    "unspecified action": (dict(action=tpb.ACTION_KIND_UNSPECIFIED), "action"),
    "unknown action": (dict(action=42), "action"),
    "unknown memory type": (dict(filter_memory_type=77), "filter_memory_type"),
    "heat above NaN": (dict(filter_heat_above=math.nan), "filter_heat_above"),
    "heat above > 1": (dict(filter_heat_above=1.5), "filter_heat_above"),
    "heat below < 0": (dict(filter_heat_below=-0.1), "filter_heat_below"),
    "heat below inf": (dict(filter_heat_below=math.inf), "filter_heat_below"),
    "above not < below": (dict(filter_heat_above=0.6, filter_heat_below=0.6), "filter_heat_above"),
    "negative max_fires": (dict(max_fires=-1), "max_fires"),
    "negative cooldown": (dict(cooldown_seconds=-1.0), "cooldown_seconds"),
    "NaN cooldown": (dict(cooldown_seconds=math.nan), "cooldown_seconds"),
    "infinite cooldown": (dict(cooldown_seconds=math.inf), "cooldown_seconds"),
    "threshold off decay": (dict(threshold=0.2), "threshold"),
    "threshold 0": (dict(event=tpb.EVENT_KIND_ON_DECAY, threshold=0.0), "threshold"),
    "threshold 1": (dict(event=tpb.EVENT_KIND_ON_DECAY, threshold=1.0), "threshold"),
    "threshold NaN": (dict(event=tpb.EVENT_KIND_ON_DECAY, threshold=math.nan), "threshold"),
    "long pattern": (dict(filter_pattern="a" * 513), "filter_pattern"),
    "bad pattern": (dict(filter_pattern="(unclosed"), "missing )"),
    "back-reference": (dict(filter_pattern=r"(a)\1"), "RE2"),
    "look-ahead": (dict(filter_pattern="a(?=b)"), "RE2"),
    "empty channel": (dict(channel=""), "channel"),
}


@pytest.mark.parametrize("case", BAD_TRIGGERS, ids=list(BAD_TRIGGERS))
def test_bad_fields_are_rejected_by_name(case: str) -> None:
    fields, word = BAD_TRIGGERS[case]
    with pytest.raises(InvalidArgumentError) as caught:
        build(**fields)
    assert word in caught.value.message, caught.value.message


NOTIFY = tpb.ACTION_KIND_NOTIFY
BOOST = tpb.ACTION_KIND_BOOST
TAG = tpb.ACTION_KIND_TAG
WEBHOOK = tpb.ACTION_KIND_WEBHOOK
HOOK = "https://hooks.example.com/calor"

BAD_CONFIGS: dict[str, tuple[int, dict[str, str], str]] = {
    "unknown key": (NOTIFY, {"colour": "red"}, "unknown key 'colour'"),
    "key for no-config action": (tpb.ACTION_KIND_PIN, {"x": "1"}, "allowed: none"),
    "long template": (NOTIFY, {"message": "x" * 1001}, "config.message"),
    "unknown placeholder": (NOTIFY, {"message": "hi {user}"}, "{user}"),
    "attribute access": (NOTIFY, {"message": "{text.upper}"}, "{text.upper}"),
    "index access": (NOTIFY, {"message": "{text[0]}"}, "{text[0]}"),
    "format spec": (NOTIFY, {"message": "{heat:.2f}"}, "{heat:.2f}"),
    "conversion": (NOTIFY, {"message": "{text!r}"}, "{text!r}"),
    "lone brace": (NOTIFY, {"message": "a { b"}, "unmatched"),
    "delta not a number": (BOOST, {"delta": "lots"}, "config.delta"),
    "delta NaN": (BOOST, {"delta": "nan"}, "config.delta"),
    "delta too big": (BOOST, {"delta": "1.5"}, "config.delta"),
    "bad boost target": (BOOST, {"target": "everyone"}, "config.target"),
    "tag without key": (TAG, {"value": "v"}, "config.key"),
    "tag without value": (TAG, {"key": "k"}, "config.value"),
    "empty tag key": (TAG, {"key": "", "value": "v"}, "config.key"),
    "long tag value": (TAG, {"key": "k", "value": "é" * 129}, "config.value"),
    "webhook without url": (WEBHOOK, {}, "config.url"),
    "ftp url": (WEBHOOK, {"url": "ftp://example.com/x"}, "config.url"),
    "url without host": (WEBHOOK, {"url": "http:///path"}, "config.url"),
    "url with spaces": (WEBHOOK, {"url": "http://a b/"}, "config.url"),
    "url with bad port": (WEBHOOK, {"url": "http://example.com:99999/"}, "config.url"),
    "url with credentials": (WEBHOOK, {"url": "http://u:p@example.com/"}, "credentials"),
    "timeout zero": (WEBHOOK, {"url": HOOK, "timeout_seconds": "0"}, "config.timeout_seconds"),
    "timeout > 60": (WEBHOOK, {"url": HOOK, "timeout_seconds": "61"}, "config.timeout_seconds"),
    "retries > 10": (WEBHOOK, {"url": HOOK, "retries": "11"}, "config.retries"),
    "retries negative": (WEBHOOK, {"url": HOOK, "retries": "-1"}, "config.retries"),
    "retries fractional": (WEBHOOK, {"url": HOOK, "retries": "1.5"}, "config.retries"),
    "chain without target": (tpb.ACTION_KIND_CHAIN, {}, "config.trigger_id"),
    "chain to blank": (tpb.ACTION_KIND_CHAIN, {"trigger_id": " "}, "config.trigger_id"),
    "oversized key": (NOTIFY, {"k" * 257: "v"}, "256 bytes"),
    "oversized value": (WEBHOOK, {"url": HOOK, "secret": "s" * 2049}, "2048 bytes"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=list(BAD_CONFIGS))
def test_bad_configs_are_rejected_by_name(case: str) -> None:
    action, config, words = BAD_CONFIGS[case]
    with pytest.raises(InvalidArgumentError) as caught:
        build(action=action, config=config)
    assert words in caught.value.message, caught.value.message


def test_good_configs_are_kept() -> None:
    hook = build(
        action=WEBHOOK,
        config={
            "url": "http://127.0.0.1:8080/h?x=1",
            "secret": "s",
            "timeout_seconds": "60",
            "retries": "10",
        },
    )
    assert hook.config_value("retries") == "10"
    boost = build(action=BOOST, config={"delta": "-1", "target": "neighbours"})
    assert boost.config_value("delta") == "-1"
    template = "{{literal}} " + " ".join("{" + name + "}" for name in MESSAGE_FIELDS)
    assert build(config={"message": template}).config_value("message") == template


def test_a_rule_is_frozen_hashable_and_copies_its_config() -> None:
    config = {"key": "k", "value": "v"}
    got = build(action=TAG, config=config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.channel = "other"  # type: ignore[misc]
    plain = rule(action="tag", config=config)
    config["key"] = "changed"
    assert plain.config_value("key") == "k"
    assert hash(got) == hash(build(action=TAG, config={"key": "k", "value": "v"}))
    assert copy.deepcopy(got) == got
    assert dataclasses.asdict(got)["config"] == {"key": "k", "value": "v"}


def test_re2_pattern_is_linear_where_python_re_would_backtrack() -> None:
    text = "a" * 40 + "b"
    got = build(filter_pattern="(a+)+$")
    started = time.perf_counter()
    hit = matches(got, event="on_store", channel="team", memory_type="fact", text=text, heat=0.5)
    assert time.perf_counter() - started < 0.5
    assert hit is False
    assert matches(got, event="on_store", channel="team", memory_type="fact", text="xaaa", heat=0.5)
    # The same pattern on a longer input still answers at once.
    assert compile_pattern("(a+)+$").search("a" * 100_000 + "b") is None
    assert time.perf_counter() - started < 0.5


def test_patterns_are_compiled_once() -> None:
    assert compile_pattern("deploy.*friday") is compile_pattern("deploy.*friday")


def test_matches_checks_event_channel_and_every_filter() -> None:
    def hit(r: TriggerRule, **event: Any) -> bool:
        base: dict[str, Any] = dict(
            event="on_store", channel="team", memory_type="fact", text="Deploy on Friday", heat=0.5
        )
        base.update(event)
        return matches(r, **base)

    plain = rule()
    assert hit(plain)
    assert not hit(plain, event="on_recall")
    assert not hit(plain, channel="other")

    typed = rule(filter_memory_type="fact")
    assert hit(typed)
    assert not hit(typed, memory_type="episodic")

    pattern = rule(filter_pattern=r"deploy\s+on")
    assert hit(pattern)  # case-insensitive
    assert not hit(pattern, text="nothing here")

    above = rule(filter_heat_above=0.5)
    assert not hit(above, heat=0.5)  # strictly above
    assert hit(above, heat=0.51)
    below = rule(filter_heat_below=0.5)
    assert not hit(below, heat=0.5)  # strictly below
    assert hit(below, heat=0.49)
    band = rule(filter_heat_above=0.2, filter_heat_below=0.8)
    assert hit(band, heat=0.3)
    assert not hit(band, heat=0.9)
    assert not hit(band, heat=math.nan)


def test_render_message_fills_only_plain_names() -> None:
    fields = {"memory_id": "m1", "heat": "0.42", "text": "{channel} is literal"}
    assert render_message("{memory_id} at {heat}", fields) == "m1 at 0.42"
    # Substituted text is not rendered again, and braces escape as in str.format.
    assert render_message("{text} {{x}}", fields) == "{channel} is literal {x}"
    # A placeholder with no value stays as written; nothing is looked up on objects.
    assert render_message("{event} {text.__class__}", fields) == "{event} {text.__class__}"


def test_json_round_trip() -> None:
    original = rule(
        action="webhook",
        config={"url": HOOK, "secret": "sé"},
        filter_memory_type="preference",
        filter_pattern="x+",
        filter_heat_above=0.1,
        filter_heat_below=0.9,
        max_fires=3,
        cooldown_seconds=2.5,
        event="on_decay",
        threshold=0.05,
    )
    data = original.to_json()
    assert isinstance(data, bytes)
    assert TriggerRule.from_json(data) == original
    assert TriggerRule.from_json(rule().to_json()) == rule()


def test_from_json_ignores_unknown_keys() -> None:
    data = rule().to_json()[:-1] + b',"from_the_future":1}'
    assert TriggerRule.from_json(data) == rule()


def test_message_round_trip() -> None:
    message = trigger(
        event=tpb.EVENT_KIND_ON_DECAY,
        action=tpb.ACTION_KIND_BOOST,
        config={"delta": "0.2", "target": "neighbours"},
        filter_memory_type=memory_pb2.MEMORY_TYPE_EPISODIC,
        filter_pattern="incident",
        filter_heat_above=0.0,
        filter_heat_below=0.7,
        max_fires=5,
        cooldown_seconds=30.0,
        threshold=0.1,
    )
    built = rule_from_message(
        message, trigger_id="trg_9", now=NOW, validate_channel=checked_channel
    )
    back = rule_message(built, fires=4)
    assert back.id == "trg_9"
    assert back.fires == 4
    assert back.created_at.ToNanoseconds() == 1_700_000_000_250_000_000  # to the nanosecond
    assert back.HasField("filter_heat_above") and back.filter_heat_above == 0.0
    assert back.HasField("threshold")
    expected = tpb.Trigger()
    expected.CopyFrom(message)
    expected.id, expected.fires = "trg_9", 4
    expected.created_at.CopyFrom(back.created_at)
    assert back == expected
    again = rule_from_message(back, trigger_id="trg_9", now=NOW, validate_channel=checked_channel)
    assert again == built

    bare = rule_message(rule(), fires=0)
    assert not bare.HasField("filter_heat_above")
    assert not bare.HasField("threshold")
    assert bare.filter_memory_type == memory_pb2.MEMORY_TYPE_UNSPECIFIED


def test_validate_channel_normalises() -> None:
    got = rule_from_message(
        trigger(channel=" Team "), trigger_id="t", now=NOW, validate_channel=str.strip
    )
    assert got.channel == "Team"


def test_error_names_the_allowed_events() -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape("EVENT_KIND_ON_DECAY")):
        build(event=tpb.EVENT_KIND_DREAM)
