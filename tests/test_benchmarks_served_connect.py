"""The ``served`` peer's hand-made ``/connect``:
the driver of ``benchmarks.capacity --workers`` posts each connect on a
plain socket instead of ``http.client``, so its status must be read as
``http.client`` would have: the whole response taken (by its
``Content-Length``, or to the close), a response cut inside its head an
error, never a status made up."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def served(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks.peers import served
    return served


def _one_shot_server(answer_in_parts: list[bytes]) -> tuple[int, list[bytes], threading.Thread]:
    """A loopback server for one connection: reads the request's head and
    body, sends ``answer_in_parts`` one ``send`` each, closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                got.append(data)
                for part in answer_in_parts:
                    conn.sendall(part)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], got, thread


def test_connect_sends_the_route_s_request_and_reads_its_status(served):
    body = b'{"status":"connected"}'
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    port, got, thread = _one_shot_server([answer[:7], answer[7:30], answer[30:]])
    assert served._connect(port, "call-7") == 200
    thread.join(5)
    head, _, sent_body = got[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /api/voice/connect HTTP/1.1\r\n")
    assert b"\r\nContent-Length: %d" % len(sent_body) in head
    assert sent_body == b'{"call_id": "call-7"}'


def test_a_refusal_s_status_is_returned(served):
    body = b'{"error":"too many calls"}'
    port, _, thread = _one_shot_server([b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s"
                                        % (len(body), body)])
    assert served._connect(port, "call-8") == 503
    thread.join(5)


def test_a_response_cut_inside_its_head_is_an_error(served):
    port, _, thread = _one_shot_server([b"HTTP/1.1 200 OK\r\ncontent-le"])
    with pytest.raises(ConnectionError, match="inside a response head"):
        served._connect(port, "call-9")
    thread.join(5)
