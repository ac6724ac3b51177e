"""Defaults that surprise no one (issue 35, point 3), through a real server: a client made
with no arguments reads the environment as the CLI does, and a subscription streams the
client's own channel from now on, not every channel's history."""

from __future__ import annotations

import asyncio
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata

import pytest

from calor.client import AsyncCalorClient, CalorClient, to_dict
from calor.client._subscription import Resumer
from calor.v1 import trigger_service_pb2 as tpb
from tests.helpers import Run

ON_STORE = "on_store"


def test_a_client_made_without_arguments_reads_the_environment(
    calor_target: str, channel_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALOR_TARGET", calor_target)
    monkeypatch.setenv("CALOR_CHANNEL", channel_name)
    with CalorClient() as calor:
        assert (calor.target, calor.channel) == (calor_target, channel_name)
        stored = calor.store("The build server restarts at midnight.")
    assert stored.channel == channel_name
    with CalorClient(channel="elsewhere") as calor:
        assert (calor.target, calor.channel) == (calor_target, "elsewhere"), "given wins"

    async def from_env() -> tuple[str, str]:
        async with AsyncCalorClient() as calor:
            hit = (await calor.recall("when does the build server restart?")).hits[0]
            return calor.channel, hit.memory.id

    assert asyncio.run(from_env()) == (channel_name, stored.id)
    monkeypatch.delenv("CALOR_TARGET")
    monkeypatch.delenv("CALOR_CHANNEL")
    assert (CalorClient().target, CalorClient().channel) == ("localhost:50051", "default")


def test_a_tls_ca_in_the_environment_is_read_as_the_cli_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CALOR_TLS_CA", "/no/such/ca.pem")
    with pytest.raises(OSError):
        CalorClient("localhost:1")  # it reads the file the variable names
    with CalorClient("localhost:1", tls_ca="") as plain:  # "" turns it off for one client
        assert plain.channel == "default"


def test_subscribe_streams_the_clients_channel_from_now(
    client: CalorClient, channel_name: str, calor_target: str
) -> None:
    client.store("Old news: the kettle was replaced.")  # history, before the stream
    with CalorClient(calor_target, channel=channel_name + "-other") as other:
        other.store("Another channel's note.")
    with client.subscribe(kinds=[ON_STORE]) as events, ThreadPoolExecutor(1) as pool:
        first = pool.submit(lambda: next(events))
        with CalorClient(calor_target, channel=channel_name + "-other") as other:
            other.store("Another channel's note, after the subscription.")
        fresh = client.store("New: the kettle was replaced again.")
        event = first.result(timeout=30)
    assert (event.memory_id, event.channel) == (fresh.id, channel_name)
    # Told otherwise, it replays the channel's history first.
    with client.subscribe(kinds=[ON_STORE], after_seq=0) as events:
        texts = [e.message for e in itertools.islice(events, 2)]
    assert len(texts) == 2


def test_the_async_subscription_also_starts_from_now(calor_target: str, channel_name: str) -> None:
    async def scenario() -> tuple[str, str, str]:
        async with AsyncCalorClient(calor_target, channel=channel_name) as calor:
            old = (await calor.store("History: the office plant was watered.")).id
            events = await calor.subscribe(kinds=[ON_STORE])  # open once awaited
            new = (await calor.store("Watered again today.")).id
            event = await asyncio.wait_for(anext(events), 30)
            await events.aclose()
            # Not awaited, it starts at its first anext: a task that is waiting sees
            # what is stored from then on.
            lazy = calor.subscribe(kinds=[ON_STORE])
            first = asyncio.ensure_future(anext(lazy))
            stored: list[str] = []
            while not first.done():
                stored.append((await calor.store(f"Watered, time {len(stored)}.")).id)
                await asyncio.wait([first], timeout=0.2)
            await lazy.aclose()
            assert first.result().memory_id in stored
            return old, new, event.memory_id

    old, new, seen = asyncio.run(scenario())
    assert seen == new != old


def test_the_start_of_a_stream_from_now_is_its_resume_point() -> None:
    resumer = Resumer(tpb.SubscribeRequest(channels=["a"], from_now=True))
    assert resumer.starting and resumer.request().from_now
    assert not resumer.accept(tpb.SubscribeResponse(start_seq=41))
    again = resumer.request()
    assert (again.from_now, again.after_seq, resumer.starting) == (False, 41, False)
    assert not resumer.accept(tpb.SubscribeResponse(event=tpb.Event(seq=41)))
    assert resumer.accept(tpb.SubscribeResponse(event=tpb.Event(seq=42)))


PEANUTS = "The user is allergic to peanuts."
UNRELATED = ["Deploys go out on Tuesdays.", "The office plant sits by the window."]
QUESTION = "what is the user allergic to?"


def test_min_band_drops_weak_hits_from_both_clients_and_the_cli(
    client: CalorClient, calor_target: str, channel_name: str, calor: Run
) -> None:
    for text in [PEANUTS, *UNRELATED]:
        client.store(text)
    every = {h.memory.text: h.band for h in client.recall(QUESTION, peek=True).hits}
    assert every[PEANUTS] in ("high", "mid") and "low" in every.values()
    kept = {h.memory.text: h.band for h in client.recall(QUESTION, peek=True, min_band="mid").hits}
    assert kept == {t: b for t, b in every.items() if b != "low"}

    async def from_async() -> dict[str, str]:
        async with AsyncCalorClient(calor_target, channel=channel_name) as calor:
            reply = await calor.recall(QUESTION, peek=True, min_band="mid")
            return {h.memory.text: h.band for h in reply.hits}

    assert asyncio.run(from_async()) == kept
    status, out, _ = calor("recall", QUESTION, "--peek", "--min-band", "mid", "--json")
    assert status == 0
    assert {h["memory"]["text"] for h in json.loads(out)["hits"]} == set(kept)
    status, _, err = calor("recall", QUESTION, "--min-band", "loud")
    assert status == 2 and "--min-band" in err


def test_calor_version_prints_the_installed_version(calor: Run) -> None:
    status, out, _ = calor("--version")
    assert (status, out) == (0, f"calor {metadata.version('calor')}\n")


def test_the_cli_names_a_triggers_options_as_the_clients_do(
    calor: Run, client: CalorClient
) -> None:
    status, _, err = calor(
        "trigger", "add", "--event", "on_store", "--action", "notify",
        "--filter-pattern", "(?i)invoice", "--filter-memory-type", "fact",
        "--filter-heat-above", "0.2", "--cooldown-seconds", "1.5",
    )  # fmt: skip
    assert (status, err) == (0, "")
    made = client.list_triggers()[0]
    assert (made.filter_pattern, made.filter_heat_above, made.cooldown_seconds) == (
        "(?i)invoice",
        0.2,
        1.5,
    )
    same = client.create_trigger(
        event="on_store",
        action="notify",
        filter_pattern="(?i)invoice",
        filter_memory_type="fact",
        filter_heat_above=0.2,
        cooldown_seconds=1.5,
    )
    assert (same.filter_memory_type, same.filter_pattern) == (
        made.filter_memory_type,
        made.filter_pattern,
    )


def test_results_and_events_become_plain_data_with_names(client: CalorClient) -> None:
    with client.subscribe(kinds=[ON_STORE]) as events:
        stored = client.store("The user prefers metric units.", memory_type="preference")
        event = next(events)
    memory = to_dict(stored)
    assert (memory["id"], memory["memory_type"], memory["state"]) == (
        stored.id,
        "MEMORY_TYPE_PREFERENCE",
        "MEMORY_STATE_ACTIVE",
    )
    assert memory["recall_count"] == 0 and memory["keystone"] is False, "defaults included"
    data = to_dict(event)
    assert (data["kind"], data["memory_id"]) == ("EVENT_KIND_ON_STORE", stored.id)
    assert json.loads(json.dumps(data)) == data
