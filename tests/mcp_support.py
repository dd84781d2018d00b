"""Real MCP servers for the tests: the SDK's low-level ``Server`` over
Streamable HTTP, served by hypercorn's trio worker on loopback, behind a
bearer-token check, plus the rig that runs calls against them (our
executor with an ``McpHub``, the Realtime simulator, a call actor).

``McpTestServer`` records what reached it: every HTTP request (``requests``)
and every tool call its handlers ran (``calls``). Its accepted tokens can be
changed while it runs (a token revoked mid-conversation); ``redirect`` makes
it answer every POST with a same-origin 307; ``streamed`` (tool name ->
bytes) makes a call of that tool answer a JSON text of that many bytes,
written in pieces as the client reads them, never held whole
(``streamed_bytes`` counts what was written, before ``gzipped`` compresses
it); ``stop()`` kills it.
"""

from __future__ import annotations

import json
import zlib
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import mcp.types as types
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from mcp.server.lowlevel import Server

from calls_support import Rig, Sideband, rig
from voiceactors.mcp.client.hub import McpHub
from voiceactors.mcp.client.sources import McpSource

Handler = Callable[..., Awaitable[types.CallToolResult]]   # (arguments) or, with_context, (arguments, ctx)

OBJECT = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class ToolDef:
    name: str
    handler: Handler
    schema: dict[str, Any] = field(default_factory=lambda: dict(OBJECT))
    read_only: bool = True
    description: str = "a test tool"
    output_schema: dict[str, Any] | None = None
    with_context: bool = False      # the handler takes the request's context too (``ctx.report_progress``)


def text_result(text: str, *, is_error: bool = False, structured: Any = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error,
                                structured_content=structured)


class McpTestServer:
    def __init__(self, tools: list[ToolDef], *, tokens: set[str] | None = None, page_size: int = 100,
                 event_stream: bool = False) -> None:
        self.tools = {t.name: t for t in tools}
        self.tokens = set(tokens or {"server-token"})
        self.page_size = page_size
        self.event_stream = event_stream     # answer as an SSE stream, not one JSON body
        self.requests = 0
        self.list_pages = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.traceparents: list[str] = []   # each request's traceparent header, as the source saw it
        self.redirect = False
        self.streamed: dict[str, int] = {}
        self.streamed_bytes = 0
        self.gzipped = False
        self.url = ""
        self._scope = trio.CancelScope()
        self._server = Server("test", on_list_tools=self._list, on_call_tool=self._call)
        self._app: Any = None

    async def _list(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        self.list_pages += 1
        listed = [types.Tool(name=t.name, description=t.description, input_schema=t.schema,
                             output_schema=t.output_schema,
                             annotations=types.ToolAnnotations(read_only_hint=t.read_only))
                  for t in self.tools.values()]
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + self.page_size
        return types.ListToolsResult(tools=listed[start:end], next_cursor=str(end) if end < len(listed) else None)

    async def _call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        self.calls.append((params.name, arguments))
        tool = self.tools[params.name]
        if tool.with_context:
            return await tool.handler(arguments, ctx)
        return await tool.handler(arguments)

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.requests += 1
            headers = dict(scope["headers"])
            if b"traceparent" in headers:
                self.traceparents.append(headers[b"traceparent"].decode())
            token = headers.get(b"authorization", b"").decode()
            if self.redirect and scope["method"] == "POST":
                await _answer(send, 307, b"", [(b"location", b"/mcp-elsewhere")])
                return
            if not token.startswith("Bearer ") or token[7:] not in self.tokens:
                await _answer(send, 401, b'{"error":"unauthorized"}', [(b"content-type", b"application/json")])
                return
            if self.streamed and scope["method"] == "POST":
                body = await _read_body(receive)
                message = json.loads(body)
                name = (message.get("params") or {}).get("name") if message.get("method") == "tools/call" else None
                if name in self.streamed:
                    await self._stream_answer(send, message["id"], self.streamed[name])
                    return
                receive = _replayed(body)
        await self._app(scope, receive, send)

    async def _stream_answer(self, send: Any, request_id: Any, size: int) -> None:
        """A tool result of ``size`` bytes of JSON text, 64 KiB a write
        (``gzipped``: compressed on the way, ``content-encoding: gzip``)."""
        head = json.dumps({"jsonrpc": "2.0", "id": request_id})[:-1].encode() + \
            b',"result":{"content":[{"type":"text","text":"'
        tail = b'"}]}}'
        compressor = zlib.compressobj(wbits=31) if self.gzipped else None

        def encoded(data: bytes) -> bytes:
            return compressor.compress(data) if compressor is not None else data

        headers = [(b"content-type", b"application/json")] + ([(b"content-encoding", b"gzip")] if compressor else [])
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": encoded(head), "more_body": True})
        piece = b"x" * 65536
        left = size - len(head) - len(tail)
        while left > 0:
            chunk = piece[:left]
            await send({"type": "http.response.body", "body": encoded(chunk), "more_body": True})
            self.streamed_bytes += len(chunk)
            left -= len(chunk)
        end = encoded(tail) + (compressor.flush() if compressor is not None else b"")
        await send({"type": "http.response.body", "body": end})

    async def serve(self, port: int = 0, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.errorlog = None
        self._scope = trio.CancelScope()   # a new one each start: the server may be restarted
        self._app = self._server.streamable_http_app(stateless_http=True, json_response=not self.event_stream)
        with self._scope:
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(serve, self._asgi, config)
                self.url = binds[0] + "/mcp"
                task_status.started(self.url)

    def stop(self) -> None:
        """Kill the server: open connections are dropped mid-request."""
        self._scope.cancel()


async def _read_body(receive: Any) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


def _replayed(body: bytes) -> Callable[[], Awaitable[dict[str, Any]]]:
    """An ASGI ``receive`` that gives ``body`` again, then waits for the disconnect."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await trio.sleep_forever()
        raise AssertionError

    return receive


async def _answer(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def mcp_rig(tmp_path: Path, servers: dict[str, McpTestServer], *, env: dict[str, str] | None = None,
                  scenario: Any = None, timeouts: dict[str, float] | None = None,
                  sideband: Sideband = Sideband.MEMORY, **changes: Any) -> AsyncIterator[tuple[Rig, McpHub]]:
    """The kit's rig with MCP sources: each server started, one source per
    entry (token env ``<NAME>_TOKEN``, ``server-token`` unless ``env`` says
    otherwise), the hub's first discovery done."""
    async with trio.open_nursery() as nursery:
        sources = []
        tokens = dict(env or {})
        for name, server in servers.items():
            url = await nursery.start(server.serve)
            env_name = f"{name.upper().replace('-', '_')}_TOKEN"
            tokens.setdefault(env_name, "server-token")
            sources.append(McpSource(name, url, env_name, (timeouts or {}).get(name)))
        async with rig(tmp_path, scenario, sideband=sideband, sources=tuple(sources), env=tokens, **changes) as r:
            assert r.mcp is not None
            yield r, r.mcp
        nursery.cancel_scope.cancel()
