"""The sideband websocket: our server's own connection to a live Realtime call.

The URL comes from the same base URL as the REST calls (``OPENAI_BASE_URL``),
so the local simulator can stand in for OpenAI. Only the standard API key is
sent (``Authorization: Bearer``); no ``OpenAI-Beta`` header (it selects the old
beta protocol) and no ``model=`` beside ``call_id``.

Handshake failures are sorted into kinds the caller acts on differently:
``CallGone`` (HTTP 404/410: the call is over, do not retry),
``SidebandRefused`` (HTTP 401/403: the key is not accepted, retrying cannot
help) and ``SidebandUnavailable`` (anything else, including a peer that
breaks the handshake protocol, e.g. a wrong ``Sec-WebSocket-Accept``: maybe
retry with backoff). An open connection that fails with a protocol error
(an oversized or malformed frame) raises ``SidebandBroken``: a drop the
caller counts as a failure.

A ``wss`` sideband verifies the service's certificate with the process's one
client TLS context (``tls.SIDEBAND``, trio-websocket's own default made once:
not again for every connect).
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable
from urllib.parse import quote, urlsplit, urlunsplit

import trio
import trio_websocket
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    ConnectionTimeout,
    DisconnectionTimeout,
    HandshakeError,
    WebSocketConnection,
)

from voiceactors.realtime import tls as client_tls
from voiceactors.settings import default

__all__ = [
    "SidebandError",
    "CallGone",
    "SidebandUnavailable",
    "SidebandRefused",
    "SidebandBroken",
    "ws_url",
    "open_sideband",
    "is_clean_close",
    "close_code",
    "CLEAN_CLOSE_CODES",
    "GONE_STATUSES",
    "ConnectionClosed",
    "WebSocketConnection",
]

CLEAN_CLOSE_CODES = frozenset({1000, 1001})
GONE_STATUSES = frozenset({404, 410})
REFUSED_STATUSES = frozenset({401, 403})
#: Bytes asked of the socket per read by trio-websocket's reader (its own
#: default is 4 KiB): a response's frames, written back to back by the
#: service, then come in one read and one hand-off instead of several, each
#: with a schedule point between, which one call's output waited for. trio's own
#: default for a stream's read.
RECEIVE_BYTES = 64 * 1024


class SidebandError(Exception):
    """The sideband could not be opened. ``status_code`` is the handshake's HTTP
    status when the server answered one, else None."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class CallGone(SidebandError):
    """The handshake answered 404 or 410: the call has ended (not a retry case)."""


class SidebandUnavailable(SidebandError):
    """Any other handshake failure: refused, timed out, 5xx, bad URL, a peer
    that breaks the handshake protocol."""


class SidebandRefused(SidebandUnavailable):
    """The handshake answered 401 or 403: the key is refused (not a retry case)."""


class SidebandBroken(SidebandError):
    """The open connection failed with a protocol error (e.g. a frame over
    ``max_message_size``). Not raised for the body's own exceptions."""


def websocket_url(base_url: str, path: str, query: str = "") -> str:
    """``path`` (and ``query``) under the REST ``base_url``, as the ws(s) URL
    of the same host: the one rule of every sideband's address. ValueError
    for a base URL that is not http(s)://host[/path]."""
    parts = urlsplit(base_url.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None or not parts.netloc:
        raise ValueError(f"base URL must be http(s)://host[/path], got scheme {parts.scheme!r}")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, query, ""))


def ws_url(base_url: str, call_id: str) -> str:
    """The sideband URL for ``call_id`` under the REST ``base_url``.

    >>> ws_url("https://api.openai.com/v1", "rtc_1")
    'wss://api.openai.com/v1/realtime?call_id=rtc_1'
    """
    return websocket_url(base_url, "/realtime", "call_id=" + quote(call_id, safe=""))


def is_clean_close(code: int | None) -> bool:
    """True for 1000/1001: the service ended the call (1001 at its 60-minute limit)."""
    return code in CLEAN_CLOSE_CODES


