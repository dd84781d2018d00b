"""The routes' side of MCP tool sources (docs/mcp.md): the source tools a
session lists, and a call's own credentials at ``POST /api/voice/connect``.

Tokens are checked for shape here and handed to the MCP hub; they are never
logged, recorded or echoed (the log scrubber learns each one).
"""

from __future__ import annotations

from typing import Any

import trio

from voiceactors.mcp.client.hub import GetMcpManifest, OpenCall
from voiceactors.messages import ask
from voiceactors.http import errors as E
from voiceactors.http.errors import ApiError
from voiceactors.logs import get_logger, register_secret
from voiceactors.runtime import Runtime
from voiceactors.mcp.client.sources import TOKEN_MAX

QUICK_ASK_S = 5.0
_log = get_logger(actor="http")


def credentials_of(body: dict[str, Any]) -> dict[str, str] | None:
    """The body's ``credentials`` (None when absent): an object of source
    name -> token. 400 for any other shape."""
    if "credentials" not in body:
        return None
    value = body["credentials"]
    if not isinstance(value, dict) or not value:
        raise ApiError(400, E.CREDENTIALS_INVALID)
    for name, token in value.items():
        if not isinstance(token, str) or not token or len(token) > TOKEN_MAX or any(
                not 0x21 <= ord(c) <= 0x7e for c in token):
            raise ApiError(400, E.CREDENTIALS_INVALID)
        register_secret(token)
    return dict(value)


async def open_call(runtime: Runtime, call_id: str, credentials: dict[str, str]) -> None:
    """Hand the call's tokens to the hub before the call starts (its first
    tool call already uses them). 400 when one names no configured source."""
    if runtime.mcp is None:
        raise ApiError(400, E.CREDENTIALS_UNKNOWN_SOURCE)
    try:
        refusal = await ask(runtime.mcp, lambda r: OpenCall(call_id, credentials, r), timeout=QUICK_ASK_S)
    except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel):
        _log.error("http.mcp_hub_gone", call_id=call_id)
        raise ApiError(500, E.RUNTIME_UNAVAILABLE) from None
    if refusal is not None:
        raise ApiError(400, E.CREDENTIALS_UNKNOWN_SOURCE)


async def source_tools(runtime: Runtime, style: str) -> list[dict[str, Any]]:
    """The function tools of the MCP sources for a session (none when the
    hub does not answer: the session still works with ours)."""
    if runtime.mcp is None:
        return []
    try:
        tools: list[dict[str, Any]] = await ask(runtime.mcp, lambda r: GetMcpManifest(style, r), timeout=QUICK_ASK_S)
    except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel):
        _log.error("http.mcp_hub_gone")
        return []
    return tools
