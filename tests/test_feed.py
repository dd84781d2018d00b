"""The client feed and the polling queues (no sockets needed)."""

from __future__ import annotations

import trio

from voiceactors.call.feed import SUBSCRIBER_BUFFER, FeedHub, RetainedQueue, split_client_event


async def test_retained_queue_expires_after_retention(autojump_clock):
    q = RetainedQueue(retention_s=60.0, max_items=8)
    q.put({"n": 1})
    await trio.sleep(30)
    q.put({"n": 2})
    await trio.sleep(31)
    assert q.take() == [{"n": 2}]
    assert q.take() == []


async def test_retained_queue_keeps_the_newest_eight(autojump_clock):
    q = RetainedQueue(retention_s=60.0, max_items=8)
    for n in range(11):
        q.put({"n": n})
    assert [i["n"] for i in q.take()] == list(range(3, 11))
    assert q.dropped == 3


async def test_slow_subscriber_loses_events_without_blocking(autojump_clock):
    hub = FeedHub()
    feed = hub.open("rtc_1")
    slow = feed.subscribe()
    fast = feed.subscribe()
    got = []
    for n in range(SUBSCRIBER_BUFFER + 10):
        feed.transcript(role="user", text=f"t{n}")   # never awaits
        got.append(fast.receive_nowait())
    assert len(got) == SUBSCRIBER_BUFFER + 10
    assert feed.dropped == 10
    assert slow.receive_nowait()["text"] == "t0"


async def test_closed_subscriber_is_forgotten_and_feed_close_ends_subscribers(autojump_clock):
    hub = FeedHub()
    feed = hub.open("rtc_1")
    gone = feed.subscribe()
    live = feed.subscribe()
    gone.close()
    feed.tool_started(tool="calendar.today", tool_call_id="c1", epoch=0)
    assert feed.subscribers == 1
    hub.close(feed, "closed_by_service")
    events = [e async for e in live]
    assert [e["type"] for e in events] == ["tool.started", "call.ended"]
    assert events[1]["reason"] == "closed_by_service"
    late = feed.subscribe()
    assert [e async for e in late] == []
    assert hub.subscribe("rtc_1") is None


async def test_tool_done_types_and_fields(autojump_clock):
    hub = FeedHub()
    feed = hub.open("rtc_1")
    sub = feed.subscribe()
    feed.tool_done(tool="journal.search", tool_call_id="c1", epoch=2, outcome="ok", duration_ms=12.34)
    feed.tool_done(tool="journal.search", tool_call_id="c2", epoch=2, outcome="timeout", duration_ms=10000)
    a, b = sub.receive_nowait(), sub.receive_nowait()
    assert a == {"call_id": "rtc_1", "type": "tool.finished", "tool": "journal.search", "tool_call_id": "c1",
                 "epoch": 2, "outcome": "ok", "duration_ms": 12.3}
    assert b["type"] == "tool.failed" and b["outcome"] == "timeout"


async def test_client_events_route_to_queues(autojump_clock):
    hub = FeedHub(retention_s=60.0, max_items=8)
    f1, f2 = hub.open("rtc_1"), hub.open("rtc_2")
    f1.client_events([{"type": "nav_hint", "target": "today"},
                      {"type": "observer_action", "action": {"type": "start_observer", "mode": "meeting"}},
                      {"type": "something_else"}], tool="t", tool_call_id="c1")
    f2.client_events([{"type": "nav_hint", "target": "entity/maya"}], tool="entities.get", tool_call_id="c2")
    assert hub.take_nav_hints("rtc_1") == [{"target": "today", "tool": "t", "call_id": "rtc_1"}]
    assert [h["target"] for h in hub.take_nav_hints("rtc_2")] == ["entity/maya"]
    assert hub.take_nav_hints("rtc_unknown") == []
    assert hub.take_observer_actions() == [
        {"call_id": "rtc_1", "tool": "t", "action": {"type": "start_observer", "mode": "meeting"}}]
    assert hub.take_observer_actions() == []


async def test_nav_hints_outlive_the_call_for_the_retention(autojump_clock):
    hub = FeedHub(retention_s=60.0, max_items=8)
    feed = hub.open("rtc_1")
    feed.client_events([{"type": "nav_hint", "target": "today"}], tool="t", tool_call_id="c1")
    hub.close(feed, "closed_by_service")
    await trio.sleep(10)
    assert [h["target"] for h in hub.take_nav_hints("rtc_1")] == ["today"]
    feed2 = hub.open("rtc_2")
    feed2.client_events([{"type": "nav_hint", "target": "x"}], tool="t", tool_call_id="c2")
    hub.close(feed2, "idle_timeout")
    await trio.sleep(61)
    hub.open("rtc_3")
    hub.close(hub.live("rtc_3"), "x")     # sweeps feeds ended more than 60 s ago
    assert hub.take_nav_hints("rtc_2") == []
    assert "rtc_2" not in hub._ended


def test_split_client_event():
    assert split_client_event({"type": "nav_hint", "target": "today"}) == ("nav", "today")
    assert split_client_event({"type": "observer_action", "action": {"type": "x"}}) == ("observer", {"type": "x"})
    assert split_client_event({"type": "nav_hint"}) is None
    assert split_client_event({"_nav_target": "today"}) is None


async def test_subscribers_are_capped_per_call_and_in_all_and_gone_ones_free_their_slot():
    from voiceactors.call.feed import TOO_MANY, TOO_MANY_FOR_CALL

    hub = FeedHub(max_per_call=2, max_total=3)
    hub.open("rtc_a")
    hub.open("rtc_b")
    a1, a2 = hub.subscribe("rtc_a"), hub.subscribe("rtc_a")
    assert hub.subscribe("rtc_a") == TOO_MANY_FOR_CALL
    b1 = hub.subscribe("rtc_b")
    assert hub.subscribe("rtc_b") == TOO_MANY
    assert hub.subscribe("rtc_none") is None
    a1.close()                                   # a stream went away
    a3 = hub.subscribe("rtc_a")
    assert not isinstance(a3, str) and a3 is not None
    for channel in (a2, a3, b1):
        channel.close()


async def test_a_subscriber_that_comes_after_the_first_response_hears_who_is_in_charge(autojump_clock):
    """Found by the console's browser test under load: the agent in charge
    is published once, at the call's first response, and a console whose
    stream opened after it never showed the agent (until a handoff)."""
    hub = FeedHub()
    feed = hub.open("rtc_1")
    early = feed.subscribe()
    assert early.statistics().current_buffer_used == 0          # nobody in charge yet: nothing to hear
    feed.agent(agent="assistant", previous=None, status="start")
    feed.agent(agent="planner", previous="assistant", status="updating")
    late = feed.subscribe()
    feed.transcript(role="user", text="hello")
    assert [(e["type"], e.get("agent")) for e in (late.receive_nowait(), late.receive_nowait())] == [
        ("agent", "planner"), ("transcript", None)]
    assert late.statistics().current_buffer_used == 0
    assert [e["agent"] for e in (early.receive_nowait(), early.receive_nowait())] == ["assistant", "planner"]
