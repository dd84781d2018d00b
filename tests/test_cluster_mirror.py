"""The mirror of a held call's unsettled tool calls (``pending:<call_id>``)
costs Redis requests per pass, not per line: the writer's passes are spaced
(``MIRROR_PASS_INTERVAL_S``, 50 ms), and a tool call started and settled within
one pass is never written at all (a real redis-server counts the commands).
A linked call's context rides in the same hash, for a taker to carry on with.
"""

from __future__ import annotations

import json

import pytest
import trio

from redis_support import REDIS_SERVER, expire_lease_now, redis_server  # noqa: F401  (the fixture)
from voiceactors.call.call_context import CallContext, LinkedContext, carried_view, taken_over_context
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import RedisRegistry
from voiceactors.linked_context.references import Reference, Unverified

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

CALL = "rtc_mirror"
TTL = 30.0     # the stale-holder tests expire leases themselves (expire_lease_now): never waited out


async def _calls(redis, command: str) -> int:
    stats = await redis.info("commandstats")
    entry = stats.get(f"cmdstat_{command}") or {}
    return int(entry.get("calls", 0)) if isinstance(entry, dict) else 0


async def _wait_pending(redis, call_id: str, expected: set[str]) -> dict[str, str]:
    with trio.fail_after(5):
        while True:
            pending = await redis.hgetall(rc.pending_key(call_id))
            if set(pending) == expected:
                return pending
            await trio.sleep(0.01)


async def test_a_tool_call_settled_within_one_pass_is_never_written(redis_server):
    holder = RedisRegistry(redis_server.url, 5.0, node="holder")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(holder.run)
        assert await holder.acquire(CALL) is not None
        sets, dels = await _calls(redis, "hset"), await _calls(redis, "hdel")
        holder.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_quick", "tool": "t"})
        holder.note_record(CALL, {"kind": "tool_call", "tool_call_id": "call_quick"})
        holder.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_slow", "tool": "t"})
        pending = await _wait_pending(redis, CALL, {"call_slow"})
        assert json.loads(pending["call_slow"])["tool"] == "t"
        # one HSET for call_slow; call_quick cost nothing
        assert await _calls(redis, "hset") - sets == 1
        assert await _calls(redis, "hdel") - dels == 0
        # a settle in a later pass than its start is written
        holder.note_record(CALL, {"kind": "tool_call", "tool_call_id": "call_slow"})
        await _wait_pending(redis, CALL, set())
        assert await _calls(redis, "hdel") - dels == 1
        nursery.cancel_scope.cancel()


async def test_a_start_seen_twice_is_still_deleted_by_its_settle(redis_server):
    """A tool call whose start was written in an earlier pass and logged
    again (a resend) before its settle: the settle still deletes it."""
    holder = RedisRegistry(redis_server.url, 5.0, node="holder")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(holder.run)
        assert await holder.acquire(CALL) is not None
        holder.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_a", "tool": "t"})
        await _wait_pending(redis, CALL, {"call_a"})
        holder.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_a", "tool": "t"})
        holder.note_record(CALL, {"kind": "tool_call", "tool_call_id": "call_a"})
        await _wait_pending(redis, CALL, set())
        nursery.cancel_scope.cancel()


async def test_lines_noted_apart_share_the_passes(redis_server):
    holder = RedisRegistry(redis_server.url, 5.0, node="holder")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(holder.run)
        assert await holder.acquire(CALL) is not None
        evals = await _calls(redis, "eval")
        for n in range(20):                 # 20 lines 2 ms apart: ~40 ms, so a handful of passes
            holder.note_record(CALL, {"kind": "tool_started", "tool_call_id": f"call_{n}", "tool": "t"})
            await trio.sleep(0.002)
        await _wait_pending(redis, CALL, {f"call_{n}" for n in range(20)})
        assert await _calls(redis, "eval") - evals <= 8
        nursery.cancel_scope.cancel()


async def test_a_linked_calls_context_and_its_selection_are_mirrored_for_a_taker(redis_server):
    """The call's linked context rides in its pending hash (``CONTEXT_FIELD``):
    written as its actor starts, rewritten at each ``selection`` line, read
    back by a taker as the ``LinkedContext`` it carries on with; a plain
    call's (no link, no selection) costs Redis nothing; a release deletes it
    with the hash."""
    link = Reference("entity", "maya_chen", "Maya Chen", entity_type="Person")
    sam = Reference("entity", "sam_okafor", "Sam Okafor", entity_type="Person")
    holder = RedisRegistry(redis_server.url, 5.0, node="holder")
    taker = RedisRegistry(redis_server.url, 5.0, node="taker")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(holder.run)
        await nursery.start(taker.run)
        lease = await holder.acquire(CALL)
        plain = await holder.acquire("rtc_plain")
        assert lease is not None and plain is not None
        sets = await _calls(redis, "hset")
        holder.note_context("rtc_plain", LinkedContext("the brain", None))
        holder.note_context(CALL, LinkedContext("the brain", link, greeting=True))
        await _wait_pending(redis, CALL, {rc.CONTEXT_FIELD})
        carried = await taker.carried(CALL)
        assert carried.pending == [] and carried.context == LinkedContext(
            "the brain", link, selection=link, taken_over=True)
        holder.note_record(CALL, {"kind": "selection", "tool_call_id": "call_select",
                                  "selection": sam.view(), "link": link.view()})
        holder.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_get", "tool": "entities.get"})
        await _wait_pending(redis, CALL, {rc.CONTEXT_FIELD, "call_get"})
        carried = await taker.carried(CALL)
        assert [p.tool_call_id for p in carried.pending] == ["call_get"]     # the context is no tool call
        assert carried.context == LinkedContext("the brain", link, selection=sam, taken_over=True)
        assert await redis.hgetall(rc.pending_key("rtc_plain")) == {}
        assert await _calls(redis, "hset") - sets == 3      # the link, the selection, call_get: none for rtc_plain
        await holder.release(lease)
        assert await redis.hgetall(rc.pending_key(CALL)) == {}
        nursery.cancel_scope.cancel()


