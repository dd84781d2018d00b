"""The shared feed on a real ``redis-server`` (issue 18, the feed across
processes), in one process: a ``FeedHub`` with the ``SharedFeed`` as its
sink, and readers of the stream as another process would read it.

* the stream holds the feed's own events with the ids the holder's memory
  subscribers saw, in order; a read after an id resumes without loss or
  duplicate;
* a holder with a lower fence (taken over) cannot append; the new one can;
* nav hints and observer actions go to the shared queues and are taken once;
* ``call.ended`` gives the stream its short expiry;
* Redis down: the writer keeps the events and writes them when it is back;
* remote streams are capped as the holder's are.
"""

from __future__ import annotations

import json

import pytest
import trio

from redis_support import RedisServer, needs_redis, redis_server  # noqa: F401  (the fixture)
from voiceactors.call.feed import FeedHub
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.shared_feed import SharedFeed, StreamRefusal

pytestmark = needs_redis

CALL = "rtc_shared"


def _shared(redis: RedisServer) -> SharedFeed:
    return SharedFeed(redis.url, max_len=100, retention_s=30.0, max_items=8, max_duration_s=3600.0,
                      max_per_call=2, max_total=3)


def _hub(shared: SharedFeed) -> FeedHub:
    hub = FeedHub()
    hub.sink = shared
    return hub


async def _read_all(shared: SharedFeed, call_id: str, after: str, count: int) -> list[dict]:
    """What a reader on another process gets after ``after``, once the
    holder's writer has written ``count`` events."""
    got: list[dict] = []
    with trio.fail_after(10):
        while len(got) < count:
            batch = await shared.read(call_id, got[-1]["id"] if got else after, 0.5)
            got.extend(batch)
    return got


async def test_the_stream_has_the_feeds_events_with_the_ids_its_memory_subscribers_saw(redis_server):
    shared = _shared(redis_server)
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        hub = _hub(shared)
        feed = hub.open(CALL, epoch=41)
        sub = feed.subscribe()
        feed.transcript(role="user", text="what is on today", item_id="i1")
        feed.tool_started(tool="calendar.today", tool_call_id="c1", epoch=0)
        feed.client_events([{"type": "nav_hint", "target": "today"}], tool="calendar.today", tool_call_id="c1")
        feed.tool_done(tool="calendar.today", tool_call_id="c1", epoch=0, outcome="ok", duration_ms=3.0)
        in_memory = [sub.receive_nowait() for _ in range(4)]
        assert [e["id"] for e in in_memory] == ["41-1", "41-2", "41-3", "41-4"]
        assert [e["type"] for e in in_memory] == ["transcript", "tool.started", "nav.hint", "tool.finished"]

        assert await _read_all(shared, CALL, "0-0", 4) == in_memory
        assert await _read_all(shared, CALL, "41-2", 2) == in_memory[2:]      # a resume: no loss, no duplicate
        assert await shared.read(CALL, "41-4", 0.05) == []
        assert await shared.last_id(CALL) == "41-4"
        nursery.cancel_scope.cancel()


async def test_a_holder_with_a_lower_fence_cannot_append_and_the_new_holder_continues(redis_server):
    shared = _shared(redis_server)
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        old, new = _hub(shared), _hub(shared)
        old_feed = old.open(CALL, epoch=10)
        old_feed.transcript(role="user", text="one")
        await _read_all(shared, CALL, "0-0", 1)
        new_feed = new.open(CALL, epoch=12)           # a takeover: a later lease, a higher fence
        new_feed.transcript(role="assistant", text="two")
        await _read_all(shared, CALL, "10-1", 1)
        old_feed.transcript(role="user", text="a paused holder wakes up")   # 10-2: below 12-1, refused
        new_feed.transcript(role="assistant", text="three")
        got = await _read_all(shared, CALL, "0-0", 3)
        assert [(e["id"], e["text"]) for e in got] == [("10-1", "one"), ("12-1", "two"), ("12-2", "three")]
        nursery.cancel_scope.cancel()


async def test_nav_hints_and_observer_actions_go_to_the_shared_queues_and_are_taken_once(redis_server):
    shared = _shared(redis_server)
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        hub = _hub(shared)
        feed = hub.open(CALL, epoch=3)
        feed.client_events([{"type": "nav_hint", "target": "today"},
                            {"type": "observer_action", "action": {"type": "start_observer", "mode": "meeting"}}],
                           tool="observer.start_listening", tool_call_id="c9")
        await _read_all(shared, CALL, "0-0", 2)
        assert hub.take_nav_hints(CALL) == [] and hub.take_observer_actions() == []   # not kept locally as well
        readers = [_shared(redis_server), _shared(redis_server)]     # two other processes, at once
        for reader in readers:
            await nursery.start(reader.run)
        hints: list[list[dict]] = []
        actions: list[list[dict]] = []

        async def take(reader: SharedFeed) -> None:
            hints.append(await reader.take_nav_hints(CALL))
            actions.append(await reader.take_observer_actions())

        async with trio.open_nursery() as racers:
            for reader in readers:
                racers.start_soon(take, reader)
        assert sorted(hints, key=len) == [[], [{"target": "today", "tool": "observer.start_listening",
                                                "call_id": CALL}]]
        assert sorted(actions, key=len) == [[], [{"call_id": CALL, "tool": "observer.start_listening",
                                                  "action": {"type": "start_observer", "mode": "meeting"}}]]
        nursery.cancel_scope.cancel()


