"""The lean benchmark peer's wire: websocket framing by hand and the Realtime
server events as string templates (``benchmarks/lean_sim.py`` plays them).

Why by hand: the simulator's cost per event is mostly its generality (a
dict per event, ``json.dumps``, trio-websocket's wsproto state machine, two
tasks and a queue per connection). Here a server→client frame is the
payload with a two- or four-byte header (servers never mask), a
client→server frame is unmasked with one big-integer XOR, and every event
is a ``%`` template with its ids spliced in.

Every template here produces the same JSON object the simulator's
``voiceactors/simulator/call.py`` sends for the same step (same type,
fields and nesting, in the order ``json.dumps`` writes them; the ids are
counters here, random there). ``tests/test_benchmarks_lean_sim.py``
compares the two peers' frames of a round against a real server.
"""

from __future__ import annotations

import base64
import hashlib
import http
import itertools
import json
import struct
from typing import Any

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


# --- websocket framing -----------------------------------------------------------------------

def frame(payload: bytes, opcode: int = OP_TEXT) -> bytes:
    """One unfragmented, unmasked frame (server → client)."""
    n = len(payload)
    first = 0x80 | opcode
    if n < 126:
        return bytes((first, n)) + payload
    if n < 65536:
        return struct.pack("!BBH", first, 126, n) + payload
    return struct.pack("!BBQ", first, 127, n) + payload


def close_frame(code: int) -> bytes:
    return frame(struct.pack("!H", code), OP_CLOSE)


def unmask(data: bytes | bytearray, mask: bytes) -> bytes:
    n = len(data)
    if not n:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


class FrameReader:
    """Client → server frames from a byte stream: ``feed(data)`` returns the
    complete ``(opcode, payload)`` pairs, messages reassembled from their
    fragments (control frames come through as they arrive, between
    fragments too). Raises ``ValueError`` on a frame no client may send
    (a reserved bit, a fragmented or oversized control frame)."""

    def __init__(self, max_message: int = 16 * 1024 * 1024) -> None:
        self.buf = bytearray()
        self.max_message = max_message
        self._parts: list[bytes] = []
        self._opcode = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self.buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            if b0 & 0x70:
                raise ValueError("reserved bits set (no extension was negotiated)")
            n = b1 & 0x7F
            head = 2
            if n == 126:
                if end - pos < 4:
                    break
                n = struct.unpack_from("!H", buf, pos + 2)[0]
                head = 4
            elif n == 127:
                if end - pos < 10:
                    break
                n = struct.unpack_from("!Q", buf, pos + 2)[0]
                head = 10
            if n > self.max_message:
                raise ValueError("frame too large")
            masked = b1 & 0x80
            start = pos + head + (4 if masked else 0)
            if end < start + n:
                break
            payload = bytes(buf[start:start + n])
            if masked:
                payload = unmask(payload, bytes(buf[pos + head:pos + head + 4]))
            pos = start + n
            opcode, fin = b0 & 0x0F, b0 & 0x80
            if opcode >= 0x8:
                if not fin or n > 125:
                    raise ValueError("bad control frame")
                out.append((opcode, payload))
            elif opcode == OP_CONT:
                self._parts.append(payload)
                if fin:
                    out.append((self._opcode, b"".join(self._parts)))
                    self._parts = []
            elif fin:
                out.append((opcode, payload))
            else:
                self._opcode, self._parts = opcode, [payload]
        del buf[:pos]
        return out


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode("latin-1") + WS_GUID).digest()).decode("ascii")


def switching_protocols(key: str) -> bytes:
    return ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_key(key)}\r\n\r\n").encode("ascii")


def http_response(status: int, body: bytes = b"", content_type: str = "application/json") -> bytes:
    phrase = http.HTTPStatus(status).phrase
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode("ascii") + body


def error_body(message: str, code: str | None = None, type_: str = "invalid_request_error",
               param: str | None = None) -> bytes:
    """The OpenAI-shaped error body the simulator answers REST and refused handshakes with."""
    return json.dumps({"error": {"message": message, "type": type_, "code": code, "param": param}}).encode()


# --- ids -------------------------------------------------------------------------------------
# the simulator's shapes (prefix + hex of the same length), from counters

_counter = itertools.count(1)


def event_id() -> str:
    return "event_%016x" % next(_counter)


def item_id() -> str:
    return "item_%020x" % next(_counter)


def response_id() -> str:
    return "resp_%020x" % next(_counter)


def call_id() -> str:
    return "call_%016x" % next(_counter)


def q(value: str | None) -> str:
    """A JSON string (ids: no escaping needed) or null."""
    return "null" if value is None else '"' + value + '"'


# --- the server events (each: the JSON text of one frame) --------------------------------------

def speech_started(item: str, ms: int) -> str:
    return ('{"type": "input_audio_buffer.speech_started", "audio_start_ms": %d, "item_id": "%s", '
            '"event_id": "%s"}' % (ms, item, event_id()))


def speech_stopped(item: str, ms: int) -> str:
    return ('{"type": "input_audio_buffer.speech_stopped", "audio_end_ms": %d, "item_id": "%s", '
            '"event_id": "%s"}' % (ms, item, event_id()))


def committed(item: str) -> str:
    return '{"type": "input_audio_buffer.committed", "item_id": "%s", "event_id": "%s"}' % (item, event_id())


def item_event(kind: str, item_json: str, previous: str | None) -> str:
    """``conversation.item.added`` / ``.done`` (``kind``: added | done) naming the item before."""
    return ('{"type": "conversation.item.%s", "item": %s, "event_id": "%s", "previous_item_id": %s}'
            % (kind, item_json, event_id(), q(previous)))


