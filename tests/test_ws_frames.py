"""The seam into trio-websocket's internals (voiceactors/realtime/ws_frames.py),
over real loopback sockets: a hand-written websocket peer (raw TCP, frames
built here) so the test decides exactly which frames share one TCP write."""

from __future__ import annotations

import base64
import hashlib
import socket
import struct
from importlib.metadata import version

import pytest
import trio
import trio.testing
import trio_websocket
from wsproto.events import CloseConnection
from wsproto.utilities import LocalProtocolError

from voiceactors.realtime import ws_frames

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def text_frame(text: str) -> bytes:
    """One unmasked (server-to-client) text frame."""
    payload = text.encode()
    if len(payload) < 126:
        return bytes([0x81, len(payload)]) + payload
    return bytes([0x81, 126]) + struct.pack("!H", len(payload)) + payload


def read_client_frame(data: bytes) -> tuple[str, bytes] | None:
    """(text, rest) of the first masked client frame in ``data``, or None."""
    if len(data) < 2:
        return None
    size, at = data[1] & 0x7F, 2
    if size == 126:
        size, at = struct.unpack("!H", data[2:4])[0], 4
    elif size == 127:
        size, at = struct.unpack("!Q", data[2:10])[0], 10
    if len(data) < at + 4 + size:
        return None
    mask, body = data[at:at + 4], data[at + 4:at + 4 + size]
    return bytes(b ^ mask[i % 4] for i, b in enumerate(body)).decode(), data[at + 4 + size:]


class Peer:
    """A websocket server on 127.0.0.1 that answers the handshake and then
    writes what the test gives it in single TCP writes."""

    def __init__(self) -> None:
        self.stream: trio.SocketStream | None = None
        self.ready = trio.Event()
        self.port = 0

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        stream = await listeners[0].accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive_some(4096)
        key = next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key"))
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        await stream.send_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                              b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        self.stream = stream
        self.ready.set()
        await trio.sleep_forever()

    async def write(self, *texts: str) -> None:
        assert self.stream is not None
        await self.stream.send_all(b"".join(text_frame(t) for t in texts))

    async def read_texts(self, n: int) -> list[str]:
        assert self.stream is not None
        data, texts = b"", []
        while len(texts) < n:
            data += await self.stream.receive_some(65536)
            while (frame := read_client_frame(data)) is not None:
                texts.append(frame[0])
                data = frame[1]
        return texts


async def connected(nursery: trio.Nursery, queue_size: int = 64):
    peer = Peer()
    await nursery.start(peer.serve)
    ws = await trio_websocket.connect_websocket(nursery, "127.0.0.1", peer.port, "/", use_ssl=False,
                                                message_queue_size=queue_size)
    await peer.ready.wait()
    return peer, ws


def test_trio_websocket_is_the_pinned_version():
    # the seam reads private attributes: a new version must be checked first
    assert version("trio-websocket") == "0.12.2"


async def test_the_frames_of_one_socket_read_come_in_one_step():
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        ws_frames.hand_off_at_once(ws)
        texts = [f'{{"n": {i}}}' for i in range(8)]
        async with trio.open_nursery() as inner:
            got: list[list[str | bytes]] = []

            async def read() -> None:
                got.append(await ws_frames.get_messages(ws))

            inner.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()     # our reader waits in get_messages
            await peer.write(*texts)                       # eight frames, one TCP write
        assert got == [texts]                               # all eight, in order, in one call
        nursery.cancel_scope.cancel()


async def test_the_hand_off_decodes_whole_frames_past_wsprotos_decoder():
    # the fast path of tests/test_ws_decode.py is installed on a real
    # connection, and what crosses a real socket arrives whole and in order
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        ws_frames.hand_off_at_once(ws)
        assert getattr(ws._wsproto.connection._proto.received_frames, "_whole_frames", False)
        texts = ["", "é€😀", "a" * 125, "b" * 126, "c" * 3000, '{"type": "response.done"}']
        await peer.write(*texts)
        got: list[str | bytes] = []
        while len(got) < len(texts):
            got += await ws_frames.get_messages(ws)
        assert got == texts
        nursery.cancel_scope.cancel()


async def test_without_the_hand_off_a_read_gives_one_frame_per_step():
    # what the seam is for: trio-websocket's own hand-off yields between messages
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        got: list[list[str | bytes]] = []

        async def read() -> None:
            got.append(await ws_frames.get_messages(ws))

        async with trio.open_nursery() as inner:
            inner.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await peer.write('{"n": 0}', '{"n": 1}', '{"n": 2}')
        assert len(got[0]) < 3
        nursery.cancel_scope.cancel()


async def test_a_full_queue_still_holds_the_reader_back_and_loses_nothing():
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery, queue_size=2)
        ws_frames.hand_off_at_once(ws)
        texts = [f'{{"n": {i}}}' for i in range(7)]
        await peer.write(*texts)
        await trio.testing.wait_all_tasks_blocked()
        assert ws._recv_channel.statistics().current_buffer_used == 2   # the reader task waits for room
        got: list[str | bytes] = []
        while len(got) < len(texts):
            got += await ws_frames.get_messages(ws)
        assert got == texts
        nursery.cancel_scope.cancel()


async def test_send_now_writes_in_order_and_waits_behind_a_write_in_progress():
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        await ws_frames.send_now(ws, "first")
        await ws._stream_lock.acquire()            # another write holds the socket
        done = trio.Event()

        async def second() -> None:
            await ws_frames.send_now(ws, "second")
            done.set()

        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()                    # it waits its turn, no interleaving
        ws._stream_lock.release()
        await done.wait()
        assert await peer.read_texts(2) == ["first", "second"]
        nursery.cancel_scope.cancel()


