"""A whole socket read in one step, and a write with no scheduler pass
first: the one place we reach into trio-websocket's internals.

Why: trio-websocket's reader task hands each message to a memory channel
with ``await send(...)`` (a schedule point per message) and ``get_message``
returns one message per call, so the k frames of one socket read cost k
passes of the scheduler over every runnable task for its reader task and k
more for ours. Its ``_send`` takes a lock whose uncontended ``acquire`` is a
schedule point too, so a frame's bytes leave one pass after the write was
asked for. Under load (hundreds of calls) each pass waits behind every
runnable task: that queueing was most of the round trip. The public API
has neither a batch read nor an immediate write, so this module adds them:

* ``hand_off_at_once(ws)`` wraps the send side of the connection's message
  channel so the reader task puts a message in at once when the channel has
  room (``send_nowait``), and waits (``send``) only when it is full: its
  backpressure (``message_queue_size``) is unchanged;
* ``get_messages(ws)`` waits for one message, then takes every message
  already queued (``receive_nowait``): all the frames of a socket read;
* ``hand_off_at_once(ws, skip)`` also drops, counts and stamps the frames
  ``skip`` names (those the reader would skip unread) before they are
  queued, so they cost the reader no wake-up (``take_skipped``,
  ``last_skipped_at``);
* ``send_now(ws, text)`` writes a text frame at once when no other write
  holds the connection's send lock (it holds the lock while writing, so
  frames never interleave), else waits its turn through ``send_message``;
* ``start_send(ws, text)`` / ``finish_send(ws, rest)``: the same write on a
  plain TCP stream with no schedule point when the socket takes the whole
  frame at once (one non-blocking ``write``), the rest finished by an
  awaited ``send_all`` when it does not;
* ``decode_whole_frames(connection)`` (``hand_off_at_once`` installs it on
  the connection's wsproto state): the complete, unfragmented, unmasked
  text frames at the head of wsproto's receive buffer are cut out and
  decoded in one loop of byte tests, and everything else (a control frame,
  a fragment, a frame not all received, anything malformed) is left to
  wsproto's own decoder, which then sees its buffer exactly as if it had
  taken those frames itself. wsproto's pure-Python decoder cost ~7 µs a
  frame, about a third of a busy call's trio-thread time (30 frames a tool
  round); the loop costs under 2.

It reads ``_send_channel``, ``_recv_channel``, ``_stream_lock``,
``_wsproto``, ``_stream`` and ``_close_reason`` and calls
``_abort_web_socket`` of ``trio_websocket.WebSocketConnection``:
trio-websocket is pinned exactly in ``pyproject.toml`` (0.12.2, the version
this was checked against), ``check_seam`` refuses a connection without them,
and ``tests/test_ws_frames.py`` checks the seam over real loopback sockets.
Of wsproto (pinned exactly too: 1.3.2) it reads the frame protocol's
decoder, buffer and message state (``FRAME_SEAM``, checked the same way);
``tests/test_ws_decode.py`` feeds the same bytes, cut at every place, to a
plain wsproto connection and to one with the fast path, and requires the
same events.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection
from wsproto.connection import Connection
from wsproto.events import TextMessage
from wsproto.frame_protocol import Frame, Opcode

__all__ = ["FRAME_SEAM", "SEAM_ATTRIBUTES", "check_seam", "decode_whole_frames", "finish_send", "get_messages",
           "hand_off_at_once", "last_skipped_at", "send_before", "send_now", "start_send", "take_skipped"]

#: The private attributes of ``WebSocketConnection`` this module uses.
SEAM_ATTRIBUTES = ("_send_channel", "_recv_channel", "_stream_lock", "_wsproto", "_stream", "_close_reason",
                   "_abort_web_socket")


def check_seam(ws: WebSocketConnection) -> None:
    """Raise ``RuntimeError`` naming what is missing when ``ws`` lacks an
    attribute this module uses (a trio-websocket other than the pinned one)."""
    missing = [name for name in SEAM_ATTRIBUTES if not hasattr(ws, name)]
    if missing:
        raise RuntimeError(f"trio-websocket internals changed (missing {', '.join(missing)}): "
                           "see voiceactors/realtime/ws_frames.py")


class _SendAtOnce:
    """The send side of the message channel, without a schedule point when
    the channel has room. Everything but ``send`` goes to the channel.

    With ``skip``: a message it says yes to is counted (``skipped``) and
    stamped (``skipped_at``) but never queued, so it does not wake the
    reader (``take_skipped``, ``last_skipped_at``)."""

    __slots__ = ("_inner", "skip", "skipped", "skipped_at")

    def __init__(self, inner: trio.MemorySendChannel[str | bytes]) -> None:
        self._inner = inner
        self.skip: Callable[[str | bytes], bool] | None = None
        self.skipped = 0
        self.skipped_at = -math.inf

    async def send(self, value: str | bytes) -> None:
        skip = self.skip
        if skip is not None and skip(value):
            self.skipped += 1
            self.skipped_at = trio.current_time()
            return
        try:
            self._inner.send_nowait(value)
        except trio.WouldBlock:
            await self._inner.send(value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _hand_off(ws: WebSocketConnection) -> _SendAtOnce | None:
    """The connection's send channel once ``hand_off_at_once`` replaced it."""
    channel: object = ws._send_channel
    return channel if isinstance(channel, _SendAtOnce) else None


