"""A process's leases renewed in one script per tick (issue 18): against a
real redis-server, many kept leases cost one ``EVAL`` per sixth of a TTL
(renewed often enough that a lease never falls below five sixths of it),
a lease another token took stops only its call, a vanished key is taken
again with a higher fence, and a paused Redis stops every call in time;
and a ``voiceactors serve`` child whose one lease another token took stops
that call only."""

from __future__ import annotations

import signal

import httpx
import trio

from calls_support import DAY, KEY
from cluster_support import TTL_S, ClusterServer, stop_all, stop_cleanly
from redis_support import redis_server  # noqa: F401  (the fixture)
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.fence import send_guard
from voiceactors.cluster.leases import keep_lease, stop_margin
from voiceactors.cluster.call_registry import Lease, RedisRegistry
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator

CLOSE_S = 0.1       # the graceful close a stop leaves room for (stop_margin)


async def _evals(redis: object) -> int:
    stats = await redis.info("commandstats")        # type: ignore[attr-defined]
    entry = stats.get("cmdstat_eval") or {}
    return int(entry.get("calls", 0)) if isinstance(entry, dict) else 0


class Kept:
    """Leases kept each by its own ``keep_lease``; ``why`` of those that ended."""

    def __init__(self, registry: RedisRegistry) -> None:
        self.registry = registry
        self.why: dict[str, str] = {}
        self.ended_at: dict[str, float] = {}

    async def keep(self, lease: Lease) -> None:
        self.why[lease.call_id] = await keep_lease(self.registry, lease, CLOSE_S)
        self.ended_at[lease.call_id] = trio.current_time()


async def _acquire_all(registry: RedisRegistry, call_ids: list[str]) -> list[Lease]:
    leases = []
    for call_id in call_ids:
        lease = await registry.acquire(call_id)
        assert lease is not None
        leases.append(lease)
    return leases


async def test_many_kept_leases_are_renewed_by_one_request_per_tick(redis_server):
    ttl = 1.5
    a = RedisRegistry(redis_server.url, ttl, node="a")
    b = RedisRegistry(redis_server.url, ttl, node="b")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(a.run)
        await nursery.start(b.run)
        leases = await _acquire_all(a, [f"rtc_{i}" for i in range(200)])
        kept = Kept(a)
        for lease in leases:
            nursery.start_soon(kept.keep, lease)
        await trio.sleep(0)
        fences = [a.fence_of(lease.call_id) for lease in leases]
        first_until = [f.until for f in fences if f is not None]
        await redis.config_resetstat()
        started = trio.current_time()
        await trio.sleep(ttl * 2)                   # 12 ticks, twice the TTL: expired unless renewed
        evals = await _evals(redis)
        ticks = (trio.current_time() - started) / a.renew_every_s
        # one script per tick for all 200 (one per lease would be 2,400)
        assert 6 <= evals <= ticks + 2, evals
        assert kept.why == {}
        for lease in leases[::20]:
            assert await b.acquire(lease.call_id) is None
            assert await redis.pttl(rc.lease_key(lease.call_id)) > ttl * 1000 / 2
        later = [f.until for f in fences if f is not None]
        assert len(later) == len(leases) and all(x > y for x, y in zip(later, first_until))   # every fence moved on
        nursery.cancel_scope.cancel()