async def test_send_now_on_a_closed_connection_raises_connection_closed():
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        assert peer.stream is not None
        await peer.stream.aclose()
        with pytest.raises(trio_websocket.ConnectionClosed):
            for _ in range(50):     # the first writes may still reach the kernel's buffer
                await ws_frames.send_now(ws, "x" * 1000)
                await trio.sleep(0)
        nursery.cancel_scope.cancel()


async def test_send_before_reads_the_clock_after_waiting_for_a_write_in_progress(autojump_clock):
    # the fence's seam (cluster/fence.py): a frame goes out only if its bytes reach
    # the socket before the deadline, however long trio-websocket's own write held the lock
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        assert await ws_frames.send_before(ws, "in time", trio.current_time() + 1.0)
        await ws._stream_lock.acquire()            # trio-websocket's own write (a pong, its close)
        outcome: list[bool] = []

        async def late() -> None:
            outcome.append(await ws_frames.send_before(ws, "late", trio.current_time() + 1.0))

        nursery.start_soon(late)
        await trio.sleep(2.0)                       # the deadline passes while it waits for the lock
        ws._stream_lock.release()
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == [False]                   # nothing written
        await ws_frames.send_now(ws, "after")
        assert await peer.read_texts(2) == ["in time", "after"]
        nursery.cancel_scope.cancel()


def test_check_seam_names_what_is_missing():
    class NotAConnection:
        _send_channel = _recv_channel = None

    with pytest.raises(RuntimeError, match="_stream_lock"):
        ws_frames.check_seam(NotAConnection())


async def test_skipped_frames_are_counted_and_stamped_but_never_queued():
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        ws_frames.hand_off_at_once(ws, skip=lambda raw: '"delta"' in raw)
        assert ws_frames.take_skipped(ws) == 0 and ws_frames.last_skipped_at(ws) == float("-inf")
        texts = ['{"n": 0}', '{"delta": 1}', '{"delta": 2}', '{"n": 3}', '{"delta": 4}']
        await peer.write(*texts)
        got: list[str | bytes] = []
        while len(got) < 2:
            got += await ws_frames.get_messages(ws)
        await trio.testing.wait_all_tasks_blocked()
        assert got == ['{"n": 0}', '{"n": 3}']                 # the rest, in order
        assert ws._recv_channel.statistics().current_buffer_used == 0
        assert ws_frames.take_skipped(ws) == 3 and ws_frames.take_skipped(ws) == 0
        assert float("-inf") < ws_frames.last_skipped_at(ws) <= trio.current_time()
        nursery.cancel_scope.cancel()


async def test_without_a_skip_every_frame_is_queued():
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        ws_frames.hand_off_at_once(ws)
        await peer.write('{"delta": 1}', '{"n": 2}')
        got: list[str | bytes] = []
        while len(got) < 2:
            got += await ws_frames.get_messages(ws)
        assert got == ['{"delta": 1}', '{"n": 2}'] and ws_frames.take_skipped(ws) == 0
        nursery.cancel_scope.cancel()


async def test_start_send_writes_a_frame_the_socket_takes_whole_in_the_callers_step():
    # the call actor's write with no schedule point and no cancel scope (CallActor._write)
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        assert ws_frames.start_send(ws, "first") == b""     # all of it went, synchronously
        assert not ws._stream_lock.locked()
        await ws._stream_lock.acquire()                      # another write holds the socket
        assert ws_frames.start_send(ws, "not now") is None   # nothing made, nothing written
        ws._stream_lock.release()
        await ws_frames.send_now(ws, "second")
        assert await peer.read_texts(2) == ["first", "second"]
        nursery.cancel_scope.cancel()


async def test_what_the_socket_does_not_take_at_once_finish_send_writes_before_any_other_frame():
    # start_send and finish_send run in one task (the send lock is a trio Lock: its owner releases it)
    async with trio.open_nursery() as nursery:
        peer, ws = await connected(nursery)
        ws._stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        big = "x" * 2_000_000                                 # far more than the buffers hold
        got: list[str] = []

        async def read() -> None:
            got.extend(await peer.read_texts(2))

        async def behind() -> None:
            await ws_frames.send_now(ws, "after")             # waits for the lock: no interleaving

        rest = ws_frames.start_send(ws, big)
        assert rest and ws._stream_lock.locked()             # held until the rest is written
        nursery.start_soon(behind)
        nursery.start_soon(read)
        await ws_frames.finish_send(ws, rest)
        with trio.fail_after(10):
            while len(got) < 2:
                await trio.sleep(0.01)
        assert got == [big, "after"]
        nursery.cancel_scope.cancel()


async def test_a_frame_wsproto_refuses_leaves_the_send_lock_free():
    # wsproto past its close (a close it handled while trio-websocket has not
    # yet set its close reason) refuses a text frame: start_send raises, as
    # send_now does, and the lock is not left held for every later write
    async with trio.open_nursery() as nursery:
        _peer, ws = await connected(nursery)
        ws._wsproto.send(CloseConnection(code=1000))         # wsproto's state only; nothing sent
        assert ws._close_reason is None
        with pytest.raises(LocalProtocolError):
            ws_frames.start_send(ws, "refused")
        assert not ws._stream_lock.locked()
        with pytest.raises(LocalProtocolError):
            await ws_frames.send_now(ws, "refused")
        assert not ws._stream_lock.locked()
        nursery.cancel_scope.cancel()
