"""The journal's nine tools as an MCP server (docs/mcp.md).

``tools``: the registry as MCP tools, and one tool call through the
ToolExecutor; ``server``: the MCP protocol server built on them; ``http``:
``/mcp`` on the voice server (Streamable HTTP, stateless, JSON responses,
behind the same guards as ``/api/voice/*``); ``stdio``: ``voiceactors mcp``.
"""
