"""The simulator's benchmark options: ``timestamps``, ``validate_sent=False``
and the ``sleep_until`` step, over real loopback websockets."""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket

from voiceactors.simulator import Simulator

KEY = "sk-test"
AUTH = [(b"authorization", f"Bearer {KEY}".encode())]


async def _start(nursery, **options) -> Simulator:
    sim = Simulator(api_key=KEY, **options)
    await nursery.start(sim.serve, 0)
    return sim


def _connect(sim: Simulator, call_id: str):
    url = sim.base_url.replace("http://", "ws://") + f"/realtime?call_id={call_id}"
    return trio_websocket.open_websocket_url(url, extra_headers=AUTH)


async def _drain(ws: trio_websocket.WebSocketConnection) -> list[dict]:
    seen = []
    try:
        while True:
            seen.append(json.loads(await ws.get_message()))
    except trio_websocket.ConnectionClosed:
        return seen


async def test_sleep_until_keeps_a_timetable(nursery, autojump_clock):
    sim = await _start(nursery, timestamps=True)
    call = sim.add_call("rtc_1", [
        {"sleep_until": 2}, {"response": {"text": "one"}},
        {"sleep": 3}, {"sleep_until": 4}, {"response": {"text": "two"}},  # 4 is past: at once
        {"sleep_until": 10}, {"response": {"text": "three"}},
        {"close": 1000}])
    async with _connect(sim, "rtc_1") as ws:
        await _drain(ws)
    created = [t - call.started_at for e, t in zip(call.sent, call.sent_at) if e["type"] == "response.created"]
    assert created == pytest.approx([2, 5, 10], abs=0.01)


