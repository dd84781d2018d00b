"""A connect answered 503 while Redis stalls is never started by anyone
(issue 34, item 4).

The refused connect's ``ACQUIRE_MANY`` went out before Redis stopped
(SIGSTOP); its bound passed, the client got 503 ``call registry
unreachable``; Redis, continued (SIGCONT), then ran the script: the lease
was set for a call nobody runs. The takeover scan took such a lease for a
dead holder's call once it expired and ran the call in full. Now the
process voids the request it gave up on as soon as Redis answers again (a
tombstone the script checks first, and the lease it may have set deleted:
``registry.acquire_abandoned``), and a call is adopted only when a holder
confirmed it runs it (its takeover entry is written by the holder's
renewal, never by the acquire), so even a void that never arrives cannot
start it.

Two ``voiceactors serve --redis`` children on loopback, the simulator, a
real redis-server; and in process, two registries on one redis-server.
"""

from __future__ import annotations

import signal

import httpx
import pytest
import trio
from structlog.testing import capture_logs

from calls_support import DAY, KEY
from cluster_support import TTL_S, ClusterServer, started_calls, stop_all, takers
from redis_support import REDIS_SERVER, expire_lease_now, redis_server  # noqa: F401  (the fixture)
from test_call_crash import crash_scenario
from test_reliability_faults import item_file, open_item
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import RedisRegistry, RegistryDown
from voiceactors.http import errors as E
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

CALL = "rtc_refused"
# what the scan needed on the code that ran a refused call: the lease's TTL
# from when Redis ran the late acquire, a scan (every third of a TTL) and a
# sideband connect on a loaded machine
ADOPTION_WINDOW_S = TTL_S + TTL_S / 3 + 2.0


def _abandoned(*lines: dict) -> list[dict]:
    return [line for line in lines if line.get("event") == "registry.acquire_abandoned"
            and line.get("call_id") == CALL]


async def test_a_connect_refused_while_redis_stalls_is_never_run_by_anyone(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    day_file = item_file(journal, item)
    before = day_file.read_bytes()
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, crash_scenario(item.id))      # a write and a read, if anyone ran it
    assert redis_server.proc is not None
    servers: list[ClusterServer] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            servers = [ClusterServer(journal, tmp_path / f"state_{i}", sim, redis_server) for i in range(2)]
            urls = [await server.start(nursery) for server in servers]
            async with httpx.AsyncClient(base_url=urls[0], timeout=20) as client:
                redis_server.proc.send_signal(signal.SIGSTOP)     # the acquire goes out, nothing answers
                try:
                    refused = await client.post("/api/voice/connect", json={"call_id": CALL})
                finally:
                    redis_server.proc.send_signal(signal.SIGCONT)  # Redis runs the script now, late
            assert refused.status_code == 503 and refused.json() == {"error": E.REGISTRY_DOWN}
            # the process voids what it gave up on as soon as Redis answers again
            with trio.move_on_after(ADOPTION_WINDOW_S):
                while not _abandoned(*servers[0].lines) and not sim.handshakes:
                    await trio.sleep(0.05)
            assert not sim.handshakes, "a refused connect's call was started"
            [abandoned] = _abandoned(*servers[0].lines)
            assert abandoned["level"] == "warning"
            async with rc.client(redis_server.url) as redis:
                assert not await redis.exists([rc.lease_key(CALL)])
                assert not await redis.hexists(rc.CALLS_KEY, CALL)   # nothing a scan could adopt
            # and for as long as the scan took to adopt it before
            await trio.sleep(ADOPTION_WINDOW_S)
            assert sim.handshakes == [] and sc.connections == 0
            assert started_calls(*servers) == [] and takers(*servers) == []
            assert day_file.read_bytes() == before
            nursery.cancel_scope.cancel()
    finally:
        stop_all(*servers)


async def test_an_acquire_redis_ran_after_its_request_failed_is_voided(redis_server):
    """In process: the batch's own request times out (Redis stopped), the
    caller gets ``RegistryDown``; once Redis runs the late script the lease
    it set is deleted, nothing names the call in ``calls``, the other
    process finds no orphan and wins the call at once."""
    a, b = RedisRegistry(redis_server.url, TTL_S, node="a"), RedisRegistry(redis_server.url, TTL_S, node="b")
    assert redis_server.proc is not None
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
            await nursery.start(a.run)
            await nursery.start(b.run)
            redis_server.proc.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(RegistryDown):
                    await a.acquire(CALL)
            finally:
                redis_server.proc.send_signal(signal.SIGCONT)
            with trio.fail_after(5):
                while not _abandoned(*logs):
                    await trio.sleep(0.02)
            [line] = _abandoned(*logs)
            # Redis runs the late acquire and the void in either order (two
            # connections): the lease it set deleted, or the request voided first
            assert (line["released"], isinstance(line["fence"], int)) in ((True, True), (False, False)), line
            assert not await redis.exists([rc.lease_key(CALL)])
            assert not await redis.hexists(rc.CALLS_KEY, CALL)
            assert await b.orphans() == []
            won = await b.acquire(CALL)                   # free at once, a new call (no previous holder)
            assert won is not None and won.previous is None and won.fence > (line["fence"] or 0)
            nursery.cancel_scope.cancel()


