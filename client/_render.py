"""How the CLI shows results: short lines for a person, one JSON document for a machine."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from calor.client._enums import (
    action_name,
    edge_name,
    event_name,
    short_name,
    state_name,
    type_name,
)
from calor.v1 import memory_pb2, memory_service_pb2, trigger_service_pb2

__all__ = [
    "dreamed",
    "edge_line",
    "event_line",
    "firings",
    "identity",
    "inspected",
    "json_line",
    "listed",
    "matches",
    "memory_line",
    "recalled",
    "stored",
    "to_dict",
    "to_json",
    "trigger_line",
    "triggers",
]


def to_dict(message: Message) -> dict[str, Any]:
    """A result or event as plain data, ready for JSON: every field present (defaults
    included), the protos' field names, enums by name (``"EVENT_KIND_NOTIFY"``),
    timestamps as RFC 3339 text, 64-bit integers as numbers.

    Example::

        hits = [to_dict(hit) for hit in calor.recall("allergies").hits]
    """
    document: dict[str, Any] = MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )
    return document


def to_json(message: Message) -> str:
    """A message as indented JSON, every field present, proto field names kept."""
    return json.dumps(to_dict(message), indent=2, ensure_ascii=False)


def json_line(message: Message) -> str:
    """A message as JSON on one line, for streams of one document a line."""
    return json.dumps(to_dict(message), ensure_ascii=False, separators=(",", ":"))


_HOT_TEXT_CHARS = 72  # of each hottest memory's text in a status


def _one_line(text: str) -> str:
    """Text with its runs of whitespace, newlines included, folded to single spaces."""
    return " ".join(text.split())


def _when(stamp: Timestamp) -> str:
    """A timestamp as ISO 8601 in UTC to the second; ``-`` when unset."""
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return stamp.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")


def _pairs(mapping: Mapping[str, object], prefix: str = "") -> str:
    """``k=v, k2=v2`` in key order, enum-name keys shortened; ``-`` when empty."""
    if not mapping:
        return "-"
    return ", ".join(
        f"{key.removeprefix(prefix).lower() if prefix else key}={value}"
        for key, value in sorted(mapping.items())
    )


def memory_line(memory: memory_pb2.Memory) -> str:
    """``ID (type, heat 0.94)``: how a memory is named in one line."""
    pin = ", keystone" if memory.keystone else ""
    return f"{memory.id} ({type_name(memory.memory_type)}, heat {memory.heat:.2f}{pin})"


def stored(memory: memory_pb2.Memory) -> str:
    """What ``calor store`` says: the new id, its type and heat."""
    return f"stored {memory_line(memory)}"


def recalled(response: memory_service_pb2.RecallResponse, channel: str = "") -> str:
    """One numbered line per hit, best first: score, band, id, type, heat and text; a hit
    from a channel other than ``channel`` names its channel."""
    lines = []
    window = response.temporal_window
    if window.phrase or window.start.seconds or window.end.seconds:
        phrase = f'"{window.phrase}" ' if window.phrase else ""
        lines.append(f"time window {phrase}{_when(window.start)} .. {_when(window.end)}")
    for rank, hit in enumerate(response.hits, start=1):
        where = f" [{hit.memory.channel}]" if channel and hit.memory.channel != channel else ""
        lines.append(
            f"{rank}. [{hit.score:.2f} {hit.band}] {memory_line(hit.memory)}{where}  "
            f"{_one_line(hit.memory.text)}"
        )
    return "\n".join(lines) if response.hits else "\n".join([*lines, "no memories found"])


def inspected(response: memory_service_pb2.InspectResponse) -> str:
    """Every field of one memory worth reading, one per line, then its edges."""
    m = response.memory
    rows = [
        ("id", m.id),
        ("text", m.text),
        ("type", type_name(m.memory_type)),
        ("state", state_name(m.state)),
        ("heat", f"{m.heat:.3f}{'  (keystone)' if m.keystone else ''}"),
        ("stability", f"{m.stability:.2f}"),
        ("importance", f"{m.importance:.2f}"),
        ("utility", f"{m.utility:.2f}"),
        ("recalled", f"{m.recall_count} times, last {_when(m.last_recalled_at)}"),
        ("created", _when(m.created_at)),
        ("updated", _when(m.updated_at)),
        ("tags", _pairs(m.tags)),
        ("entities", ", ".join(m.entities) or "-"),
        ("source", short_name(memory_pb2.Source, "SOURCE_", m.source)),
        ("confidence", short_name(memory_pb2.Confidence, "CONFIDENCE_", m.confidence)),
    ]
    if m.merged_into:
        rows.append(("merged into", m.merged_into))
    if m.merged_from:
        rows.append(("merged from", ", ".join(m.merged_from)))
    lines = [f"{label:<12}{value}" for label, value in rows]
    if response.edges:
        lines.append("edges")
        for edge in response.edges:
            kind = edge_name(edge.kind)
            other = edge.to_id if edge.from_id == m.id else edge.from_id
            lines.append(f"  {kind:<10}{edge.weight:.2f}  {other}")
    return "\n".join(lines)


def edge_line(edge: memory_pb2.Edge) -> str:
    """``FROM -> TO (kind, weight 0.80)``."""
    kind = edge_name(edge.kind)
    return f"{edge.from_id} -> {edge.to_id} ({kind}, weight {edge.weight:.2f})"


def dreamed(report: memory_service_pb2.DreamResponse) -> str:
    """A dream's report on one line: what each step changed, the channel's heat, the time."""
    unopened = (
        f" ({report.conflicts_unopened} more not opened)" if report.conflicts_unopened else ""
    )
    steps = ", ".join(
        f"{name} {getattr(report, name)}"
        for name in (
            "migrated",
            "merged",
            "keystoned",
            "promoted",
            "reclassified",
            "summarised",
            "echoed",
            "pruned",
            "archived",
        )
    )
    return (
        f"{steps}, conflicts {report.conflicts}{unopened}; "
        f"channel heat {report.channel_heat_before:.2f} -> {report.channel_heat_after:.2f} "
        f"in {report.duration_ms} ms"
    )


def listed(memories: list[memory_pb2.Memory], next_page_token: str = "") -> str:
    """One line per memory: id, type, state, heat, text; then how to get the next page."""
    lines = [
        f"{m.id}  {type_name(m.memory_type):<10} {state_name(m.state):<8} "
        f"heat {m.heat:.2f}  {_one_line(m.text)}"
        for m in memories
    ]
    if not lines:
        lines.append("no memories")
    if next_page_token:
        lines.append(f"more: --page-token {next_page_token}  (or --all)")
    return "\n".join(lines)


def identity(response: memory_service_pb2.IdentityResponse, channel: str) -> str:
    """A channel's status: totals, counts by state and type, heat, gates, conflicts."""
    settings = response.settings
    mode = short_name(memory_pb2.DecayMode, "DECAY_MODE_", settings.decay_mode or 1)
    curve = short_name(memory_pb2.DecayCurve, "DECAY_CURVE_", settings.decay_curve or 1)
    decay = f"{mode} mode, {curve} curve"
    rows = [
        ("channel", channel),
        ("memories", str(response.total)),
        ("heat", f"{response.channel_heat:.2f}"),
        ("decay", decay),
        ("by state", _pairs(response.by_state, "MEMORY_STATE_")),
        ("by type", _pairs(response.by_type, "MEMORY_TYPE_")),
        ("gates", ", ".join(response.active_gates) or "none"),
        ("conflicts", str(len(response.conflicts)) if response.conflicts else "none"),
    ]
    lines = [f"{label:<11}{value}" for label, value in rows]
    lines.extend(f"  {c.a_id} <> {c.b_id}: {c.reason}" for c in response.conflicts)
    lines.append(f"{'hottest':<11}{'none' if not response.hottest else ''}".rstrip())
    lines.extend(
        f"  {hot.heat:.2f}  {hot.id}  {_one_line(hot.text)[:_HOT_TEXT_CHARS]}"
        for hot in response.hottest
    )
    for rated in response.feedback:
        if rated.hint:
            lines.append(f"{'feedback':<11}{rated.hint}")
    if response.feedback_summary:
        lines.append(f"{'feedback':<11}{response.feedback_summary}")
    return "\n".join(lines)


