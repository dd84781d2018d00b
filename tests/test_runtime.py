"""The runtime: one nursery with the three actors, joined (bounded) on exit."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pytest
import trio

from calls_support import our_tasks
from voiceactors.call.record import record_path
from voiceactors.messages import AwaitReady, Connect, CountCalls, GetBrain, ask
from voiceactors.simulator import Simulator
from voiceactors.runtime import open_runtime
from voiceactors.settings import Settings

# ask requires its deadline; these tests bound the wait themselves (autojump_clock
# or a cancel scope), and a finite ask deadline would race autojump during thread waits
UNBOUNDED = math.inf

DAY = dt.date(2026, 3, 27)
FAKE_CLAUDE = Path(__file__).parent / "bin" / "fake-claude"
SIM_KEY = "sk-test-runtime-0123456789"



@pytest.fixture
def journal(make_sample) -> Path:
    """A fresh copy per test: tests edit the voice config and the brain writes its session file."""
    return make_sample(days=2)


def make_settings(journal: Path, tmp_path: Path, **changes) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY).replace(**changes)




async def test_runtime_serves_the_actors_and_leaves_nothing_behind(journal, tmp_path):
    async with open_runtime(make_settings(journal, tmp_path)) as rt:
        assert len(rt.nursery.child_tasks) == 4   # mcp hub, brain, executor, supervisor
        brain = await ask(rt.brain, GetBrain, timeout=5)
        assert brain.ready is False and brain.age_s is None
        assert await ask(rt.calls, CountCalls, timeout=5) == 0
        ready = await ask(rt.brain, AwaitReady, timeout=10)   # local backend: quick
        assert ready.ready and "sol" in ready.instruction
        assert our_tasks()
    assert not rt.nursery.child_tasks
    assert our_tasks() == []
    # the actors are gone: their inboxes no longer accept messages
    with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
        await ask(rt.brain, GetBrain, timeout=1)


async def test_a_hung_brain_does_not_hold_up_shutdown(journal, tmp_path, monkeypatch, settled_clock):
    config = journal / "config" / "journal.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "voice": {"brain": "claude"}}))
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "hang")
    settings = make_settings(journal, tmp_path, claude_command=str(FAKE_CLAUDE))
    async with open_runtime(settings) as rt:
        with trio.move_on_after(3):
            await ask(rt.brain, AwaitReady, timeout=UNBOUNDED)     # never ready: the CLI hangs
        stopping = trio.current_time()
    assert trio.current_time() - stopping < settings.shutdown_deadline_s
    assert not rt.nursery.child_tasks


async def test_cancelled_owner_still_joins_the_actors(journal, tmp_path):
    with trio.move_on_after(0.5):
        async with open_runtime(make_settings(journal, tmp_path)) as rt:
            await trio.sleep_forever()
    assert not rt.nursery.child_tasks
    assert our_tasks() == []


async def test_exit_closes_live_calls_and_flushes_their_records(journal, tmp_path):
    sim = Simulator("silence", api_key=SIM_KEY)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        # A long close deadline: a clean goodbye must not wait it out (it once
        # did, because cancellation also killed the websocket's own reader, so
        # the closing handshake could never complete).
        settings = make_settings(journal, tmp_path, openai_base_url=sim.base_url,
                                 close_deadline_s=30.0, shutdown_deadline_s=60.0)
        for call_id in ("rtc_rt_1", "rtc_rt_2"):
            sim.add_call(call_id)
        async with open_runtime(settings) as rt:
            for call_id in ("rtc_rt_1", "rtc_rt_2"):
                assert await ask(rt.calls, lambda r, c=call_id: Connect(c, r), timeout=10) == "connected"
            with trio.fail_after(5):
                for call_id in ("rtc_rt_1", "rtc_rt_2"):
                    await sim.calls[call_id].wait_until(lambda c: c.connection is not None)
            assert await ask(rt.calls, CountCalls, timeout=5) == 2
            stopping = trio.current_time()
        assert trio.current_time() - stopping < 10   # far below the 30 s close deadline
        for call_id in ("rtc_rt_1", "rtc_rt_2"):
            lines = [json.loads(line) for line in record_path(settings.state_dir, call_id).read_text().splitlines()]
            assert lines[0]["kind"] == "start" and lines[-1]["kind"] == "end"
            assert lines[-1]["reason"] == "shutdown"
            assert sim.calls[call_id].connection is None
        nursery.cancel_scope.cancel()