def hand_off_at_once(ws: WebSocketConnection, skip: Callable[[str | bytes], bool] | None = None) -> None:
    """Make the connection's reader task queue every message of a socket
    read without yielding between them (idempotent). With ``skip``, the
    messages it says yes to are counted and dropped there instead of queued:
    the reader is not woken for a frame it would skip unread (most of a busy
    call's frames are deltas), and learns how many it missed from
    ``take_skipped``."""
    check_seam(ws)
    channel = _hand_off(ws)
    if channel is None:
        channel = _SendAtOnce(ws._send_channel)
        # trio's MemorySendChannel is final: the stand-in has its methods (the rest forwarded), not its type
        ws._send_channel = channel   # type: ignore[assignment]
    channel.skip = skip
    if ws._wsproto.connection is not None:    # None only before the handshake's answer came
        decode_whole_frames(ws._wsproto.connection)


#: What ``decode_whole_frames`` reads of wsproto's state, object by object.
FRAME_SEAM = {
    "Connection": ("_proto",),
    "FrameProtocol": ("_frame_decoder", "_message_decoder", "_parse_more", "extensions", "received_frames"),
    "FrameDecoder": ("buffer", "header"),
    "Buffer": ("buffer", "bytes_used"),
    "MessageDecoder": ("opcode",),
}

#: The first byte of a whole text frame: FIN, no RSV bit, opcode TEXT.
_WHOLE_TEXT = 0x81


def decode_whole_frames(connection: Connection) -> None:
    """Give a wsproto ``Connection`` the fast path for whole text frames
    (see the module doc; idempotent). Its events are the same, in the same
    order; only the frames it decodes cost less. Raises ``RuntimeError``
    naming what is missing when wsproto is not the version this reads."""
    proto: Any = getattr(connection, "_proto", None)
    parts = {"Connection": connection, "FrameProtocol": proto}
    parts["FrameDecoder"] = getattr(proto, "_frame_decoder", None)
    parts["Buffer"] = getattr(parts["FrameDecoder"], "buffer", None)
    parts["MessageDecoder"] = getattr(proto, "_message_decoder", None)
    missing = [f"{kind}.{name}" for kind, names in FRAME_SEAM.items()
               for name in names if not hasattr(parts[kind], name)]
    if missing:
        raise RuntimeError(f"wsproto internals changed (missing {', '.join(missing)}): "
                           "see voiceactors/realtime/ws_frames.py")
    original = proto.received_frames
    if getattr(original, "_whole_frames", False):
        return
    decoder, messages, parsing = proto._frame_decoder, proto._message_decoder, proto._parse_more
    buffer = decoder.buffer

    def received_frames() -> Any:
        # only at a frame boundary with no message half-read, no extension
        # and wsproto's parser still running (it ends at a close frame)
        if (decoder.header is None and messages.opcode is None and buffer.bytes_used == 0
                and not proto.extensions and parsing.gi_frame is not None):
            texts, used = _whole_text_frames(buffer.buffer)
            if used:
                del buffer.buffer[:used]
                for text in texts:
                    yield Frame(Opcode.TEXT, text, True, True)
        yield from original()

    vars(received_frames)["_whole_frames"] = True    # a function's own attribute: this connection has the fast path
    proto.received_frames = received_frames


def _whole_text_frames(data: bytearray) -> tuple[list[str], int]:
    """The texts of the whole, unmasked text frames at the head of ``data``
    and how many bytes they take. It stops at the first frame that is
    anything else, so wsproto's decoder takes that one (and refuses it, if
    it is malformed, as it would have: a length not in its shortest form,
    invalid UTF-8, a mask from a server)."""
    texts: list[str] = []
    end, at = len(data), 0
    while end - at >= 2 and data[at] == _WHOLE_TEXT:
        size = data[at + 1]            # the mask bit set makes it >= 128: left to wsproto
        if size < 126:
            start = at + 2
        elif size == 126 and end - at >= 4:
            start, size = at + 4, (data[at + 2] << 8) | data[at + 3]
            if size < 126:
                break
        else:                          # an 8-byte length (64 KiB and more): rare, wsproto's
            break
        stop = start + size
        if stop > end:
            break
        try:
            texts.append(data[start:stop].decode())
        except UnicodeDecodeError:
            break
        at = stop
    return texts, at


