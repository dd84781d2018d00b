"""The attach sideband of a Live session: its URL and the opener of its websocket.

``wss://…/v1/live/sessions/{session_id}/attach`` under the REST base URL
(``OPENAI_BASE_URL``; the simulator's in tests), opened with the API key as
a Realtime call's sideband is (``realtime/sideband.py``: the same handshake,
bounds and failures, told as the call transport seam's by
``call/websocket_transport.py``). The connection carries Live's frames:
``transport.py`` puts the translator on it.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import AsyncIterator
from urllib.parse import quote, urlsplit, urlunsplit

from voiceactors.call.transport import CallTransport, OpenTransport
from voiceactors.call.websocket_transport import WebSocketTransport, failure
from voiceactors.realtime.sideband import SidebandError, SidebandUnavailable, open_sideband

__all__ = ["attach_opener", "attach_url"]


def attach_url(base_url: str, session_id: str) -> str:
    """The attach sideband's URL of ``session_id`` under the REST ``base_url``.

    >>> attach_url("https://api.openai.com/v1", "live_1")
    'wss://api.openai.com/v1/live/sessions/live_1/attach'
    """
    parts = urlsplit(base_url.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None or not parts.netloc:
        raise ValueError(f"base URL must be http(s)://host[/path], got scheme {parts.scheme!r}")
    path = f"{parts.path.rstrip('/')}/live/sessions/{quote(session_id, safe='')}/attach"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def attach_opener(base_url: str, session_id: str, *, connect_timeout: float) -> OpenTransport:
    """The opener of ``session_id``'s attach websocket: each attempt a new
    one with that attempt's API key (Live's frames, untranslated)."""

    def open_transport(api_key: str) -> AbstractAsyncContextManager[CallTransport]:
        return _open(base_url, api_key, session_id, connect_timeout)

    return open_transport


@asynccontextmanager
async def _open(base_url: str, api_key: str, session_id: str, connect_timeout: float) -> AsyncIterator[CallTransport]:
    try:
        url = attach_url(base_url, session_id)
    except ValueError as exc:
        raise failure(SidebandUnavailable(str(exc))) from None
    try:
        async with open_sideband(base_url, api_key, session_id, connect_timeout=connect_timeout, url=url) as ws:
            yield WebSocketTransport(ws)
    except SidebandError as exc:     # the sideband's own failures only: the body's pass unchanged
        raise failure(exc) from None
