"""MCP both ways: the client of configured MCP tool sources (``client``) and the journal's tools served as an MCP server (``server``); docs/mcp.md."""
