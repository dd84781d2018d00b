"""Hostile or broken Realtime peers (issue 11, item 13): over real loopback
sockets, a small raw-socket peer here for handshakes and frames the
simulator would never send, and the simulator's handshake; the simulator's
injection hooks for bad events, with the sideband in memory (the events are
the call's to handle, not the socket's)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math

import pytest
import structlog
import trio

from calls_support import KEY, Sideband, real_time_limit, rig
from voiceactors import logs
from voiceactors.call.actor import CallActor
from voiceactors.realtime.sideband import SidebandUnavailable, open_sideband

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _accept(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


class RawPeer:
    """Answers every websocket upgrade the way ``mode`` says; counts them."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.handshakes = 0
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, stream: trio.SocketStream) -> None:
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                data = await stream.receive_some(65536)
                if not data:
                    return
                head += data
            self.handshakes += 1
            key = next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                       if line.lower().startswith(b"sec-websocket-key:"))
            if self.mode.startswith("status:"):
                status = int(self.mode.split(":")[1])
                body = json.dumps({"error": {"message": "no", "type": "invalid_request_error",
                                             "code": "invalid_api_key"}}).encode()
                await stream.send_all(f"HTTP/1.1 {status} No\r\ncontent-type: application/json\r\n"
                                      f"content-length: {len(body)}\r\n\r\n".encode() + body)
                return
            accept = "d3Jvbmcgd3Jvbmcgd3Jvbmc=" if self.mode == "bad_accept" else _accept(key)
            await stream.send_all(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                   f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n").encode())
            if self.mode == "oversized":
                size = 5 * 1024 * 1024           # over the sideband's 4 MiB message limit
                await stream.send_all(b"\x81\x7f" + size.to_bytes(8, "big"))
                chunk = b"a" * 65536
                for _ in range(size // len(chunk)):
                    await stream.send_all(chunk)
            await trio.sleep(5)
        except (trio.BrokenResourceError, trio.ClosedResourceError, StopIteration):
            pass
        finally:
            await stream.aclose()


@pytest.fixture
async def nursery_peer(nursery):
    async def start(mode: str) -> RawPeer:
        peer = RawPeer(mode)
        await nursery.start(peer.serve)
        return peer
    return start


async def test_a_bad_accept_header_is_a_handshake_failure_not_a_crash(nursery_peer):
    peer = await nursery_peer("bad_accept")
    with trio.fail_after(10):
        with pytest.raises(SidebandUnavailable):
            async with open_sideband(peer.base_url, KEY, "rtc_bad_accept"):
                pass


def _actor(settings, peer, call_id: str, executor) -> CallActor:
    return CallActor(settings.replace(openai_base_url=peer.base_url), call_id, executor.inbox, KEY)


async def test_a_bad_accept_header_is_retried_then_exhausted(tmp_path, nursery_peer, autojump_clock):
    peer = await nursery_peer("bad_accept")
    async with rig(tmp_path, reconnect_attempts=2, reconnect_base_s=0.01) as r:
        actor = _actor(r.settings, peer, "rtc_bad_accept", r.executor)
        with real_time_limit():
            assert await actor.run() == "reconnect_exhausted"
    assert peer.handshakes == 3


async def test_an_oversized_frame_counts_toward_the_reconnect_limit(tmp_path, nursery_peer, autojump_clock):
    peer = await nursery_peer("oversized")
    async with rig(tmp_path, reconnect_attempts=2, reconnect_base_s=0.01, call_max_duration_s=3600.0) as r:
        actor = _actor(r.settings, peer, "rtc_oversized", r.executor)
        with real_time_limit(30):
            assert await actor.run() == "reconnect_exhausted"
    assert peer.handshakes == 3          # not endless reconnects until the maximum duration


@pytest.mark.parametrize("status", [401, 403])
async def test_401_or_403_at_the_handshake_ends_the_call_at_once(tmp_path, nursery_peer, autojump_clock, status):
    peer = await nursery_peer(f"status:{status}")
    async with rig(tmp_path, reconnect_attempts=5) as r:
        actor = _actor(r.settings, peer, "rtc_denied", r.executor)
        with real_time_limit():
            assert await actor.run() == "unauthorized"
    assert peer.handshakes == 1


async def test_a_wrong_key_at_the_simulator_ends_the_call_at_once(tmp_path, autojump_clock):
    # the 401 is the websocket handshake's answer: the real one, over a socket
    async with rig(tmp_path, sideband=Sideband.LOOPBACK, reconnect_attempts=5) as r:
        r.sim.add_call("rtc_wrong_key")
        with real_time_limit():
            actor, _ = await r.run_call("rtc_wrong_key", api_key="sk-not-the-right-one")
    assert actor.end_reason == "unauthorized"
    assert [h["status"] for h in r.sim.handshakes] == [401]


HOLD = [{"user_turn": {"text": "hi"}}, {"sleep": 600.0}, {"close": 1000}]


@pytest.mark.parametrize("code,reason", [("insufficient_quota", "insufficient_quota"),
                                         ("invalid_api_key", "unauthorized")])
async def test_a_fatal_error_event_ends_the_call_at_once(tmp_path, autojump_clock, code, reason):
    async with rig(tmp_path, reconnect_attempts=5) as r:
        sc = r.sim.add_call("rtc_fatal", HOLD)
        actor = CallActor(r.settings, "rtc_fatal", r.executor.inbox, KEY, open_transport=r.memory_sideband("rtc_fatal"))
        with real_time_limit():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(actor.run)
                await sc.wait_until(lambda c: c.connection is not None)
                await r.sim.inject("rtc_fatal", {"type": "error", "event_id": "evt_srv", "error": {
                    "type": "invalid_request_error", "code": code, "message": "You exceeded your quota."}})
                await sc.wait_until(lambda c: c.connection is None)
        record = r.record("rtc_fatal")
    assert actor.end_reason == reason and sc.connections == 1
    assert record[-1]["reason"] == reason


async def test_peer_strings_are_truncated_and_floods_of_bad_frames_rate_limited(tmp_path, autojump_clock):
    buffer = io.StringIO()
    logs.configure("json", "debug", stream=buffer)
    try:
        async with rig(tmp_path) as r:
            sc = r.sim.add_call("rtc_noise", HOLD)
            actor = CallActor(r.settings, "rtc_noise", r.executor.inbox, KEY,
                              open_transport=r.memory_sideband("rtc_noise"))
            with real_time_limit(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(actor.run)
                    await sc.wait_until(lambda c: c.connection is not None)
                    long_type = "x" * 100_000
                    await r.sim.inject("rtc_noise", {"type": long_type})
                    await r.sim.inject("rtc_noise", {"type": "error", "event_id": "e" * 50_000, "error": {
                        "type": "t" * 50_000, "code": "c" * 50_000, "message": "m", "event_id": "v" * 50_000}})
                    await r.sim.inject("rtc_noise", {          # a tool call with a 100 000-character name
                        "type": "response.output_item.done", "event_id": "evt_n", "response_id": "resp_noise",
                        "output_index": 0, "item": {"type": "function_call", "call_id": "call_noise",
                                                    "name": "n" * 100_000, "arguments": "{}",
                                                    "status": "completed"}})
                    with trio.fail_after(30):
                        await sc.wait_until(lambda c: "call_noise" in c.outputs)
                    for i in range(500):
                        await r.sim.inject("rtc_noise", {"type": f"response.unknown_{i}"})
                    await r.sim.inject("rtc_noise", {"type": "input_audio_buffer.speech_started",
                                                     "event_id": "evt_after", "audio_start_ms": 0,
                                                     "item_id": "item_after"})
                    with trio.fail_after(30):
                        while actor.epoch < 2:     # the call still reads events after the flood
                            await trio.sleep(0.01)
                    await r.sim.end_call("rtc_noise", 1000)
    finally:
        structlog.reset_defaults()
    lines = [json.loads(x) for x in buffer.getvalue().splitlines() if x.startswith("{")]
    assert max(len(x) for x in buffer.getvalue().splitlines()) < 2000     # nothing peer-sized in a line
    skipped = [x for x in lines if x.get("event") == "realtime.event_skipped"]
    errors = [x for x in lines if x.get("event") == "realtime.error"]
    assert 1 <= len(skipped) <= 40                                # not one line per frame
    suppressed = sum(x.get("suppressed") or 0 for x in lines) + sum(
        x.get("suppressed_logs") or 0 for x in lines if x.get("event") == "call.ended")
    # every injected bad frame and every error the simulator itself sent
    # (invalid_tool_call_id for the fake call) counted exactly once
    assert len(skipped) + len(errors) + suppressed == 502 + len(sc.error_codes)
    assert errors and len(errors[0]["code"]) <= 64 and len(errors[0]["event_id"]) <= 64
    assert all(len(x.get("type") or "") <= 64 for x in skipped)
    assert json.loads(sc.outputs["call_noise"][0]) == {"error": "unknown tool"}   # answered once, still