def take_skipped(ws: WebSocketConnection) -> int:
    """How many messages ``skip`` dropped since the last call (0 without the hand-off)."""
    channel: object = ws._send_channel     # (not _hand_off: read per batch, one call less)
    if not isinstance(channel, _SendAtOnce):
        return 0
    skipped, channel.skipped = channel.skipped, 0
    return skipped


def last_skipped_at(ws: WebSocketConnection) -> float:
    """``trio.current_time()`` when ``skip`` last dropped a message (-inf: never)."""
    channel: object = ws._send_channel
    return channel.skipped_at if isinstance(channel, _SendAtOnce) else -math.inf


async def get_messages(ws: WebSocketConnection) -> list[str | bytes]:
    """The next message (waiting for it) and every message queued behind it.
    Raises ``ConnectionClosed`` like ``get_message`` when none is left."""
    batch: list[str | bytes] = [await ws.get_message()]
    channel = ws._recv_channel
    while True:
        try:
            batch.append(channel.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return batch   # a closed channel: the next get_messages raises ConnectionClosed


async def send_now(ws: WebSocketConnection, text: str) -> None:
    """Write one text frame. When no write holds the send lock, the frame is
    made and its bytes handed to the socket before the first schedule point;
    otherwise it waits its turn (``send_message``). Raises ``ConnectionClosed``
    like ``send_message``."""
    lock = ws._stream_lock
    if lock.locked() or ws._close_reason is not None:
        await ws.send_message(text)
        return
    lock.acquire_nowait()
    try:
        data = ws._wsproto.send(TextMessage(data=text))
        try:
            await ws._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await ws._abort_web_socket()
            raise ConnectionClosed(ws._close_reason) from None
    finally:
        lock.release()


def start_send(ws: WebSocketConnection, text: str) -> bytes | None:
    """Begin writing one text frame in this step, with no schedule point at
    all: on a plain TCP stream (a ``ws://`` sideband: the loopback of the
    tests and benchmarks, a local proxy) with the send lock free, the frame
    is made and written with one non-blocking ``write`` of the socket. Returns
    ``b""`` when every byte went; the bytes still to go when the socket took
    fewer (or refused them: the error is ``finish_send``'s to raise), with the
    send lock still held, so ``finish_send`` must follow (it awaits, so its
    caller bounds and shields it as any write); None when it could not start
    (the lock held, the connection closing, a TLS stream), with nothing made
    or written: write with ``send_now`` instead. A frame wsproto refuses (its
    state past a close) raises as in ``send_now``, with the lock released.

    ``send_now``'s path after its bytes are handed over is trio's
    ``send_all``, whose ``send`` ends with a schedule point even when the
    socket took every byte; the frame's bytes leave at the same moment here,
    but the task that wrote it goes on in its step (and its caller needs no
    cancel scope for a write that cannot wait)."""
    lock, stream = ws._stream_lock, ws._stream
    if lock.locked() or ws._close_reason is not None or type(stream) is not trio.SocketStream:
        return None
    lock.acquire_nowait()
    try:
        data = ws._wsproto.send(TextMessage(data=text))
    except BaseException:    # wsproto past a close: raised as send_now raises it, the lock not kept
        lock.release()
        raise
    try:
        sent = os.write(stream.socket.fileno(), data)
    except OSError:      # full (BlockingIOError), or broken: finish_send's send_all waits or raises
        sent = 0
    if sent == len(data):
        lock.release()
        return b""
    return data[sent:]


async def finish_send(ws: WebSocketConnection, rest: bytes) -> None:
    """Write what ``start_send`` left of its frame and release the send lock
    it held. Raises ``ConnectionClosed`` like ``send_message``."""
    try:
        await ws._stream.send_all(rest)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        await ws._abort_web_socket()
        raise ConnectionClosed(ws._close_reason) from None
    finally:
        ws._stream_lock.release()


async def send_before(ws: WebSocketConnection, text: str, until: float) -> bool:
    """Write one text frame only if trio's clock is before ``until`` at the
    moment its bytes go to the socket; False (nothing written) when it is
    not. A write of trio-websocket's own (a pong, its close) holding the send
    lock is waited for first, and the clock read after it: the read and the
    bytes then share one step (``send_now``'s path with the lock free), so no
    schedule point lets the deadline pass unseen between them. A frame too
    big for the socket's buffer finishes later, bounded by the caller."""
    lock = ws._stream_lock
    while lock.locked():
        async with lock:
            pass
    if trio.current_time() >= until:
        return False
    await send_now(ws, text)
    return True
