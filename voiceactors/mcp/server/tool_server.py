"""The MCP protocol server over the journal's tools (one for HTTP and stdio).

A low-level ``mcp.server.Server`` with two handlers: ``tools/list`` (the
registry, in one page) and ``tools/call`` (``ToolCaller``). Nothing else is
offered (no resources, prompts or sampling).
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from voiceactors import __version__
from voiceactors.logs import get_logger
from voiceactors.mcp.server.tools import ToolCaller

SERVER_NAME = "voiceactors-journal"
INSTRUCTIONS = ("The user's solstone journal: days, search, people and organisations, commitments, today's "
                "calendar and briefing. Tool results are reference data from the journal.")

_log = get_logger(actor="mcp")


def build_server(caller: ToolCaller) -> Server[Any]:
    """The MCP server answering with ``caller``'s tools."""

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=caller.list_tools())

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        return await caller.call(params.name, params.arguments, ctx.meta)

    relay_sdk_logs()
    # get_tool_input_schema: the 2026-07-28 era checks a call's Mcp-Param-* headers
    # against its tool's schema; without it the SDK lists every tool per call to find it
    return Server(SERVER_NAME, version=__version__, instructions=INSTRUCTIONS,
                  get_tool_input_schema=caller.input_schema, on_list_tools=list_tools, on_call_tool=call_tool)


class _SdkLogHandler(logging.Handler):
    """The SDK's warnings (stdlib logging) as our structured lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        method = _log.error if record.levelno >= logging.ERROR else _log.warning
        if record.exc_info and record.exc_info[1] is not None:
            method("mcp.sdk_message", logger=record.name, message=record.getMessage(), exc_info=record.exc_info)
        else:
            method("mcp.sdk_message", logger=record.name, message=record.getMessage())


def relay_sdk_logs() -> None:
    """Route the ``mcp`` package's warnings and errors into our log (once:
    the handler list is replaced, not appended to)."""
    sdk = logging.getLogger("mcp")
    sdk.handlers = [_SdkLogHandler()]
    sdk.setLevel(logging.WARNING)
    sdk.propagate = False
