"""One socket write per small fixed-length HTTP response (issue 14, the
connect; ``voiceactors/http/head_hold.py``, ``serving.SlotStream.hold_heads``).

hypercorn writes a response's head and body as two sends; the stream we
hand it holds a fixed-length response's head until the body's write. Checked
three ways: the rule alone (which heads are held), hypercorn's real
``TCPServer`` on a real loopback socket whose sends are recorded (a stand-in
for trio's socket stream that writes through and keeps what it sent), and
the whole app served by ``serving.serve``, read with a raw socket and parsed
by h11 as a client: still valid HTTP, the same headers and body,
keep-alive and streaming responses unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from functools import partial
from typing import Any

import h11
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from mcp_server_support import served
from voiceactors.http.head_hold import JOIN_MAX_BYTES, HeadHold, holdable_head
from voiceactors.http.serving import SlotStream, serve_connection
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)

FIXED = b"HTTP/1.1 200 \r\ncontent-type: application/json\r\ncontent-length: 23\r\ndate: x\r\nserver: h\r\n\r\n"


# --- the rule ------------------------------------------------------------------

@pytest.mark.parametrize("data, held", [
    (FIXED, True),
    (FIXED.replace(b"content-length", b"Content-Length"), True),             # any case
    (b"HTTP/1.0 404 \r\ncontent-length: 9\r\n\r\n", True),
    (b"HTTP/1.1 200 \r\ncontent-length: 0\r\n\r\n", False),                   # no body to wait for
    (b"HTTP/1.1 200 \r\ntransfer-encoding: chunked\r\n\r\n", False),          # streaming: the head goes now
    (b"HTTP/1.1 200 \r\ncontent-type: text/event-stream\r\n\r\n", False),     # no length: read to close
    (b"HTTP/1.1 100 \r\n\r\n", False),                                        # informational
    (b"HTTP/1.1 101 \r\ncontent-length: 4\r\n\r\n", False),
    (FIXED + b'{"status":"connected"}\n', False),                             # a head and a body: send it
    (b'{"status":"connected"}\n', False),
    (b"", False),
    (bytearray(FIXED), False),                                                # h11 writes bytes; anything else is sent
])
def test_only_a_whole_fixed_length_head_is_held(data, held):
    assert holdable_head(data) is held


def test_a_held_head_leaves_with_the_next_write_in_one_send():
    hold = HeadHold()
    assert hold.take(FIXED) is None and hold.holding
    assert hold.take(b'{"status":"connected"}\n') == [FIXED + b'{"status":"connected"}\n']
    assert hold.take(b"") == [b""] and not hold.holding        # the end's empty write: nothing held, passed on
    assert hold.take(FIXED) is None
    assert hold.take(b"") == [FIXED]                           # a suppressed body (HEAD, 304): the end releases it
    big = b"x" * (JOIN_MAX_BYTES + 1)
    assert hold.take(FIXED) is None
    assert hold.take(big) == [FIXED, big]                      # a big body is not copied onto the head
    assert hold.take(FIXED) is None
    assert hold.release() == FIXED and hold.release() == b""


# --- hypercorn's TCPServer on a recorded socket --------------------------------

class RecordedSocketStream(trio.abc.HalfCloseableStream):
    """A real ``trio.SocketStream`` that keeps every ``send_all``'s bytes."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.inner = stream
        self.sends: list[bytes] = []

    @property
    def socket(self) -> Any:
        return self.inner.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def tiny_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/fixed``: 5 bytes of known length; ``/stream``: chunked, its first
    chunk sent only once ``STREAM_GO`` is set (after the client saw the head)."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/fixed":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})
    else:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await STREAM_GO.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})


STREAM_GO = trio.Event()