def close_code(exc: ConnectionClosed) -> int | None:
    """The close code carried by a ``ConnectionClosed`` (1006 for an abnormal drop)."""
    reason = getattr(exc, "reason", None)
    return getattr(reason, "code", None)


def _root_type(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return type(exc).__name__


@asynccontextmanager
async def open_sideband(
    base_url: str,
    api_key: str,
    call_id: str,
    *,
    connect_timeout: float = default("connect_timeout_s"),
    disconnect_timeout: float = 5.0,
    message_queue_size: int = 64,
    max_message_size: int = 4 * 1024 * 1024,
    url_of: Callable[[str, str], str] = ws_url,
) -> AsyncIterator[WebSocketConnection]:
    """Open the sideband for ``call_id`` and yield the connected websocket,
    at ``url_of(base_url, call_id)`` (a Realtime call's by default; a Live
    session's attach: ``live/attach.py``).

    Raises ``CallGone``, ``SidebandRefused`` or ``SidebandUnavailable`` when
    the handshake fails, ``SidebandBroken`` when the open connection fails
    with a protocol error; exceptions from the body propagate unchanged. Leaving the block closes the
    websocket (code 1000) within ``disconnect_timeout``; a close that times out
    is not an error (the connection is gone either way). Cancellation is
    honoured at every step.
    """
    try:
        url = url_of(base_url, call_id)
    except ValueError as exc:
        raise SidebandUnavailable(str(exc)) from None
    headers = [(b"authorization", f"Bearer {api_key}".encode())]
    connected = False
    body_error: BaseException | None = None
    # trio-websocket's own connect timeout leaves its reader task waiting on a
    # server that never answers the handshake, so the deadline is enforced here
    # (and, for the same reason, around the closing handshake).
    scope = trio.CancelScope(deadline=trio.current_time() + connect_timeout)
    try:
        with scope:
            tls = await client_tls.SIDEBAND.get() if url.startswith("wss:") else None
            async with trio_websocket.open_websocket_url(
                url,
                tls,
                extra_headers=headers,
                connect_timeout=connect_timeout + 1,
                disconnect_timeout=disconnect_timeout,
                message_queue_size=message_queue_size,
                max_message_size=max_message_size,
                receive_buffer_size=RECEIVE_BYTES,
            ) as ws:
                connected = True
                scope.deadline = math.inf
                try:
                    yield ws
                except BaseException as exc:
                    body_error = exc
                    raise
                finally:
                    scope.deadline = trio.current_time() + disconnect_timeout + 1
    except ConnectionRejected as exc:
        if connected:
            raise
        status = exc.status_code
        kind = (CallGone if status in GONE_STATUSES else
                SidebandRefused if status in REFUSED_STATUSES else SidebandUnavailable)
        raise kind(f"sideband handshake rejected with HTTP {status}", status) from None
    except ConnectionTimeout:
        if connected:
            raise
        raise SidebandUnavailable("sideband handshake timed out") from None
    except DisconnectionTimeout:
        # only raised while closing; keep the body's own exception if it had one
        if body_error is not None:
            raise body_error from None
        return
    except (HandshakeError, OSError, trio.BrokenResourceError) as exc:
        if connected:
            raise
        raise SidebandUnavailable(f"sideband connection failed: {type(exc).__name__}") from None
    except Exception as exc:
        # Whatever else the websocket stack raises (h11/wsproto protocol
        # errors from a peer that breaks the protocol) is the connection's
        # failure, not ours: classified, so the caller can retry or count it.
        # The body's own exceptions pass through unchanged.
        if body_error is not None and not isinstance(body_error, trio.Cancelled):
            raise
        name = _root_type(exc)
        if not connected:
            raise SidebandUnavailable(f"sideband handshake failed: {name}") from None
        raise SidebandBroken(f"sideband connection broke: {name}") from None
    if body_error is not None:
        raise body_error  # our close deadline swallowed it with the cancellation
    if not connected:
        raise SidebandUnavailable("sideband handshake timed out")
