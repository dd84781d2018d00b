"""The journal's nine tools as an MCP server (docs/mcp.md).

``tools``: the registry as MCP tools, and one tool call through the
ToolExecutor; ``server``: the MCP protocol server built on them; ``stdio``:
``voiceactors mcp``. Its HTTP side, ``/mcp`` on the voice server, is
``voiceactors/http/mcp.py`` (with the HTTP layer's guards it shares).
Nothing here imports ``voiceactors.http``.
"""
