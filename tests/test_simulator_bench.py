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
