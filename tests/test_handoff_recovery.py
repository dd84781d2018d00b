"""A call that handed over between agents resumes with the agent in charge:
rejoined after a crash (its record's last block, no ``end``) and, with
``--redis``, taken over from a dead holder (the mirror, a real
redis-server), during the handoff (its update sent, not acknowledged) and
after it. In process: a ``CallSupervisor`` against the simulator, as
``tests/test_call_crash.py`` and ``tests/test_cluster_takeover.py`` do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import trio

from calls_support import KEY, real_time_limit, rig, steady
from redis_support import REDIS_SERVER, expire_lease_now, redis_server  # noqa: F401  (the fixture)
from test_handoff_calls import BASE, with_agents
from voiceactors.call.call_context import carried_view
from voiceactors.call.record import append_block, record_path
from voiceactors.call.supervisor import CallSupervisor
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import RedisRegistry
from voiceactors.simulator import SimCall, ToolCallRecord

#: The rejoined call answers the handoff call (the service still waits for it), then goes on.
RESUME = [{"wait_outputs": {"timeout_s": 60}}, {"response": {"text": "There."}}, {"close": 1000}]
#: The handoff call's ``tool_started`` line, as the crashed run wrote it.
STARTED = {"kind": "tool_started", "t": 1.0, "tool_call_id": "call_h", "tool": "handoff.planner",
           "response_id": "resp_1", "epoch": 0, "turn": 1, "effect": None}
HANDED = json.dumps({"handed_to": "planner", "from": "assistant"})
#: A handoff's record line: during (its update sent) and after (acknowledged and its words spoken);
#: a failed one leaves the assistant in charge.
CASES = [("updating", "planner"), ("done", "planner"), ("failed", "assistant")]


def handoff_line(status: str) -> dict[str, Any]:
    return {"kind": "handoff", "t": 2.0, "tool_call_id": "call_h", "tool": "handoff.planner", "response_id": "resp_1",
            "from": "assistant", "to": "planner", "event_id": "evt_update", "status": status}


def waiting_call(r: Any, call_id: str) -> SimCall:
    """The service's call: it still waits for the handoff call's output."""
    sim_call = r.sim.add_call(call_id, steady(RESUME))
    sim_call.add_tool_call(ToolCallRecord("call_h", "handoff.planner", "{}", "resp_1", "item_call_h", complete=True))
    return sim_call


def resumed_updates(sim_call: SimCall) -> list[dict[str, Any]]:
    return [e["session"] for e in sim_call.received if e["type"] == "session.update"]


def assert_resumed_with(sim_call: SimCall, record: list[dict[str, Any]], agent: str) -> None:
    updates = resumed_updates(sim_call)
    if agent == "assistant":
        assert updates == []                   # the session is the first agent's, as it was minted
    else:
        [update] = updates                     # its tools and words at the first connection
        tools = [t["name"] for t in update["tools"]]
        assert "commitments.complete" in tools and "handoff.assistant" in tools
        assert update["instructions"].startswith(BASE) and f"You are the {agent} agent" in update["instructions"]
    block = record[[i for i, x in enumerate(record) if x["kind"] == "start"][-1]:]
    [context] = [x["context"] for x in block if x["kind"] == "context"]
    assert context["agent"] == agent           # what a second crash or takeover would carry on
    # the handoff call answered as it was before the crash, never with the restart error
    assert sim_call.outputs["call_h"] == [HANDED]
    assert sim_call.violations == [] and sim_call.error_codes == []


async def run_supervisor(r: Any, sim_call: SimCall, **kw: Any) -> None:
    async with trio.open_nursery() as nursery:
        sup = CallSupervisor(r.settings, r.executor.inbox, KEY, **kw)
        with real_time_limit():
            await nursery.start(sup.run)
            await sim_call.wait_until(lambda c: c.closed)
            while sup.calls:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def taken_over(r: Any, redis_server: Any, call_id: str, holder: Callable[[RedisRegistry], None],
                     mirrored: Callable[[dict[str, str]], bool],
                     service_call: Callable[[Any, str], SimCall]) -> SimCall:
    """A holder leases ``call_id``, tells its registry what its actor did
    (``holder``), and dies once the mirror shows it (``mirrored`` of the
    call's mirrored hash); another process's supervisor takes the call over
    and serves the service's call (``service_call``) to its end."""
    dead = RedisRegistry(redis_server.url, 3.0, node="dead")
    alive = RedisRegistry(redis_server.url, 3.0, node="alive")
    async with trio.open_nursery() as registries:
        await registries.start(dead.run)
        await registries.start(alive.run)
        lease = await dead.acquire(call_id)
        assert lease is not None and await dead.confirm(lease)
        holder(dead)
        async with rc.client(redis_server.url) as redis:
            with trio.fail_after(5):
                while not mirrored(await redis.hgetall(rc.pending_key(call_id))):
                    await trio.sleep(0.01)
        registries.cancel_scope.cancel()          # the holder dies: no renewal, no release
    await expire_lease_now(redis_server, call_id, 3.0)      # its lease runs out now, not in 3 s
    sim_call = service_call(r, call_id)
    async with trio.open_nursery() as nursery:
        await nursery.start(alive.run)
        await run_supervisor(r, sim_call, registry=alive)
        nursery.cancel_scope.cancel()
    return sim_call


@pytest.mark.parametrize("status, agent", CASES)
async def test_a_rejoin_after_a_crash_resumes_with_the_agent_in_charge(tmp_path, autojump_clock, status, agent):
    state: Path = tmp_path / "state"
    call_id = f"rtc_crash_{status}"
    path = record_path(state, call_id)
    lines = [{"kind": "start", "t": 0.0, "call_id": call_id, "at": "2026-03-27T10:00:00+00:00"},
             {"kind": "context", "t": 0.0, "context": carried_view(with_agents())},
             {"kind": "connect", "t": 0.01, "reconnects": 0}, STARTED, handoff_line(status)]
    append_block(path, [json.dumps(x) for x in lines])
    async with rig(tmp_path) as r:
        sim_call = waiting_call(r, call_id)
        await run_supervisor(r, sim_call)
        record = r.record(call_id)
    assert record[len(lines)]["rejoined"] is True
    assert_resumed_with(sim_call, record, agent)


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
@pytest.mark.parametrize("status, agent", CASES[:2])
async def test_a_takeover_resumes_with_the_agent_in_charge(tmp_path, redis_server, status, agent):
    call_id = f"rtc_taken_{status}"

    def holder(dead: RedisRegistry) -> None:
        # the holder's actor started with its context and recorded the handoff: the mirror keeps both
        dead.note_context(call_id, with_agents())
        dead.note_record(call_id, STARTED)
        dead.note_record(call_id, handoff_line(status))

    async with rig(tmp_path) as r:
        sim_call = await taken_over(r, redis_server, call_id, holder,
                                    lambda pending: '"output"' in pending.get("call_h", ""), waiting_call)
        record = r.record(call_id)
    assert_resumed_with(sim_call, record, agent)


#: After the takeover the model hands over: the taker must know the handoff tools.
HAND_OVER_AFTER = [{"response": {"tool_calls": [{"name": "handoff.planner", "call_id": "call_later",
                                                  "arguments": {}}]}},
                   {"wait_outputs": {"timeout_s": 60}}, {"response": {"text": "Planner here."}}, {"close": 1000}]


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
async def test_a_taker_of_a_call_that_never_handed_over_can_hand_over(tmp_path, redis_server):
    """Before: the mirror kept no context for a call without a link, a
    selection or a handoff, so its taker ran it without agents and a later
    ``handoff.planner`` was an unknown tool. The context of a call with
    agents is mirrored now: the taker has them, the first in charge, and
    the instruction their parts are added to."""
    call_id = "rtc_taken_plain"

    def holder(dead: RedisRegistry) -> None:
        dead.note_context(call_id, with_agents())           # the first in charge, no link, no selection

    async with rig(tmp_path) as r:
        sim_call = await taken_over(r, redis_server, call_id, holder, bool,
                                    lambda r, call_id: r.sim.add_call(call_id, steady(HAND_OVER_AFTER)))
        record = r.record(call_id)
    assert sim_call.outputs["call_later"] == [HANDED]
    [update] = resumed_updates(sim_call)
    assert "You are the planner agent" in update["instructions"]
    assert [(x["to"], x["status"]) for x in record if x["kind"] == "handoff"][-1] == ("planner", "done")
    assert sim_call.violations == [] and sim_call.error_codes == []