def test_a_taken_over_context_sends_its_selection_at_the_first_connection_and_never_greets():
    link = Unverified("entity", "not_found")
    sam = Reference("entity", "sam_okafor", "Sam Okafor", entity_type="Person")
    view = carried_view(LinkedContext("the brain", link, greeting=True, selection=sam))
    linked = taken_over_context(json.loads(json.dumps(view)))
    assert linked == LinkedContext("the brain", link, selection=sam, taken_over=True)
    ctx = CallContext(linked)
    assert ctx.selection == sam and ctx.greeting == "none"
    events, dropped = ctx.on_connected(quiet=True)
    assert dropped is None and [e["type"] for e in events] == ["session.update"]
    assert '"Sam Okafor"' in events[0]["session"]["instructions"]
    assert taken_over_context("not a view") is None


async def test_a_stale_holders_mirror_is_refused_and_it_loses_the_call(redis_server):
    """A holder whose call another process took over (its lease expired while
    it was paused) writes nothing more to the call's mirror, whatever it
    logs before a renewal would tell it: the script checks the lease's token
    in the same step as the write, and the refusal stops the stale holder's
    actor as a lost renewal does (``LeaseStop.why == 'lost'``, fence closed)."""
    a = RedisRegistry(redis_server.url, TTL, node="a")
    b = RedisRegistry(redis_server.url, TTL, node="b")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(a.run)
        await nursery.start(b.run)
        stale = await a.acquire(CALL)
        assert stale is not None
        stop = a.lease_stop(stale, 10.0)
        assert await a.confirm(stale)                          # its actor runs (lease_stop sent it too)
        fence = a.fence_of(CALL)
        a.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_a", "tool": "t"})
        await _wait_pending(redis, CALL, {"call_a"})          # a's own, before the takeover
        await expire_lease_now(redis_server, CALL, TTL)       # a "paused" past its TTL
        taken = await b.acquire(CALL)
        assert taken is not None and taken.previous == stale.token
        b.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_b", "tool": "t2"})
        mirrored = await _wait_pending(redis, CALL, {"call_a", "call_b"})
        # a wakes and logs before any renewal of its own: a settle and a start
        a.note_record(CALL, {"kind": "tool_call", "tool_call_id": "call_a"})
        a.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_b", "tool": "stale"})
        with trio.fail_after(5):
            while a.lease_of(CALL) is not None:
                await trio.sleep(0.01)
        assert await redis.hgetall(rc.pending_key(CALL)) == mirrored
        assert stop.scope.cancel_called and stop.why == "lost"
        assert fence is not None and not fence.allows() and a.fence_of(CALL) is None
        assert b.lease_of(CALL) == taken                      # the new holder is untouched
        assert await redis.get(rc.lease_key(CALL)) == taken.token
        nursery.cancel_scope.cancel()


async def test_a_mirror_line_whose_lease_nobody_holds_is_refused_and_the_call_taken_again(redis_server):
    """The lease key is gone and nobody took the call (Redis lost it, or it
    expired unclaimed): the line is refused as a renewal's ``-1`` is, and
    the holder takes the call again with a new token, as that renewal does."""
    holder = RedisRegistry(redis_server.url, TTL, node="holder")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(holder.run)
        first = await holder.acquire(CALL)
        assert first is not None
        holder.lease_stop(first, 10.0)
        await expire_lease_now(redis_server, CALL, TTL)
        holder.note_record(CALL, {"kind": "tool_started", "tool_call_id": "call_gone", "tool": "t"})
        with trio.fail_after(5):
            while holder.lease_of(CALL) == first:
                await trio.sleep(0.01)
        again = holder.lease_of(CALL)
        assert again is not None and again.fence > first.fence
        assert await redis.get(rc.lease_key(CALL)) == again.token
        assert await redis.hgetall(rc.pending_key(CALL)) == {}   # the refused line was not written
        nursery.cancel_scope.cancel()
