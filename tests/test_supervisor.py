"""CallSupervisor: registry, capacity, parallel calls, feed and polling queues,
with real CallActors against the simulator."""

from __future__ import annotations

import time

import trio

from calls_support import KEY, assert_clean_protocol, real_time_limit, rig, steady
from voiceactors.messages import Connect, CountCalls, Subscribe, TakeNavHints, TakeObserverActions, ask
from voiceactors.call.supervisor import CallSupervisor


async def _start(r, **kw) -> CallSupervisor:
    sup = CallSupervisor(r.settings, r.executor.inbox, KEY, **kw)
    await r.nursery.start(sup.run)
    return sup


async def _count(sup) -> int:
    return await ask(sup.inbox, lambda reply: CountCalls(reply), timeout=5)


async def _wait_count(sup, n: int) -> None:
    # Poll with a pause in REAL time: under autojump_clock a trio.sleep here
    # returns at once, and the busy poll starved the tools' worker threads.
    with real_time_limit():
        while await _count(sup) != n:
            await trio.to_thread.run_sync(time.sleep, 0.02)


HOLD = [{"user_turn": {"text": "hi"}}, {"sleep": 30.0}, {"close": 1000}]


async def test_connect_twice_is_one_actor(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        sup = await _start(r)
        sc = r.sim.add_call("rtc_1", HOLD)
        assert await ask(sup.inbox, lambda reply: Connect("rtc_1", reply), timeout=5) == "connected"
        assert await ask(sup.inbox, lambda reply: Connect("rtc_1", reply), timeout=5) == "connected"
        assert await _count(sup) == 1
        with real_time_limit():
            await sc.wait_until(lambda c: c.closed)
        await _wait_count(sup, 0)
        assert sc.connections == 1 and [h["status"] for h in r.sim.handshakes] == [101]


async def test_capacity(tmp_path, autojump_clock):
    async with rig(tmp_path, max_calls=2) as r:
        sup = await _start(r)
        for call_id in ("rtc_a", "rtc_b", "rtc_c"):
            r.sim.add_call(call_id, HOLD)
        replies = [await ask(sup.inbox, lambda reply, c=c: Connect(c, reply), timeout=5)
                   for c in ("rtc_a", "rtc_b", "rtc_c")]
        assert replies == ["connected", "connected", "at_capacity"]
        assert await _count(sup) == 2
        await _wait_count(sup, 0)
        # capacity frees up when calls end
        assert await ask(sup.inbox, lambda reply: Connect("rtc_c", reply), timeout=5) == "connected"


async def test_ended_call_leaves_registry_and_a_new_connect_meets_call_gone(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        sup = await _start(r)
        r.sim.add_call("rtc_end", steady("clean_close"))
        await ask(sup.inbox, lambda reply: Connect("rtc_end", reply), timeout=5)
        await _wait_count(sup, 0)
        assert await ask(sup.inbox, lambda reply: Connect("rtc_end", reply), timeout=5) == "connected"
        await _wait_count(sup, 0)
        assert [reason for _, reason in sup.ended] == ["closed_by_service", "call_gone"]


async def test_parallel_calls_each_get_their_own_outputs(tmp_path, autojump_clock):
    """Several calls at once, each a parallel batch: no output crosses calls,
    one response.create per call."""
    ids = [f"rtc_p{i}" for i in range(6)]
    async with rig(tmp_path) as r:
        sup = await _start(r)
        calls = [r.sim.add_call(i, steady("parallel_tools")) for i in ids]
        for call_id in ids:
            assert await ask(sup.inbox, lambda reply, c=call_id: Connect(c, reply), timeout=5) == "connected"
        assert await _count(sup) == 6
        await _wait_count(sup, 0)
    for sc in calls:
        assert_clean_protocol(sc, creates=1)
        assert len(sc.tool_calls) == 3


async def test_feed_and_polling_queues(tmp_path, autojump_clock):
    scenario = steady([
        {"user_turn": {"text": "brief me and start listening"}},
        {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}},
                                     {"name": "observer.start_listening", "arguments": {"mode": "meeting"}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here is your day."}},
        {"sleep": 1.0},
        {"close": 1000},
    ])
    async with rig(tmp_path) as r:
        sup = await _start(r)
        sc = r.sim.add_call("rtc_feed", scenario)
        assert await ask(sup.inbox, lambda reply: Subscribe("rtc_feed", reply), timeout=5) is None  # not live
        await ask(sup.inbox, lambda reply: Connect("rtc_feed", reply), timeout=5)
        feed = await ask(sup.inbox, lambda reply: Subscribe("rtc_feed", reply), timeout=5)
        events = []
        with real_time_limit():
            async for event in feed:
                events.append(event)
        hints = await ask(sup.inbox, lambda reply: TakeNavHints("rtc_feed", reply), timeout=5)
        again = await ask(sup.inbox, lambda reply: TakeNavHints("rtc_feed", reply), timeout=5)
        actions = await ask(sup.inbox, lambda reply: TakeObserverActions(reply), timeout=5)
    types = [e["type"] for e in events]
    assert types.count("tool.started") == 2 and types.count("tool.finished") == 2
    assert types[-1] == "call.ended" and events[-1]["reason"] == "closed_by_service"
    assert {e["role"] for e in events if e["type"] == "transcript"} == {"user", "assistant"}
    assert {"text": "brief me and start listening"}.items() <= next(
        e for e in events if e["type"] == "transcript" and e["role"] == "user").items()
    assert [e["target"] for e in events if e["type"] == "nav.hint"] == ["today"]
    assert [e["action"]["type"] for e in events if e["type"] == "observer.action"] == ["start_observer"]
    for e in events:
        assert e["call_id"] == "rtc_feed"
        assert "arguments" not in e and "output" not in e   # never argument values or outputs
    assert [h["target"] for h in hints] == ["today"] and again == []
    assert [a["action"] for a in actions] == [{"type": "start_observer", "mode": "meeting"}]
    assert_clean_protocol(sc, creates=1)


async def test_cancelling_the_supervisor_closes_every_call(tmp_path, autojump_clock):
    async with rig(tmp_path, close_deadline_s=2.0) as r:
        sup = CallSupervisor(r.settings, r.executor.inbox, KEY)
        ids = ["rtc_s1", "rtc_s2", "rtc_s3"]
        calls = [r.sim.add_call(i, [{"sleep": 3600}]) for i in ids]
        with real_time_limit():
            async with trio.open_nursery() as n:
                await n.start(sup.run)
                for call_id in ids:
                    await ask(sup.inbox, lambda reply, c=call_id: Connect(c, reply), timeout=5)
                for sc in calls:
                    await sc.wait_until(lambda c: c.connections == 1)
                n.cancel_scope.cancel()
            for sc in calls:
                await sc.wait_until(lambda c: c.connection is None)
        assert sup.calls == {}
        for call_id in ids:
            assert r.record(call_id)[-1]["reason"] == "shutdown"
        assert r.sim.hangups == []
