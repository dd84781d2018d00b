"""The ``/events`` stream wakes on events, not on polls (issue 11, item 9b):
an idle stream is not scheduled until its keepalive is due, and a server
stop ends it at once. Driven through the route's own generator with a real
feed; trio's instrument API counts how often the stream's task runs."""

from __future__ import annotations

import trio
import trio.lowlevel

from voiceactors.call.feed import FeedHub
from voiceactors.http.routes import SSE_KEEPALIVE_S, _sse


class StepCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps: dict[str, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] = self.steps.get(task.name, 0) + 1

    def of(self, name: str) -> int:
        return sum(n for task, n in self.steps.items() if name in task)


async def _consume(stream, out: list, name: str) -> None:
    async for chunk in stream:
        out.append((trio.current_time(), chunk))


async def test_an_idle_stream_sleeps_until_its_keepalive_and_events_wake_it(autojump_clock):
    hub = FeedHub()
    feed = hub.open("rtc_idle")
    stopping = trio.Event()
    chunks: list = []
    counter = StepCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_consume, _sse(hub.subscribe("rtc_idle"), stopping, "rtc_idle"), chunks, "x",
                               name="sse-consumer")
            await trio.sleep(1)
            before = counter.of("sse-consumer") + counter.of("receive") + counter.of("stop")
            await trio.sleep(SSE_KEEPALIVE_S - 2)            # idle, short of the keepalive
            idle_steps = counter.of("sse-consumer") + counter.of("receive") + counter.of("stop") - before
            assert idle_steps == 0                            # the old 0.5 s poll ran 26 times here
            t_event = trio.current_time()
            feed.tool_started(tool="calendar.today", tool_call_id="call_1", epoch=0)
            await trio.sleep(0.001)
            assert chunks[-1][1].startswith(b"data: ") and chunks[-1][0] - t_event < 0.01   # woken by the event
            await trio.sleep(SSE_KEEPALIVE_S + 1)
            assert chunks[-1][1] == b": keepalive\n\n"
            t_stop = trio.current_time()
            stopping.set()
            with trio.fail_after(1):
                while nursery.child_tasks:
                    await trio.sleep(0.001)
            assert trio.current_time() - t_stop < 0.01        # the stop ends it at once, not at the next poll
    finally:
        trio.lowlevel.remove_instrument(counter)


async def test_the_stream_ends_with_the_feed(autojump_clock):
    hub = FeedHub()
    feed = hub.open("rtc_end")
    chunks: list = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_consume, _sse(hub.subscribe("rtc_end"), trio.Event(), "rtc_end"), chunks, "x")
        await trio.sleep(1)
        hub.close(feed, "closed_by_service")
    assert b'"call.ended"' in chunks[-1][1]
