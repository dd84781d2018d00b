"""The simulator survives any client (issue 11, item 14): a client that
disconnects while its handshake is being rejected must not take the
simulator down; the next call still works."""

from __future__ import annotations

import socket
import struct

import json

import pytest
import trio

from voiceactors.realtime import events
from voiceactors.realtime.sideband import CallGone, open_sideband
from voiceactors.simulator import Simulator, conformance

KEY = "sk-test"


@pytest.fixture(autouse=True)
def _conformance(monkeypatch):
    """Every simulator of this file holds its events to the SDK's types exactly
    (docs/simulator.md § Conformance; the suite's fixture fails a test that meets one that does not)."""
    monkeypatch.setenv(conformance.ENV_FLAG, "1")


def _upgrade(call_id: str, port: int) -> bytes:
    return (f"GET /v1/realtime?call_id={call_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer {KEY}\r\n\r\n").encode()


async def _send_and_reset(port: int, call_id: str) -> None:
    """Send an upgrade the simulator rejects (unknown call), then reset the
    connection at once (SO_LINGER 0: RST, no FIN) without reading the answer."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    await sock.connect(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await sock.send(_upgrade(call_id, port))
    sock.close()


async def test_client_resetting_during_a_rejected_handshake_does_not_kill_the_simulator():
    sim = Simulator(api_key=KEY)
    sim.add_call("rtc_ok")
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        for i in range(30):
            await _send_and_reset(sim.port, f"rtc_unknown_{i}")
        with trio.fail_after(5):
            while len(sim.handshakes) < 30:
                await trio.sleep(0.01)
            await trio.sleep(0.2)  # let every rejection run into the reset
        with trio.fail_after(10):
            with pytest.raises(CallGone):  # a normal rejection still answers
                async with open_sideband(sim.base_url, KEY, "rtc_unknown_again"):
                    pass
            async with open_sideband(sim.base_url, KEY, "rtc_ok") as ws:
                await ws.send_message(json.dumps(events.session_update({"instructions": "hi"})))
                raw = await ws.get_message()
        assert json.loads(raw)["type"] == "session.updated"
        assert sim.calls["rtc_ok"].connections == 1
        assert all(h["status"] == 404 for h in sim.handshakes if h["call_id"].startswith("rtc_unknown"))
        nursery.cancel_scope.cancel()
