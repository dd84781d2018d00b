"""The mirror of a held call's unsettled tool calls (``pending:<call_id>``)
costs Redis requests per pass, not per line: the writer's passes are spaced
(``MIRROR_PASS_INTERVAL_S``, 50 ms), and a tool call started and settled within
one pass is never written at all (a real redis-server counts the commands).
"""

from __future__ import annotations

import json

import pytest
import trio

from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.registry import RedisRegistry

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

CALL = "rtc_mirror"


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
