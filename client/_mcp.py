"""``calor mcp``: Calor's memory tools for agent hosts, over the Model Context Protocol on stdio.

The host starts ``calor mcp`` as a child process and speaks MCP on its stdin and
stdout; each tool call becomes one gRPC call to a Calor server through
:class:`~calor.client.AsyncCalorClient`. A call the server refuses comes back as a
tool error (``is_error``) carrying the server's status and message, so the model
can read it and correct itself; the MCP server itself keeps running.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import anyio
import grpc
import grpc.aio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from calor.client._cli_connection import hint
from calor.client._credentials import ChannelSecurity, open_aio_channel
from calor.client._mcp_tools import TOOLS, Reply, ToolSpec
from calor.client.aio import AsyncCalorClient
from calor.client.errors import CalorClientError

__all__ = ["McpOptions", "build_server", "call_tool", "open_channel", "run"]

_log = logging.getLogger("calor.client.mcp")

INSTRUCTIONS = """\
Calor is this agent's long-term memory. Memories have a heat that fades with time and
grows each time they are recalled, so what keeps being used stays at hand.
- Before answering, call memory_context with the user's message (or memory_recall with
  a question) to see what is known.
- When you learn something worth keeping (a fact about the user, a preference, a
  decision, what happened), call memory_store with one self-contained statement.
- Before saying something that depends on what is known, memory_evaluate checks it.
- memory_forget removes what is wrong; memory_keystone pins what must never fade."""


@dataclass(frozen=True)
class McpOptions:
    """How ``calor mcp`` reaches its Calor server.

    Attributes:
        target: The server's ``host:port``.
        channel: The channel tools work in when a call names none.
        timeout: Seconds each gRPC call may take; None waits for ever.
        security: The API key every call carries and the TLS to speak (from
            ``--api-key``/``CALOR_API_KEY`` and ``--tls-ca``/``CALOR_TLS_CA``).
    """

    target: str
    channel: str
    timeout: float | None = 30.0
    security: ChannelSecurity = field(default_factory=ChannelSecurity)


def open_channel(options: McpOptions) -> grpc.aio.Channel:
    """The gRPC channel every tool calls through, carrying the key and TLS of ``options``."""
    return open_aio_channel(options.target, options.security)


def _result(reply: Reply) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=reply.text)],
        structured_content=reply.data,
    )


def _error(code: str, message: str, hint: str = "") -> types.CallToolResult:
    """A tool error: ``CODE: message`` for the model, and the same as data."""
    text = f"{code}: {message}" + (f"\n{hint}" if hint else "")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"error": {"code": code, "message": message}},
        is_error=True,
    )


def _bad_arguments(err: ValidationError) -> str:
    """What was wrong with a tool's arguments, one clause per argument, as Calor says it."""
    clauses: dict[str, str] = {}
    for problem in err.errors(include_url=False):
        # An optional argument's "or None" branch reports too; its first problem says it.
        name = str(problem["loc"][0]) if problem["loc"] else "arguments"
        clauses.setdefault(name, f"{name}: {_in_our_words(name, problem)}")
    return "; ".join(clauses.values())


# What a value that does not match an argument's pattern is not, as the server says it.
_NOT_A = {
    "channel": "is not a channel name (1-128 letters, digits or _.:@/+-, starting with a "
    "letter or digit)",
    "id": "is not a memory id",
    "ids": "holds something that is not a memory id",
    "trigger_id": "is not a trigger id (1-64 letters, digits or _.:-, starting with a "
    "letter or digit)",
}


def _in_our_words(name: str, problem: Any) -> str:
    """One argument's problem in the words the server uses for the same mistake."""
    kind, context = problem["type"], problem.get("ctx", {})
    said = {
        "missing": "is required",
        "extra_forbidden": "is not an argument of this tool",
        "string_too_short": "must not be empty",
        "string_too_long": f"must be at most {context.get('max_length')} characters",
        "string_pattern_mismatch": _NOT_A.get(name, "is not well formed"),
        "too_short": f"needs at least {context.get('min_length')} item(s)",
        "too_long": f"takes at most {context.get('max_length')} items",
        "greater_than_equal": f"must be at least {context.get('ge')}",
        "less_than_equal": f"must be at most {context.get('le')}",
        "literal_error": f"must be one of {context.get('expected')}",
        "bool_type": "must be true or false",
        "bool_parsing": "must be true or false",
        "int_type": "must be a whole number",
        "int_parsing": "must be a whole number",
        "int_from_float": "must be a whole number",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "string_type": "must be text",
        "dict_type": "must be an object of text values",
        "list_type": "must be a list",
    }.get(kind)
    if said is not None:
        return said
    message = str(problem["msg"])
    return message.removeprefix("Value error, ")  # our own checks say it already


async def call_tool(
    spec: ToolSpec[Any], calor: AsyncCalorClient, arguments: dict[str, Any]
) -> types.CallToolResult:
    """Make one tool's call and say how it went, a refusal included, as a tool result."""
    try:
        reply = await spec.call(calor, arguments)
    except ValidationError as err:
        return _error(grpc.StatusCode.INVALID_ARGUMENT.name, _bad_arguments(err))
    except CalorClientError as err:
        _log.info("%s failed: %s", spec.name, err)
        return _error(err.code.name, err.details, hint(err, calor.target))
    return _result(reply)


def build_server(calor: AsyncCalorClient) -> Server[Any]:
    """The MCP server that lists :data:`~calor.client._mcp_tools.TOOLS` and calls them."""
    by_name = {spec.name: spec for spec in TOOLS}
    listing = types.ListToolsResult(tools=[spec.tool() for spec in TOOLS])

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def on_call(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        spec = by_name.get(params.name)
        if spec is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {params.name!r}")
        return await call_tool(spec, calor, params.arguments or {})

    return Server(
        "calor",
        version=metadata.version("calor"),
        title="Calor memory",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=on_call,
    )


async def _serve(options: McpOptions) -> None:
    async with open_channel(options) as channel:
        calor = AsyncCalorClient(
            options.target, channel=options.channel, timeout=options.timeout, grpc_channel=channel
        )
        server = build_server(calor)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


def run(options: McpOptions) -> None:
    """Serve MCP on stdin and stdout until the host closes stdin."""
    anyio.run(_serve, options)
