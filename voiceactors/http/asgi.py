"""The app's HTTP connection class: quart-trio's, minus one self-cancellation.

Why this exists: quart-trio runs each request as two tasks in one nursery,
one reading ASGI messages and one handling the request, and cancels the
nursery as soon as the reader sees ``http.disconnect``. Hypercorn finishes a
response *inside the app's own* ``send`` call: the last body message makes it
end the stream, queue ``http.disconnect`` for the app, and — for
``Connection: close``, HTTP/1.0 or a refusal — close the socket, or else arm
the keep-alive idle timer. The reader then wakes and cancels the nursery,
and the cancellation lands on the handler task while it is still inside
hypercorn's close (``send_eof`` checkpoints before shutting the socket down)
or before the idle timer is armed. So no connection was ever closed by the
server. A bare hypercorn ASGI app does not cancel itself, which is why it
closes.

(Here the handler runs in the nursery's body rather than a task of its own,
``_serve_in_this_task``: the same nursery, the same cancellations, one task
fewer per request; the reader is still a task.)

Here, once the last body message has been handed to the server, a disconnect
no longer cancels the handler: it is finishing on its own (and cancels the
nursery itself when done, as quart-trio's handler does). A disconnect before
that still cancels the handler, so a client that goes away mid-request (an
event stream) still ends it.

It also gives the refusal served below hypercorn (``RateLimitRefusal``,
asked by ``serving.py`` at accept): a client whose bucket is empty gets the
same early 429 from its connection's first read, without hypercorn or Quart.

It also hands every request to ``/api/voice/connect`` to the app's
connect handler (``connect.py``) instead of Quart.

It also caps the requests in flight (``app.max_requests_in_flight``): past
it a request is answered ``503 {"error": "server busy"}`` with
``Connection: close`` before the app sees it. With connections now closed
after ``Connection: close`` and after the keep-alive idle timeout, that
bounds what the server holds open for clients that are doing something.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
import uuid
from typing import Any

import trio
from quart.asgi import ASGIHTTPConnection
from quart_trio.asgi import TrioASGIHTTPConnection

from voiceactors import metrics
from voiceactors.http import in_flight
from voiceactors.http.errors import BUSY, RATE_LIMITED
from voiceactors.http.connect import CONNECT_PATH
from voiceactors.http.forwarded import TrustedProxies
from voiceactors.http.ratelimit import RATE_LIMITED_POSTS, bucket_key, retry_after
from voiceactors.http.targets import scope_path, target_path
from voiceactors.logs import get_logger

_log = get_logger(actor="http")
_BUSY_BODY = json.dumps({"error": BUSY}).encode("utf-8")
_RATE_LIMITED_BODY = json.dumps({"error": RATE_LIMITED}).encode("utf-8")


def _is_last_body(message: Any) -> bool:
    return message.get("type") == "http.response.body" and not message.get("more_body", False)


class ClosingHTTPConnection(TrioASGIHTTPConnection):
    """quart-trio's HTTP connection, letting the server finish a sent response."""

    _response_handed_over = False

    async def __call__(self, receive: Any, send: Any) -> None:
        app: Any = self.app
        if in_flight.full(app):
            await _answer_busy(send)
            return
        wait = _rate_limit_wait(app, self.scope)
        if wait > 0:
            refusal_log(app).refused()
            await _answer_rate_limited(send, wait)
            return

        async def send_marking_the_end(message: Any) -> None:
            if _is_last_body(message):
                self._response_handed_over = True
            await send(message)

        with in_flight.counted(app):
            connect = getattr(app, "connect", None)
            if connect is not None and scope_path(self.scope) == CONNECT_PATH:
                await connect(self.scope, receive, send)      # the connect's one handler (connect.py), not Quart
                return
            await self._serve_in_this_task(receive, send_marking_the_end)

    async def _serve_in_this_task(self, receive: Any, send: Any) -> None:
        """quart-trio's ``__call__`` with the request handled in this task,
        the nursery's body, instead of a task of its own: the same nursery
        and the same cancellations (a disconnect cancels the nursery, the
        body with it; the handler cancels it when done), one task spawn and
        its first step fewer per request."""
        request = self._create_request_from_scope(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handle_messages, nursery, request, receive)
            await self.handle_request(nursery, request, send)

    async def handle_messages(self, nursery: trio.Nursery, request: Any, receive: Any) -> None:  # type: ignore[override]
        await ASGIHTTPConnection.handle_messages(self, request, receive)
        if not self._response_handed_over:
            nursery.cancel_scope.cancel()


def _rate_limit_wait(app: Any, scope: Any) -> float:
    """How long this client must still wait on a rate-limited POST (0: go on).

    Why here: a flood of refused POSTs from one client cost about 1.5 ms of
    the trio thread each through Quart (request context, hooks, error
    handler, a log line), and live calls' tool round trips queued behind
    them. A client whose bucket is already empty is refused before the app
    runs; every other request still meets the guards in their order (host,
    browser, token, then the limit itself, which takes the token)."""
    limiter = app.extensions.get("voiceactors_rate_limiter")
    key = bucket_key(scope) if limiter is not None and limiter.enabled else None
    return 0.0 if key is None else float(limiter.wait_for(key))


