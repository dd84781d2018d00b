"""The leases asked for (and released) at once go to Redis in one script
each (``cluster/batched.py``): a join's connects cost one round trip per
batch, not per call, with every lease's guarantees kept. A real
redis-server counts the requests."""

from __future__ import annotations

import signal

import pytest
import trio

from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import Lease, RedisRegistry

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

TTL_S = 5.0
CALLS = [f"rtc_batch_{n}" for n in range(40)]


async def _evals(redis) -> int:
    stats = await redis.info("commandstats")
    entry = stats.get("cmdstat_eval") or {}
    return int(entry.get("calls", 0)) if isinstance(entry, dict) else 0


async def test_leases_asked_for_at_once_share_a_request_and_stay_exclusive(redis_server):
    a, b = RedisRegistry(redis_server.url, TTL_S, node="a"), RedisRegistry(redis_server.url, TTL_S, node="b")
    won: dict[str, Lease | None] = {}

    async def ask(registry: RedisRegistry, call_id: str) -> None:
        won[call_id] = await registry.acquire(call_id)

    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(a.run)
        await nursery.start(b.run)
        before = await _evals(redis)
        async with trio.open_nursery() as asking:
            for call_id in CALLS:
                asking.start_soon(ask, a, call_id)
        assert await _evals(redis) - before <= 3          # not one per lease (40)
        leases = [won[c] for c in CALLS]
        assert all(lease is not None and a.lease_of(lease.call_id) == lease for lease in leases)
        assert len({lease.fence for lease in leases if lease is not None}) == len(CALLS)   # a token each
        # no takeover entry until an actor runs the call (its first renewal confirms it)
        assert not await redis.hexists(rc.CALLS_KEY, CALLS[7])
        assert await a.confirm(leases[7])
        assert await redis.hget(rc.CALLS_KEY, CALLS[7]) == a.lease_of(CALLS[7]).token

        async with trio.open_nursery() as asking:         # held: b wins none of them, in a batch too
            for call_id in CALLS:
                asking.start_soon(ask, b, call_id)
        assert all(won[c] is None for c in CALLS)

        before = await _evals(redis)
        async with trio.open_nursery() as releasing:
            for lease in leases:
                assert lease is not None
                releasing.start_soon(a.release, lease)
        assert await _evals(redis) - before <= 3
        assert a.lease_of(CALLS[0]) is None and await redis.hlen(rc.CALLS_KEY) == 0
        assert await redis.exists([rc.lease_key(c) for c in CALLS]) == 0
        again = await b.acquire(CALLS[0])                 # released: free for anyone
        assert again is not None and again.fence > max(lease.fence for lease in leases if lease is not None)
        nursery.cancel_scope.cancel()


async def test_a_lease_won_for_a_caller_that_stopped_waiting_is_released(redis_server):
    a, b = RedisRegistry(redis_server.url, TTL_S, node="a"), RedisRegistry(redis_server.url, TTL_S, node="b")
    assert redis_server.proc is not None
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(a.run)
        await nursery.start(b.run)
        redis_server.proc.send_signal(signal.SIGSTOP)     # the request goes out, its answer waits
        try:
            with trio.move_on_after(0.2) as gave_up:
                await a.acquire("rtc_gone")
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        assert gave_up.cancelled_caught
        with trio.fail_after(3):                          # Redis granted it; nobody will run it: released
            while await redis.exists([rc.lease_key("rtc_gone")]) or await redis.hexists(rc.CALLS_KEY, "rtc_gone"):
                await trio.sleep(0.02)
        assert a.lease_of("rtc_gone") is None and a.health()["leases_held"] == 0
        assert await b.acquire("rtc_gone") is not None    # free at once, not after its TTL
        nursery.cancel_scope.cancel()