async def _served_once(requests: bytes, *, hold: bool = True, read_until: bytes | None = None,
                       then: bytes = b"") -> tuple[list[bytes], bytes]:
    """One connection to ``tiny_app`` through hypercorn's ``TCPServer`` over
    our ``SlotStream`` (heads held, as ``serve_connection`` sets, unless
    ``hold`` is False); the client sends ``requests``, reads until
    ``read_until`` appears (then sends ``then``) and to EOF. The server's
    sends and the client's bytes."""
    global STREAM_GO
    STREAM_GO = trio.Event()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    config = Config()
    config.keep_alive_timeout = 0.5
    serve_http = partial(TCPServer, wrap_app(tiny_app, config.wsgi_max_body_size, "asgi"), config,
                         WorkerContext(None), ConnectionState({}))
    recorded: list[RecordedSocketStream] = []
    got = bytearray()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            async def server() -> None:
                stream = RecordedSocketStream(await listeners[0].accept())
                recorded.append(stream)
                wrapped = SlotStream(stream, None)     # type: ignore[arg-type]  # a SocketStream in all but name
                if hold:
                    await serve_connection(serve_http, None, wrapped)
                else:
                    await serve_http(wrapped)

            nursery.start_soon(server)
            client = await trio.open_tcp_stream("127.0.0.1", port)
            await client.send_all(requests)
            while True:
                chunk = await client.receive_some(65536)
                if not chunk:
                    break
                got += chunk
                if read_until is not None and read_until in got:
                    read_until = None
                    STREAM_GO.set()
                    if then:
                        await client.send_all(then)
            await client.aclose()
            await listeners[0].aclose()
    return [s for s in recorded[0].sends if s], bytes(got)


def _responses(data: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Every response in ``data``, parsed by h11 as a client: (status, headers, body)."""
    conn = h11.Connection(h11.CLIENT)
    out: list[tuple[int, dict[bytes, bytes], bytes]] = []
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    status, headers, body = 0, {}, b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Response):
            status, headers, body = event.status_code, dict(event.headers), b""
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            out.append((status, headers, body))
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                break
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                break
            conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
            conn.send(h11.EndOfMessage())
        elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
            break
    return out


GET_FIXED = b"GET /fixed HTTP/1.1\r\nHost: x\r\n\r\n"
CLOSE = b"GET /fixed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def test_a_fixed_length_response_is_one_send_and_parses_the_same():
    sends, got = await _served_once(CLOSE)
    sends_apart, got_apart = await _served_once(CLOSE, hold=False)
    assert len(sends) == 1 and sends[0].endswith(b"\r\n\r\nhello")      # head and body in one write
    assert len(sends_apart) == 2                                         # hypercorn's own: the head, the body
    [(status, headers, body)] = _responses(got)
    [(status_apart, headers_apart, body_apart)] = _responses(got_apart)
    assert (status, body) == (status_apart, body_apart) == (200, b"hello")
    headers.pop(b"date"), headers_apart.pop(b"date")
    assert headers == headers_apart and headers[b"content-length"] == b"5"


async def test_keep_alive_requests_on_one_connection_each_get_one_send():
    sends, got = await _served_once(GET_FIXED + GET_FIXED + CLOSE)
    assert [status for status, _, _ in _responses(got)] == [200, 200, 200]
    assert [body for _, _, body in _responses(got)] == [b"hello"] * 3
    assert len(sends) == 3


async def test_a_head_request_gets_its_head_though_no_body_follows():
    sends, got = await _served_once(b"HEAD /fixed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"\r\n\r\n")
    assert b"content-length: 5" in got.lower() and len(sends) == 1


async def test_a_streaming_response_head_is_not_held_for_its_first_chunk():
    """The chunked head must reach the client before any chunk exists: the
    app sends its first chunk only once the client saw the head (held, this
    test would time out)."""
    sends, got = await _served_once(b"GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                    read_until=b"\r\n\r\n")
    assert sends[0].startswith(b"HTTP/1.1 200 ") and sends[0].endswith(b"\r\n\r\n")
    [(status, headers, body)] = _responses(got)
    assert status == 200 and headers[b"transfer-encoding"] == b"chunked" and body == b"data: 1\n\n"


# --- the whole app through serving.serve ---------------------------------------

def _raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


async def test_the_app_answers_valid_http_with_its_headers_and_json_bodies(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=1, today=DAY)
    settings = Settings(journal=journal, state_dir=tmp_path / "state").replace(rate_limit_per_s=0)
    async with served(settings) as base:
        port = int(base.rsplit(":", 1)[1])
        host = f"127.0.0.1:{port}".encode()
        bad = b'{"call_id": ""}'
        request = (b"GET /api/voice/status HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"
                   b"POST /api/voice/connect HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(bad)).encode() + b"\r\nConnection: close\r\n\r\n" + bad)
        data = await trio.to_thread.run_sync(_raw_exchange, port, request)
    (status_code, status_headers, status_body), (code, headers, body) = _responses(data)
    assert status_code == 200 and status_headers[b"content-type"] == b"application/json"
    assert int(status_headers[b"content-length"]) == len(status_body) and "active_sessions" in json.loads(status_body)
    assert code == 400 and headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(body)
    assert json.loads(body) == {"error": "call_id is required"}
