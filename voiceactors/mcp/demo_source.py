"""The demo's MCP tool source: a tiny weather server on loopback.

Built with the MCP SDK's ``MCPServer`` (Streamable HTTP, stateless, JSON
responses) behind a bearer-token check, so ``voiceactors demo`` and ``serve
--demo`` show a call using a tool from an MCP source (``weather.forecast``)
beside the journal's, under the same rules (docs/mcp.md). The forecast is
made up from the city's name: the demo needs no network.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from typing import Any, AsyncIterator, TypedDict

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from voiceactors.settings import Settings

SOURCE_NAME = "weather"
TOKEN_ENV = "VOICEACTORS_DEMO_MCP_TOKEN"
SKIES = ("sunny", "cloudy", "light rain", "windy", "clear")


class Forecast(TypedDict):
    city: str
    sky: str
    high_c: int
    low_c: int


def forecast_for(city: str) -> Forecast:
    digest = hashlib.sha256(city.strip().lower().encode()).digest()
    high = 12 + digest[0] % 15
    return Forecast(city=city.strip(), sky=SKIES[digest[1] % len(SKIES)], high_c=high, low_c=high - 4 - digest[2] % 5)


def build_server() -> MCPServer:
    # WARNING: MCPServer configures the root logger (logging.basicConfig); at INFO every
    # HTTP request of the SDK would print beside our JSON lines
    server = MCPServer("voiceactors-demo-weather", log_level="WARNING")

    @server.tool(description="Tomorrow's weather for a city: the sky and the high and low in °C.",
                 annotations=ToolAnnotations(read_only_hint=True))
    def forecast(city: str) -> Forecast:
        return forecast_for(city)

    return server


def _with_bearer(app: Any, token: str) -> Any:
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"error": "unauthorized"}'})
            return
        await app(scope, receive, send)

    return guarded


@contextlib.asynccontextmanager
async def open_demo_source(settings: Settings) -> AsyncIterator[Settings]:
    """Serve the weather source on an ephemeral loopback port; yield the
    settings with it as their one MCP source (its token in ``TOKEN_ENV``)."""
    token = secrets.token_urlsafe(24)
    os.environ[TOKEN_ENV] = token
    app = build_server().streamable_http_app(stateless_http=True, json_response=True)
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, _with_bearer(app, token), config)
        sources = [{"name": SOURCE_NAME, "url": binds[0] + "/mcp", "token_env": TOKEN_ENV}]
        yield settings.replace(mcp_sources=json.dumps(sources))
        nursery.cancel_scope.cancel()