async def test_call_ended_gives_the_stream_its_short_expiry(redis_server):
    shared = _shared(redis_server)
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        hub = _hub(shared)
        feed = hub.open(CALL, epoch=5)
        feed.transcript(role="user", text="bye")
        await _read_all(shared, CALL, "0-0", 1)
        async with rc.client(redis_server.url) as redis:
            assert (await redis.pttl(rc.feed_key(CALL))) > 3_000_000   # live: the call's longest life
            hub.close(feed, "hangup")
            ended = await _read_all(shared, CALL, "5-1", 1)
            assert ended[0]["type"] == "call.ended" and ended[0]["id"] == "5-2"
            assert 0 < await redis.pttl(rc.feed_key(CALL)) <= 30_000
        nursery.cancel_scope.cancel()


async def test_redis_down_the_writer_keeps_the_events_and_writes_them_when_it_is_back(redis_server):
    shared = _shared(redis_server)
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        hub = _hub(shared)
        feed = hub.open(CALL, epoch=8)
        sub = feed.subscribe()
        feed.transcript(role="user", text="before")
        await _read_all(shared, CALL, "0-0", 1)
        redis_server.stop()
        feed.transcript(role="user", text="while Redis is down")
        assert sub.receive_nowait()["text"] == "before"
        assert sub.receive_nowait()["text"] == "while Redis is down"      # the holder's own clients: unaffected
        await trio.sleep(0.5)                                              # the writer has failed at least once
        redis_server.start()                                               # without its data
        got = await _read_all(shared, CALL, "8-1", 1)
        assert [(e["id"], e["text"]) for e in got] == [("8-2", "while Redis is down")]
        assert shared.dropped == 0
        nursery.cancel_scope.cancel()


async def test_remote_streams_are_capped_per_call_and_in_all(redis_server):
    shared = _shared(redis_server)             # max_per_call=2, max_total=3
    for call_id in ("rtc_a", "rtc_a", "rtc_b"):
        shared.check_reader(call_id)
        shared.open_reader(call_id)
    with pytest.raises(StreamRefusal, match="^too many event streams for this call$"):
        shared.check_reader("rtc_a")
    with pytest.raises(StreamRefusal, match="^too many event streams$"):
        shared.check_reader("rtc_c")
    shared.close_reader("rtc_a")               # a closed stream frees its slot
    shared.check_reader("rtc_a")
    shared.check_reader("rtc_c")


async def test_many_blocked_remote_reads_do_not_hold_up_the_holders_writes(redis_server):
    """More blocked XREADs than coredis's default pool (64): the writer and
    the takes have a pool of their own, so the event still goes out at once."""
    shared = SharedFeed(redis_server.url, max_len=100, retention_s=30.0, max_items=8, max_duration_s=3600.0,
                        max_per_call=100, max_total=100)
    got: list[list[dict]] = []

    async def blocked_reader() -> None:
        got.append(await shared.read(CALL, "0-0", 8.0))

    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        for _ in range(70):
            nursery.start_soon(blocked_reader)
        await trio.sleep(0.5)                      # all of them blocked in XREAD
        feed = _hub(shared).open(CALL, epoch=2)
        feed.transcript(role="user", text="hello")
        with trio.fail_after(3):                    # well before their 8 s block ends
            while len(got) < 70:
                await trio.sleep(0.05)
        assert all([e["id"] for e in batch] == ["2-1"] for batch in got)
        assert await shared.take_nav_hints(CALL) == []
        nursery.cancel_scope.cancel()


async def test_an_append_redis_applied_already_is_not_applied_twice(redis_server):
    """A write whose answer was lost (cancelled, timed out) is retried: its
    id is in the stream already, so neither the event nor its nav hint lands
    twice."""
    shared = _shared(redis_server)
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        feed = _hub(shared).open(CALL, epoch=4)
        hint = {"target": "today", "tool": "calendar.today", "call_id": CALL}
        event = {"call_id": CALL, "type": "nav.hint", "tool": "calendar.today", "tool_call_id": "c1",
                 "target": "today", "id": "4-1"}
        async with rc.client(redis_server.url) as redis:     # the first try, applied by Redis
            await redis.eval(rc.FEED_APPEND_MANY, keys=[rc.feed_key(CALL), rc.nav_hints_key(CALL)],
                             args=["100", "8", "30000", "4-1", json.dumps(event), "60000", json.dumps(hint)])
        feed.client_events([{"type": "nav_hint", "target": "today"}], tool="calendar.today", tool_call_id="c1")
        feed.transcript(role="user", text="after")
        got = await _read_all(shared, CALL, "0-0", 2)
        assert [(e["id"], e["type"]) for e in got] == [("4-1", "nav.hint"), ("4-2", "transcript")]
        assert await shared.take_nav_hints(CALL) == [hint]
        nursery.cancel_scope.cancel()


async def test_readers_that_leave_mid_read_do_not_use_up_the_blocking_pool(redis_server):
    """Each remote reader's blocked ``XREAD`` holds a connection of a pool of
    ``max_total + 1``; a reader cancelled mid-read (its SSE client left)
    makes coredis close that connection. Its slot comes back
    (``redis_client._SlotKeepingPool``): before, ``max_total + 1`` such
    cancels left every later read waiting for a connection for ever
    (``RegistryDown`` at its bound, also once Redis was fine)."""
    shared = _shared(redis_server)
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        hub = _hub(shared)
        feed = hub.open(CALL, epoch=7)
        for _ in range(2 * (shared.max_total + 1)):
            with trio.move_on_after(0.1) as scope:
                await shared.read(CALL, "0-0", 30.0)         # nothing yet: it blocks
            assert scope.cancelled_caught
        feed.transcript(role="user", text="still there?", item_id="i1")
        [event] = await _read_all(shared, CALL, "0-0", 1)
        assert event["id"] == "7-1" and event["type"] == "transcript"
        nursery.cancel_scope.cancel()
