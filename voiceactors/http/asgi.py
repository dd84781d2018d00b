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

Here, once the last body message has been handed to the server, a disconnect
no longer cancels the handler: it is finishing on its own (and cancels the
nursery itself when done, as quart-trio's handler does). A disconnect before
that still cancels the handler, so a client that goes away mid-request (an
event stream) still ends it.

It also caps the requests in flight (``app.max_requests_in_flight``): past
it a request is answered ``503 {"error": "server busy"}`` with
``Connection: close`` before the app sees it. With connections now closed
after ``Connection: close`` and after the keep-alive idle timeout, that
bounds what the server holds open for clients that are doing something.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import trio
from quart.asgi import ASGIHTTPConnection
from quart_trio.asgi import TrioASGIHTTPConnection

from voiceactors import metrics
from voiceactors.http.errors import BUSY, RATE_LIMITED
from voiceactors.http.ratelimit import bucket_key, retry_after
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
        cap = getattr(app, "max_requests_in_flight", 0)
        if cap and app.requests_in_flight >= cap:
            await _answer_busy(send)
            return
        wait = _rate_limit_wait(app, self.scope)
        if wait > 0:
            app.extensions.setdefault("voiceactors_refusal_log", _RefusalLog()).refused()
            await _answer_rate_limited(send, wait)
            return

        async def send_marking_the_end(message: Any) -> None:
            if _is_last_body(message):
                self._response_handed_over = True
            await send(message)

        app.requests_in_flight = getattr(app, "requests_in_flight", 0) + 1
        try:
            await super().__call__(receive, send_marking_the_end)
        finally:
            app.requests_in_flight -= 1

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


async def _answer_rate_limited(send: Any, wait: float) -> None:
    metrics.http_request("rate_limited", 429)
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(_RATE_LIMITED_BODY)).encode()),
        (b"connection", b"close"), (b"retry-after", retry_after(wait).encode()), (b"cache-control", b"no-store"),
        (b"x-request-id", uuid.uuid4().hex.encode())]})
    await send({"type": "http.response.body", "body": _RATE_LIMITED_BODY, "more_body": False})


async def _answer_busy(send: Any) -> None:
    metrics.http_request("busy", 503)
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(_BUSY_BODY)).encode()),
        (b"connection", b"close"), (b"retry-after", b"1"), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": _BUSY_BODY, "more_body": False})


class PathSwitch:
    """The app's ASGI entry (``app.asgi_app``): ``/mcp`` (exactly: a POST
    there is never redirected) goes to the MCP endpoint
    (``voiceactors/http/mcp.py``), everything else — lifespan included —
    to Quart. ``/mcp`` requests count toward ``max_requests_in_flight`` like
    every other request."""

    def __init__(self, app: Any, quart: Any, path: str, endpoint: Any) -> None:
        self.app, self.quart, self.path, self.endpoint = app, quart, path, endpoint

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") != self.path:
            await self.quart(scope, receive, send)
            return
        app = self.app
        cap = getattr(app, "max_requests_in_flight", 0)
        if cap and app.requests_in_flight >= cap:
            await _answer_busy(send)
            return
        app.requests_in_flight += 1
        try:
            await self.endpoint(scope, receive, send)
        finally:
            app.requests_in_flight -= 1
