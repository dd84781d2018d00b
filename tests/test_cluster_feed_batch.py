"""The shared feed's writer batches (issue 18: one script per pass for every
waiting event of every call), on a real ``redis-server``:

* many calls' events waiting at once land in one script (counted with Redis's
  own ``INFO commandstats``), in order per stream, each stream capped and
  given its TTL; the batch is bounded in entries and in bytes;
* one stale entry in a batch (its stream already past its id) is dropped and
  logged alone: the others, before and after it, are written, and its queue
  item is not pushed while the others' are;
* a batch Redis applied whose answer was lost (a loopback proxy between the
  writer and Redis swallows the answer) is retried and refused entry by
  entry: nothing lands twice, no queue item twice;
* Redis down then back: everything within ``WRITER_QUEUE`` is written, in
  order; past it exactly the excess is dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from redis_support import RedisServer, needs_redis, redis_server  # noqa: F401  (the fixture)
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.shared_feed import BATCH_BYTES, BATCH_ENTRIES, PASS_INTERVAL_S, WRITER_QUEUE, SharedFeed

pytestmark = needs_redis


def _shared(url: str, max_len: int = 1000) -> SharedFeed:
    return SharedFeed(url, max_len=max_len, retention_s=30.0, max_items=8, max_duration_s=3600.0,
                      max_per_call=2, max_total=3)


def _event(call_id: str, event_id: str, **fields: Any) -> dict[str, Any]:
    return {"call_id": call_id, "type": "transcript", "id": event_id, **fields}


async def _evals(redis: Any) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_eval", {}).get("calls", 0))


async def _stream(redis: Any, call_id: str) -> list[tuple[str, dict[str, Any]]]:
    entries = await redis.xrange(rc.feed_key(call_id), "-", "+")
    return [(str(e.identifier), json.loads(e.field_values["e"])) for e in entries]


async def _until_lengths(redis: Any, lengths: dict[str, int]) -> None:
    with trio.fail_after(15):
        while True:
            now = {call_id: int(await redis.xlen(rc.feed_key(call_id))) for call_id in lengths}
            if now == lengths:
                return
            await trio.sleep(0.02)


def _stale_logs(log_stream: Any) -> list[str]:
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.startswith("{")]
    return [f"{e['call_id']}/{e['event_id']}" for e in lines if e.get("event") == "shared_feed.stale_append"]


async def test_many_calls_events_waiting_at_once_land_in_one_script_in_order_per_stream(redis_server):
    shared = _shared(redis_server.url, max_len=1000)
    calls = [f"rtc_{n}" for n in range(40)]
    async with rc.client(redis_server.url) as redis, trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        before = await _evals(redis)
        for seq in range(1, 6):                     # a tool round's worth of events for 40 calls: 200
            for n, call_id in enumerate(calls):
                shared.append(call_id, _event(call_id, f"{n + 1}-{seq}", text=f"{call_id} says {seq}"), None)
        await _until_lengths(redis, {call_id: 5 for call_id in calls})
        assert await _evals(redis) - before == 1    # one round trip for all 200, not one per event
        for n, call_id in enumerate(calls):
            assert await _stream(redis, call_id) == [
                (f"{n + 1}-{seq}", _event(call_id, f"{n + 1}-{seq}", text=f"{call_id} says {seq}"))
                for seq in range(1, 6)]
            assert 3_000_000 < await redis.pttl(rc.feed_key(call_id)) <= 3_630_000   # live: the call's longest life

        before = await _evals(redis)                # past the bound in entries: 600 events, 3 scripts
        for seq in range(6, 21):
            for n, call_id in enumerate(calls):
                shared.append(call_id, _event(call_id, f"{n + 1}-{seq}"), None)
        await _until_lengths(redis, {call_id: 20 for call_id in calls})
        assert await _evals(redis) - before == -(-600 // BATCH_ENTRIES)
        assert [i for i, _ in await _stream(redis, "rtc_7")] == [f"8-{seq}" for seq in range(1, 21)]

        before = await _evals(redis)                # past the bound in bytes: each batch stays under it
        big = "x" * (BATCH_BYTES // 3)
        for seq in range(1, 7):
            shared.append("rtc_big", _event("rtc_big", f"1-{seq}", text=big), None)
        await _until_lengths(redis, {"rtc_big": 6})
        assert await _evals(redis) - before == 3    # two events per script
        assert [i for i, _ in await _stream(redis, "rtc_big")] == [f"1-{seq}" for seq in range(1, 7)]
        nursery.cancel_scope.cancel()


async def test_the_stream_cap_holds_for_a_batch_of_one_call(redis_server):
    shared = _shared(redis_server.url, max_len=10)
    async with rc.client(redis_server.url) as redis, trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        for seq in range(1, 201):
            shared.append("rtc_long", _event("rtc_long", f"3-{seq}"), None)
        with trio.fail_after(10):
            while await shared.last_id("rtc_long") != "3-200":
                await trio.sleep(0.02)
        kept = await redis.xlen(rc.feed_key("rtc_long"))
        assert 10 <= kept < 200        # MAXLEN ~: trimmed by whole nodes, never below the cap
        nursery.cancel_scope.cancel()


async def test_one_stale_entry_in_a_batch_is_dropped_alone_and_its_queue_item_with_it(redis_server, log_stream):
    shared = _shared(redis_server.url)
    async with rc.client(redis_server.url) as redis, trio.open_nursery() as nursery:
        await redis.xadd(rc.feed_key("rtc_a"), {"e": "{}"}, identifier="9-5")   # a taker's event, fence 9
        await nursery.start(shared.run)
        before = await _evals(redis)
        shared.append("rtc_b", _event("rtc_b", "1-1"), ("nav", {"target": "today", "call_id": "rtc_b"}))
        shared.append("rtc_a", _event("rtc_a", "9-3"), ("nav", {"target": "stale", "call_id": "rtc_a"}))
        shared.append("rtc_c", _event("rtc_c", "2-1"), ("observer", {"action": {"type": "start_observer"}}))
        shared.append("rtc_a", _event("rtc_a", "9-6", text="after the stale one"), None)
        shared.append("rtc_b", {"call_id": "rtc_b", "type": "call.ended", "id": "1-2"}, None)
        await _until_lengths(redis, {"rtc_a": 2, "rtc_b": 2, "rtc_c": 1})
        assert await _evals(redis) - before == 1
        assert [i for i, _ in await _stream(redis, "rtc_a")] == ["9-5", "9-6"]
        assert [e["type"] for _, e in await _stream(redis, "rtc_b")] == ["transcript", "call.ended"]
        assert [i for i, _ in await _stream(redis, "rtc_c")] == ["2-1"]
        assert _stale_logs(log_stream) == ["rtc_a/9-3"]
        # each written entry's queue item pushed with it, the stale one's not
        assert await shared.take_nav_hints("rtc_b") == [{"target": "today", "call_id": "rtc_b"}]
        assert await shared.take_nav_hints("rtc_a") == []
        assert await shared.take_observer_actions() == [{"action": {"type": "start_observer"}}]
        # each stream's TTL from its own last entry: the ended call's the retention
        assert 0 < await redis.pttl(rc.feed_key("rtc_b")) <= 30_000
        assert await redis.pttl(rc.feed_key("rtc_a")) > 3_000_000
        nursery.cancel_scope.cancel()


class AnswerSwallowingProxy:
    """A unix-socket relay between the writer and redis-server: requests go
    through; while ``swallow`` is set, an answer from Redis is thrown away
    and the connection closed (an applied request's answer lost with its
    connection, as a network failure loses it); while ``held`` is not set,
    answers wait in the relay (a slow way back), and go on when it is."""

    def __init__(self, folder: Path, upstream: Path) -> None:
        self.path = folder / "proxy.sock"
        self.upstream = upstream
        self.swallow = False
        self.swallowed = 0
        self.held = trio.Event()
        self.held.set()
        self.holding = 0          # answers waiting in the relay now

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(str(self.path))
        sock.listen()
        listener = trio.SocketListener(sock)
        task_status.started()
        await trio.serve_listeners(self._relay, [listener])

    async def _relay(self, client: trio.abc.Stream) -> None:
        upstream = await trio.open_unix_socket(str(self.upstream))
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, False, nursery.cancel_scope)
            nursery.start_soon(self._pump, upstream, client, True, nursery.cancel_scope)

    async def _pump(self, source: trio.abc.Stream, sink: trio.abc.Stream, answers: bool,
                    connection: trio.CancelScope) -> None:
        try:
            async for data in source:
                if answers and self.swallow:
                    self.swallowed += len(data)
                    break
                if answers and not self.held.is_set():
                    self.holding += 1
                    await self.held.wait()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        connection.cancel()      # either side gone: both closed


async def test_a_batch_redis_applied_whose_answer_was_lost_is_retried_and_adds_nothing_twice(
        redis_server, log_stream, tmp_path):
    proxy = AnswerSwallowingProxy(tmp_path, redis_server.socket)
    async with rc.client(redis_server.url) as redis, trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        shared = _shared(proxy.url)
        await nursery.start(shared.run)
        shared.append("rtc_x", _event("rtc_x", "5-1"), None)          # the writer's connection is up
        await _until_lengths(redis, {"rtc_x": 1})
        proxy.swallow = True
        shared.append("rtc_x", _event("rtc_x", "5-2"), ("nav", {"target": "today", "call_id": "rtc_x"}))
        shared.append("rtc_y", _event("rtc_y", "6-1"), ("observer", {"action": {"type": "stop_observer"}}))
        shared.append("rtc_x", _event("rtc_x", "5-3"), None)
        await _until_lengths(redis, {"rtc_x": 3, "rtc_y": 1})          # Redis applied the batch...
        with trio.fail_after(10):
            while not proxy.swallowed:
                await trio.sleep(0.01)
        proxy.swallow = False                                          # ...its answer never came back
        with trio.fail_after(15):                                      # the writer's timeout, then its retry
            while len(_stale_logs(log_stream)) < 3:
                await trio.sleep(0.05)
        shared.append("rtc_x", _event("rtc_x", "5-4"), None)
        await _until_lengths(redis, {"rtc_x": 4, "rtc_y": 1})
        assert [i for i, _ in await _stream(redis, "rtc_x")] == ["5-1", "5-2", "5-3", "5-4"]
        assert [i for i, _ in await _stream(redis, "rtc_y")] == ["6-1"]
        assert sorted(_stale_logs(log_stream)) == ["rtc_x/5-2", "rtc_x/5-3", "rtc_y/6-1"]   # each once
        assert await shared.take_nav_hints("rtc_x") == [{"target": "today", "call_id": "rtc_x"}]
        assert await shared.take_observer_actions() == [{"action": {"type": "stop_observer"}}]
        assert shared.dropped == 0
        nursery.cancel_scope.cancel()


async def test_redis_down_then_back_everything_within_the_writer_queue_lands_in_order(redis_server):
    shared = _shared(redis_server.url)
    calls = [f"rtc_{n}" for n in range(64)]
    extra = 10
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        redis_server.stop()
        shared.append(calls[0], _event(calls[0], "1-1"), None)
        await trio.sleep(0.5)                      # the writer has failed and is waiting to retry
        order = [(n, seq) for seq in range(1, 66) for n in range(64)][1:WRITER_QUEUE + extra]
        for n, seq in order:
            shared.append(calls[n], _event(calls[n], f"{n + 1}-{seq}"), None)
        assert shared.dropped == extra             # the bound counts the batch in flight too
        redis_server.start()                       # without its data
        async with rc.client(redis_server.url) as redis:
            with trio.fail_after(15):
                while sum([int(await redis.xlen(rc.feed_key(c))) for c in calls]) < WRITER_QUEUE:
                    await trio.sleep(0.05)
            landed = {c: [i for i, _ in await _stream(redis, c)] for c in calls}
        assert sum(map(len, landed.values())) == WRITER_QUEUE
        for n, call_id in enumerate(calls):        # per stream in order; only the oldest could be dropped
            ids = landed[call_id]
            assert ids == sorted(ids, key=lambda i: int(i.split("-")[1]))
        newest = order[extra:]
        assert all(f"{n + 1}-{seq}" in landed[calls[n]] for n, seq in newest)
        nursery.cancel_scope.cancel()


async def test_under_a_steady_stream_of_events_the_passes_are_spaced(redis_server):
    """Events one by one, a millisecond apart (calls publishing at a high
    rate): the writer does not follow each with its own request; its passes
    are at least ``PASS_INTERVAL_S`` apart, each carrying what waited."""
    shared = _shared(redis_server.url)
    calls = [f"rtc_{n}" for n in range(20)]
    async with rc.client(redis_server.url) as redis, trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        before = await _evals(redis)
        started = trio.current_time()
        for seq in range(1, 11):
            for n, call_id in enumerate(calls):
                shared.append(call_id, _event(call_id, f"{n + 1}-{seq}"), None)
                await trio.sleep(0.001)
        elapsed = trio.current_time() - started
        await _until_lengths(redis, {call_id: 10 for call_id in calls})
        passes = await _evals(redis) - before
        assert passes <= elapsed / PASS_INTERVAL_S + 2       # not one per event (200)
        for n, call_id in enumerate(calls):
            assert [i for i, _ in await _stream(redis, call_id)] == [f"{n + 1}-{seq}" for seq in range(1, 11)]
        nursery.cancel_scope.cancel()


async def test_a_stop_while_redis_is_down_logs_what_is_left_and_does_not_raise(redis_server, log_stream):
    """The stop's last flush failing (Redis gone, or the connection the
    cancelled batch broke) is logged with what was left unwritten; it does
    not fail the server's stop."""
    shared = _shared(redis_server.url)
    async with trio.open_nursery() as nursery:
        await nursery.start(shared.run)
        shared.append("rtc_s", _event("rtc_s", "1-1"), None)
        async with rc.client(redis_server.url) as redis:
            await _until_lengths(redis, {"rtc_s": 1})
        redis_server.stop()
        for seq in range(2, 5):
            shared.append("rtc_s", _event("rtc_s", f"1-{seq}"), None)
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.startswith("{")]
    left = [e for e in lines if e.get("event") == "shared_feed.unwritten_at_stop"]
    assert [e["events"] for e in left] == [3]


