"""Refusals below hypercorn (a flood's refusals cost the trio thread less; the `floods` benchmark).

A rate-limited client whose bucket is empty gets its 429 from the
connection's first read (``serving.serve_connection`` with the app's
``RateLimitRefusal``), without h11, hypercorn's connection setup or Quart;
everything else reaches hypercorn with the bytes read put back. Checked on
real sockets: the seam on its own (a stand-in for hypercorn that records
what it reads), the request parser, and a real server.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import trio

from voiceactors.http.asgi import whole_request
from voiceactors.http.serving import PEEK_S, CappedListener, SlotStream, serve_connection
from voiceactors.journal.sample import write_sample_journal
from voiceactors.server import run_server
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)
KEY = "sk-accept-refusal-test-77a1"


class Refusal:
    """Watches one address; answers one request line."""

    def __init__(self, address: str = "127.0.0.1", refuse: bytes = b"POST /no ") -> None:
        self.address = address
        self.refuse = refuse
        self.asked: list[bytes] = []

    def watching(self, address: str) -> bool:
        return address == self.address

    def answer(self, address: str, data: bytes) -> bytes | None:
        self.asked.append(data)
        return b"HTTP/1.1 429 \r\ncontent-length: 0\r\n\r\n" if data.startswith(self.refuse) else None


async def _one_connection(refusal: Any, send: list[bytes], *, pause_s: float = 0.0,
                          read: int = 0) -> tuple[bytes, list[bytes] | None]:
    """A client sends ``send`` (pausing ``pause_s`` between parts) on one
    connection served by ``serve_connection``; returns what the client got
    until EOF, and what the stand-in for hypercorn read (None: never called)."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    listener = CappedListener(sock, None, cap=0)
    served: list[bytes] | None = None

    async def stand_in(stream: SlotStream) -> None:
        nonlocal served
        served = []
        got = 0
        while got < read:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            served.append(bytes(chunk))
            got += len(chunk)
        await stream.send_all(b"served")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        async def server() -> None:
            stream = await listener.accept()
            await serve_connection(stand_in, refusal, stream)

        nursery.start_soon(server)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        for n, part in enumerate(send):
            if n and pause_s:
                await trio.sleep(pause_s)
            await client.send_all(part)
        got = b""
        with trio.fail_after(10):
            while chunk := await client.receive_some(65536):
                got += chunk
        await client.aclose()
    await listener.aclose()
    return got, served


async def test_a_watched_client_is_answered_from_its_first_read_and_closed():
    refusal = Refusal()
    got, served = await _one_connection(refusal, [b"POST /no HTTP/1.1\r\n\r\n"])
    assert got == b"HTTP/1.1 429 \r\ncontent-length: 0\r\n\r\n"
    assert served is None                                  # hypercorn never saw it
    assert refusal.asked == [b"POST /no HTTP/1.1\r\n\r\n"]


async def test_a_request_not_refused_reaches_hypercorn_with_every_byte_in_order():
    refusal = Refusal()
    first, later = b"GET /ok HTTP/1.1\r\nHost: x\r\n", b"\r\n"
    got, served = await _one_connection(refusal, [first, later], pause_s=0.2, read=len(first + later))
    assert got == b"served"
    assert served is not None and b"".join(served) == first + later
    assert refusal.asked == [first]


async def test_a_client_not_watched_is_not_read_before_hypercorn():
    refusal = Refusal(address="127.0.0.2")
    request = b"POST /no HTTP/1.1\r\n\r\n"
    got, served = await _one_connection(refusal, [request], read=len(request))
    assert got == b"served" and served == [b"POST /no HTTP/1.1\r\n\r\n"]
    assert refusal.asked == []


async def test_a_watched_client_that_sends_nothing_goes_to_hypercorn_after_the_peek(autojump_clock):
    refusal = Refusal()
    started = trio.current_time()
    late = b"GET /late HTTP/1.1\r\n\r\n"
    got, served = await _one_connection(refusal, [b"", late], pause_s=PEEK_S + 1, read=len(late))
    assert got == b"served" and b"".join(served or []) == late
    assert refusal.asked == []                             # the peek gave up; hypercorn read it all
    assert trio.current_time() - started >= PEEK_S


