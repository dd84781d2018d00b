"""The Redis call registry against a real redis-server: leases, fencing
tokens, the shared write log's fenced claim, and Redis going away.

The lease TTL is setup here, not the behaviour, except where a test says so:
a long one (``TTL``), so that no lease expires and no request passes its
bound (a quarter of the TTL, at most 2 s) while a loaded machine runs the
test. A test of what follows an expiry makes Redis expire the lease now
(``_expire_now``) instead of waiting out a short TTL in real time."""

from __future__ import annotations

import time

import pytest
import trio

from redis_support import RedisServer, expire_lease_now, redis_server  # noqa: F401  (the fixture)
from voiceactors.cluster.leases import keep_lease, stop_margin
from voiceactors.cluster.call_registry import RedisRegistry, RegistryDown, WriteClaim
from voiceactors.settings import InvalidSettings, Settings

TTL = 30.0


async def _two(server: RedisServer, nursery: trio.Nursery, ttl: float = TTL) -> tuple[RedisRegistry, RedisRegistry]:
    a, b = RedisRegistry(server.url, ttl, node="a"), RedisRegistry(server.url, ttl, node="b")
    await nursery.start(a.run)
    await nursery.start(b.run)
    return a, b


async def test_one_lease_per_call_released_only_by_its_holder(redis_server):
    async with trio.open_nursery() as nursery:
        a, b = await _two(redis_server, nursery)
        first = await a.acquire("rtc_1")
        assert first is not None and first.token.startswith("a/") and first.previous is None
        assert await b.acquire("rtc_1") is None              # held: no second holder
        await b.release(type(first)("rtc_1", "b:1"))          # a wrong token deletes nothing
        assert await b.acquire("rtc_1") is None
        await a.release(first)
        second = await b.acquire("rtc_1")
        assert second is not None and second.fence > first.fence and second.previous is None
        assert await a.renew(first) is None                  # a's old token renews nothing
        assert await b.renew(second) == second
        nursery.cancel_scope.cancel()


async def test_an_unreleased_lease_expires_and_the_next_holder_learns_whose_it_was(redis_server):
    async with trio.open_nursery() as nursery:
        a, b = await _two(redis_server, nursery)
        dead = await a.acquire("rtc_2")
        assert dead is not None
        assert await a.confirm(dead)                        # an actor ran it: a call to take over
        assert await b.orphans() == []                      # still leased
        await expire_lease_now(redis_server, "rtc_2", TTL)  # a "died": never renewed
        assert await b.orphans() == [("rtc_2", dead.token)]
        taken = await b.acquire("rtc_2")
        assert taken is not None and taken.previous == dead.token and taken.fence > dead.fence
        assert await a.renew(dead) is None                  # b holds it now: a's is lost
        assert await b.confirm(taken)                       # b ran it: the takeover entry is b's now
        await b.release(taken)
        assert await b.orphans() == []                      # released cleanly: nothing to take over
        nursery.cancel_scope.cancel()


async def test_fencing_tokens_never_repeat_after_redis_forgets_everything(redis_server):
    async with trio.open_nursery() as nursery:
        a, _ = await _two(redis_server, nursery)
        before = await a.acquire("rtc_3")
        assert before is not None
        # the seed is Redis's clock in ms, so a fresh counter starts near now
        assert abs(before.fence - time.time() * 1000) < 60_000
        redis_server.stop()                                  # a restart without persistence
        redis_server.start()
        after = None
        with trio.fail_after(10):
            while after is None:
                try:
                    after = await a.acquire("rtc_3")
                except RegistryDown:
                    await trio.sleep(0.05)
        assert after.fence > before.fence
        nursery.cancel_scope.cancel()


