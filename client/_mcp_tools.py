"""The tools ``calor mcp`` offers: the calls they make and what they answer.

Each tool is one :class:`ToolSpec`: a name, a description written for the model that
will call it, the model of its arguments (:mod:`calor.client._mcp_arguments`), and a
coroutine that makes the call through :class:`~calor.client.AsyncCalorClient` and says
what came back, as short text for the model and as structured data.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Generic, NamedTuple, TypeVar

from mcp import types

from calor.client import _render
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
from calor.client._mcp_schema import message_schema, object_schema
from calor.client._transfer import export_total
from calor.client.aio import AsyncCalorClient
from calor.v1 import memory_pb2, memory_service_pb2, trigger_service_pb2

__all__ = [
    "TOOLS",
    "Reply",
    "ToolSpec",
    "context_text",
    "dream_text",
    "evaluation_text",
    "export_sections",
]


class Reply(NamedTuple):
    """What a tool answers: text for the model to read, and the same as structured data."""

    text: str
    data: dict[str, Any]


# --- the calls ------------------------------------------------------------------------------


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


async def _store(calor: AsyncCalorClient, a: StoreArguments) -> Reply:
    memory = await calor.store(
        a.text,
        channel=a.channel,
        idempotency_key=a.idempotency_key,
        memory_type=a.memory_type,
        importance=a.importance,
        keystone=a.keystone,
        tags=a.tags,
        source=a.source,
        confidence=a.confidence,
    )
    return Reply(_render.stored(memory), {"memory": _render.to_dict(memory)})


async def _recall(calor: AsyncCalorClient, a: RecallArguments) -> Reply:
    response = await calor.recall(
        a.query,
        channel=a.channel,
        limit=a.limit,
        memory_types=a.memory_types,
        include_archived=a.include_archived,
        peek=a.peek,
        min_band=a.min_band,
    )
    return Reply(_render.recalled(response), _render.to_dict(response))


def context_text(response: memory_service_pb2.ContextResponse) -> str:
    """A context block with a line above it saying what it holds."""
    if not response.items and not response.block:
        return "no memories for this message"
    reused = ", reused" if response.reused else ""
    head = (
        f"context: {_count(len(response.items), 'memory', 'memories')}, "
        f"{response.tokens_used} tokens{reused}"
    )
    return f"{head}\n\n{response.block}"


async def _context(calor: AsyncCalorClient, a: ContextArguments) -> Reply:
    response = await calor.context(
        a.message,
        channel=a.channel,
        token_budget=a.token_budget,
        heat=a.heat,
        max_nodes=a.max_nodes,
        max_chars=a.max_chars,
    )
    return Reply(context_text(response), _render.to_dict(response))


async def _inspect(calor: AsyncCalorClient, a: IdArguments) -> Reply:
    response = await calor.inspect(a.id, channel=a.channel)
    return Reply(_render.inspected(response), _render.to_dict(response))


async def _forget(calor: AsyncCalorClient, a: ForgetArguments) -> Reply:
    count = await calor.forget(a.ids, channel=a.channel, reject=a.reject)
    return Reply(f"forgot {_count(count, 'memory', 'memories')}", {"forgotten": count})


async def _keystone(calor: AsyncCalorClient, a: KeystoneArguments) -> Reply:
    memory = await calor.keystone(a.id, on=a.keystone, channel=a.channel)
    verb = "pinned" if a.keystone else "unpinned"
    return Reply(f"{verb} {_render.memory_line(memory)}", {"memory": _render.to_dict(memory)})


async def _update(calor: AsyncCalorClient, a: UpdateArguments) -> Reply:
    memory = await calor.update(
        a.id,
        channel=a.channel,
        text=a.text,
        memory_type=a.memory_type,
        tags=a.tags,
        importance=a.importance,
        supersedes=a.supersedes or "",
    )
    return Reply(f"updated {_render.memory_line(memory)}", {"memory": _render.to_dict(memory)})


async def _list(calor: AsyncCalorClient, a: ListArguments) -> Reply:
    page = await calor.list_memories(
        channel=a.channel,
        page_token=a.page_token,
        page_size=a.page_size,
        memory_types=a.memory_types,
        tags=a.tags,
    )
    text = _render.listed(list(page.memories))
    if page.next_page_token:
        text += f"\nmore: page_token {page.next_page_token}"
    return Reply(text, _render.to_dict(page))


async def _share(calor: AsyncCalorClient, a: ShareArguments) -> Reply:
    memory = await calor.share(a.id, a.target_channel, channel=a.channel)
    text = f"shared into {a.target_channel}: {_render.memory_line(memory)}"
    return Reply(text, {"memory": _render.to_dict(memory)})


async def _recent_events(calor: AsyncCalorClient, a: RecentEventsArguments) -> Reply:
    channels = [a.channel] if a.channel else None
    opened = await calor.subscribe(channels=channels, kinds=a.kinds, resume=False)
    end = opened.last_seq  # the log's last event as the stream opened
    await opened.aclose()
    recent: deque[trigger_service_pb2.Event] = deque(maxlen=a.limit)
    if end:
        history = calor.subscribe(
            channels=channels,
            kinds=a.kinds,
            after_seq=0,
            from_oldest_retained=True,
            until_seq=end,
            resume=False,
        )
        try:
            async for event in history:
                recent.append(event)
        finally:
            await history.aclose()
    lines = [_render.event_line(event) for event in recent]
    text = "\n".join(lines) if lines else "no events retained"
    data = {"events": [_render.to_dict(event) for event in recent], "last_seq": end}
    return Reply(text, data)


async def _trigger_feedback(calor: AsyncCalorClient, a: TriggerFeedbackArguments) -> Reply:
    trigger = await calor.trigger_feedback(a.trigger_id, a.cause_seq, a.rating, channel=a.channel)
    precision = f"{trigger.precision:.2f}" if trigger.HasField("precision") else "-"
    text = f"rated {a.rating}: trigger {trigger.id} precision {precision} over {trigger.rated}"
    if trigger.paused:
        text += f"; paused: {trigger.paused}"
    return Reply(text, {"trigger": _render.to_dict(trigger)})


def evaluation_text(response: memory_service_pb2.EvaluateResponse) -> str:
    """The alignment, then one line per issue naming the memory behind it."""
    head = f"{response.status}, alignment {response.alignment:.2f}"
    if not response.issues:
        lines = [f"{head}: no issues found"]
    else:
        lines = [f"{head}: {_count(len(response.issues), 'issue', 'issues')}"]
        for issue in response.issues:
            lines.append(
                f"- {issue.kind} with {issue.memory_id} (similarity {issue.similarity:.2f}): "
                f"{issue.message}"
            )
            if issue.correction:
                lines.append(f"  correction: {issue.correction}")
    if response.stored_ids:
        lines.append(f"stored as findings: {', '.join(response.stored_ids)}")
    return "\n".join(lines)


async def _evaluate(calor: AsyncCalorClient, a: EvaluateArguments) -> Reply:
    response = await calor.evaluate(a.text, channel=a.channel, store_findings=a.store_findings)
    return Reply(evaluation_text(response), _render.to_dict(response))


async def _status(calor: AsyncCalorClient, a: Arguments) -> Reply:
    response = await calor.identity(channel=a.channel)
    return Reply(_render.identity(response, a.channel or calor.channel), _render.to_dict(response))


def dream_text(report: memory_service_pb2.DreamResponse) -> str:
    """A dream report on one line: what each step changed, the channel's heat, the time."""
    return f"dreamed: {_render.dreamed(report)}"


