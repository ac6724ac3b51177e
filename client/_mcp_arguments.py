"""The arguments of ``calor mcp``'s tools: checked by pydantic, declared to hosts as JSON Schema.

Each tool's arguments are one pydantic model, the single source of both the schema a
host is shown and the check the arguments a model sends must pass. Optional arguments
are left out of ``required`` and never declared ``null``; enums come from the protos.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema

from calor.client._enums import MEMORY_TYPE_NAMES, short_name
from calor.v1 import memory_pb2, trigger_service_pb2

__all__ = [
    "Arguments",
    "ContextArguments",
    "EvaluateArguments",
    "ExportArguments",
    "ForgetArguments",
    "IdArguments",
    "KeystoneArguments",
    "ListArguments",
    "RecallArguments",
    "ShareArguments",
    "RecentEventsArguments",
    "StoreArguments",
    "TriggerFeedbackArguments",
    "UpdateArguments",
    "input_schema",
]


def _enum_names(wrapper: Any, prefix: str) -> tuple[str, ...]:
    """The short names of a proto enum's values, UNSPECIFIED left out."""
    return tuple(short_name(wrapper, prefix, number) for number in wrapper.values() if number != 0)


def _known(names: tuple[str, ...], what: str) -> Callable[[str], str]:
    """A check that a string is one of ``names``."""

    def check(value: str) -> str:
        if value not in names:
            raise ValueError(f"unknown {what} {value!r} (expected one of {', '.join(names)})")
        return value

    return check


def _enum_schema(names: tuple[str, ...]) -> WithJsonSchema:
    """How a string restricted to ``names`` is declared to hosts."""
    return WithJsonSchema({"type": "string", "enum": list(names)})


SOURCE_NAMES = _enum_names(memory_pb2.Source, "SOURCE_")
CONFIDENCE_NAMES = _enum_names(memory_pb2.Confidence, "CONFIDENCE_")

MemoryTypeName = Annotated[
    str, AfterValidator(_known(MEMORY_TYPE_NAMES, "memory type")), _enum_schema(MEMORY_TYPE_NAMES)
]
SourceName = Annotated[
    str, AfterValidator(_known(SOURCE_NAMES, "source")), _enum_schema(SOURCE_NAMES)
]
EVENT_KIND_NAMES = _enum_names(trigger_service_pb2.EventKind, "EVENT_KIND_")
EventKindName = Annotated[
    str, AfterValidator(_known(EVENT_KIND_NAMES, "event kind")), _enum_schema(EVENT_KIND_NAMES)
]
ConfidenceName = Annotated[
    str, AfterValidator(_known(CONFIDENCE_NAMES, "confidence")), _enum_schema(CONFIDENCE_NAMES)
]
# The bounds the server enforces, declared so that a host (and the model) sees them.
MAX_TEXT_CHARS = 32 * 1024  # the server counts 32 KiB of UTF-8: fewer for non-ASCII text
CHANNEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@/+-]*$"
MEMORY_ID_PATTERN = r"^[0-9A-HJKMNP-TV-Z]{26}$"
TRIGGER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"

Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)]
MemoryId = Annotated[str, Field(pattern=MEMORY_ID_PATTERN)]
TagText = Annotated[str, Field(min_length=1, max_length=256)]

# An optional argument: None when left out, and no "null" in the schema a host sees.
Channel = (
    Annotated[str, Field(min_length=1, max_length=128, pattern=CHANNEL_PATTERN)]
    | SkipJsonSchema[None]
)

_CHANNEL = (
    "The memory channel to work in; leave it out for the channel `calor mcp` was started "
    "with (--channel). Names are letters, digits and _.:@/+-, starting with a letter or digit."
)