def event_line(event: trigger_service_pb2.Event) -> str:
    """``#seq kind channel memory_id trigger message``; ``-`` for a field left empty."""
    fields = (event.channel, event.memory_id, event.trigger_id)
    head = " ".join(value or "-" for value in fields)
    return f"#{event.seq} {event_name(event.kind)} {head} {_one_line(event.message)}".rstrip()


def trigger_line(trigger: trigger_service_pb2.Trigger) -> str:
    """``ID  on_store -> notify  in CHANNEL  fired N[/MAX]`` and the filters that are set."""
    limit = f"/{trigger.max_fires}" if trigger.max_fires else ""
    parts = [
        trigger.id,
        f"{event_name(trigger.event)} -> {action_name(trigger.action)}",
        f"in {trigger.channel}",
        f"fired {trigger.fires}{limit}",
    ]
    if trigger.filter_memory_type:
        parts.append(f"type {type_name(trigger.filter_memory_type)}")
    if trigger.filter_pattern:
        parts.append(f"pattern {trigger.filter_pattern!r}")
    if trigger.HasField("filter_heat_above"):
        parts.append(f"heat > {trigger.filter_heat_above:g}")
    if trigger.HasField("filter_heat_below"):
        parts.append(f"heat < {trigger.filter_heat_below:g}")
    if trigger.cooldown_seconds:
        parts.append(f"cooldown {trigger.cooldown_seconds:g}s")
    if trigger.HasField("threshold"):
        parts.append(f"threshold {trigger.threshold:g}")
    if trigger.config:
        parts.append(f"config {_pairs(trigger.config)}")
    return "  ".join(parts)


def triggers(items: list[trigger_service_pb2.Trigger]) -> str:
    """One :func:`trigger_line` per trigger; ``no triggers`` when there are none."""
    return "\n".join(trigger_line(t) for t in items) if items else "no triggers"


def matches(items: list[trigger_service_pb2.TriggerMatch]) -> str:
    """Each trigger a dry run matched, then what it would do; or that none would fire."""
    lines = [f"{trigger_line(m.trigger)}\n  would: {_one_line(m.would)}" for m in items]
    return "\n".join(lines) if lines else "no trigger would fire"


def firings(items: list[trigger_service_pb2.TriggerFiring]) -> str:
    """One line per firing, oldest first: ``#seq  time  memory  outcome``."""
    lines = [
        f"#{f.seq}  {_when(f.at)}  {f.memory_id or '-'}  {_one_line(f.outcome)}"
        f"{'  (late)' if f.late else ''}"
        for f in items
    ]
    return "\n".join(lines) if lines else "no firings"
