"""Concurrent ``/mcp`` writes with one idempotency key on two ``serve
--redis`` processes (issue 34, item 8): the write is applied once, and every
answer says applied, with the winner's result, as a duplicate on one process
gets it. Before, the requests that found the key claimed by a run still
applying it answered "another server started this write and its outcome is
unknown" at once.

Real ``voiceactors serve`` children on loopback, one real redis-server, the
SDK's MCP client; the journal day file's lock is held so the first write
waits inside its claim while the others arrive.
"""

from __future__ import annotations

import fcntl

import pytest
import trio

from calls_support import DAY
from cluster_support import ClusterServer, stop_all
from mcp_server_support import mcp_client
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from test_reliability_faults import item_file, ledger_close_edits, open_item
from voiceactors.cluster import redis_client as rc
from voiceactors.journal.sample import write_sample_journal
from voiceactors.mcp.server.tools import IDEMPOTENCY_META_KEY, WRITE_ID_PREFIX
from voiceactors.simulator import Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

KEY = "close-shared-1"
# how long the others' requests get to answer while the first write is held:
# on the code that answered "outcome unknown" at once they all had by then
HELD_S = 1.5


async def test_same_key_writes_on_two_processes_all_say_applied_with_one_result(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    day_file = item_file(journal, item)
    sim = Simulator(None)
    servers: list[ClusterServer] = []
    answers: list[dict] = []

    async def complete(url: str, resolution: str) -> None:
        async with mcp_client(url) as client:
            result = await client.call_tool("commitments.complete", {"commitment_id": item.id,
                                                                     "resolution": resolution},
                                            meta={IDEMPOTENCY_META_KEY: KEY})
        answers.append({"is_error": result.is_error, "body": result.structured_content})

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            servers = [ClusterServer(journal, tmp_path / f"state_{i}", sim, redis_server) for i in range(2)]
            for server in servers:
                server.env["VOICEACTORS_JOURNAL_LOCK_TIMEOUT"] = "30"   # the first write waits for our lock
            urls = [await server.start(nursery) for server in servers]
            lock = open(f"{day_file}.lock", "a+b")
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                async with trio.open_nursery() as requests:
                    requests.start_soon(complete, urls[0], "done")
                    async with rc.client(redis_server.url) as redis:   # the first claimed it, and waits
                        with trio.fail_after(20):
                            while await redis.get(rc.write_key(WRITE_ID_PREFIX + KEY)) != rc.APPLYING + rc.UNFENCED:
                                await trio.sleep(0.02)
                    # the same key on the other process twice, and once more on the first
                    for url, resolution in ((urls[1], "dropped"), (urls[1], "done"), (urls[0], "dropped")):
                        requests.start_soon(complete, url, resolution)
                    with trio.move_on_after(HELD_S):
                        while not answers:
                            await trio.sleep(0.02)
                    assert answers == [], "answered while the first write was still applying"
                    fcntl.flock(lock, fcntl.LOCK_UN)
            finally:
                lock.close()
            nursery.cancel_scope.cancel()
    finally:
        stop_all(*servers)
    assert len(answers) == 4
    assert all(not answer["is_error"] for answer in answers), answers
    assert len({repr(answer["body"]) for answer in answers}) == 1, answers   # the winner's result, each
    assert answers[0]["body"]["commitment"]["state"] == "closed"
    assert len(ledger_close_edits(day_file, item.id)) == 1