async def _dream(calor: AsyncCalorClient, a: Arguments) -> Reply:
    report = await calor.dream(channel=a.channel)
    return Reply(dream_text(report), _render.to_dict(report))


_FENCE_OPENING = re.compile(r"(`{3,})text")


def export_sections(markdown: str) -> list[str]:
    """An export chunk cut before each memory section (a ``## `` line outside a fence).

    A memory's text sits in a fence longer than any backtick run in it, so no line of
    the text can pass for the start of a section.
    """
    cuts: list[int] = []
    fence: str | None = None
    offset = 0
    for line in markdown.split("\n"):
        if fence is None:
            opening = _FENCE_OPENING.fullmatch(line)
            if opening:
                fence = opening.group(1)
            elif line.startswith("## ") and offset:
                cuts.append(offset)
        elif line == fence:
            fence = None
        offset += len(line) + 1
    return [markdown[a:b] for a, b in pairwise([0, *cuts, len(markdown)])]


async def _export(calor: AsyncCalorClient, a: ExportArguments) -> Reply:
    kept: list[str] = []  # the header, then one section per memory
    chars = 0
    total: int | None = None
    truncated = False
    stream = calor.export(channel=a.channel, include_archived=a.include_archived)
    try:
        async for chunk in stream:
            if not kept:  # the header comes first and is always kept
                total = export_total(chunk.markdown)
                sections = [chunk.markdown]
            else:
                sections = export_sections(chunk.markdown)
            for section in sections:
                if kept and chars + len(section) > a.max_chars:
                    truncated = True
                    break
                kept.append(section)
                chars += len(section)
            if truncated:
                break
    finally:
        await stream.aclose()  # cancels the call when stopped early
    markdown = "".join(kept)
    shown = max(len(kept) - 1, 0)
    text = markdown
    if truncated:
        of = f" of {total}" if total is not None else ""
        text += f"\n\n[truncated at {a.max_chars} characters: {shown}{of} memories shown]"
    data = {"markdown": markdown, "memories": shown, "total": total, "truncated": truncated}
    return Reply(text, data)


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
        _store,
        object_schema({"memory": memory_pb2.Memory.DESCRIPTOR}),
    ),
    ToolSpec(
        "memory_recall",
        "Recall memories",
        "Find the memories that answer a question, ranked by meaning and heat (how recently "
        "and often they were used). Each hit shows its score, confidence band (high, mid, "
        "low), id, type, heat and text. Recalling warms what it returns unless peek is set.",
        RecallArguments,
        _recall,
        message_schema(memory_service_pb2.RecallResponse.DESCRIPTOR),
    ),
    ToolSpec(
        "memory_context",
        "Build a context block",
        "Build the block of memories to put before answering a message: what is relevant to "
        "it, the hottest memories, and the user's profile (core facts, facts, preferences), "
        "packed into a token budget. The same memories give the same text.",
        ContextArguments,
        _context,
        message_schema(memory_service_pb2.ContextResponse.DESCRIPTOR),
    ),
    ToolSpec(
        "memory_inspect",
        "Inspect a memory",
        "Show one memory by id, in any state, with its heat, stability, recalls, tags, "
        "entities and its links to other memories.",
        IdArguments,
        _inspect,
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
        _update,
        object_schema({"memory": memory_pb2.Memory.DESCRIPTOR}),
        idempotent=True,
    ),
    ToolSpec(
        "memory_list",
        "List memories",
        "List the channel's memories page by page (no ranking and no warming), optionally "
        "only some types or tags. Pass next_page_token as page_token for the next page.",
        ListArguments,
        _list,
        message_schema(memory_service_pb2.ListMemoriesResponse.DESCRIPTOR),
        read_only=True,
    ),
    ToolSpec(
        "memory_share",
        "Share a memory",
        "Copy a memory into another channel (for another agent, or a shared channel), marked "
        "as shared from this one. Returns the copy.",
        ShareArguments,
        _share,
        object_schema({"memory": memory_pb2.Memory.DESCRIPTOR}),
    ),
    ToolSpec(
        "memory_forget",
        "Forget memories",
        "Forget memories by id, for good: they are no longer recalled. Use it for what is "
        "wrong or what the user asks to be forgotten; with reject, what they said is not "
        "learned again. Returns how many were forgotten.",
        ForgetArguments,
        _forget,
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
        _keystone,
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
        _evaluate,
        message_schema(memory_service_pb2.EvaluateResponse.DESCRIPTOR),
    ),
    ToolSpec(
        "memory_subscribe_recent",
        "Recent memory events",
        "The channel's latest events, oldest first: memories stored, recalled, updated, "
        "forgotten, dreams, and what triggers notified. Each shows its seq (pass it to "
        "trigger_feedback as cause_seq), kind, memory and message. Changes nothing.",
        RecentEventsArguments,
        _recent_events,
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
        _trigger_feedback,
        object_schema({"trigger": trigger_service_pb2.Trigger.DESCRIPTOR}),
        idempotent=True,
    ),
    ToolSpec(
        "memory_status",
        "Channel status",
        "The channel's status: how many memories by state and type, the channel's heat, "
        "active gates and open conflicts between memories.",
        Arguments,
        _status,
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
        _dream,
        message_schema(memory_service_pb2.DreamResponse.DESCRIPTOR),
    ),
    ToolSpec(
        "memory_export",
        "Export memories",
        "The channel's memories as Markdown, one section per memory with its type, heat and "
        "tags, up to max_chars characters.",
        ExportArguments,
        _export,
        _EXPORT_SCHEMA,
        read_only=True,
    ),
)
"""Every tool ``calor mcp`` serves, in the order hosts list them."""
