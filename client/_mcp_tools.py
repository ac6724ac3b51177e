"""The tools ``calor mcp`` offers: the calls they make and what they answer.

Each tool is one :class:`ToolSpec`: a name, a description written for the model that
will call it, the model of its arguments (:mod:`calor.client._mcp_arguments`), and a
coroutine that makes the call through :class:`~calor.client.AsyncCalorClient` and says
what came back, as short text for the model and as structured data.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mcp import types

from calor.client import _mcp_calls as calls
from calor.client._mcp_arguments import (
    Arguments,
    ContextArguments,
    EvaluateArguments,
    ExportArguments,
    ForgetArguments,
    IdArguments,
    KeystoneArguments,
    ListArguments,
    RecallArguments,
    RecentEventsArguments,
    ShareArguments,
    StoreArguments,
    TriggerFeedbackArguments,
    UpdateArguments,
    input_schema,
)
from calor.client._mcp_calls import Reply
from calor.client._mcp_schema import message_schema, object_schema
from calor.client.aio import AsyncCalorClient
from calor.v1 import memory_pb2, memory_service_pb2, trigger_service_pb2

__all__ = ["TOOLS", "Reply", "ToolSpec"]


# --- the catalogue --------------------------------------------------------------------------

_EXPORT_SCHEMA = object_schema(
    {
        "markdown": {"type": "string"},
        "memories": {"type": "integer"},
        "total": {"type": ["integer", "null"]},
        "truncated": {"type": "boolean"},
    }
)

A = TypeVar("A", bound=Arguments)


@dataclass(frozen=True)
class ToolSpec(Generic[A]):
    """One tool: what hosts are told about it and the call it makes.

    Attributes:
        name: The tool's name.
        title: A short human-readable name.
        description: What it does and when to use it, for the model.
        arguments: The model its arguments are checked against (and their schema).
        run: The call, given checked arguments.
        output: The JSON Schema of the structured data it answers (``outputSchema``).
        read_only: It changes nothing.
        destructive: It may remove or overwrite what is there.
        idempotent: Calling it again with the same arguments changes nothing more.
    """

    name: str
    title: str
    description: str
    arguments: type[A]
    run: Callable[[AsyncCalorClient, A], Awaitable[Reply]]
    output: dict[str, Any]
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False

    def tool(self) -> types.Tool:
        """How the tool is listed to hosts."""
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=input_schema(self.arguments),
            output_schema=self.output,
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=False,
            ),
        )

    async def call(self, calor: AsyncCalorClient, arguments: Mapping[str, Any]) -> Reply:
        """Check the arguments and make the call.

        Raises:
            pydantic.ValidationError: The arguments do not fit the schema.
            CalorClientError: The server refused or failed the call.
        """
        return await self.run(calor, self.arguments.model_validate(dict(arguments)))


TOOLS: tuple[ToolSpec[Any], ...] = (
    ToolSpec(
        "memory_store",
        "Store a memory",
        "Remember something for later: a fact about the user, a decision, what happened, "
        "how to do something. Store one self-contained statement per call. Returns the new "
        "memory's id, type and heat.",
        StoreArguments,
        calls.memory_store,
        object_schema({"memory": memory_pb2.Memory.DESCRIPTOR}),
    ),
    ToolSpec(
        "memory_recall",
        "Recall memories",
        "Find the memories that answer a question, ranked by meaning and heat (how recently "
        "and often they were used). Each hit shows its score, confidence band (high, mid, "
        "low), id, type, heat and text. Recalling warms what it returns unless peek is set.",
        RecallArguments,
        calls.memory_recall,
        message_schema(memory_service_pb2.RecallResponse.DESCRIPTOR),
    ),
    ToolSpec(
        "memory_context",
        "Build a context block",
        "Build the block of memories to put before answering a message: what is relevant to "
        "it, the hottest memories, and the user's profile (core facts, facts, preferences), "
        "packed into a token budget. The same memories give the same text.",
        ContextArguments,
        calls.memory_context,
        message_schema(memory_service_pb2.ContextResponse.DESCRIPTOR),
    ),
    ToolSpec(
        "memory_inspect",
        "Inspect a memory",
        "Show one memory by id, in any state, with its heat, stability, recalls, tags, "
        "entities and its links to other memories.",
        IdArguments,
        calls.memory_inspect,
        message_schema(memory_service_pb2.InspectResponse.DESCRIPTOR),
        read_only=True,
    ),
    ToolSpec(
        "memory_update",
        "Correct a memory",
        "Correct a memory by id: its text, type, tags or importance (what is left out stays "
        "as it is). With supersedes, it replaces an older memory, which is kept as history "
        "and no longer recalled first. Returns the memory as it is now.",
        UpdateArguments,
        calls.memory_update,
        object_schema({"memory": memory_pb2.Memory.DESCRIPTOR}),
        idempotent=True,
    ),
    ToolSpec(
        "memory_list",
        "List memories",
        "List the channel's memories page by page (no ranking and no warming), optionally "
        "only some types or tags. Pass next_page_token as page_token for the next page.",
        ListArguments,
        calls.memory_list,
        message_schema(memory_service_pb2.ListMemoriesResponse.DESCRIPTOR),
        read_only=True,
    ),
    ToolSpec(
        "memory_share",
        "Share a memory",
        "Copy a memory into another channel (for another agent, or a shared channel), marked "
        "as shared from this one. Returns the copy.",
        ShareArguments,
        calls.memory_share,
        object_schema({"memory": memory_pb2.Memory.DESCRIPTOR}),
    ),
    ToolSpec(
        "memory_forget",
        "Forget memories",
        "Forget memories by id, for good: they are no longer recalled. Use it for what is "
        "wrong or what the user asks to be forgotten; with reject, what they said is not "
        "learned again. Returns how many were forgotten.",
        ForgetArguments,
        calls.memory_forget,
        object_schema({"forgotten": {"type": "integer"}}),
        destructive=True,
        idempotent=True,
    ),
    ToolSpec(
        "memory_keystone",
        "Pin or unpin a memory",
        "Pin a memory as a keystone so that its heat never decays (keystone true), or unpin "
        "it (keystone false). Pin what must never be forgotten.",
        KeystoneArguments,
        calls.memory_keystone,
        object_schema({"memory": memory_pb2.Memory.DESCRIPTOR}),
        idempotent=True,
    ),
    ToolSpec(
        "memory_evaluate",
        "Check a text against memory",
        "Check what you are about to say against the memories: contradictions, drift from "
        "the user's preferences, references to what newer memories superseded. Returns an "
        "alignment score (0..1) and each issue with the memory behind it.",
        EvaluateArguments,
        calls.memory_evaluate,
        message_schema(memory_service_pb2.EvaluateResponse.DESCRIPTOR),
    ),
    ToolSpec(
        "memory_subscribe_recent",
        "Recent memory events",
        "The channel's latest events, oldest first: memories stored, recalled, updated, "
        "forgotten, dreams, and what triggers notified. Each shows its seq (pass it to "
        "trigger_feedback as cause_seq), kind, memory and message. Changes nothing.",
        RecentEventsArguments,
        calls.memory_subscribe_recent,
        object_schema(
            {
                "events": [trigger_service_pb2.Event.DESCRIPTOR],
                "last_seq": {"type": "integer"},
            }
        ),
        read_only=True,
    ),
    ToolSpec(
        "trigger_feedback",
        "Rate a trigger's firing",
        "Say whether a trigger's firing (named by the seq of the event that caused it) was "
        "useful or noise. Returns the trigger's precision over its rated firings of the "
        "last 30 days; a trigger that is mostly noise is flagged, and may be paused.",
        TriggerFeedbackArguments,
        calls.trigger_feedback,
        object_schema({"trigger": trigger_service_pb2.Trigger.DESCRIPTOR}),
        idempotent=True,
    ),
    ToolSpec(
        "memory_status",
        "Channel status",
        "The channel's status: how many memories by state and type, the channel's heat, "
        "active gates and open conflicts between memories.",
        Arguments,
        calls.memory_status,
        message_schema(memory_service_pb2.IdentityResponse.DESCRIPTOR),
        read_only=True,
    ),
    ToolSpec(
        "memory_dream",
        "Consolidate memories",
        "Consolidate the channel now: merge near-duplicates, open conflicts between memories "
        "that disagree, promote keystones and types, archive the stale. Returns what each "
        "step changed.",
        Arguments,
        calls.memory_dream,
        message_schema(memory_service_pb2.DreamResponse.DESCRIPTOR),
    ),
    ToolSpec(
        "memory_export",
        "Export memories",
        "The channel's memories as Markdown, one section per memory with its type, heat and "
        "tags, up to max_chars characters.",
        ExportArguments,
        calls.memory_export,
        _EXPORT_SCHEMA,
        read_only=True,
    ),
)
"""Every tool ``calor mcp`` serves, in the order hosts list them."""
