"""Fencing a paused holder (issue 18): "a paused holder (SIGSTOP past its
TTL, then SIGCONT) cannot send or write after takeover".

Two ``voiceactors serve`` processes share one real redis-server; the
simulator lets the newest sideband take a call over and records what still
arrives on an older one (``SimCall.supersede_sideband``). A holds the call
with a write waiting on the journal's lock (claimed in the shared write log,
not applied); A is stopped past its lease; B takes the call over, rejoins the
sideband and answers; A is continued with the lock free. A sends no event on
its old sideband, its write is refused at the journal file's replace (the
ledger unchanged), and A ends its side of the call.

Plus, in process: a holder's ``SendFence`` never allows while another
process could win the lease.
"""

from __future__ import annotations

import fcntl
import json
import signal

import httpx
import pytest
import trio

from calls_support import DAY, KEY
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from test_call_crash import _wait_for_line
from cluster_support import ClusterServer, mirrored, stop_all, stop_cleanly
from test_call_crash import crash_scenario
from test_reliability_faults import item_file, ledger_close_edits, open_item
from voiceactors.executor import write_log
from voiceactors.call.record import read_record, record_path
from voiceactors.call.recovery import RESTARTED_OUTPUT
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.fence import send_guard
from voiceactors.cluster.call_registry import RedisRegistry
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

TTL_S = 2.0
CALL = "rtc_paused"


async def test_a_paused_holder_sends_and_writes_nothing_after_the_takeover(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    day_file = item_file(journal, item)
    before = day_file.read_bytes()
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, crash_scenario(item.id))
    sc.supersede_sideband = True
    a = b = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a = ClusterServer(journal, tmp_path / "state_a", sim, redis_server)
            # A's write must still be waiting for the lock, not timed out, when A wakes
            a.env["VOICEACTORS_JOURNAL_LOCK_TIMEOUT"] = "60"
            a.env["VOICEACTORS_TOOL_TIMEOUT_WRITE"] = "60"
            b = ClusterServer(journal, tmp_path / "state_b", sim, redis_server)
            url_a = await a.start(nursery)
            await b.start(nursery)
            lock = open(f"{day_file}.lock", "a+b")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)      # A's write claims, then waits for it
            stopped = False
            try:
                async with httpx.AsyncClient(base_url=url_a, timeout=10) as client:
                    response = await client.post("/api/voice/connect", json={"call_id": CALL})
                    assert response.status_code == 200, response.text
                record_a = record_path(tmp_path / "state_a", CALL)
                await _wait_for_line(record_a, "tool_started", "call_w")
                await _wait_for_line(record_a, "tool_call", "call_r")   # the read settled
                await mirrored(redis_server.url, CALL, {"call_w"})
                assert sc.connection is not None and sc.connection.number == 1
                received_by_a = len(sc.received)
                a.proc.send_signal(signal.SIGSTOP)
                stopped = True
                # B finds the expired lease (its scan), rejoins and answers, while A sleeps
                with trio.fail_after(TTL_S + 15):
                    await sc.wait_until(lambda c: "call_w" in c.outputs and c.step_index >= 4)
                assert sc.connection is not None and sc.connection.number == 2
                assert sc.outputs["call_w"] == [RESTARTED_OUTPUT]   # A's claim: outcome unknown, not applied
                [take_over] = b.events("supervisor.take_over")
                assert take_over["call_id"] == CALL and take_over["pending"] == 1
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)           # free before A wakes: its write may go on
                lock.close()
                if stopped:
                    a.proc.send_signal(signal.SIGCONT)
            with trio.fail_after(20):
                while not any(line.get("event") == "call.ended" for line in a.lines):
                    await trio.sleep(0.05)
            await trio.sleep(0.5)                           # anything A would still send has arrived
            # nothing A sent after its lease arrived on its old sideband (events, not the close frame)
            assert sc.stale_received == []
            assert ledger_close_edits(day_file, item.id) == [] and day_file.read_bytes() == before
            [ended] = a.events("call.ended")
            assert ended["reason"] == "shutdown"
            assert a.events("supervisor.lease_lost")
            assert a.events("tool.write_fenced")            # A's write, woken: refused at the replace
            assert len(sc.received) >= received_by_a and sc.connection is not None and sc.connection.number == 2
            assert sc.outputs["call_w"] == [RESTARTED_OUTPUT] and len(sc.outputs["call_r"]) == 1
            assert sc.violations == []
            assert a.proc.poll() is None and b.proc.poll() is None
            await stop_cleanly(b, a)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a, b)
    # the write applied nowhere: the journal file as it was, no record of it on either side
    assert ledger_close_edits(day_file, item.id) == [] and day_file.read_bytes() == before
    assert write_log.load(tmp_path / "state_a", "call_w") is None
    assert write_log.load(tmp_path / "state_b", "call_w") is None
    lines_a = read_record(record_path(tmp_path / "state_a", CALL))
    [settled] = [x for x in lines_a if x["kind"] == "tool_call" and x["tool_call_id"] == "call_w"]
    assert settled["outcome"] == "rejected"


