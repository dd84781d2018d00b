"""A Live call under ``--redis``: leased like any call. In process, the
supervisor with a real redis-server's registry and the simulator's Live
session on loopback: the call connected as ``POST /api/voice/live`` hands it
over (``connect_leased``) holds its lease while it runs, its mirror carries
the Live session a taker would attach with (and the seconds of audio
counted so far), its record says ``live``, and the lease is released when
the session ends."""

from __future__ import annotations

from dataclasses import replace

import trio

from calls_support import KEY, real_time_limit, rig
from redis_support import redis_server  # noqa: F401  (the fixture)
from voiceactors.call.call_context import LinkedContext
from voiceactors.call.record import read_record, record_path
from voiceactors.call.supervisor import CallSupervisor
from voiceactors.cluster.call_registry import RedisRegistry
from voiceactors.live.names import FunctionNames
from voiceactors.live.session import live_session
from voiceactors.messages import ConnectOutcome
from voiceactors.simulator import live_events as le
from voiceactors.tool_effect import WRITE
from voiceactors.tools.registry import REGISTRY


def live_context() -> LinkedContext:
    names = FunctionNames.of(REGISTRY)
    return LinkedContext("You are the journal's voice.", live=live_session(
        names, "You are the journal's voice.", lambda tool: REGISTRY[tool].effect == WRITE, "gpt-5-mini",
        le.LIVE_MODEL))


async def test_a_live_call_holds_a_lease_and_its_mirror_carries_the_session(tmp_path, redis_server):
    # real time, as the other cluster tests: the registry's requests to redis-server are real I/O
    async with rig(tmp_path) as r:
        session = r.sim.live.add({"model": le.LIVE_MODEL})
        session.steps = [{"user": "Hello there."}, {"usage": 12}]
        call_id = session.session_id
        registry = RedisRegistry(redis_server.url, 10.0, node="here")
        async with trio.open_nursery() as nursery:
            await nursery.start(registry.run)
            supervisor = CallSupervisor(r.settings, r.executor.inbox, KEY, registry=registry)
            with real_time_limit():
                await nursery.start(supervisor.run)
                assert await supervisor.connect_leased(call_id, live_context()) == ConnectOutcome.CONNECTED
                await session.wait_until(lambda s: s.step == len(s.steps))
                assert call_id in supervisor.calls and registry.lease_of(call_id) is not None
                # what a taker would attach with (the mirror is written by its own task: a pass or so
                # later), with the session's seconds counted so far: a taker counts only what is above
                with trio.fail_after(10):
                    while (carried := await registry.carried(call_id)).context is None \
                            or carried.context.live is None or carried.context.live.audio_s != 12:
                        await trio.sleep(0.02)
                assert carried.context.live == replace(live_context().live, audio_s=12.0)
                assert await supervisor.connect_leased(call_id, live_context()) == ConnectOutcome.CONNECTED
                assert len(supervisor.calls) == 1 and session.attaches == 1      # live here: no second actor
                await r.sim.live.close(session, "remote_hangup")
                while supervisor.calls:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert registry.lease_of(call_id) is None                # released at the end
    record = read_record(record_path(r.settings.state_dir, call_id))
    assert record[0]["kind"] == "start" and record[0]["arrival"] == "live"
    assert [line["added_s"] for line in record if line["kind"] == "audio_usage"] == [12]