class Arguments(BaseModel):
    """Arguments every tool takes: the channel. Unknown arguments are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    channel: Channel = Field(None, description=_CHANNEL)


class StoreArguments(Arguments):
    """The arguments of ``memory_store``."""

    text: Text = Field(description="What to remember, as a self-contained statement.")
    memory_type: MemoryTypeName | SkipJsonSchema[None] = Field(
        None,
        description="How long it should last: working (an hour), episodic (events, a day), "
        "semantic (knowledge, a month), procedural (how-tos), preference, fact (a year), "
        "core (identity and safety facts, never fade below 0.6), codebase. Leave it out to "
        "let the server classify the text.",
    )
    importance: Annotated[float, Field(ge=0.0, le=1.0)] | SkipJsonSchema[None] = Field(
        None, description="0..1; leave it out to let the server estimate it."
    )
    keystone: bool = Field(False, description="Pin it so its heat never decays.")
    tags: dict[TagText, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Free labels (key: value) to filter by later.",
    )
    source: SourceName | SkipJsonSchema[None] = Field(
        None, description="Who it comes from: human (a person said it), agent (the default)."
    )
    confidence: ConfidenceName | SkipJsonSchema[None] = Field(
        None, description="observed (the default), inferred or asserted."
    )
    idempotency_key: TagText | SkipJsonSchema[None] = Field(
        None,
        description="Give the same key when retrying a store that may have succeeded: the "
        "retry returns the first memory and stores nothing.",
    )


class RecallArguments(Arguments):
    """The arguments of ``memory_recall``."""

    query: Text = Field(
        description="What to look for, in plain words; time phrases such as 'yesterday' or "
        "'last week' favour memories from then."
    )
    limit: int = Field(10, ge=1, le=100, description="At most this many memories.")
    memory_types: list[MemoryTypeName] = Field(
        default_factory=list, description="Only memories of these types (default: all)."
    )
    include_archived: bool = Field(False, description="Search cold storage too.")
    peek: bool = Field(
        False, description="Look without warming what is found (a recall normally heats it)."
    )
    min_band: Literal["", "low", "mid", "high"] = Field(
        "",
        description="Leave out memories whose match is less sure than this band ('mid' "
        "drops the weakly related; default '': keep all).",
    )


class ContextArguments(Arguments):
    """The arguments of ``memory_context``."""

    message: Text = Field(description="The message the agent is about to answer.")
    token_budget: int = Field(
        1000, ge=1, le=100_000, description="Tokens the block may take (the model's tokenizer)."
    )
    heat: bool = Field(
        False, description="Warm the memories shown, as a recall would (default: read only)."
    )
    max_nodes: int = Field(200, ge=1, le=200, description="At most this many memories.")
    max_chars: int = Field(50_000, ge=1, le=50_000, description="At most this many characters.")


class IdArguments(Arguments):
    """The arguments of a tool on one memory (``memory_inspect``)."""

    id: MemoryId = Field(description="The memory's id, as store or recall gave it.")


class ForgetArguments(Arguments):
    """The arguments of ``memory_forget``."""

    ids: list[MemoryId] = Field(
        min_length=1, max_length=1000, description="The ids of the memories to forget."
    )
    reject: bool = Field(
        default=False,
        description="Also keep them from being learned again: a later memory that says "
        "nearly the same is marked resembles_rejected and stored with less importance.",
    )


class KeystoneArguments(IdArguments):
    """The arguments of ``memory_keystone``."""

    keystone: bool = Field(True, description="true pins the memory, false unpins it.")


class UpdateArguments(IdArguments):
    """The arguments of ``memory_update``: what is left out stays as it is."""

    text: Text | SkipJsonSchema[None] = Field(
        None, description="The corrected text (it replaces the old one, which is re-read)."
    )
    memory_type: MemoryTypeName | SkipJsonSchema[None] = Field(
        None, description="The corrected type."
    )
    tags: dict[TagText, Annotated[str, Field(max_length=256)]] | SkipJsonSchema[None] = Field(
        None, max_length=64, description="New tags, replacing the old ones ({} clears them)."
    )
    importance: Annotated[float, Field(ge=0.0, le=1.0)] | SkipJsonSchema[None] = Field(
        None, description="The new importance, 0..1."
    )
    supersedes: MemoryId | SkipJsonSchema[None] = Field(
        None,
        description="The id of an older memory this one replaces: the older one is kept as "
        "history, cooled and no longer recalled first.",
    )


class ListArguments(Arguments):
    """The arguments of ``memory_list``."""

    memory_types: list[MemoryTypeName] = Field(
        default_factory=list, description="Only memories of these types (default: all)."
    )
    tags: dict[TagText, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=64, description="Only memories with these tags."
    )
    page_size: int = Field(20, ge=1, le=100, description="At most this many memories.")
    page_token: str = Field(
        "", max_length=1024, description="Where to go on: next_page_token of the last page."
    )


class ShareArguments(IdArguments):
    """The arguments of ``memory_share``."""

    target_channel: Annotated[str, Field(min_length=1, max_length=128, pattern=CHANNEL_PATTERN)] = (
        Field(description="The channel to copy the memory into.")
    )


class EvaluateArguments(Arguments):
    """The arguments of ``memory_evaluate``."""

    text: Text = Field(description="What the agent is about to say.")
    store_findings: bool = Field(
        False, description="Store each misalignment found as an episodic memory."
    )


class TriggerFeedbackArguments(Arguments):
    """The arguments of ``trigger_feedback``."""

    trigger_id: Annotated[str, Field(pattern=TRIGGER_ID_PATTERN)] = Field(
        description="The trigger that fired."
    )
    cause_seq: int = Field(
        ge=1, description="The seq of the event that made it fire (cause_seq of its events)."
    )
    rating: Literal["useful", "noise"] = Field(description="Whether the firing was worth it.")


class ExportArguments(Arguments):
    """The arguments of ``memory_export``."""

    include_archived: bool = Field(False, description="Export archived memories too.")
    max_chars: int = Field(
        100_000,
        ge=1000,
        le=1_000_000,
        description="Stop after this many characters of Markdown (whole memories only).",
    )


class RecentEventsArguments(Arguments):
    """The arguments of ``memory_subscribe_recent``."""

    limit: int = Field(20, ge=1, le=200, description="At most this many events, the latest.")
    kinds: list[EventKindName] = Field(
        default_factory=list, max_length=16, description="Only these kinds (default: all)."
    )


def input_schema(arguments: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments as hosts see it.

    No titles and no null defaults; the channel, which most calls leave out, comes last.
    """
    schema = arguments.model_json_schema()
    schema.pop("title", None)
    schema.pop("description", None)
    properties: dict[str, dict[str, Any]] = schema.get("properties", {})
    for field in properties.values():
        field.pop("title", None)
        if "default" in field and field["default"] is None:
            del field["default"]
    if "channel" in properties:
        properties["channel"] = properties.pop("channel")
    return schema
