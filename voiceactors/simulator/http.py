"""A minimal HTTP/1.1 + websocket listener for the simulator, on one port.

Why not Hypercorn/Quart: the simulator must be able to *drop* a websocket
without a close frame (the client then sees code 1006), which an ASGI app
cannot do. So each TCP connection is read with h11 up to the request head;
a websocket upgrade is handed, bytes and all, to trio-websocket (which can
also reject the handshake with any HTTP status); anything else is a plain
one-request REST exchange (``Connection: close``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

import h11
import trio
import trio_websocket

from voiceactors.logs import get_logger

__all__ = ["HttpRequest", "HttpResponse", "json_response", "open_listeners", "serve_http", "ReplayStream"]

MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024
READ_TIMEOUT_S = 30.0

_log = get_logger(actor="simulator")


@dataclass
class HttpRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names; the last value wins
    body: bytes = b""
    stream: "ReplayStream | None" = None   # a websocket upgrade's stream (see ``ReplayStream.cork``)


@dataclass
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


def json_response(status: int, obj: object, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    return HttpResponse(status, json.dumps(obj).encode(), "application/json", headers or [])


class ReplayStream(trio.abc.Stream):
    """A stream that first replays bytes already read, then reads from ``inner``.
    Closing it closes ``inner`` (no websocket close frame: that is the "drop").

    ``cork()`` … ``await uncork()``: writes in between are collected and go out
    in one ``send_all`` at ``uncork`` (one syscall, and one wake-up of the
    peer, for a burst of frames).

    ``last_write_at``: ``trio.current_time()`` right before the last write's
    bytes were handed to ``inner`` (no schedule point between the stamp and
    the socket's send; -inf before the first)."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes) -> None:
        self.inner = inner
        self._prefix = prefix
        self._corked: list[bytes] | None = None
        self._sending = trio.StrictFIFOLock()  # uncork writes outside trio-websocket's own lock
        self.last_write_at = -math.inf

    def cork(self) -> None:
        if self._corked is None:
            self._corked = []

    async def uncork(self) -> None:
        """Write what was collected since ``cork`` (may raise like ``send_all``)."""
        held, self._corked = self._corked, None
        if held:
            async with self._sending:
                data = b"".join(held)
                self.last_write_at = trio.current_time()
                await self.inner.send_all(data)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            n = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:n], self._prefix[n:]
            await trio.lowlevel.checkpoint()
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._corked is not None:
            self._corked.append(bytes(data))
            return
        async with self._sending:
            self.last_write_at = trio.current_time()
            await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:  # pragma: no cover - not used by trio-websocket
        inner = self.inner
        if not isinstance(inner, trio.abc.HalfCloseableStream):
            raise TypeError(f"{type(inner).__name__} cannot send an EOF")
        await inner.send_eof()

    async def aclose(self) -> None:
        try:
            await self.uncork()  # e.g. a close frame written while corked
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await self.inner.aclose()


RestHandler = Callable[[HttpRequest], Awaitable[HttpResponse]]
# (request, path, query, headers) for an upgrade; the handler accepts or rejects it
WsHandler = Callable[[trio_websocket.WebSocketRequest, HttpRequest], Awaitable[None]]


async def _read_head(stream: trio.abc.Stream, conn: h11.Connection, raw: bytearray) -> h11.Request | None:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data:
                return None
            raw += data
            conn.receive_data(bytes(data))   # the stream's bytes as they are (a bytearray copied)
            continue
        return event if isinstance(event, h11.Request) else None


async def _read_body(stream: trio.abc.Stream, conn: h11.Connection) -> bytes:
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            conn.receive_data(bytes(data))  # b"" means EOF; h11 then raises on a short body
            continue
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise h11.RemoteProtocolError("body too large", error_status_hint=413)
            continue
        return bytes(body)


async def _send_response(stream: trio.abc.Stream, conn: h11.Connection, resp: HttpResponse) -> None:
    headers = [("content-type", resp.content_type), ("content-length", str(len(resp.body))),
               ("connection", "close"), *resp.headers]
    out = conn.send(h11.Response(status_code=resp.status, headers=headers))
    out += conn.send(h11.Data(data=resp.body)) if resp.body else b""
    out += conn.send(h11.EndOfMessage())
    await stream.send_all(out)


def _request_meta(req: h11.Request) -> HttpRequest:
    target = req.target.decode("latin-1")
    parts = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in req.headers}
    return HttpRequest(req.method.decode("ascii"), parts.path, query, headers)


async def _handle_connection(stream: trio.abc.Stream, rest: RestHandler, ws: WsHandler) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    raw = bytearray()
    try:
        with trio.move_on_after(READ_TIMEOUT_S) as scope:
            head = await _read_head(stream, conn, raw)
        if scope.cancelled_caught or head is None:
            return
        meta = _request_meta(head)
        if "websocket" in meta.headers.get("upgrade", "").lower():
            async with trio.open_nursery() as nursery:
                # trio-websocket re-parses the handshake from the replayed bytes
                meta.stream = ReplayStream(stream, bytes(raw))
                request = await trio_websocket.wrap_server_stream(nursery, meta.stream)
                await ws(request, meta)
                nursery.cancel_scope.cancel()
            return
        with trio.move_on_after(READ_TIMEOUT_S):
            meta.body = await _read_body(stream, conn)
            await _send_response(stream, conn, await rest(meta))
    except h11.RemoteProtocolError as exc:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            status = exc.error_status_hint or 400
            body = {"error": {"message": "bad request", "type": "invalid_request_error", "code": None, "param": None}}
            try:
                await _send_response(stream, conn, json_response(status, body))
            except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away


_CLIENT_GONE = (trio_websocket.ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError,
                ConnectionError)


def _split_client_gone(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """(the client-went-away part, everything else) of ``exc``."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(_CLIENT_GONE)
    return (exc, None) if isinstance(exc, _CLIENT_GONE) else (None, exc)


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def open_listeners(host: str, port: int) -> tuple[list[trio.SocketListener], int]:
    """Bind ``host:port`` (0 = ephemeral); returns the listeners and the bound
    port. Raises ``OSError`` (e.g. port in use) plainly, outside any nursery."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    if port == 0 and len(listeners) > 1:
        # an ephemeral port differs per address family: keep one, so one URL works
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    return listeners, listeners[0].socket.getsockname()[1]


async def serve_http(
    rest: RestHandler,
    ws: WsHandler,
    listeners: list[trio.SocketListener],
    *,
    # started with the listeners, as trio.serve_listeners reports them
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve connections on ``listeners`` until cancelled; cancelling also
    cancels every open connection (websockets drop without a close frame)."""

    async def handler(stream: trio.abc.Stream) -> None:
        # One client must never take the listener down: a peer that goes away
        # mid-exchange (e.g. resets while its handshake is being rejected) is
        # normal; anything else is a simulator bug, logged, and only that
        # connection ends.
        try:
            await _handle_connection(stream, rest, ws)
        except BaseException as exc:
            lost, other = _split_client_gone(exc)
            if other is not None:
                if not isinstance(other, Exception) and not isinstance(other, BaseExceptionGroup):
                    raise
                if _only_cancelled(other):
                    raise
                _log.exception("simulator.connection_failed")
            elif lost is not None:
                _log.info("simulator.client_gone", error=type(lost).__name__)

    await trio.serve_listeners(handler, listeners, task_status=task_status)
