"""The simulator's MCP tool source: tools that take their time.

A stand-in for a slow tool source beside the Realtime simulator: a loopback
MCP server (the SDK's low-level ``Server``, Streamable HTTP answering as an
event stream, so progress notifications reach the client while a call
runs, behind a bearer-token check) whose tools are declared by the test or
the script that starts it (``SlowTool``). Each call of a tool waits its
``run_s``, sending ``notifications/progress`` every ``progress_every_s``
(progress counted in those steps, with the total when the run is known,
and a short message), then answers its ``text``. A scenario's
``slow_tool`` step changes a tool's pace while a call plays
(``ToolSource.pace``), so the same tool can be quick in one turn and slow
in the next (docs/simulator.md § Slow tools).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

import mcp.types as types
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from mcp.server.lowlevel import Server

__all__ = ["SlowTool", "ToolSource"]

OBJECT = {"type": "object", "properties": {}, "additionalProperties": True}


@dataclass
class SlowTool:
    """One tool of the source and its pace."""

    name: str
    run_s: float = 0.0               # how long a call takes
    progress_every_s: float = 0.0    # a progress notification this often while it runs (0: none)
    text: str = "done"               # the answer (a text block)
    read_only: bool = True           # its ``readOnlyHint``


class ToolSource:
    """The MCP source. ``calls`` records each call (tool name, arguments),
    ``progress_sent`` each progress notification (tool name, progress,
    total); ``url`` is set once ``serve`` has started."""

    def __init__(self, tools: list[SlowTool], *, token: str | None = None) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.token = token or secrets.token_urlsafe(16)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.progress_sent: list[tuple[str, float, float | None]] = []
        self.url = ""
        self._server = Server("voiceactors-simulator-tools", on_list_tools=self._list, on_call_tool=self._call)

    def pace(self, name: str, run_s: float, progress_every_s: float = 0.0) -> None:
        """Change a tool's pace from the next call on (a scenario's ``slow_tool`` step)."""
        tool = self.tools[name]
        tool.run_s, tool.progress_every_s = run_s, progress_every_s

    async def _list(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=t.name, description=f"a tool that takes its time ({t.name})", input_schema=OBJECT,
                       annotations=types.ToolAnnotations(read_only_hint=t.read_only))
            for t in self.tools.values()])

    async def _call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = self.tools.get(params.name)
        if tool is None:
            return types.CallToolResult(content=[types.TextContent(type="text", text="no such tool")], is_error=True)
        self.calls.append((tool.name, dict(params.arguments or {})))
        run_s, every = tool.run_s, tool.progress_every_s
        token = (ctx.meta or {}).get("progress_token") if isinstance(ctx.meta, dict) else None
        total = float(math.ceil(run_s / every)) if every > 0 else None
        step = 0
        deadline = trio.current_time() + run_s
        while every > 0 and token is not None and trio.current_time() + every < deadline:
            await trio.sleep(every)
            step += 1
            self.progress_sent.append((tool.name, float(step), total))
            await ctx.session.send_progress_notification(token, float(step), total, f"step {step} of {total:g}",
                                                         related_request_id=ctx.request_id)
        await trio.sleep_until(deadline)
        return types.CallToolResult(content=[types.TextContent(type="text", text=tool.text)])

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != f"Bearer {self.token}".encode():
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"error": "unauthorized"}'})
            return
        await self._app(scope, receive, send)

    async def serve(self, port: int = 0, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on loopback until cancelled; ``task_status.started(url)``."""
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.errorlog = None
        # an event stream, not one JSON body: room for the progress notifications
        self._app = self._server.streamable_http_app(stateless_http=True, json_response=False)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, self._asgi, config)
            self.url = binds[0] + "/mcp"
            task_status.started(self.url)