async def test_a_lease_kept_between_ticks_is_renewed_within_a_tick(redis_server):
    ttl = 1.5
    a = RedisRegistry(redis_server.url, ttl, node="a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await trio.sleep(a.renew_every_s + 0.05)   # just after a tick
        [lease] = await _acquire_all(a, ["rtc_new"])
        fence = a.fence_of("rtc_new")
        assert fence is not None
        granted = fence.until
        nursery.start_soon(keep_lease, a, lease, CLOSE_S)
        with trio.fail_after(a.renew_every_s + 0.3):
            while fence.until == granted:
                await trio.sleep(0.01)
        assert trio.current_time() - lease.acquired_at <= a.renew_every_s + 0.3
        nursery.cancel_scope.cancel()


async def test_a_kept_lease_is_renewed_every_sixth_of_its_ttl(redis_server):
    # the room a stalled renewal leaves before the call stops (TTL - stop
    # margin - the interval) is twice what renewing every third gave: Redis's
    # own TTL of the key never falls much below five sixths of the lease
    # (every third: two thirds)
    ttl = 3.0
    a = RedisRegistry(redis_server.url, ttl, node="a")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(a.run)
        [lease] = await _acquire_all(a, ["rtc_sixth"])
        nursery.start_soon(keep_lease, a, lease, CLOSE_S)
        lowest = ttl * 1000
        started = trio.current_time()
        while trio.current_time() - started < ttl:      # six ticks
            lowest = min(lowest, await redis.pttl(rc.lease_key("rtc_sixth")))
            await trio.sleep(0.02)
        assert ttl * 1000 * 5 / 6 - 250 <= lowest < ttl * 1000 * 5 / 6 + 100, lowest
        nursery.cancel_scope.cancel()


async def test_a_lease_another_token_took_stops_only_its_call(redis_server):
    ttl = 1.5
    a = RedisRegistry(redis_server.url, ttl, node="a")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(a.run)
        stolen, kept_on = await _acquire_all(a, ["rtc_stolen", "rtc_kept"])
        kept = Kept(a)
        nursery.start_soon(kept.keep, stolen)
        nursery.start_soon(kept.keep, kept_on)
        await trio.sleep(0)
        stolen_fence = a.fence_of("rtc_stolen")
        assert stolen_fence is not None
        await redis.set(rc.lease_key("rtc_stolen"), "b:1", px=10_000)    # another token holds it now
        with trio.fail_after(ttl / 3 + 1):
            while "rtc_stolen" not in kept.why:
                await trio.sleep(0.01)
        assert kept.why == {"rtc_stolen": "lost"}
        assert stolen_fence.until == float("-inf") and a.lease_of("rtc_stolen") is None
        assert await redis.get(rc.lease_key("rtc_stolen")) == "b:1"       # the other's lease untouched
        await trio.sleep(ttl)                                            # the other call renewed on
        assert kept.why == {"rtc_stolen": "lost"}
        assert a.lease_of("rtc_kept") == kept_on and await redis.get(rc.lease_key("rtc_kept")) == kept_on.token
        nursery.cancel_scope.cancel()


async def test_a_vanished_lease_key_is_taken_again_with_a_higher_fence(redis_server):
    ttl = 1.5
    a = RedisRegistry(redis_server.url, ttl, node="a")
    b = RedisRegistry(redis_server.url, ttl, node="b")
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(a.run)
        await nursery.start(b.run)
        leases = await _acquire_all(a, ["rtc_x", "rtc_y", "rtc_z"])
        kept = Kept(a)
        for lease in leases:
            nursery.start_soon(kept.keep, lease)
        await trio.sleep(0)
        await redis.flushall()                      # Redis forgot everything (a restart without its data)
        with trio.fail_after(ttl / 3 + 1):
            while any(a.lease_of(lease.call_id) == lease for lease in leases):
                await trio.sleep(0.01)
        for lease in leases:
            again = a.lease_of(lease.call_id)
            assert again is not None and again.fence > lease.fence
            assert await redis.get(rc.lease_key(lease.call_id)) == again.token
            fence = a.fence_of(lease.call_id)
            assert fence is not None and fence.allows()
            assert await b.acquire(lease.call_id) is None          # still one holder
        await trio.sleep(ttl)                       # and renewed on under the new tokens
        assert kept.why == {}
        for lease in leases:
            held = a.lease_of(lease.call_id)
            assert held is not None and await redis.get(rc.lease_key(lease.call_id)) == held.token
        nursery.cancel_scope.cancel()


async def test_a_paused_redis_stops_every_kept_call_before_its_lease_can_expire(redis_server):
    ttl = 1.5
    a = RedisRegistry(redis_server.url, ttl, node="a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        leases = await _acquire_all(a, [f"rtc_{i}" for i in range(50)])
        kept = Kept(a)
        for lease in leases:
            nursery.start_soon(kept.keep, lease)
        await trio.sleep(ttl / 2)                   # renewed once at least
        fences = {lease.call_id: a.fence_of(lease.call_id) for lease in leases}
        assert redis_server.proc is not None
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            # the last grant's request was sent at most then: Redis expires the key no earlier
            granted = {call_id: f.until + send_guard(ttl) - ttl for call_id, f in fences.items() if f is not None}
            with trio.fail_after(ttl + 1):
                while len(kept.why) < len(leases):
                    await trio.sleep(0.01)
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        assert set(kept.why.values()) == {"unrenewable"}
        margin = stop_margin(ttl, CLOSE_S)
        for call_id, ended in kept.ended_at.items():
            # stopped at its stop deadline (a little scheduling late at most), margin before the lease's end
            assert ended < granted[call_id] + ttl - margin + 0.2, call_id
            assert ended >= granted[call_id] + ttl - margin
        nursery.cancel_scope.cancel()


async def test_a_lease_whose_keeper_ended_is_renewed_no_more(redis_server):
    ttl = 1.0
    a = RedisRegistry(redis_server.url, ttl, node="a")
    b = RedisRegistry(redis_server.url, ttl, node="b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        gone, kept_on = await _acquire_all(a, ["rtc_gone", "rtc_on"])
        nursery.start_soon(keep_lease, a, kept_on, CLOSE_S)
        with trio.move_on_after(ttl / 2):
            await keep_lease(a, gone, CLOSE_S)       # its actor ended without releasing (a crash, say)
        with trio.fail_after(ttl * 2):
            while await b.acquire("rtc_gone") is None:     # expired at its TTL: nobody renewed it
                await trio.sleep(0.05)
        assert await b.acquire("rtc_on") is None
        nursery.cancel_scope.cancel()


async def test_a_serve_process_whose_lease_another_token_took_stops_only_that_call(tmp_path, redis_server):
    # the supervisor's side: the actor runs inside its LeaseStop, cancelled by the renewal batch
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    stolen = sim.add_call("rtc_stolen", [{"sleep": 120}])
    kept = sim.add_call("rtc_kept", [{"sleep": 120}])
    a = None
    try:
        async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
            await nursery.start(sim.serve, 0)
            a = ClusterServer(journal, tmp_path / "state_a", sim, redis_server)
            url = await a.start(nursery)
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                for call_id in ("rtc_stolen", "rtc_kept"):
                    assert (await client.post("/api/voice/connect", json={"call_id": call_id})).status_code == 200
            with trio.fail_after(10):
                await stolen.wait_until(lambda c: c.connection is not None)
                await kept.wait_until(lambda c: c.connection is not None)
            await redis.set(rc.lease_key("rtc_stolen"), "other:1", px=60_000)   # another token holds it
            with trio.fail_after(TTL_S + 5):
                while not a.events("supervisor.lease_lost"):
                    await trio.sleep(0.02)
                await stolen.wait_until(lambda c: c.connection is None)
            [lost] = a.events("supervisor.lease_lost")
            assert lost["call_id"] == "rtc_stolen" and lost["why"] == "lost"
            assert await redis.get(rc.lease_key("rtc_stolen")) == "other:1"     # not released by the loser
            await trio.sleep(TTL_S)                                             # past the other's TTL
            assert len(a.events("supervisor.lease_lost")) == 1
            assert kept.connection is not None and not kept.closed and kept.connections == 1
            assert stolen.connections == 1                                      # not rejoined here
            await stop_cleanly(a)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a)