async def test_a_write_is_claimed_once_among_many_and_never_by_a_stale_holder(redis_server):
    async with trio.open_nursery() as nursery:
        a, b = await _two(redis_server, nursery)
        assert await a.acquire("rtc_4") is not None
        answers = []

        async def claim() -> None:
            answers.append(await a.claim_write("rtc_4", "call_w"))

        async with trio.open_nursery() as racers:
            for _ in range(20):
                racers.start_soon(claim)
        assert sorted(x.state for x in answers) == [WriteClaim.CLAIMED] + [WriteClaim.TAKEN] * 19
        assert all(x.record is None for x in answers)        # applying: the outcome is not known yet
        record = {"output": '{"ok": true}', "outcome": "ok", "tool": "commitments.complete"}
        await a.record_write("call_w", record)
        replay = await b.claim_write("rtc_4", "call_w")       # b holds no lease but the record answers
        assert replay.state == WriteClaim.TAKEN and replay.record == record
        # b holds no lease of rtc_4: a new write is refused, nothing claimed
        assert (await b.claim_write("rtc_4", "call_new")).state == WriteClaim.STALE
        assert (await a.claim_write("rtc_4", "call_new")).state == WriteClaim.CLAIMED
        nursery.cancel_scope.cancel()


async def test_redis_gone_raises_registry_down_in_bounded_time_and_health_says_so(redis_server):
    async with trio.open_nursery() as nursery:
        a, _ = await _two(redis_server, nursery)
        lease = await a.acquire("rtc_5")
        assert lease is not None
        assert a.health() == {"backend": "redis", "reachable": True, "leases_held": 1}
        redis_server.stop()
        with trio.fail_after(a.op_timeout_s * 3 + 1):
            for operation in (a.acquire("rtc_6"), a.renew(lease), a.claim_write("rtc_5", "call_x")):
                try:
                    await operation
                except RegistryDown:
                    continue
                raise AssertionError("an operation against a dead Redis did not raise RegistryDown")
        assert a.health()["reachable"] is False
        nursery.cancel_scope.cancel()


async def test_a_holder_that_cannot_renew_gives_up_before_its_lease_expires(redis_server):
    async with trio.open_nursery() as nursery:
        a, b = await _two(redis_server, nursery, ttl=1.5)
        lease = await a.acquire("rtc_7")
        assert lease is not None
        redis_server.stop()
        with trio.fail_after(5):
            why = await keep_lease(a, lease, close_deadline_s=0.1)
        given_up = trio.current_time()
        assert why == "unrenewable"
        # it gave up at least the margin before the lease could expire in Redis
        assert given_up <= lease.acquired_at + 1.5 - stop_margin(1.5, 0.1) + 0.5
        redis_server.start()
        lease2 = await a.acquire("rtc_8")
        assert lease2 is not None
        assert await b.acquire("rtc_8") is None
        with trio.move_on_after(1.2):                      # renewed past its TTL: still held
            await keep_lease(a, lease2, close_deadline_s=0.1)
            raise AssertionError("a renewable lease was given up")
        assert await b.acquire("rtc_8") is None
        nursery.cancel_scope.cancel()


async def test_a_lease_nobody_holds_any_more_is_taken_again_with_a_new_token(redis_server):
    async with trio.open_nursery() as nursery:
        a, b = await _two(redis_server, nursery)
        lease = await a.acquire("rtc_9")
        assert lease is not None
        await expire_lease_now(redis_server, "rtc_9", TTL)  # expired, nobody took it
        again = await a.renew(lease)
        assert again is not None and again.fence > lease.fence and a.lease_of("rtc_9") == again
        assert (await a.claim_write("rtc_9", "call_y")).state == WriteClaim.CLAIMED   # the new token is the fence
        redis_server.stop()                                  # a restart without persistence
        redis_server.start()
        with trio.fail_after(10):
            while True:
                try:
                    third = await a.renew(again)
                    break
                except RegistryDown:
                    await trio.sleep(0.05)
        assert third is not None and third.fence > again.fence
        assert await b.acquire("rtc_9") is None             # still one holder
        await a.release(third)
        assert a.lease_of("rtc_9") is None and await b.acquire("rtc_9") is not None
        nursery.cancel_scope.cancel()


def test_a_redis_url_of_another_scheme_is_refused_without_echoing_it(tmp_path):
    settings = Settings(journal=tmp_path, state_dir=tmp_path / "state", redis_url="http://user:s3cret@host:6379")
    with pytest.raises(InvalidSettings) as refused:
        settings.validate()
    assert "redis_url" in str(refused.value) and "s3cret" not in str(refused.value)
    Settings(journal=tmp_path, state_dir=tmp_path / "state", redis_url="redis://127.0.0.1:6379/0").validate()