class BrokenRefusal(Refusal):
    def answer(self, address: str, data: bytes) -> bytes | None:
        raise RuntimeError("a bug in the refusal")


async def test_a_refusal_that_raises_lets_hypercorn_serve_and_is_logged(log_stream):
    request = b"POST /no HTTP/1.1\r\n\r\n"
    got, served = await _one_connection(BrokenRefusal(), [request], read=len(request))
    assert got == b"served" and served == [request]        # the server goes on; the request too
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.startswith("{")]
    assert [x["event"] for x in lines if x.get("level") == "error"] == ["server.refusal_failed"]


@pytest.mark.parametrize("data, expected", [
    (b"POST /api/voice/session HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", ("POST", "/api/voice/session")),
    (b"POST /api/voice/connect?x=1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", ("POST", "/api/voice/connect")),
    (b"GET /api/voice/status HTTP/1.0\r\n\r\n", ("GET", "/api/voice/status")),
    (b"POST /api/voice/connect HTTP/1.1\r\nContent-Length: 20\r\n\r\n{}", None),         # body still coming
    (b"POST /api/voice/connect HTTP/1.1\r\nContent-Length: 0\r\n\r\nGET / HTTP/1.1\r\n\r\n", None),  # pipelined
    (b"POST /api/voice/connect HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", None),
    (b"POST /api/voice/connect HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", None),
    (b"POST /api/voice/connect HTTP/1.1\r\nContent-Length: -1\r\n\r\n", None),
    (b"POST /api/voice/connect HTTP/1.1\r\nHost: h\r\n", None),                            # head not whole
    (b"POST /api/voice/connect\r\n\r\n", None),
    (b"POST /api/voice/connect HTTP/1.1\r\nno colon\r\n\r\n", None),
])
def test_only_one_whole_request_is_parsed(data, expected):
    assert whole_request(data) == expected


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    return write_sample_journal(tmp_path_factory.mktemp("refusal") / "journal", days=1, today=DAY)


async def _exchange(port: int, parts: list[bytes], pause_s: float = 0.0) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = b""
    async with stream:
        for n, part in enumerate(parts):
            if n:
                await trio.sleep(pause_s)
            await stream.send_all(part)
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    return data


async def test_a_real_server_refuses_an_empty_bucket_below_hypercorn_and_serves_the_rest(journal, tmp_path,
                                                                                        log_stream):
    settings = Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=KEY).replace(
        port=0, rate_limit_burst=1, rate_limit_per_s=0.01, shutdown_deadline_s=3.0, close_deadline_s=1.0)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        port = int(base.rsplit(":", 1)[1])
        host = f"Host: 127.0.0.1:{port}\r\n".encode()
        post = b"POST /api/voice/refresh-brain HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        first = await _exchange(port, [post])                       # takes the one token
        at_accept = await _exchange(port, [post])                   # the bucket is empty: refused at accept
        split = await _exchange(port, [post[:-2], post[-2:]], 0.2)  # not whole in one read: the ASGI layer's 429
        status = await _exchange(port, [b"GET /api/voice/status HTTP/1.1\r\n" + host + b"Connection: close\r\n\r\n"])
        stop.set()
    assert first.startswith(b"HTTP/1.1 20")
    for answer in (at_accept, split):
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429") and json.loads(body) == {"error": "too many requests"}
        for header in (b"retry-after: ", b"x-request-id: ", b"connection: close", b"cache-control: no-store",
                       b"content-type: application/json", b"date: "):
            assert b"\r\n" + header in head.lower(), (header, head)
    # hypercorn names itself in every answer it writes; the refusal at accept never went through it
    assert b"\r\nserver: hypercorn" not in at_accept.lower() and b"\r\nserver: hypercorn" in split.lower()
    assert status.startswith(b"HTTP/1.1 200")                   # a watched client's other requests are served
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.startswith("{")]
    assert [x["status"] for x in lines if x.get("event") == "http.request"
            and x.get("path") == "/api/voice/refresh-brain"] == [200]
    assert [x["refused"] for x in lines if x.get("event") == "http.rate_limited"] == [1]
