"""A Redis request cancelled between its send and its reply (its bound in
``redis_client.bounded``, or its caller's cancel) never leaves its
connection out of step: the next request on that connection reads its own
reply, never the cancelled one's.

The window is made real by ``CLIENT PAUSE`` (another client's): the server
holds every command it receives until the pause ends, so the bound expires
with the command sent and its reply not yet come. Each client here has one
connection (``max_connections=1``), so the next request must use the very
connection the cancelled one left. coredis (6.x) queues every request on its
connection in order and a cancelled request stays queued, consuming its own
reply when it comes; a cancelled blocking read (``XREAD BLOCK``) closes its
connection instead. These tests pin that against a coredis upgrade."""

from __future__ import annotations

import pytest
import trio

from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.redis_client import RegistryDown

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

PAUSE_MS = 1000     # far past the cancelled requests' bound: their replies come only after it
BOUND_S = 0.1


async def _cancelled_by_its_bound(request) -> None:
    with pytest.raises(RegistryDown) as caught:
        await rc.bounded(request, BOUND_S)
    assert caught.value.timed_out             # cancelled with its reply still to come


async def test_the_request_after_a_cancelled_one_reads_its_own_reply(redis_server):
    async with rc.client(redis_server.url, max_connections=1) as redis, rc.client(redis_server.url) as pauser:
        await redis.set("a", "A")
        await redis.set("b", "B")
        await pauser.client_pause(PAUSE_MS)
        await _cancelled_by_its_bound(redis.get("a"))
        await _cancelled_by_its_bound(rc.eval_script(redis, "return 'script'", [], []))
        assert await rc.bounded(redis.get("b"), 10.0) == "B"      # after the pause: not "A", not "script"
        answers: dict[int, str | None] = {}

        async def get(n: int) -> None:
            answers[n] = await rc.bounded(redis.get("a" if n % 2 else "b"), 10.0)

        async with trio.open_nursery() as nursery:                 # many at once on the one connection
            for n in range(20):
                nursery.start_soon(get, n)
        assert answers == {n: "A" if n % 2 else "B" for n in range(20)}


async def test_a_script_cancelled_mid_request_leaves_the_next_script_its_own_answer(redis_server):
    """Our scripts as the registry sends them: a RENEW cancelled while the
    server holds it, then another script, each answered with its own value."""
    async with rc.client(redis_server.url, max_connections=1) as redis, rc.client(redis_server.url) as pauser:
        await redis.set(rc.lease_key("rtc_a"), "node:1", px=60_000)
        await pauser.client_pause(PAUSE_MS)
        await _cancelled_by_its_bound(rc.eval_script(redis, rc.RENEW, [rc.lease_key("rtc_a")], ["node:1", 60_000]))
        # a lease nobody holds: -1 (the cancelled RENEW's answer was 1)
        assert int(await rc.bounded(rc.eval_script(redis, rc.RENEW, [rc.lease_key("rtc_none")],
                                                   ["node:2", 60_000]), 10.0)) == -1
        assert await rc.bounded(redis.get(rc.lease_key("rtc_a")), 10.0) == "node:1"


async def test_a_cancelled_blocking_read_leaves_its_client_usable(redis_server):
    """coredis closes the connection of a blocking read cancelled mid-request
    (its reply can come any time); its pool slot comes back with it
    (``_SlotKeepingPool``), so the client's next requests get a connection:
    without that, a pool of one was spent by the first such cancel."""
    stream = "voiceactors:test:stream"
    async with rc.client(redis_server.url, max_connections=1) as redis:
        await redis.set("b", "B")
        for n in range(3):
            with trio.move_on_after(BOUND_S) as scope:             # nothing new to read: it blocks
                await rc.guarded(redis.xread({stream: "$"}, count=1, block=60_000))
            assert scope.cancelled_caught
            await rc.bounded(redis.xadd(stream, {"e": str(n)}), 5.0)   # what the cancelled read would have got
            assert await rc.bounded(redis.get("b"), 5.0) == "B"
        [(_, entries)] = (await rc.bounded(redis.xread({stream: "0-0"}, count=10, block=1), 5.0)).items()
        assert [e.field_values["e"] for e in entries] == ["0", "1", "2"]
