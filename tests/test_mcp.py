"""`calor mcp` as an agent host sees it: the MCP SDK's stdio client drives the command in a
child process, which calls the shared test server."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from jsonschema import Draft202012Validator
from mcp import Client, MCPError, StdioServerParameters, types

from calor.client import AsyncCalorClient, CalorClient
from calor.client._enums import MEMORY_TYPE_NAMES
from calor.client._mcp import call_tool
from calor.client._mcp_calls import export_sections
from calor.client._mcp_tools import TOOLS
from tests.helpers import Run

DEFAULT_CHANNEL = "mcp-default"

TOOL_NAMES = {
    "memory_store",
    "memory_recall",
    "memory_context",
    "memory_inspect",
    "memory_forget",
    "memory_keystone",
    "memory_evaluate",
    "memory_status",
    "memory_dream",
    "memory_export",
    "memory_update",
    "memory_list",
    "memory_share",
    "memory_subscribe_recent",
    "trigger_feedback",
}


class Host:
    """An MCP client session on `calor mcp`, called from synchronous tests."""

    def __init__(self, portal: BlockingPortal, client: Client) -> None:
        self._portal = portal
        self._client = client

    def tools(self) -> dict[str, types.Tool]:
        listing = self._portal.call(self._client.list_tools)
        return {tool.name: tool for tool in listing.tools}

    def call(self, name: str, **arguments: Any) -> types.CallToolResult:
        return self._portal.call(self._client.call_tool, name, arguments)

    def ok(self, name: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
        """Call a tool that must succeed; its text and structured content."""
        result = self.call(name, **arguments)
        assert not result.is_error, text_of(result)
        assert isinstance(result.structured_content, dict)
        return text_of(result), result.structured_content


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


@pytest.fixture(scope="module")
def host(calor_target: str) -> Iterator[Host]:
    """One `calor mcp` child process for the module, its session open on a portal thread."""
    command = str(Path(sys.executable).with_name("calor"))
    server = StdioServerParameters(
        command=command, args=["mcp", "--target", calor_target, "--channel", DEFAULT_CHANNEL]
    )
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(server)) as client:
            yield Host(portal, client)


# --- the listing ----------------------------------------------------------------------------


def test_lists_every_tool_with_a_precise_schema(host: Host) -> None:
    tools = host.tools()
    assert set(tools) == TOOL_NAMES

    store = tools["memory_store"].input_schema
    assert store["type"] == "object"
    assert store["required"] == ["text"]
    assert store["additionalProperties"] is False
    props = store["properties"]
    assert props["text"] == {
        "type": "string",
        "minLength": 1,
        "maxLength": 32 * 1024,
        "description": props["text"]["description"],
    }
    assert props["memory_type"]["enum"] == list(MEMORY_TYPE_NAMES)
    assert props["importance"]["type"] == "number"
    assert (props["importance"]["minimum"], props["importance"]["maximum"]) == (0.0, 1.0)
    assert props["source"]["enum"] == ["human", "agent", "extracted", "ingest"]
    assert props["tags"] == {
        "type": "object",
        "additionalProperties": {"type": "string", "maxLength": 256},
        "propertyNames": {"minLength": 1, "maxLength": 256},
        "maxProperties": 64,
        "description": props["tags"]["description"],
    }
    channel = props["channel"]
    assert (channel["type"], channel["maxLength"]) == ("string", 128)
    assert channel["pattern"] == "^[A-Za-z0-9][A-Za-z0-9_.:@/+-]*$"
    assert "null" not in str(store), "optional arguments are left out, never null"

    recall = tools["memory_recall"].input_schema
    assert recall["required"] == ["query"]
    limit = recall["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"], limit["default"]) == (
        "integer",
        1,
        100,
        10,
    )
    assert recall["properties"]["memory_types"]["items"]["enum"] == list(MEMORY_TYPE_NAMES)
    band = recall["properties"]["min_band"]
    assert (band["enum"], band["default"]) == (["", "low", "mid", "high"], "")

    assert tools["memory_context"].input_schema["required"] == ["message"]
    assert tools["memory_evaluate"].input_schema["required"] == ["text"]
    assert tools["memory_inspect"].input_schema["required"] == ["id"]
    forget = tools["memory_forget"].input_schema
    assert forget["required"] == ["ids"]
    assert (forget["properties"]["ids"]["minItems"], forget["properties"]["ids"]["maxItems"]) == (
        1,
        1000,
    )
    for name in ("memory_status", "memory_dream"):
        assert tools[name].input_schema["properties"].keys() == {"channel"}
        assert "required" not in tools[name].input_schema
    assert tools["memory_forget"].annotations is not None
    assert tools["memory_forget"].annotations.destructive_hint is True
    assert tools["memory_inspect"].annotations is not None
    assert tools["memory_inspect"].annotations.read_only_hint is True
    assert all(tool.description for tool in tools.values())


# --- store and recall -----------------------------------------------------------------------


def test_store_then_recall(host: Host, channel_name: str) -> None:
    text, data = host.ok(
        "memory_store",
        text="The user is allergic to peanuts.",
        memory_type="fact",
        tags={"topic": "health"},
        channel=channel_name,
    )
    memory = data["memory"]
    assert text == f"stored {memory['id']} (fact, heat 1.00)"
    assert (memory["channel"], memory["memory_type"], memory["tags"]) == (
        channel_name,
        "MEMORY_TYPE_FACT",
        {"topic": "health"},
    )
    host.ok("memory_store", text="Deploys go out on Tuesdays.", channel=channel_name)

    text, data = host.ok(
        "memory_recall", query="what is the user allergic to?", limit=1, channel=channel_name
    )
    assert [hit["memory"]["id"] for hit in data["hits"]] == [memory["id"]]
    assert text.startswith("1. [")
    assert memory["id"] in text and "The user is allergic to peanuts." in text


def test_a_call_without_a_channel_works_in_the_default_one(host: Host) -> None:
    _, data = host.ok("memory_store", text="The office plant is a fiddle-leaf fig.")
    assert data["memory"]["channel"] == DEFAULT_CHANNEL
    _, status = host.ok("memory_status")
    assert status["total"] >= 1


# --- errors ---------------------------------------------------------------------------------


def test_a_server_refusal_is_a_tool_error_with_the_servers_message(host: Host) -> None:
    result = host.call("memory_store", text="\u200b\u200b")  # fits the schema; says nothing
    assert result.is_error
    text = text_of(result)
    assert text.startswith("INVALID_ARGUMENT: text: must not be empty, blank or only invisible")
    assert result.structured_content == {
        "error": {"code": "INVALID_ARGUMENT", "message": text.removeprefix("INVALID_ARGUMENT: ")}
    }


def test_arguments_that_do_not_fit_the_schema_are_a_tool_error(host: Host) -> None:
    result = host.call("memory_store", text="x", importance=2.0, memory_type="gossip", color=1)
    assert result.is_error
    text = text_of(result)
    assert text.startswith("INVALID_ARGUMENT: ")
    assert "importance: must be at most 1.0" in text
    assert "memory_type: unknown memory type 'gossip'" in text
    assert "color: is not an argument of this tool" in text
    missing = host.call("memory_recall")
    assert missing.is_error and "query: is required" in text_of(missing)
    # The server's bounds are the schema's, refused in the server's words before a call.
    bad = host.call(
        "memory_store", text="x" * (32 * 1024 + 1), channel="not a channel!", tags={"k": ""}
    )
    said = text_of(bad)
    assert "text: must be at most 32768 characters" in said
    assert "channel: is not a channel name (1-128 letters" in said
    unknown = host.call("memory_inspect", id="nope")
    assert "id: is not a memory id" in text_of(unknown)


def test_an_unknown_id_is_not_found_and_the_server_keeps_serving(
    host: Host, channel_name: str
) -> None:
    result = host.call("memory_inspect", id="01M825EWPPBV32ACFC3X1Y9FEE", channel=channel_name)
    assert result.is_error
    assert text_of(result).startswith("NOT_FOUND: ")
    host.ok("memory_status", channel=channel_name)


def test_an_unknown_tool_is_a_protocol_error(host: Host) -> None:
    with pytest.raises(MCPError, match="unknown tool 'memory_nap'"):
        host.call("memory_nap")


def test_an_unreachable_server_is_a_tool_error_with_a_hint() -> None:
    with socket.socket() as sock:  # a port nothing listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = next(spec for spec in TOOLS if spec.name == "memory_store")

    async def attempt() -> types.CallToolResult:
        async with AsyncCalorClient(f"127.0.0.1:{port}", channel="c", timeout=10) as calor:
            return await call_tool(store, calor, {"text": "hello"})

    result = asyncio.run(attempt())
    assert result.is_error
    text = text_of(result)
    assert text.startswith("UNAVAILABLE: ")
    assert f"is a Calor server running at 127.0.0.1:{port}?" in text


# --- tending memories -----------------------------------------------------------------------


def test_inspect_shows_a_memory_and_its_edges(host: Host, channel_name: str) -> None:
    _, stored = host.ok("memory_store", text="Ana works on compilers.", channel=channel_name)
    memory_id = stored["memory"]["id"]
    text, data = host.ok("memory_inspect", id=memory_id, channel=channel_name)
    assert data["memory"]["id"] == memory_id
    assert "edges" in data
    assert f"id          {memory_id}" in text
    assert "text        Ana works on compilers." in text


def test_forget_removes_memories(host: Host, channel_name: str) -> None:
    ids = [
        host.ok("memory_store", text=text, channel=channel_name)[1]["memory"]["id"]
        for text in ("The cat is called Miso.", "The dog is called Pepper.")
    ]
    text, data = host.ok("memory_forget", ids=ids, channel=channel_name)
    assert (text, data) == ("forgot 2 memories", {"forgotten": 2})
    _, recalled = host.ok("memory_recall", query="pets", peek=True, channel=channel_name)
    assert recalled["hits"] == []
    empty = host.call("memory_forget", ids=[], channel=channel_name)
    assert empty.is_error and "ids: needs at least 1 item(s)" in text_of(empty)
    wrong = "The cat is allergic to fish."
    memory_id = host.ok("memory_store", text=wrong, channel=channel_name)[1]["memory"]["id"]
    host.ok("memory_forget", ids=[memory_id], reject=True, channel=channel_name)
    _, again = host.ok("memory_store", text=wrong, channel=channel_name)
    assert again["memory"]["provenance"]["resembles_rejected"] == memory_id


def test_keystone_pins_and_unpins(host: Host, channel_name: str) -> None:
    _, stored = host.ok("memory_store", text="The user's name is Ines.", channel=channel_name)
    memory_id = stored["memory"]["id"]
    text, data = host.ok("memory_keystone", id=memory_id, channel=channel_name)
    assert data["memory"]["keystone"] is True
    assert text.startswith(f"pinned {memory_id} (") and text.endswith(", keystone)")
    text, data = host.ok("memory_keystone", id=memory_id, keystone=False, channel=channel_name)
    assert data["memory"]["keystone"] is False
    assert text.startswith(f"unpinned {memory_id} (")


def test_status_counts_the_channel(host: Host, channel_name: str) -> None:
    for text in ("Meeting with Bo on Friday.", "Bo prefers tea."):
        host.ok("memory_store", text=text, channel=channel_name)
    text, data = host.ok("memory_status", channel=channel_name)
    assert data["total"] == 2
    assert data["by_state"] == {"MEMORY_STATE_ACTIVE": 2}
    assert f"channel    {channel_name}" in text
    assert "memories   2" in text


def test_dream_reports_what_it_changed(host: Host, channel_name: str) -> None:
    host.ok("memory_store", text="The build uses Bazel.", channel=channel_name)
    text, data = host.ok("memory_dream", channel=channel_name)
    assert text.startswith("dreamed: migrated 0, merged 0, ")
    assert {"migrated", "merged", "keystoned", "archived", "duration_ms"} <= data.keys()


def test_export_returns_the_channel_as_markdown(host: Host, channel_name: str) -> None:
    texts = ["Lunch is at noon.", "The wifi password is on the fridge."]
    for text in texts:
        host.ok("memory_store", text=text, channel=channel_name)
    text, data = host.ok("memory_export", channel=channel_name)
    assert (data["memories"], data["total"], data["truncated"]) == (2, 2, False)
    assert text == data["markdown"]
    assert all(t in text for t in texts)


def test_export_stops_at_max_chars(host: Host, calor_target: str, channel_name: str) -> None:
    notes = [
        f"Field note {i}: the heron returned to pond {i} at dawn, " + "x" * 150 for i in range(20)
    ]
    with CalorClient(calor_target, channel=channel_name) as calor:
        calor.store_many(notes)
    text, data = host.ok("memory_export", max_chars=4000, channel=channel_name)
    assert data["truncated"] is True
    assert data["total"] == 20
    assert 0 < data["memories"] < 20
    assert len(data["markdown"]) <= 4000
    assert text.endswith(f"[truncated at 4000 characters: {data['memories']} of 20 memories shown]")


# --- context and evaluation (the Context and Evaluate RPCs) ---------------------------------


def test_context_brings_the_profile_to_an_unrelated_message(host: Host, channel_name: str) -> None:
    _, stored = host.ok(
        "memory_store",
        text="The user is allergic to peanuts.",
        memory_type="core",
        channel=channel_name,
    )
    text, data = host.ok(
        "memory_context",
        message="What should we cook for dinner tonight?",
        token_budget=500,
        channel=channel_name,
    )
    assert stored["memory"]["id"] in [item["memory"]["id"] for item in data["items"]]
    assert 0 < data["tokens_used"] <= 500
    assert "The user is allergic to peanuts." in data["block"]
    assert text.startswith("context: 1 memory, ")
    assert text.endswith(data["block"])


def test_evaluate_flags_a_contradiction(host: Host, channel_name: str) -> None:
    _, stored = host.ok(
        "memory_store",
        text="The user is allergic to peanuts.",
        memory_type="fact",
        channel=channel_name,
    )
    text, data = host.ok(
        "memory_evaluate", text="The user is not allergic to peanuts.", channel=channel_name
    )
    issues = [(issue["kind"], issue["memory_id"]) for issue in data["issues"]]
    assert ("contradiction", stored["memory"]["id"]) in issues
    assert data["alignment"] < 1.0
    assert f"- contradiction with {stored['memory']['id']}" in text


def test_export_sections_cut_only_at_headings_outside_fences() -> None:
    first = "## Notes\n- id: A\n- type: fact\n\n````text\nkeep\n## not a heading\n```\n````\n\n"
    second = "## Lunch\n- id: B\n- type: fact\n\n```text\nLunch is at noon.\n```\n\n"
    assert export_sections(first + second) == [first, second]
    assert export_sections("") == [""]


def test_recall_leaves_out_weak_hits_below_min_band(host: Host, channel_name: str) -> None:
    for text in ("The user is allergic to peanuts.", "Deploys go out on Tuesdays."):
        host.ok("memory_store", text=text, channel=channel_name)
    query = {"query": "what is the user allergic to?", "peek": True, "channel": channel_name}
    _, every = host.ok("memory_recall", **query)
    assert "low" in [hit["band"] for hit in every["hits"]]
    _, kept = host.ok("memory_recall", min_band="mid", **query)
    assert [hit["memory"]["text"] for hit in kept["hits"]] == ["The user is allergic to peanuts."]


def test_every_tool_declares_an_output_schema_its_answers_fit(
    host: Host, calor_target: str, channel_name: str
) -> None:
    tools = host.tools()
    for tool in tools.values():
        assert tool.output_schema is not None, tool.name
        Draft202012Validator.check_schema(tool.output_schema)
    with CalorClient(calor_target, channel=channel_name) as calor:
        trigger = calor.create_trigger(event="on_store", action="notify", trigger_id="walk")
        stored = calor.store("The user is allergic to peanuts.", memory_type="fact")
        for _ in range(100):
            history = calor.trigger_history(trigger.id)
            if history:
                break
            time.sleep(0.05)
    here = {"channel": channel_name}
    calls: list[tuple[str, dict[str, Any]]] = [
        ("memory_store", {"text": "Deploys go out on Tuesdays.", **here}),
        ("memory_recall", {"query": "allergies", **here}),
        ("memory_context", {"message": "What can I cook tonight?", **here}),
        ("memory_inspect", {"id": stored.id, **here}),
        ("memory_keystone", {"id": stored.id, "keystone": True, **here}),
        ("memory_evaluate", {"text": "The user can eat peanuts.", **here}),
        ("trigger_feedback", {"trigger_id": "walk", "cause_seq": history[0].seq,
                              "rating": "useful", **here}),
        ("memory_status", here),
        ("memory_dream", here),
        ("memory_export", here),
        ("memory_update", {"id": stored.id, "tags": {"topic": "health"}, **here}),
        ("memory_list", {"tags": {"topic": "health"}, **here}),
        ("memory_share", {"id": stored.id, "target_channel": channel_name + "-team", **here}),
        ("memory_forget", {"ids": [stored.id], **here}),
        ("memory_subscribe_recent", {"limit": 3, **here}),
    ]  # fmt: skip
    assert {name for name, _ in calls} == set(tools)
    for name, arguments in calls:
        _, data = host.ok(name, **arguments)  # the SDK's client checks it too
        errors = list(Draft202012Validator(tools[name].output_schema or {}).iter_errors(data))
        assert not errors, (name, errors[0].message)


def test_an_agent_corrects_lists_and_shares_memories(host: Host, channel_name: str) -> None:
    _, first = host.ok("memory_store", text="The office moved to the fourth floor.",
                       channel=channel_name)  # fmt: skip
    _, second = host.ok("memory_store", text="The office moved to the fifth floor.",
                        channel=channel_name)  # fmt: skip
    old, new = first["memory"]["id"], second["memory"]["id"]
    text, data = host.ok(
        "memory_update", id=new, supersedes=old, tags={"topic": "office"}, channel=channel_name
    )
    assert text.startswith(f"updated {new}")
    assert data["memory"]["tags"] == {"topic": "office", "supersedes": old}
    _, listed = host.ok("memory_list", tags={"topic": "office"}, channel=channel_name)
    assert [m["id"] for m in listed["memories"]] == [new]
    _, page = host.ok("memory_list", page_size=1, channel=channel_name)
    assert len(page["memories"]) == 1 and page["next_page_token"]
    text, more = host.ok(
        "memory_list", page_size=1, page_token=page["next_page_token"], channel=channel_name
    )
    assert more["memories"][0]["id"] != page["memories"][0]["id"]
    text, shared = host.ok(
        "memory_share", id=new, target_channel=channel_name + "-team", channel=channel_name
    )
    copy = shared["memory"]
    assert text.startswith(f"shared into {channel_name}-team: ")
    assert copy["channel"] == channel_name + "-team" and copy["id"] != new
    assert "fifth floor" in copy["text"]


def test_recent_events_are_the_channels_last_ones_oldest_first(
    host: Host, calor_target: str, channel_name: str
) -> None:
    text, data = host.ok("memory_subscribe_recent", channel=channel_name)
    assert data["events"] == [] and text == "no events retained"
    with CalorClient(calor_target, channel=channel_name) as calor:
        ids = [calor.store(f"Note {n} of the recent-events test.").id for n in range(5)]
        calor.store("Elsewhere.", channel=channel_name + "-other")
    text, data = host.ok("memory_subscribe_recent", limit=3, kinds=["on_store"],
                         channel=channel_name)  # fmt: skip
    assert [e["memory_id"] for e in data["events"]] == ids[-3:]
    assert all(e["channel"] == channel_name for e in data["events"])
    assert data["last_seq"] >= data["events"][-1]["seq"]
    assert len(text.splitlines()) == 3 and ids[-1] in text.splitlines()[-1]
    _, everything = host.ok("memory_subscribe_recent", limit=200, channel=channel_name)
    assert len(everything["events"]) >= 5  # stores, and whatever else the channel logged


def test_the_printed_host_config_starts_a_working_server(
    calor: Run, calor_target: str, channel_name: str, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    status, out, _ = calor("mcp", "--print-config", "--tls-ca", str(ca), "--api-key", "k-1")
    assert status == 0
    entry = json.loads(out)["mcpServers"]["calor"]
    assert Path(entry["command"]).is_absolute() and Path(entry["command"]).name == "calor"
    assert entry["args"][entry["args"].index("--tls-ca") + 1] == str(ca.resolve())
    assert entry["env"] == {"CALOR_API_KEY": "<your Calor API key>"}, "the key's name only"
    assert "k-1" not in out
    status, out, _ = calor("mcp", "--print-config")
    entry = json.loads(out)["mcpServers"]["calor"]
    assert entry["args"] == ["mcp", "--target", calor_target, "--channel", channel_name]

    async def started() -> dict[str, Any]:
        server = StdioServerParameters(command=entry["command"], args=entry["args"])
        async with Client(server) as client:
            result = await client.call_tool("memory_status", {})
            assert not result.is_error
            assert isinstance(result.structured_content, dict)
            return result.structured_content

    assert "by_state" in asyncio.run(started())
