"""``CallSupervisor.connect_leased``: a connect with a shared registry
answered in the caller's task (the connect handler's, ``http/connect.py``),
in process, against a real redis-server.

Pinned: a caller cancelled while the lease is asked for does not cut the
win short (the call's actor starts and its lease is held: the supervisor's
task per connect was never cancelled by its asker either); a duplicate
waits for the first; without a shared registry, or before the supervisor
serves, it declines (None)."""

from __future__ import annotations

import trio

from calls_support import KEY, real_time_limit, rig
from redis_support import redis_server  # noqa: F401  (the fixture)
from voiceactors.messages import ConnectOutcome
from voiceactors.call.supervisor import CallSupervisor
from voiceactors.cluster.call_registry import RedisRegistry

CALL = "rtc_leased"


async def test_a_cancelled_caller_still_gets_its_lease_and_actor(tmp_path, redis_server):
    async with rig(tmp_path) as r:
        r.sim.add_call(CALL, [{"sleep": 0.5}, {"close": 1000}])
        registry = RedisRegistry(redis_server.url, 10.0, node="here")
        async with trio.open_nursery() as nursery:
            await nursery.start(registry.run)
            supervisor = CallSupervisor(r.settings, r.executor.inbox, KEY, registry=registry)
            assert await supervisor.connect_leased(CALL) is None          # not serving yet: send Connect
            with real_time_limit():
                await nursery.start(supervisor.run)
                answers: list[ConnectOutcome | None] = []
                with trio.CancelScope() as scope:
                    scope.cancel()                  # the asker goes away before the lease is even asked for
                    answers.append(await supervisor.connect_leased(CALL))
                assert answers == [ConnectOutcome.CONNECTED]
                assert CALL in supervisor.calls and registry.lease_of(CALL) is not None
                again = await supervisor.connect_leased(CALL)     # live here: no second actor
                assert again == ConnectOutcome.CONNECTED and len(supervisor.calls) == 1
                while supervisor.calls:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert registry.lease_of(CALL) is None                    # released at the end


async def test_without_a_shared_registry_it_declines(tmp_path):
    async with rig(tmp_path) as r:
        async with trio.open_nursery() as nursery:
            supervisor = CallSupervisor(r.settings, r.executor.inbox, KEY)
            await nursery.start(supervisor.run)
            assert await supervisor.connect_leased(CALL) is None
            assert not supervisor.calls
            nursery.cancel_scope.cancel()