async def _set_after(event: trio.Event, delay_s: float) -> None:
    await trio.sleep(delay_s)
    event.set()


async def test_a_stop_cancelling_a_batch_redis_applied_writes_the_rest_and_nothing_twice(
        redis_server, log_stream, tmp_path):
    """The server stops while a batch's answer is on its way (Redis applied
    it): the stop's flush puts it back, writes it again, finds it applied
    (stale per entry) and writes what came after it."""
    proxy = AnswerSwallowingProxy(tmp_path, redis_server.socket)
    async with rc.client(redis_server.url) as redis:
        async with trio.open_nursery() as outer:
            await outer.start(proxy.serve)
            async with trio.open_nursery() as nursery:
                shared = _shared(proxy.url)
                await nursery.start(shared.run)
                shared.append("rtc_z", _event("rtc_z", "7-1"), None)
                await _until_lengths(redis, {"rtc_z": 1})
                proxy.held = trio.Event()
                shared.append("rtc_z", _event("rtc_z", "7-2"), ("nav", {"target": "today", "call_id": "rtc_z"}))
                await _until_lengths(redis, {"rtc_z": 2})               # applied; the writer waits for its answer
                with trio.fail_after(5):
                    while not proxy.holding:
                        await trio.sleep(0.01)
                shared.append("rtc_z", _event("rtc_z", "7-3"), None)    # waiting behind it
                outer.start_soon(_set_after, proxy.held, 0.2)           # the answer comes once the stop began
                nursery.cancel_scope.cancel()                            # the stop
            outer.cancel_scope.cancel()
        assert [i for i, _ in await _stream(redis, "rtc_z")] == ["7-1", "7-2", "7-3"]
        assert await redis.llen(rc.nav_hints_key("rtc_z")) == 1
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.startswith("{")]
    assert not [e for e in lines if e.get("event") == "shared_feed.unwritten_at_stop"]
    assert _stale_logs(log_stream) == ["rtc_z/7-2"]
