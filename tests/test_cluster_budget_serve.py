"""The daily budget across two ``voiceactors serve --redis`` processes (issue
18), real children on loopback against our simulator: a call's cost on A
makes B answer 503 ``budget spent``."""

from __future__ import annotations

import httpx
import pytest
import trio

from calls_support import DAY, KEY
from cluster_support import ClusterServer, stop_all, stop_cleanly
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from voiceactors.http import errors as E
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

SPEND = [{"user_turn": {"text": "hello there"}}, {"response": {"text": "Hi."}}, {"close": 1000}]   # $0.001296


async def test_a_calls_cost_on_one_process_spends_the_budget_on_the_other(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    call = sim.add_call("rtc_spend", SPEND)
    servers: list[ClusterServer] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            servers = [ClusterServer(journal, tmp_path / f"state_{i}", sim, redis_server) for i in range(2)]
            for server in servers:
                server.env["VOICEACTORS_DAILY_BUDGET_USD"] = "0.002"   # one call's cost each stays under it
            url_a, url_b = [await server.start(nursery) for server in servers]
            async with httpx.AsyncClient(base_url=url_a, timeout=10) as a, \
                    httpx.AsyncClient(base_url=url_b, timeout=10) as b:
                assert (await b.get("/api/voice/status")).json()["budget_spent"] is False
                assert (await a.post("/api/voice/connect", json={"call_id": "rtc_spend"})).status_code == 200
                with trio.fail_after(10):
                    await call.wait_until(lambda c: c.closed and c.connection is None)
                # B learns of A's cost within A's sync and its own (a second each)
                with trio.fail_after(10):
                    while (await b.get("/api/voice/status")).json()["daily_cost_usd"] != 0.001296:
                        await trio.sleep(0.05)
                assert (await b.get("/api/voice/status")).json()["budget_spent"] is False
                # a second call's cost on B itself: the sum crosses the budget for both
                second = sim.add_call("rtc_spend_b", SPEND)
                assert (await b.post("/api/voice/connect", json={"call_id": "rtc_spend_b"})).status_code == 200
                with trio.fail_after(10):
                    await second.wait_until(lambda c: c.closed and c.connection is None)
                with trio.fail_after(10):
                    while not (await a.get("/api/voice/status")).json()["budget_spent"]:
                        await trio.sleep(0.05)
                for client in (a, b):
                    refused = await client.post("/api/voice/session")
                    assert refused.status_code == 503 and refused.json() == {"error": E.BUDGET_SPENT}
                    assert (await client.get("/api/voice/status")).json()["daily_cost_usd"] == 0.002592
            await stop_cleanly(*servers)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(*servers)
