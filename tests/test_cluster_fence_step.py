"""A leased call's sideband write in its own step.

The call's fence comes from a real ``RedisRegistry`` on a real redis-server:
while its lease is good, each frame goes to the socket as one process's does
(``ws_frames.start_send``: one non-blocking ``os.write`` in the step that
read the fence, no awaited ``send_all``); once another token holds the call
and the holder's renewal has closed its fence, nothing more leaves through
that path or any other, and the call ends ``shutdown``.

Observed at the socket, as tests/test_output_first.py does: ``os.write`` and
trio's ``SocketStream.send_all`` (the library's) wrapped to count the writes
on the call's sideband. Real time (Redis's TTLs are), so the scenario's
sleeps are real and short.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

from calls_support import Sideband, assert_clean_protocol, rig, sideband_stream, steady
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import RedisRegistry

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

TTL_S = 10.0      # long: no renewal is due while the call runs (none is asked for: no actor's stop is kept)


class SidebandWrites:
    """The text frames written on one actor's sideband socket, by path:
    ``in_step`` (``os.write`` on its descriptor) and ``awaited``
    (``send_all`` on its stream). A close frame (trio-websocket's own write
    at the end) is not counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.actor: Any = None
        self.in_step = 0
        self.awaited = 0
        write, send_all = os.write, trio.SocketStream.send_all
        watch = self

        def counting_write(fd: int, data: Any) -> int:
            stream = watch._stream()
            if stream is not None and fd == stream.socket.fileno() and _is_text(data):
                watch.in_step += 1
            return write(fd, data)

        async def counting_send_all(self: trio.SocketStream, data: Any) -> None:
            if self is watch._stream() and _is_text(data):
                watch.awaited += 1
            await send_all(self, data)

        monkeypatch.setattr(os, "write", counting_write)
        monkeypatch.setattr(trio.SocketStream, "send_all", counting_send_all)

    def _stream(self) -> Any:
        return sideband_stream(self.actor) if self.actor is not None else None


def _is_text(data: Any) -> bool:
    return len(data) > 0 and data[0] & 0x0F == 0x1     # a frame's opcode: 1 is text, 8 close


async def _held_fence(registry: RedisRegistry, call_id: str) -> Any:
    lease = await registry.acquire(call_id)
    assert lease is not None
    fence = registry.fence_of(call_id)
    assert fence is not None and fence.allows()
    return lease, fence


async def test_a_held_lease_writes_each_frame_in_its_step(tmp_path: Any, redis_server: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = steady([
        {"user_turn": {"text": "brief me"}},
        {"response": {"tool_calls": [{"name": "briefing.get", "call_id": "call_1", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here it is."}},
        {"sleep": 0.2},
        {"close": 1000},
    ])
    writes = SidebandWrites(monkeypatch)
    holder = RedisRegistry(redis_server.url, TTL_S, node="holder")
    async with trio.open_nursery() as nursery:
        await nursery.start(holder.run)
        _, fence = await _held_fence(holder, "rtc_held")
        async with rig(tmp_path, sideband=Sideband.LOOPBACK) as r:
            r.sim.add_call("rtc_held", scenario)
            actor = writes.actor = r.actor("rtc_held", fence=fence)
            await actor.run()
            sc = r.sim.calls["rtc_held"]
        nursery.cancel_scope.cancel()
    assert actor.end_reason == "closed_by_service"
    assert_clean_protocol(sc, creates=1)
    # every event we sent (the output, its response.create) went in its step; none through send_all
    assert len(sc.received) >= 2 and writes.in_step == len(sc.received)
    assert writes.awaited == 0


async def test_a_lost_lease_sends_nothing_more(tmp_path: Any, redis_server: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = steady([
        {"user_turn": {"text": "brief me"}},
        {"response": {"tool_calls": [{"name": "briefing.get", "call_id": "call_1", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"sleep": 2.0},                               # the lease is lost meanwhile (below)
        {"user_turn": {"text": "and again"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "call_id": "call_2", "arguments": {}}]}},
        {"wait_outputs": {"timeout_s": 30}},
        {"sleep": 3600},
    ])
    writes = SidebandWrites(monkeypatch)
    holder = RedisRegistry(redis_server.url, TTL_S, node="holder")
    other = RedisRegistry(redis_server.url, TTL_S, node="other")
    async with trio.open_nursery() as nursery:
        await nursery.start(holder.run)
        await nursery.start(other.run)
        lease, fence = await _held_fence(holder, "rtc_lost")
        async with rig(tmp_path, sideband=Sideband.LOOPBACK) as r:
            sc = r.sim.add_call("rtc_lost", scenario)
            actor = writes.actor = r.actor("rtc_lost", fence=fence)

            async def lose_the_lease() -> None:
                await sc.wait_until(lambda c: "call_1" in c.outputs and c.response_creates == 1)
                in_step_while_held = writes.in_step
                # another process takes the call (its key gone, as at expiry); the holder learns it at its renewal
                async with rc.client(redis_server.url) as redis:
                    await redis.delete([rc.lease_key("rtc_lost")])
                assert await other.acquire("rtc_lost") is not None
                assert await holder.renew(lease) is None
                assert not fence.allows()
                held["in_step"] = in_step_while_held

            held: dict[str, int] = {}
            async with trio.open_nursery() as calls:
                calls.start_soon(lose_the_lease)
                with trio.fail_after(30):
                    await actor.run()
        nursery.cancel_scope.cancel()
    assert actor.end_reason == "shutdown"
    assert held["in_step"] == 2                       # the first round's output and response.create, in step
    assert "call_2" in sc.tool_calls and "call_2" not in sc.outputs   # its answer never went out
    assert writes.in_step == 2 and writes.awaited == 0                # nothing after the loss, by either path
    assert sc.response_creates == 1 and len(sc.received) == 2