async def test_the_fence_never_allows_while_another_process_could_win_the_lease(redis_server):
    ttl = 0.5
    holder = RedisRegistry(redis_server.url, ttl, node="holder")
    other = RedisRegistry(redis_server.url, ttl, node="other")
    async with trio.open_nursery() as nursery:
        await nursery.start(holder.run)
        await nursery.start(other.run)
        guard = send_guard(ttl)
        sent = trio.current_time()
        lease = await holder.acquire(CALL)
        answered = trio.current_time()
        assert lease is not None
        fence = holder.fence_of(CALL)
        # counted from before the request went out, never from its answer
        assert fence is not None and sent + ttl - guard <= fence.until <= answered + ttl - guard
        # its actor runs (confirmed): another's acquire finds it held at once, not a lease to wait for
        assert await holder.confirm(lease)
        sent = trio.current_time()
        assert await holder.renew(lease) is lease                  # a renewal moves it on
        answered = trio.current_time()
        assert sent + ttl - guard <= fence.until <= answered + ttl - guard
        # the holder "pauses" (no more renewals): while its fence allows, nobody else wins the call
        with trio.fail_after(5):
            while fence.allows():
                assert await other.acquire(CALL) is None
                await trio.sleep(0.01)
            while await other.acquire(CALL) is None:
                await trio.sleep(0.01)
        assert not fence.allows()
        # its late renewal finds another token: the fence closes for good
        assert await holder.renew(lease) is None
        assert fence.until == float("-inf") and holder.fence_of(CALL) is None
        nursery.cancel_scope.cancel()


async def test_the_mirror_applies_a_burst_of_lines_in_order(redis_server):
    holder = RedisRegistry(redis_server.url, 5.0, node="holder")
    async with trio.open_nursery() as nursery:
        await nursery.start(holder.run)
        for call_id in ("rtc_one", "rtc_two"):
            assert await holder.acquire(call_id) is not None
        # noted in one step, so the writer takes them as one batch: a start and its settle in it cancel out
        for call_id in ("rtc_one", "rtc_two"):
            for n in range(3):
                holder.note_record(call_id, {"kind": "tool_started", "tool_call_id": f"call_{n}", "tool": "t"})
            holder.note_record(call_id, {"kind": "tool_call", "tool_call_id": "call_1"})
        holder.note_record("rtc_not_held", {"kind": "tool_started", "tool_call_id": "call_x", "tool": "t"})
        async with rc.client(redis_server.url) as redis:
            with trio.fail_after(5):
                while len(await redis.hgetall(rc.pending_key("rtc_two"))) != 2:
                    await trio.sleep(0.01)
            for call_id in ("rtc_one", "rtc_two"):
                pending = await redis.hgetall(rc.pending_key(call_id))
                assert set(pending) == {"call_0", "call_2"}
                assert json.loads(pending["call_0"])["tool"] == "t"
            assert await redis.hgetall(rc.pending_key("rtc_not_held")) == {}
        nursery.cancel_scope.cancel()