async def test_a_void_that_reaches_redis_first_voids_the_late_acquire(redis_server):
    """The void and the late acquire travel on different connections, so
    Redis may run either first: the void leaves a tombstone the acquire
    checks in the same step, and a voided acquire sets nothing."""
    request = "a/7"
    keys = [rc.lease_key(CALL), rc.FENCE_KEY, rc.CALLS_KEY, rc.void_key(request)]
    async with rc.client(redis_server.url) as redis:
        deleted = await rc.run_script(redis, rc.VOID_ACQUIRE, [rc.void_key(request), rc.lease_key(CALL)],
                                      [60, f"{request}:", 1])
        assert deleted == [""]                            # nothing set yet
        answers = await rc.run_script(redis, rc.ACQUIRE_MANY, keys, [request, 60_000, CALL])
        assert [int(answer[0]) for answer in answers] == [0]
        assert not await redis.exists([rc.lease_key(CALL)]) and not await redis.hexists(rc.CALLS_KEY, CALL)
        other = await rc.run_script(redis, rc.ACQUIRE_MANY, [*keys[:3], rc.void_key("a/8")], ["a/8", 60_000, CALL])
        assert int(other[0][0]) == 1                      # another request of the same process is not void


async def test_only_a_confirmed_lease_is_adopted_when_it_expires(redis_server):
    """A lease won and never confirmed (no actor ran it: its connect was
    refused, or the process died before it answered) leaves nothing to take
    over when it expires; one whose holder confirmed it is taken over."""
    a, b = RedisRegistry(redis_server.url, TTL_S, node="a"), RedisRegistry(redis_server.url, TTL_S, node="b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        unconfirmed = await a.acquire(CALL)
        confirmed = await a.acquire("rtc_confirmed")
        assert unconfirmed is not None and confirmed is not None
        assert await a.confirm(confirmed)
        await expire_lease_now(redis_server, CALL, TTL_S)
        await expire_lease_now(redis_server, "rtc_confirmed", TTL_S)
        assert await b.orphans() == [("rtc_confirmed", confirmed.token)]
        fresh = await b.acquire(CALL)
        assert fresh is not None and fresh.previous is None     # a new call, nobody's to take over
        nursery.cancel_scope.cancel()


async def _evals(redis) -> int:
    entry = (await redis.info("commandstats")).get("cmdstat_eval") or {}
    return int(entry.get("calls", 0)) if isinstance(entry, dict) else 0


async def test_a_connect_that_finds_an_unconfirmed_lease_waits_for_its_holder(redis_server):
    """A lease won and not confirmed yet (its holder's connect still being
    answered, or a refused connect's lease its void is about to delete):
    another process's acquire asks again. Released a moment later, the asker
    wins the call (before, it answered ``connected`` and nobody ran it);
    confirmed, the asker finds it held."""
    a, b = RedisRegistry(redis_server.url, TTL_S, node="a"), RedisRegistry(redis_server.url, TTL_S, node="b")
    answers: dict[str, object] = {}

    async def ask(name: str, call_id: str) -> None:
        answers[name] = await b.acquire(call_id)

    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(a.run)
        await nursery.start(b.run)
        for call_id, settle in ((CALL, "release"), ("rtc_answered", "confirm")):
            lease = await a.acquire(call_id)
            assert lease is not None
            before = await _evals(redis)
            async with trio.open_nursery() as asking:
                asking.start_soon(ask, settle, call_id)
                with trio.fail_after(5):                      # b's acquire found it held (not confirmed)
                    while await _evals(redis) == before:
                        await trio.sleep(0.005)
                if settle == "release":
                    await a.release(lease)
                else:
                    assert await a.confirm(lease)
        won, held = answers["release"], answers["confirm"]
        assert won is not None and b.lease_of(CALL) == won
        assert held is None and b.lease_of("rtc_answered") is None
        nursery.cancel_scope.cancel()
