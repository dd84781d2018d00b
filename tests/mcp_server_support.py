"""Serving the voice server on loopback for the MCP server tests, and the
SDK's own client against it."""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, AsyncIterator

import httpx2
import trio
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from voiceactors.http import create_app, serving
from voiceactors.server import hypercorn_config
from voiceactors.settings import Settings

TOKEN = "tok-mcp-7d2c9f0b41e6a853"
MODES = ("legacy", "auto")      # the initialize handshake, and the 2026-07-28 per-request era


@contextlib.asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[str]:
    """The app for ``settings`` served on 127.0.0.1 (any port) by our
    hypercorn seam, whatever address the settings name: an app configured
    as if off loopback (``host="0.0.0.0"``) then runs on loopback only.
    Yields the base URL; stops (the bounded shutdown) on exit."""
    app = create_app(settings)
    config = hypercorn_config(settings.replace(host="127.0.0.1", port=0))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(partial(serving.serve, app, config, max_connections=settings.max_connections,
                                             shutdown_trigger=stop.wait))
        try:
            yield base
        finally:
            stop.set()


@contextlib.asynccontextmanager
async def mcp_client(base: str, *, token: str | None = None, mode: str = "legacy") -> AsyncIterator[Client]:
    """The SDK's client on ``base``/mcp, refusing redirects, with ``token``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, max_redirects=0, timeout=20) as http:
        async with Client(streamable_http_client(f"{base}/mcp", http_client=http), mode=mode) as client:
            yield client


def rpc(method: str, params: dict[str, Any] | None = None, request_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


#: What a stateless JSON-response POST needs besides its body (legacy era).
POST_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-11-25"}