def user_item(item: str) -> str:
    return ('{"id": "%s", "object": "realtime.item", "type": "message", "role": "user", "status": "completed", '
            '"content": [{"type": "input_audio", "transcript": null}]}' % item)


def transcription_delta(item: str, text_json: str) -> str:
    return ('{"type": "conversation.item.input_audio_transcription.delta", "item_id": "%s", "content_index": 0, '
            '"delta": %s, "event_id": "%s"}' % (item, text_json, event_id()))


def transcription_completed(item: str, text_json: str, seconds_json: str) -> str:
    return ('{"type": "conversation.item.input_audio_transcription.completed", "item_id": "%s", '
            '"content_index": 0, "transcript": %s, "usage": {"type": "duration", "seconds": %s}, '
            '"event_id": "%s"}' % (item, text_json, seconds_json, event_id()))


def response_created(resp: str) -> str:
    return ('{"type": "response.created", "response": {"id": "%s", "object": "realtime.response", '
            '"status": "in_progress", "output": []}, "event_id": "%s"}' % (resp, event_id()))


def output_item(kind: str, resp: str, index: int, item_json: str) -> str:
    """``response.output_item.added`` / ``.done``."""
    return ('{"type": "response.output_item.%s", "response_id": "%s", "output_index": %d, "item": %s, '
            '"event_id": "%s"}' % (kind, resp, index, item_json, event_id()))


def function_call_item(item: str, status: str, name_json: str, call: str, arguments_json: str) -> str:
    return ('{"id": "%s", "object": "realtime.item", "type": "function_call", "status": "%s", "name": %s, '
            '"call_id": "%s", "arguments": %s}' % (item, status, name_json, call, arguments_json))


def arguments_delta(resp: str, item: str, index: int, call: str, delta_json: str) -> str:
    return ('{"type": "response.function_call_arguments.delta", "response_id": "%s", "item_id": "%s", '
            '"output_index": %d, "call_id": "%s", "delta": %s, "event_id": "%s"}'
            % (resp, item, index, call, delta_json, event_id()))


def arguments_done(resp: str, item: str, index: int, call: str, name_json: str, arguments_json: str) -> str:
    return ('{"type": "response.function_call_arguments.done", "response_id": "%s", "item_id": "%s", '
            '"output_index": %d, "call_id": "%s", "name": %s, "arguments": %s, "event_id": "%s"}'
            % (resp, item, index, call, name_json, arguments_json, event_id()))


def message_item(item: str, status: str, content_json: str) -> str:
    return ('{"id": "%s", "object": "realtime.item", "type": "message", "role": "assistant", "status": "%s", '
            '"content": %s}' % (item, status, content_json))


def _part_common(resp: str, item: str, index: int) -> str:
    return '"response_id": "%s", "item_id": "%s", "output_index": %d, "content_index": 0' % (resp, item, index)


def content_part(kind: str, resp: str, item: str, index: int, transcript_json: str) -> str:
    """``response.content_part.added`` / ``.done``."""
    return ('{"type": "response.content_part.%s", %s, "part": {"type": "audio", "transcript": %s}, '
            '"event_id": "%s"}' % (kind, _part_common(resp, item, index), transcript_json, event_id()))


def transcript_delta(resp: str, item: str, index: int, delta_json: str) -> str:
    return ('{"type": "response.output_audio_transcript.delta", %s, "delta": %s, "event_id": "%s"}'
            % (_part_common(resp, item, index), delta_json, event_id()))


def transcript_done(resp: str, item: str, index: int, text_json: str) -> str:
    return ('{"type": "response.output_audio_transcript.done", %s, "transcript": %s, "event_id": "%s"}'
            % (_part_common(resp, item, index), text_json, event_id()))


def audio_buffer(kind: str, resp: str) -> str:
    """``output_audio_buffer.started`` / ``.stopped`` / ``.cleared``."""
    return '{"type": "output_audio_buffer.%s", "response_id": "%s", "event_id": "%s"}' % (kind, resp, event_id())


def response_done(resp: str, output_json: str, usage: dict[str, Any]) -> str:
    u, i, o = usage, usage["input_token_details"], usage["output_token_details"]
    c = i["cached_tokens_details"]
    usage_json = ('{"total_tokens": %d, "input_tokens": %d, "output_tokens": %d, "input_token_details": '
                  '{"text_tokens": %d, "audio_tokens": %d, "image_tokens": 0, "cached_tokens": %d, '
                  '"cached_tokens_details": {"text_tokens": %d, "audio_tokens": %d, "image_tokens": 0}}, '
                  '"output_token_details": {"text_tokens": %d, "audio_tokens": %d}}'
                  % (u["total_tokens"], u["input_tokens"], u["output_tokens"], i["text_tokens"], i["audio_tokens"],
                     i["cached_tokens"], c["text_tokens"], c["audio_tokens"], o["text_tokens"], o["audio_tokens"]))
    return ('{"type": "response.done", "response": {"id": "%s", "object": "realtime.response", '
            '"status": "completed", "status_details": null, "output": %s, "usage": %s}, "event_id": "%s"}'
            % (resp, output_json, usage_json, event_id()))


def session_updated(session: dict[str, Any]) -> str:
    return '{"type": "session.updated", "session": %s, "event_id": "%s"}' % (json.dumps(session), event_id())


def error_event(message: str, code: str | None, client_event_id: str | None, param: str | None = None) -> str:
    error = {"type": "invalid_request_error", "code": code, "message": message, "param": param,
             "event_id": client_event_id}
    return '{"type": "error", "event_id": "%s", "error": %s}' % (event_id(), json.dumps(error))


def noise_delta(item: str, i: int) -> str:
    return ('{"type": "conversation.item.input_audio_transcription.delta", "item_id": "%s", "content_index": 0, '
            '"delta": "w%d ", "event_id": "%s"}' % (item, i, event_id()))
