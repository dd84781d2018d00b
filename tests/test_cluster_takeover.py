"""Taking over a dead holder's call, in process, against a real redis-server.

Redis is left as a holder that died mid-call leaves it: its lease expired
unreleased, the mirror of its record's unsettled tool calls, one write
applied and recorded in the shared log, one write claimed and never finished,
one read. The supervisor's scan finds the call and rejoins its sideband; the
new actor answers the applied write from the shared log, the unfinished one
with the honest restart error (never applied), and runs the read again."""

from __future__ import annotations

import json

import trio

from calls_support import KEY, real_time_limit, rig, steady
from redis_support import redis_server  # noqa: F401  (the fixture)
from voiceactors.executor import write_log
from voiceactors.call.recovery import RESTARTED_OUTPUT
from voiceactors.call.supervisor import CallSupervisor
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import RedisRegistry
from voiceactors.simulator import ToolCallRecord

CALL = "rtc_orphan"
RESUME = [{"wait_outputs": {"timeout_s": 60}}, {"response": {"text": "There."}}, {"close": 1000}]
# the lease's TTL is setup here, not the behaviour: the taken-over call must
# keep its lease (renewed every TTL/6) while the test runs, and 0.6 s lost it
# once on a loaded CI machine (a renewal late past the stop margin: the call
# stopped, "unrenewable", and the simulator's call never closed)
TTL = 3.0


def _started(tool_call_id: str, tool: str, effect: str, **extra) -> dict:
    return {"kind": "tool_started", "t": 1.0, "tool_call_id": tool_call_id, "tool": tool,
            "response_id": "resp_1", "epoch": 0, "turn": 1, "effect": effect, **extra}


async def test_the_scan_takes_over_a_dead_holders_call_and_answers_each_pending_call_once(tmp_path, redis_server):
    applied = {"output": json.dumps({"ok": True, "item": "x"}), "outcome": "ok", "tool": "commitments.complete"}
    async with rig(tmp_path) as r:
        dead = RedisRegistry(redis_server.url, TTL, node="dead")
        alive = RedisRegistry(redis_server.url, TTL, node="alive")
        async with trio.open_nursery() as registries:
            await registries.start(dead.run)
            await registries.start(alive.run)
            lease = await dead.acquire(CALL)
            assert lease is not None and await dead.confirm(lease)    # its actor ran: a call to take over
            # the mirror of its record as the holder's writer left it (call_ok had settled)
            async with rc.client(redis_server.url) as redis:
                await redis.hset(rc.pending_key(CALL), {
                    line["tool_call_id"]: json.dumps(line) for line in (
                        _started("call_done", "commitments.complete", "write"),
                        _started("call_lost", "commitments.complete", "write"),
                        _started("call_read", "calendar.today", "read", arguments="{}"),
                        _started("call_ok", "calendar.today", "read", arguments="{}"))})
                await redis.hdel(rc.pending_key(CALL), ["call_ok"])
            assert (await dead.claim_write(CALL, "call_done")).state == "claimed"
            await dead.record_write("call_done", applied)
            assert (await dead.claim_write(CALL, "call_lost")).state == "claimed"   # died applying it
            sc = r.sim.add_call(CALL, steady(RESUME))
            for tool_call_id, name in (("call_done", "commitments.complete"), ("call_read", "calendar.today"),
                                       ("call_lost", "commitments.complete")):
                sc.add_tool_call(ToolCallRecord(tool_call_id, name, "{}", "resp_1", "item_" + tool_call_id,
                                                complete=True))
            registries.cancel_scope.cancel()                  # the holder dies: no renewal, no release
        async with trio.open_nursery() as nursery:
            await nursery.start(alive.run)
            sup = CallSupervisor(r.settings, r.executor.inbox, KEY, registry=alive)
            with real_time_limit():
                await nursery.start(sup.run)
                await sc.wait_until(lambda c: c.closed)
                while sup.calls:
                    await trio.sleep(0.01)
            assert await alive.orphans() == []                # released at the end: nothing left to take
            nursery.cancel_scope.cancel()
    assert sc.outputs["call_done"] == [applied["output"]]     # from the shared log, not applied here
    assert sc.outputs["call_lost"] == [RESTARTED_OUTPUT]       # outcome unknown: never applied again
    [read] = sc.outputs["call_read"]
    assert "error" not in json.loads(read)                     # the read ran again
    assert "call_ok" not in sc.outputs                         # it had settled
    assert sc.response_creates == 1 and sc.violations == []
    assert write_log.load(r.settings.state_dir, "call_done")["output"] == applied["output"]
    assert write_log.load(r.settings.state_dir, "call_lost") is None
    block = r.record(CALL)
    assert block[0]["kind"] == "start" and block[0]["rejoined"] is True
    outcomes = {x["tool_call_id"]: x["outcome"] for x in block if x["kind"] == "tool_call"}
    assert outcomes == {"call_done": "replayed", "call_read": "ok", "call_lost": "restarted"}
