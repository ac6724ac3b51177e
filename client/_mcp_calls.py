"""The calls ``calor mcp``'s tools make through :class:`~calor.client.AsyncCalorClient`,
and what each says of its answer: short text for the model, and structured data.

One coroutine per tool, named as the tool is (:func:`memory_recall`); the
catalogue of tools (names, descriptions, schemas) is :mod:`calor.client._mcp_tools`.
"""

from __future__ import annotations

import re
from collections import deque
from itertools import pairwise
from typing import Any, NamedTuple

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
)
from calor.client._transfer import export_total
from calor.client.aio import AsyncCalorClient
from calor.v1 import memory_service_pb2, trigger_service_pb2

__all__ = [
    "Reply",
    "context_text",
    "dream_text",
    "evaluation_text",
    "export_sections",
    "memory_context",
    "memory_dream",
    "memory_evaluate",
    "memory_export",
    "memory_forget",
    "memory_inspect",
    "memory_keystone",
    "memory_list",
    "memory_recall",
    "memory_share",
    "memory_status",
    "memory_store",
    "memory_subscribe_recent",
    "memory_update",
    "trigger_feedback",
]


class Reply(NamedTuple):
    """What a tool answers: text for the model to read, and the same as structured data."""

    text: str
    data: dict[str, Any]


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


async def memory_store(calor: AsyncCalorClient, a: StoreArguments) -> Reply:
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


async def memory_recall(calor: AsyncCalorClient, a: RecallArguments) -> Reply:
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


async def memory_context(calor: AsyncCalorClient, a: ContextArguments) -> Reply:
    response = await calor.context(
        a.message,
        channel=a.channel,
        token_budget=a.token_budget,
        heat=a.heat,
        max_nodes=a.max_nodes,
        max_chars=a.max_chars,
    )
    return Reply(context_text(response), _render.to_dict(response))


async def memory_inspect(calor: AsyncCalorClient, a: IdArguments) -> Reply:
    response = await calor.inspect(a.id, channel=a.channel)
    return Reply(_render.inspected(response), _render.to_dict(response))


async def memory_forget(calor: AsyncCalorClient, a: ForgetArguments) -> Reply:
    count = await calor.forget(a.ids, channel=a.channel, reject=a.reject)
    return Reply(f"forgot {_count(count, 'memory', 'memories')}", {"forgotten": count})


async def memory_keystone(calor: AsyncCalorClient, a: KeystoneArguments) -> Reply:
    memory = await calor.keystone(a.id, on=a.keystone, channel=a.channel)
    verb = "pinned" if a.keystone else "unpinned"
    return Reply(f"{verb} {_render.memory_line(memory)}", {"memory": _render.to_dict(memory)})


async def memory_update(calor: AsyncCalorClient, a: UpdateArguments) -> Reply:
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


async def memory_list(calor: AsyncCalorClient, a: ListArguments) -> Reply:
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


async def memory_share(calor: AsyncCalorClient, a: ShareArguments) -> Reply:
    memory = await calor.share(a.id, a.target_channel, channel=a.channel)
    text = f"shared into {a.target_channel}: {_render.memory_line(memory)}"
    return Reply(text, {"memory": _render.to_dict(memory)})


async def memory_subscribe_recent(calor: AsyncCalorClient, a: RecentEventsArguments) -> Reply:
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


async def trigger_feedback(calor: AsyncCalorClient, a: TriggerFeedbackArguments) -> Reply:
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


async def memory_evaluate(calor: AsyncCalorClient, a: EvaluateArguments) -> Reply:
    response = await calor.evaluate(a.text, channel=a.channel, store_findings=a.store_findings)
    return Reply(evaluation_text(response), _render.to_dict(response))


async def memory_status(calor: AsyncCalorClient, a: Arguments) -> Reply:
    response = await calor.identity(channel=a.channel)
    return Reply(_render.identity(response, a.channel or calor.channel), _render.to_dict(response))


def dream_text(report: memory_service_pb2.DreamResponse) -> str:
    """A dream report on one line: what each step changed, the channel's heat, the time."""
    return f"dreamed: {_render.dreamed(report)}"


async def memory_dream(calor: AsyncCalorClient, a: Arguments) -> Reply:
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


async def memory_export(calor: AsyncCalorClient, a: ExportArguments) -> Reply:
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
