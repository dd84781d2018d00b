"""``/connect`` answered in the route's own step (``CallSupervisor.connect_now``).

The route asked the supervisor's inbox for every connect (a reply channel,
two scheduler turns); the supervisor's ``_connect`` never awaits, so the
route now runs it in its own step, as the supervisor's task would for a
``Connect``. Pinned here: a connect works with the supervisor's inbox
closed to the route; the call's task is started in the supervisor's
context, not the request's (its log lines carry no ``request_id``); it
answers as the inbox does (connected, found live, at capacity) and only
while the supervisor serves. Real app, actors and simulator on loopback.
"""

from __future__ import annotations

import json
import math
from typing import Any

import trio

from test_context_calls import SIM_KEY, app_for, sim  # noqa: F401 - the simulator fixture
from calls_support import DAY
from clock_support import serving
from voiceactors.messages import ConnectOutcome, CountCalls
from voiceactors.call.supervisor import CallSupervisor
from voiceactors.settings import Settings


async def test_a_connect_needs_no_ask_of_the_supervisor(make_sample, tmp_path, sim, pin_today, log_stream):  # noqa: F811
    from voiceactors.http.app import voice_state

    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=3), tmp_path, sim)
    async with serving(app) as test_app:
        client = test_app.test_client()
        runtime = voice_state(app).runtime
        closed, _unused = trio.open_memory_channel[Any](0)
        closed.close()
        runtime.calls = closed      # an ask to the supervisor now fails at once (500)
        call = sim.add_call("rtc_connect_now", [{"sleep": 0.5}, {"close": 1000}])
        response = await client.post("/api/voice/connect", json={"call_id": "rtc_connect_now"},
                                     headers={"X-Request-Id": "req-connect-now"})
        assert response.status_code == 200 and (await response.get_json())["status"] == "connected"
        with trio.fail_after(10):
            await call.wait_until(lambda c: c.closed and c.connection is None)
        supervisor = runtime.actors["calls"]
        with trio.fail_after(10):
            while "rtc_connect_now" in supervisor.calls:
                await trio.sleep(0.01)
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.strip()]
    (request,) = [line for line in lines if line["event"] == "http.request" and line["path"] == "/api/voice/connect"]
    assert request["request_id"] == "req-connect-now" and request["status"] == 200
    call_lines = [line for line in lines if line.get("call_id") == "rtc_connect_now" and line.get("actor") == "call"]
    assert {"call.connected", "call.ended"} <= {line["event"] for line in call_lines}
    assert all("request_id" not in line for line in call_lines)


async def test_connect_now_answers_as_the_inbox_does_while_the_supervisor_serves(tmp_path):
    settings = Settings(journal=tmp_path / "journal", state_dir=tmp_path / "state", openai_base_url="http://127.0.0.1:9",
                        rejoin_max_calls=0, reconnect_attempts=0, call_idle_timeout_s=math.inf, max_calls=1)
    executor_inbox, _executor_receive = trio.open_memory_channel[Any](10)
    supervisor = CallSupervisor(settings, executor_inbox, api_key="sk-test", hangup=False)
    assert supervisor.connect_now("rtc_early") is None            # not serving yet: the route asks
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert supervisor.connect_now("rtc_a") == ConnectOutcome.CONNECTED
        assert supervisor.connect_now("rtc_a") == ConnectOutcome.CONNECTED      # found live, not started twice
        assert supervisor.connect_now("rtc_b") == ConnectOutcome.AT_CAPACITY    # max_calls=1
        assert list(supervisor.calls) == ["rtc_a"]
        reply, answer = trio.open_memory_channel[int](1)
        await supervisor.inbox.send(CountCalls(reply))
        assert await answer.receive() == 1                          # the inbox sees the same table
        nursery.cancel_scope.cancel()
    assert supervisor.connect_now("rtc_late") is None             # stopped: the route asks (and fails)
