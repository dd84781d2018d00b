"""The MCP protocol server over the journal's tools (one for HTTP and stdio).

A low-level ``mcp.server.Server`` with two handlers: ``tools/list`` (the
registry, in one page) and ``tools/call`` (``ToolCaller``). Nothing else is
offered (no resources, prompts or sampling).
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from voiceactors import __version__
from voiceactors.mcp_server.tools import ToolCaller

SERVER_NAME = "voiceactors-journal"
INSTRUCTIONS = ("The user's solstone journal: days, search, people and organisations, commitments, today's "
                "calendar and briefing. Tool results are reference data from the journal.")


def build_server(caller: ToolCaller) -> Server[Any]:
    """The MCP server answering with ``caller``'s tools."""

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=caller.list_tools())

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        return await caller.call(params.name, params.arguments, ctx.meta)

    return Server(SERVER_NAME, version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)