class _RefusalLog:
    """One ``http.rate_limited`` line a second at most, counting the refusals
    answered before the app (one line per refused request would let a flood
    fill the log as well). One per app: it reads trio's clock, and each
    trio run has its own."""

    def __init__(self) -> None:
        self.count = 0
        self.logged_at = -math.inf

    def refused(self) -> None:
        self.count += 1
        now = trio.current_time()
        if now - self.logged_at >= 1.0:
            _log.warning("http.rate_limited", refused=self.count)
            self.count, self.logged_at = 0, now


def refusal_log(app: Any) -> "_RefusalLog":
    """The app's ``http.rate_limited`` summary (one for both early refusals)."""
    log: _RefusalLog = app.extensions.setdefault("voiceactors_refusal_log", _RefusalLog())
    return log


def _rate_limited_headers(wait: float) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(_RATE_LIMITED_BODY)).encode()),
            (b"connection", b"close"), (b"retry-after", retry_after(wait).encode()), (b"cache-control", b"no-store"),
            (b"x-request-id", uuid.uuid4().hex.encode())]


class RateLimitRefusal:
    """The early 429 from a connection's first read (``serving.AcceptRefusal``).

    ``watching``: the address has an empty bucket for one of the
    rate-limited POSTs (four dictionary lookups; no bucket changes).
    ``answer``: the first read holds one whole request — request line,
    headers, and exactly the body its ``Content-Length`` declares (no
    ``Transfer-Encoding``, nothing pipelined after it) — that is a POST to a
    rate-limited path whose bucket for this address is still empty: the 429
    the ASGI layer would send (same body and headers, plus ``date``),
    counted in the same ``http.rate_limited`` summary and metric. Anything
    else is None, and the request takes the usual way (where the ASGI layer's
    early 429 and the app's own limit still apply). A connection from a
    trusted proxy is never watched: its peer is not its client
    (``forwarded.py``; the ASGI layer reads the forwarded one)."""

    def __init__(self, app: Any, limiter: Any, proxies: TrustedProxies) -> None:
        self._app = app
        self._limiter = limiter
        self._proxies = proxies

    def watching(self, address: str) -> bool:
        if self._proxies and self._proxies.trusts(address):
            return False
        limiter = self._limiter
        return any(limiter.wait_for((path, address)) > 0 for path in RATE_LIMITED_POSTS)

    def answer(self, address: str, data: bytes) -> bytes | None:
        request = whole_request(data)
        if request is None or (self._proxies and self._proxies.trusts(address)):
            return None
        method, path = request
        key = bucket_key({"method": method, "path": path, "client": (address, 0)})
        wait = self._limiter.wait_for(key) if key is not None else 0.0
        if wait <= 0:
            return None
        refusal_log(self._app).refused()
        metrics.http_request("rate_limited", 429)
        head = [b"HTTP/1.1 429 ", *(name + b": " + value for name, value in _rate_limited_headers(wait)),
                b"date: " + _http_date().encode()]
        return b"\r\n".join(head) + b"\r\n\r\n" + _RATE_LIMITED_BODY


def whole_request(data: bytes) -> tuple[str, str] | None:
    """``(method, routed path)`` when ``data`` is exactly one whole HTTP/1.x
    request with a ``Content-Length`` body (or none), else None."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = data[:end].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        name = name.strip().lower()
        if not colon or name == b"transfer-encoding":
            return None
        if name == b"content-length":
            if length is not None or not value.strip().isdigit():
                return None                  # duplicated or not a number: hypercorn decides
            length = int(value.strip())
    if len(data) - end - 4 != (length or 0):
        return None                          # body not all here, or more than one request
    path = target_path(parts[1])             # the path Quart would route (targets.py), as every limit keys on
    return None if path is None else (parts[0].decode("latin-1"), path)


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The ``date`` header's value, made once a second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, email.utils.formatdate(now, usegmt=True))
    return _date_cache[1]


async def _answer_rate_limited(send: Any, wait: float) -> None:
    metrics.http_request("rate_limited", 429)
    await send({"type": "http.response.start", "status": 429, "headers": _rate_limited_headers(wait)})
    await send({"type": "http.response.body", "body": _RATE_LIMITED_BODY, "more_body": False})


async def _answer_busy(send: Any) -> None:
    metrics.http_request("busy", 503)
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(_BUSY_BODY)).encode()),
        (b"connection", b"close"), (b"retry-after", b"1"), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": _BUSY_BODY, "more_body": False})


class PathSwitch:
    """The app's ASGI entry (``app.asgi_app``): ``/mcp`` (exactly, as Quart
    would route it: ``targets.py``; a POST there is never redirected) goes
    to the MCP endpoint (``voiceactors/http/mcp.py``), everything else —
    lifespan included — to Quart. ``/mcp`` requests count toward ``max_requests_in_flight`` like
    every other request."""

    def __init__(self, app: Any, quart: Any, path: str, endpoint: Any) -> None:
        self.app, self.quart, self.path, self.endpoint = app, quart, path, endpoint

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope_path(scope) != self.path:
            await self.quart(scope, receive, send)
            return
        app = self.app
        if in_flight.full(app):
            await _answer_busy(send)
            return
        with in_flight.counted(app):
            await self.endpoint(scope, receive, send)
