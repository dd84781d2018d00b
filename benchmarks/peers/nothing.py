"""Peer (control): a do-nothing *server* for ``benchmarks.burst``.

It takes the same ``POST /api/voice/connect {"call_id": ...}`` our server
takes (on ``--port``, plain HTTP/1.1, one request per connection), opens
the call's sideband to ``--base-url`` with a raw ``trio_websocket``
connection and answers ``200 {"status": "connected"}`` once the sideband is
open. On the sideband it does the least the protocol allows: every
``response.function_call_arguments.done`` is answered at once with a fixed
``function_call_output`` (no tool runs, no model validation: ``json.loads``
of only the two event types it acts on, found by their first bytes), and
after a completed ``response.done`` whose function calls it answered, one
``response.create`` (a create while a response is active would be
refused). Nothing is logged; the cyclic garbage collector is off.

Its latencies are what the simulator, the loopback and one scheduler turn
cost by themselves, under the same burst: the floor our server is compared
with in the same run.
``BENCH_NOTHING_FAST_FRAMES=1`` gives its sideband our own frame fast path
(``voiceactors.realtime.ws_frames``), which our server uses: a stricter
floor (the ``burst`` benchmark sets it).

Run by ``benchmarks.burst``: prints ``STARTED`` once listening; exits when
stdin closes or after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from urllib.parse import urlsplit

import trio
import trio_websocket

from voiceactors.realtime import ws_frames

FAST_FRAMES = os.environ.get("BENCH_NOTHING_FAST_FRAMES") == "1"
FIXED_OUTPUT = '{"ok": true}'
CREATE = json.dumps({"type": "response.create"})
# json.dumps of a server event starts with its type: '{"type": "response.done", ...'
_ARGS_DONE = '{"type": "response.function_call_arguments.done"'
_RESPONSE_DONE = '{"type": "response.done"'


async def sideband(base_url: str, api_key: str, call_id: str, opened: trio.Event) -> None:
    url = urlsplit(base_url)
    async with trio_websocket.open_websocket(url.hostname or "127.0.0.1", url.port or 80,
                                             f"{url.path}/realtime?call_id={call_id}", use_ssl=False,
                                             extra_headers=[(b"authorization", f"Bearer {api_key}".encode())]) as ws:
        if FAST_FRAMES:
            ws_frames.hand_off_at_once(ws)
        opened.set()
        answered = False
        try:
            while True:
                message = await ws.get_message()
                if not isinstance(message, str):
                    continue
                if message.startswith(_ARGS_DONE):
                    event = json.loads(message)
                    await ws.send_message(json.dumps({"type": "conversation.item.create", "item": {
                        "type": "function_call_output", "call_id": event["call_id"], "output": FIXED_OUTPUT}}))
                    answered = True
                elif message.startswith(_RESPONSE_DONE) and answered:
                    if json.loads(message)["response"].get("status") == "completed":
                        answered = False
                        await ws.send_message(CREATE)
        except trio_websocket.ConnectionClosed:
            return


async def _read_request(stream: trio.SocketStream) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return b""
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        body += chunk
    return body


def _answer(status: str, obj: dict[str, str]) -> bytes:
    body = json.dumps(obj).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


async def main(args: argparse.Namespace) -> None:
    async with trio.open_nursery() as calls:
        async def connect(stream: trio.SocketStream) -> None:
            async with stream:
                body = await _read_request(stream)
                try:
                    call_id = str(json.loads(body)["call_id"])
                except (ValueError, KeyError, TypeError):
                    await stream.send_all(_answer("400 Bad Request", {"error": "call_id is required"}))
                    return
                opened = trio.Event()
                calls.start_soon(sideband, args.base_url, args.api_key, call_id, opened)
                with trio.move_on_after(10):
                    await opened.wait()
                if opened.is_set():
                    await stream.send_all(_answer("200 OK", {"status": "connected"}))
                else:
                    await stream.send_all(_answer("502 Bad Gateway", {"error": "sideband not open"}))

        listeners = await trio.open_tcp_listeners(args.port, host="127.0.0.1")
        calls.start_soon(trio.serve_listeners, connect, listeners)
        print("STARTED", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)   # EOF: stop
        calls.cancel_scope.cancel()


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="do-nothing server peer")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--base-url", required=True, help="the simulator's http://127.0.0.1:PORT/v1")
    p.add_argument("--api-key", required=True)
    p.add_argument("--max-seconds", type=float, default=600.0)
    args = p.parse_args(argv)
    gc.freeze()
    gc.disable()

    async def bounded() -> None:
        with trio.move_on_after(args.max_seconds):
            await main(args)

    trio.run(bounded)
    return 0


if __name__ == "__main__":
    sys.exit(run())
