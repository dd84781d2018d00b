"""A feed no one listens to: the call actor builds none of its events
(``CallFeed.listened``), and loses nothing anyone can read: a subscriber
that joins gets every event from then on, and a tool's nav hint is queued
for polling with or without one."""

from __future__ import annotations

from typing import Any

import trio

from calls_support import assert_clean_protocol, rig, steady
from voiceactors.call.feed import FeedHub

SCENARIO = steady([
    {"user_turn": {"text": "what happened that day"}},
    {"response": {"tool_calls": [{"name": "journal.get_day", "arguments": {"day": "2026-03-26"}}]}},
    {"wait_outputs": {}},
    {"response": {"text": "Here it is."}},
    {"close": 1000},
])


async def test_a_feed_is_listened_to_while_it_has_a_subscriber():
    hub = FeedHub()
    feed = hub.open("rtc_1")
    assert not feed.listened()
    receive = feed.subscribe()
    assert feed.listened()
    feed.transcript(role="user", text="hi")
    assert receive.receive_nowait()["type"] == "transcript"
    receive.close()
    feed.transcript(role="user", text="again")     # the gone subscriber is noticed here
    assert not feed.listened()


async def test_an_unlistened_call_still_queues_its_nav_hints_and_a_subscriber_gets_every_event(
        tmp_path: Any, autojump_clock: Any) -> None:
    async with rig(tmp_path) as r:
        await r.run_call("rtc_alone", SCENARIO)
        hints = r.hub.take_nav_hints("rtc_alone")
        assert [h["target"] for h in hints] == ["today/journal/2026-03-26"]

        feed = r.hub.open("rtc_heard")
        receive = feed.subscribe()
        actor, sc = await r.run_call("rtc_heard", SCENARIO, feed=feed)
        assert_clean_protocol(sc, creates=1)
        types = []
        while True:
            try:
                types.append(receive.receive_nowait()["type"])
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        assert {"tool.started", "tool.finished", "nav.hint", "transcript", "usage"} <= set(types)
        assert [h["target"] for h in r.hub.take_nav_hints("rtc_heard")] == ["today/journal/2026-03-26"]
