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
from calor.v1 import memory_pb2

__all__ = [
    "Arguments",
    "ContextArguments",
    "EvaluateArguments",
    "ExportArguments",
    "ForgetArguments",
    "IdArguments",
    "KeystoneArguments",
    "RecallArguments",
    "StoreArguments",
    "TriggerFeedbackArguments",
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
ConfidenceName = Annotated[
    str, AfterValidator(_known(CONFIDENCE_NAMES, "confidence")), _enum_schema(CONFIDENCE_NAMES)
]
NonEmpty = Annotated[str, Field(min_length=1)]

# An optional argument: None when left out, and no "null" in the schema a host sees.
Channel = NonEmpty | SkipJsonSchema[None]

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

    text: NonEmpty = Field(description="What to remember, as a self-contained statement.")
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
    tags: dict[str, str] = Field(
        default_factory=dict, description="Free labels (key: value) to filter by later."
    )
    source: SourceName | SkipJsonSchema[None] = Field(
        None, description="Who it comes from: human (a person said it), agent (the default)."
    )
    confidence: ConfidenceName | SkipJsonSchema[None] = Field(
        None, description="observed (the default), inferred or asserted."
    )
    idempotency_key: NonEmpty | SkipJsonSchema[None] = Field(
        None,
        description="Give the same key when retrying a store that may have succeeded: the "
        "retry returns the first memory and stores nothing.",
    )


class RecallArguments(Arguments):
    """The arguments of ``memory_recall``."""

    query: NonEmpty = Field(
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

    message: NonEmpty = Field(description="The message the agent is about to answer.")
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

    id: NonEmpty = Field(description="The memory's id, as store or recall gave it.")


class ForgetArguments(Arguments):
    """The arguments of ``memory_forget``."""

    ids: list[NonEmpty] = Field(
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


class EvaluateArguments(Arguments):
    """The arguments of ``memory_evaluate``."""

    text: NonEmpty = Field(description="What the agent is about to say.")
    store_findings: bool = Field(
        False, description="Store each misalignment found as an episodic memory."
    )


class TriggerFeedbackArguments(Arguments):
    """The arguments of ``trigger_feedback``."""

    trigger_id: NonEmpty = Field(description="The trigger that fired.")
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