async def test_timestamps_follow_the_records(nursery, autojump_clock):
    sim = await _start(nursery, timestamps=True)
    call = sim.add_call("rtc_1", "single_tool")
    async with _connect(sim, "rtc_1") as ws:
        while True:
            event = json.loads(await ws.get_message())
            if event["type"] == "response.done":
                break
        [tool] = [o for o in event["response"]["output"] if o["type"] == "function_call"]
        await trio.sleep(0.25)
        await ws.send_message(json.dumps({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": tool["call_id"], "output": "{}"}}))
        await ws.send_message(json.dumps({"type": "response.create"}))
        await _drain(ws)
    assert len(call.sent_at) == len(call.sent) and len(call.received_at) == len(call.received) == 2
    assert call.sent_at == sorted(call.sent_at) and call.received_at == sorted(call.received_at)
    done_at = max(t for e, t in zip(call.sent, call.sent_at) if e["type"] == "response.done"
                  and e["response"]["output"][0]["type"] == "function_call")
    assert call.received_at[0] - done_at == pytest.approx(0.25, abs=0.01)
    plain = await _start(nursery)
    assert plain.add_call("rtc_2").sent_at is None and plain.calls["rtc_2"].received_at is None


@pytest.mark.nonconforming_events
@pytest.mark.parametrize("validate", [True, False])
async def test_validate_sent_can_be_turned_off(nursery, validate):
    sim = await _start(nursery, validate_sent=validate)
    call = sim.add_call("rtc_1")
    async with _connect(sim, "rtc_1") as ws:
        with trio.fail_after(5):
            await call.wait_until(lambda c: c.connection is not None)
        bogus = {"type": "response.bogus", "event_id": "event_x"}
        if validate:
            with pytest.raises(ValueError):
                await call.connection.send(dict(bogus))
            assert call.sent == []
        else:
            await call.connection.send(dict(bogus))
            with trio.fail_after(5):
                assert json.loads(await ws.get_message()) == bogus
            assert call.sent == [bogus]


# -- coalesce_writes=False: one frame per event, one socket write per frame

def _data_segments_in(sock) -> int:
    """Linux ``tcp_info.tcpi_data_segs_in``: TCP segments with data this
    socket has received (offset 152 of ``struct tcp_info``, Linux >= 4.6)."""
    import socket
    import struct

    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 160)
    if len(info) < 156:
        pytest.skip("this kernel's tcp_info has no data_segs_in")
    return struct.unpack_from("I", info, 152)[0]


async def _raw_call(sim: Simulator, call_id: str) -> tuple[int, int, int]:
    """A websocket client by hand (wsproto over a trio TCP stream) that
    answers the scenario's tool call and the close. Returns (text frames
    received, data segments received after the handshake's answer, segments
    in all)."""
    import socket

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, CloseConnection, Message, Request, TextMessage

    stream = await trio.open_tcp_stream("127.0.0.1", sim.port)
    conn = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(conn.send(Request(host=f"127.0.0.1:{sim.port}", target=f"/v1/realtime?call_id={call_id}",
                                            extra_headers=AUTH)))
    frames, after_handshake, text, nodelay = 0, 0, "", 0
    with trio.fail_after(10):
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            conn.receive_data(data)
            for event in conn.events():
                if isinstance(event, AcceptConnection):
                    after_handshake = _data_segments_in(stream.socket)
                    with trio.fail_after(5):
                        await sim.calls[call_id].wait_until(lambda c: c.connection is not None)
                    server_side = sim.calls[call_id].connection.stream.inner   # the simulator's TCP stream
                    nodelay = server_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                elif isinstance(event, TextMessage):
                    assert event.message_finished   # never a message split over frames
                    frames += 1
                    text += event.data
                    if event.message_finished:
                        message, text = json.loads(text), ""
                        if message["type"] == "response.done":
                            for item in message["response"]["output"]:
                                if item["type"] == "function_call":
                                    reply = {"type": "conversation.item.create", "item": {
                                        "type": "function_call_output", "call_id": item["call_id"], "output": "{}"}}
                                    await stream.send_all(conn.send(Message(data=json.dumps(reply))))
                                    await stream.send_all(conn.send(Message(data='{"type": "response.create"}')))
                elif isinstance(event, CloseConnection):
                    await stream.send_all(conn.send(event.response()))
    total = _data_segments_in(stream.socket)
    await stream.aclose()
    assert nodelay                                # the simulator's side writes without Nagle's delay
    return frames, total - after_handshake, total


@pytest.mark.skipif(not hasattr(__import__("socket"), "TCP_INFO"), reason="needs Linux TCP_INFO")
@pytest.mark.parametrize("coalesce", [True, False])
async def test_coalesce_writes_off_sends_each_event_in_its_own_segment(nursery, coalesce):
    sim = await _start(nursery, coalesce_writes=coalesce)
    call = sim.add_call("rtc_1", [
        {"user_turn": {"text": "What is on today?", "duration_ms": 0}},
        {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
        {"wait_outputs": {"timeout_s": 5}},
        {"response": {"text": "Two meetings and a walk in the afternoon."}},
        {"close": 1000}])
    frames, segments, _ = await _raw_call(sim, "rtc_1")
    events = len(call.sent)
    assert frames == events and events > 30   # one text frame per event either way
    if coalesce:
        assert segments < events / 2              # bursts of events share a write (and a segment)
    else:
        assert segments >= frames                 # every frame its own write, so its own segment


# -- the wire stamps: written_at / read_at (the burst benchmark's measure)

async def _slow_reader(sim: Simulator, call_id: str):
    """A websocket client by hand on a socket with a tiny receive buffer, so
    the simulator's writes block until it reads: (stream, wsproto connection)."""
    import socket

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # before connect: no autotuning
    await sock.connect(("127.0.0.1", sim.port))
    stream = trio.SocketStream(sock)
    conn = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(conn.send(Request(host=f"127.0.0.1:{sim.port}", target=f"/v1/realtime?call_id={call_id}",
                                            extra_headers=AUTH)))
    while True:
        conn.receive_data(await stream.receive_some(65536))
        if any(isinstance(e, AcceptConnection) for e in conn.events()):
            return stream, conn


@pytest.mark.parametrize("coalesce", [True, False])
async def test_wire_stamps_are_taken_at_the_socket_not_at_the_queues(nursery, autojump_clock, coalesce):
    from wsproto.events import Message, TextMessage

    sim = await _start(nursery, timestamps=True, validate_sent=False, coalesce_writes=coalesce)
    call = sim.add_call("rtc_1", [{"sleep": 100}])
    with trio.fail_after(5):
        stream, conn = await _slow_reader(sim, "rtc_1")
        await call.wait_until(lambda c: c.connection is not None)
    import socket

    # small socket buffers both ways (set, so not autotuned): ~20 KB fill them
    call.connection.stream.inner.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    try:
        t0 = trio.current_time()
        # queued together (under SEND_BUFFER, so no wait): the big event fills the
        # socket (the client does not read yet), the marker waits behind it, and the
        # filler takes the unwritten characters over SEND_BUFFER
        await call.connection.send({"type": "bench.big", "text": "x" * 60_000})
        await call.connection.send({"type": "bench.marker"})
        await call.connection.send({"type": "bench.filler", "text": "x" * 10_000})
        # a client event whose answer cannot be queued until the writer drains (the
        # simulator's reader is held there), then one the reader cannot take meanwhile
        with trio.fail_after(5):
            await stream.send_all(conn.send(Message(data=json.dumps({"type": "session.update", "session": {"type": "realtime"}}))))
            await trio.sleep(1)
            await stream.send_all(conn.send(Message(data=json.dumps({"type": "session.update", "session": {"type": "realtime"}}))))
        await trio.sleep_until(t0 + 5)   # the client starts reading at t0 + 5
        seen: list[str] = []
        text = ""
        with trio.move_on_after(30):
            while len(seen) < 5:
                data = await stream.receive_some(1 << 20)
                assert data, f"the simulator closed the connection; seen {seen}"
                conn.receive_data(data)
                for event in conn.events():
                    if isinstance(event, TextMessage):
                        text += event.data
                        if event.message_finished:
                            seen.append(json.loads(text)["type"])
                            text = ""
    finally:
        await stream.aclose()   # else the simulator's shielded write would wait for it for ever
    assert seen == ["bench.big", "bench.marker", "bench.filler", "session.updated", "session.updated"]
    big, marker, _ = (call.sent_at[i] for i, e in enumerate(call.sent) if e["type"].startswith("bench."))
    big_w, marker_w, _ = (call.written_at[i] for i, e in enumerate(call.sent) if e["type"].startswith("bench."))
    assert big == pytest.approx(t0, abs=0.01) and marker == pytest.approx(t0, abs=0.01)   # queued at once
    assert big_w == pytest.approx(t0, abs=0.01)      # its write started at once ...
    if coalesce:
        assert marker_w == big_w                     # ... with the marker in the same write
    else:
        assert marker_w >= t0 + 5                    # ... and the marker went out once the client read
    assert [e["type"] for e in call.received] == ["session.update", "session.update"]
    first, second = call.read_at
    assert first == pytest.approx(t0, abs=0.01) and call.received_at[0] == pytest.approx(t0, abs=0.01)
    assert second == pytest.approx(t0 + 1, abs=0.01)  # read off the socket at t0 + 1 ...
    assert call.received_at[1] >= t0 + 5             # ... taken once the reader's own write drained
    assert len(call.written_at) == len(call.sent) and None not in call.written_at


def test_read_stamps_refuse_a_connection_without_the_seam():
    from voiceactors.simulator.read_stamps import stamp_reads

    with pytest.raises(RuntimeError, match="_send_channel"):
        stamp_reads(object())
