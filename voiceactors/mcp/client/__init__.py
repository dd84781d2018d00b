"""The MCP client: the configured tool sources, their discovered tools, a session per source and the executor's rules for their tools (docs/mcp.md)."""
