"""The connect path stays cheap (the ``connect`` benchmark measures it): a
call's start does no worker-thread hop for its model (and the model read
still prices the call, or falls back to the default with a
warning when the journal config cannot be read); a quiet call runs no
writer task; a supervised call runs in one task and still stops cleanly
when the supervisor is cancelled. Real actors against the simulator (the
sideband in memory; over loopback the quiet call, whose writes leave whole
only if the socket takes them, and the supervisor's actor, which opens the
browser's sideband)."""

from __future__ import annotations

import threading

import trio
import trio.lowlevel
from structlog.testing import capture_logs

from calls_support import KEY, Sideband, rig, steady
from voiceactors.messages import Connect, ask
from voiceactors.call.supervisor import CallSupervisor
from voiceactors.voice_config import DEFAULT_VOICE_MODEL, ConfigUnreadable


async def test_the_model_is_read_on_the_trio_thread_and_prices_the_call(tmp_path):
    asked_on: list[threading.Thread] = []

    def model() -> str:
        asked_on.append(threading.current_thread())
        return "gpt-realtime-mini"

    async with rig(tmp_path, steady("clean_close")) as r:
        actor, _ = await r.run_call("rtc_model_thread", model=model)
    assert actor.end_reason == "closed_by_service"
    # a worker-thread hop per connect cost a tenth of its CPU: no hop
    assert asked_on == [threading.main_thread()]
    assert actor.protocol.meter is not None and actor.protocol.meter.model == "gpt-realtime-mini"


async def test_an_unreadable_config_prices_the_call_as_the_default_model(tmp_path):
    def model() -> str:
        raise ConfigUnreadable("voice config unreadable: EIO")

    async with rig(tmp_path, steady("clean_close")) as r:
        with capture_logs() as logs:
            actor, _ = await r.run_call("rtc_model_unreadable", model=model)
    assert actor.end_reason == "closed_by_service"
    assert actor.protocol.meter is not None and actor.protocol.meter.model == DEFAULT_VOICE_MODEL
    warned = [line for line in logs if line["event"] == "call.model_unreadable"]
    assert [line["error"] for line in warned] == ["ConfigUnreadable"]


def _tasks_under(task: trio.lowlevel.Task) -> list[str]:
    names: list[str] = []
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            names.append(child.name)
            names.extend(_tasks_under(child))
    return names


async def test_a_connected_quiet_call_runs_no_writer_task(tmp_path):
    """Every write of a quiet call goes out from its own step: the writer
    task (for backpressure) is not started, so a live call holds one task
    fewer (its start, teardown and objects for every full collection).
    Over a socket: whether a write goes whole from its step is the socket's."""
    async with rig(tmp_path, sideband=Sideband.LOOPBACK) as r:
        sim_call = r.sim.add_call("rtc_quiet", steady("silence"))
        actor = r.actor("rtc_quiet")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run, name="quiet-call")
            with trio.fail_after(10):
                await sim_call.wait_until(lambda c: c.connections >= 1)
                while actor.transport is None:
                    await trio.sleep(0.01)
            task = next(t for t in nursery.child_tasks if t.name == "quiet-call")
            tasks = _tasks_under(task)
            nursery.cancel_scope.cancel()
    assert any(name.endswith("CallActor._reader") for name in tasks), tasks
    assert not any(name.endswith("CallActor._writer") for name in tasks), tasks
    assert actor.end_reason == "shutdown"


async def test_a_supervised_call_runs_in_one_task_and_a_cancelled_supervisor_still_stops_it_cleanly(tmp_path):
    """The supervisor runs a call in its ``call:<id>`` task itself (no guard
    task per call, ``CallActor.run_shielded``); cancelling the supervisor
    stops the call gracefully: record ``shutdown``, the socket closed 1000."""
    async with rig(tmp_path) as r:
        sim_call = r.sim.add_call("rtc_one_task", steady("silence"))
        sup = CallSupervisor(r.settings, r.executor.inbox, KEY)
        with capture_logs() as logs, trio.CancelScope() as sup_scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(sup.run)
                assert await ask(sup.inbox, lambda reply: Connect("rtc_one_task", reply), timeout=5) == "connected"
                with trio.fail_after(10):
                    await sim_call.wait_until(lambda c: c.connections >= 1)
                    while sup.calls["rtc_one_task"].transport is None:
                        await trio.sleep(0.01)
                tasks = _tasks_under(trio.lowlevel.current_task())
                call_task = [name for name in tasks if name == "call:rtc_one_task"]
                assert call_task and not any(name.endswith("run.<locals>.shielded") for name in tasks), tasks
                stopping_at = trio.current_time()
                sup_scope.cancel()
        assert sup_scope.cancelled_caught
        assert trio.current_time() - stopping_at < r.settings.close_deadline_s
        ends = [line for line in r.record("rtc_one_task") if line["kind"] == "end"]
        assert [line["reason"] for line in ends] == ["shutdown"]
        with trio.fail_after(5):
            while not any(line["event"] == "simulator.connection_ended" for line in logs):
                await trio.sleep(0.01)
        ended = [line for line in logs if line["event"] == "simulator.connection_ended"]
        assert [(line["ended_by"], int(line["peer_close"])) for line in ended] == [("peer", 1000)]
        assert sup.calls == {}


class SpawnedNames(trio.abc.Instrument):
    """The name of every task spawned while installed."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


async def test_a_call_without_capture_starts_no_task_for_its_record_and_still_records(tmp_path):
    """The record is written by the process's one ``RecordWriter``: a call
    spawns no task (and opens no nursery) for it, only for a capture; the
    record still holds the run's start, connect and end lines."""
    async with rig(tmp_path) as r:
        sim_call = r.sim.add_call("rtc_no_record_task", steady("silence"))
        actor = r.actor("rtc_no_record_task")
        spawned = SpawnedNames()
        trio.lowlevel.add_instrument(spawned)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(actor.run, name="quiet-call")
                with trio.fail_after(10):
                    await sim_call.wait_until(lambda c: c.connections >= 1)
                    while actor.transport is None:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        finally:
            trio.lowlevel.remove_instrument(spawned)
        assert not any("CallRecord" in name for name in spawned.names), spawned.names
        assert any(name.endswith("CallActor._reader") for name in spawned.names), spawned.names
        kinds = [line["kind"] for line in r.record("rtc_no_record_task")]
        assert kinds[:2] == ["start", "connect"] and kinds[-1] == "end"


async def test_a_reconnect_jitter_is_the_call_ids_sequence(tmp_path):
    """The jitter's generator is made at the first reconnect, not at start:
    the same delays as one seeded with the call id from the start."""
    import random

    from voiceactors.call.actor import backoff_delay

    async with rig(tmp_path) as r:
        actor = r.actor("rtc_jitter")
        assert actor._rng is None
        expected = random.Random("rtc_jitter")
        delays = [backoff_delay(n, 0.5, 8.0, actor._reconnect_rng()) for n in (1, 2, 3)]
        assert delays == [backoff_delay(n, 0.5, 8.0, expected) for n in (1, 2, 3)]
