"""Two and three ``voiceactors serve`` processes sharing one Redis (issue
18), as real child processes on loopback against our simulator, each with
its own state folder, all on one journal.

* duplicate connects on every process start one actor (one sideband);
* kill -9 of the holder mid-call: exactly one other process takes the call
  over within the lease TTL plus a reconnect and answers the pending tool
  calls exactly once, no write applied twice (the fixture's ledger checked):
  a write that never applied gets the restart error, a write the holder
  applied but never answered (its sideband dropped before the service had
  the output) gets the output it produced, from the shared write log;
* Redis gone: a call in progress stops before its lease can expire, new
  connects answer 503 with a clear error, ``/status`` says so, the server
  keeps running, and connects work again when Redis returns;
* Redis restarted without its data mid-call: the holder keeps the call, a
  write after it is applied once, the feed from the other process loses nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest
import trio

from calls_support import DAY, KEY
from cluster_support import TTL_S, ClusterServer, mirrored, started_calls, stop_all, stop_cleanly, takers
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from test_call_crash import _wait_for_line, crash_scenario
from test_cluster_feed_serve import Watcher, _is
from test_reliability_faults import item_file, ledger_close_edits, open_item
from voiceactors.executor import write_log
from voiceactors.call.record import read_record, record_path
from voiceactors.call.recovery import RESTARTED_OUTPUT
from voiceactors.cluster import redis_client as rc
from voiceactors.http import errors as E
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import SimCall, Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

CALL = "rtc_cluster"
# kill -9 to the taker's answer: the dead holder's lease expires within a TTL
# (it renewed it at most a sixth of one before), an orphan scan (every third
# of a TTL) finds it, then the taker's start and sideband connect on loopback
# (a fraction of a second, more on a loaded 2-core machine: 2 s of slack)
TAKEOVER_BOUND_S = TTL_S + TTL_S / 3 + 2.0
# the holder's sideband backoff, once it dropped: it is still waiting when it is killed
HOLDER_RECONNECT_S = "60"

#: Three processes: exactly one of the two survivors must act (with two the
#: survivor has no rival, so three covers what two would and more).
THREE = 3


@pytest.mark.parametrize("processes", [THREE])
async def test_duplicate_connects_on_several_processes_start_one_actor(tmp_path, redis_server, processes):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, [{"sleep": 120}])
    servers: list[ClusterServer] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            servers = [ClusterServer(journal, tmp_path / f"state_{i}", sim, redis_server) for i in range(processes)]
            urls = [await server.start(nursery) for server in servers]
            answers: list[httpx.Response] = []

            async def connect(url: str) -> None:
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    answers.append(await client.post("/api/voice/connect", json={"call_id": CALL}))

            async with trio.open_nursery() as racers:      # at once, on both, twice each
                for url in urls * 2:
                    racers.start_soon(connect, url)
            assert [r.status_code for r in answers] == [200] * 2 * processes, [r.text for r in answers]
            assert all(r.json()["status"] == "connected" for r in answers)
            with trio.fail_after(10):
                await sc.wait_until(lambda c: c.connection is not None)
            assert started_calls(*servers) == [CALL]
            [holder] = [s for s in servers if s.events("supervisor.call_started")]
            others = [s for s in servers if s is not holder]
            assert all(other.events("supervisor.call_held_elsewhere") for other in others)
            assert not takers(*servers)
            await trio.sleep(TTL_S * 1.5)                 # renewals keep it: still one actor
            async with httpx.AsyncClient(base_url=urls[0], timeout=10) as client:
                status = (await client.get("/api/voice/status")).json()
            assert status["cluster"]["backend"] == "redis" and status["cluster"]["reachable"] is True
            assert started_calls(*servers) == [CALL] and not takers(*servers)
            assert sc.connections == 1 and [h["call_id"] for h in sim.handshakes] == [CALL]
            assert not holder.events("supervisor.lease_lost")
            nursery.cancel_scope.cancel()
    finally:
        stop_all(*servers)


@pytest.mark.parametrize("processes", [THREE])
async def test_kill_9_of_the_holder_exactly_one_other_process_takes_the_call_over(tmp_path, redis_server,
                                                                                   processes):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    day_file = item_file(journal, item)
    before = day_file.read_bytes()
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, crash_scenario(item.id))
    servers: list[ClusterServer] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            servers = [ClusterServer(journal, tmp_path / f"state_{i}", sim, redis_server) for i in range(processes)]
            a, others = servers[0], servers[1:]
            url_a = await a.start(nursery)
            for other in others:
                await other.start(nursery)
            async with _holder_at_the_write(url_a, day_file, record_path(tmp_path / "state_0", CALL)):
                await mirrored(redis_server.url, CALL, {"call_w"})
                killed = await _kill_9(a)                                # mid-call, the write not applied
            # once, honestly: it never applied
            record_b = await _taken_over_once(sc, servers, tmp_path, RESTARTED_OUTPUT, killed)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(*servers)
    lines = read_record(record_b)
    assert lines[0]["kind"] == "start" and lines[0]["rejoined"] is True and lines[0]["recovered"] == ["call_w"]
    [settled] = [x for x in lines if x["kind"] == "tool_call"]
    assert settled["tool_call_id"] == "call_w" and settled["outcome"] == "restarted"
    # the write never applied anywhere: never twice
    for i in range(processes):
        assert write_log.load(tmp_path / f"state_{i}", "call_w") is None
    assert ledger_close_edits(day_file, item.id) == [] and day_file.read_bytes() == before


@contextlib.asynccontextmanager
async def _holder_at_the_write(url_a: str, day_file: Path, record_a: Path) -> AsyncIterator[None]:
    """The call connected on the holder (``url_a``), its read settled and its
    write waiting for the day file's lock, which is held until the block ends."""
    with open(f"{day_file}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            async with httpx.AsyncClient(base_url=url_a, timeout=10) as client:
                response = await client.post("/api/voice/connect", json={"call_id": CALL})
                assert response.status_code == 200, response.text
            await _wait_for_line(record_a, "tool_started", "call_w")
            await _wait_for_line(record_a, "tool_call", "call_r")   # the read settled
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


async def _kill_9(server: ClusterServer) -> float:
    """SIGKILL ``server``; when it was killed (trio's clock)."""
    server.proc.kill()
    killed = trio.current_time()
    with trio.fail_after(10):
        assert await server.proc.wait() == -9
    return killed


async def _taken_over_once(sc: SimCall, servers: list[ClusterServer], tmp_path: Path, output: str,
                           killed: float) -> Path:
    """Exactly one of the holder's (``servers[0]``) others finds its expired
    lease itself (nobody calls /connect again) and answers the pending write
    ``output`` once, the settled read not again; the others are stopped
    cleanly. The taker's call record."""
    others = servers[1:]
    with trio.fail_after(TTL_S + 10):
        await sc.wait_until(lambda c: "call_w" in c.outputs and c.step_index >= 4)
    _check_takeover_time(trio.current_time() - killed)
    assert sc.outputs["call_w"] == [output]
    assert len(sc.outputs["call_r"]) == 1                    # the settled read is not answered again
    assert sc.violations == [] and sc.connections == 2
    await trio.sleep(TTL_S)                                  # a second taker would have come by now
    [take_over] = takers(*others)
    assert take_over["call_id"] == CALL and take_over["pending"] == 1
    [b] = [other for other in others if other.events("supervisor.take_over")]
    record_b = record_path(tmp_path / f"state_{servers.index(b)}", CALL)
    await _wait_for_line(record_b, "tool_call", "call_w")
    assert sc.outputs["call_w"] == [output] and sc.connections == 2
    await stop_cleanly(*others)
    return record_b


def _check_takeover_time(taken_after: float) -> None:
    assert taken_after < TAKEOVER_BOUND_S, \
        f"taken over and answered {taken_after:.2f} s after the kill (bound {TAKEOVER_BOUND_S:.2f} s)"


async def _shared_record(url: str, tool_call_id: str) -> dict | None:
    """The shared write log's record of ``tool_call_id`` (None: none, or only a claim)."""
    async with rc.client(url) as redis:
        text = await redis.get(rc.write_key(tool_call_id))
    return None if text is None or text.startswith(rc.APPLYING) else json.loads(text)


@pytest.mark.parametrize("processes", [THREE])
async def test_kill_9_after_a_write_applied_unanswered_the_taker_answers_it_once_from_the_shared_log(
        tmp_path, redis_server, processes):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    day_file = item_file(journal, item)
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call(CALL, crash_scenario(item.id))
    servers: list[ClusterServer] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            servers = [ClusterServer(journal, tmp_path / f"state_{i}", sim, redis_server) for i in range(processes)]
            a, others = servers[0], servers[1:]
            a.env["VOICEACTORS_RECONNECT_BASE"] = a.env["VOICEACTORS_RECONNECT_MAX"] = HOLDER_RECONNECT_S
            url_a = await a.start(nursery)
            for other in others:
                await other.start(nursery)
            async with _holder_at_the_write(url_a, day_file, record_path(tmp_path / "state_0", CALL)):
                # the next output (the write's) drops the socket before the service has it
                sc.output_fault = "lost"
            # the write applies now
            with trio.fail_after(30):
                await sc.wait_until(lambda c: "call_w" in c.lost_outputs)
                while not a.events("call.reconnecting"):         # a waits out its backoff
                    await trio.sleep(0.02)
            [backoff] = a.events("call.reconnecting")
            assert backoff["delay_s"] >= float(HOLDER_RECONNECT_S) / 2
            # applied on a (its journal edit, its write log, the shared log), never answered
            applied = write_log.load(tmp_path / "state_0", "call_w")
            assert applied is not None and applied["outcome"] == "ok", applied
            assert await _shared_record(redis_server.url, "call_w") == applied
            assert sc.lost_outputs["call_w"] == [applied["output"]] and "call_w" not in sc.outputs
            assert len(ledger_close_edits(day_file, item.id)) == 1
            after = day_file.read_bytes()
            await mirrored(redis_server.url, CALL, {"call_w"})      # still pending for a taker
            killed = await _kill_9(a)                                # in its backoff
            # once: what the write produced
            record_b = await _taken_over_once(sc, servers, tmp_path, applied["output"], killed)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(*servers)
    lines = read_record(record_b)
    assert lines[0]["kind"] == "start" and lines[0]["rejoined"] is True and lines[0]["recovered"] == ["call_w"]
    [settled] = [x for x in lines if x["kind"] == "tool_call"]
    assert settled["tool_call_id"] == "call_w" and settled["outcome"] == "replayed" and settled["delivered"]
    # the taker answered from the shared log's record (copied into its own), applied nothing
    for i in range(1, processes):
        state = tmp_path / f"state_{i}"
        assert write_log.load(state, "call_w") == (applied if record_b.is_relative_to(state) else None)
    assert len(ledger_close_edits(day_file, item.id)) == 1 and day_file.read_bytes() == after


async def test_redis_gone_new_connects_503_status_says_so_and_it_recovers(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    live = sim.add_call("rtc_live", [{"sleep": 120}])
    sim.add_call("rtc_after", [{"sleep": 120}])
    a = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a = ClusterServer(journal, tmp_path / "state_a", sim, redis_server)
            url = await a.start(nursery)
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                assert (await client.post("/api/voice/connect", json={"call_id": "rtc_live"})).status_code == 200
            with trio.fail_after(10):
                await live.wait_until(lambda c: c.connection is not None)
            redis_server.stop()
            gone = trio.current_time()
            # the call in progress stops itself before its lease (renewed at most a sixth of a TTL ago) could expire
            with trio.fail_after(TTL_S + 5):
                while not a.events("supervisor.lease_lost"):
                    await trio.sleep(0.02)
            assert trio.current_time() - gone < TTL_S
            [lost] = a.events("supervisor.lease_lost")
            assert lost["call_id"] == "rtc_live" and lost["why"] == "unrenewable"
            with trio.fail_after(10):
                await live.wait_until(lambda c: c.connection is None)
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                with trio.fail_after(10):
                    refused = await client.post("/api/voice/connect", json={"call_id": "rtc_during"})
                assert refused.status_code == 503
                assert refused.json() == {"error": E.REGISTRY_DOWN}
                # the actor leaves the supervisor's table a moment after its socket closed (it writes
                # its record's last lines first): wait for that, bounded, rather than read once
                with trio.fail_after(10):
                    while True:
                        status = await client.get("/api/voice/status")
                        if status.status_code == 200 and status.json().get("active_sessions") == 0:
                            break
                        await trio.sleep(0.05)
                assert status.json()["cluster"] == {"backend": "redis", "reachable": False, "leases_held": 0,
                                                  "active_sessions_here": 0}
                assert a.proc.poll() is None                       # still serving
                redis_server.start()                               # back, empty
                with trio.fail_after(10):
                    while True:
                        answer = await client.post("/api/voice/connect", json={"call_id": "rtc_after"})
                        if answer.status_code == 200:
                            break
                        assert answer.json() == {"error": E.REGISTRY_DOWN}
                        await trio.sleep(0.1)
                assert (await client.get("/api/voice/status")).json()["cluster"]["reachable"] is True
            assert a.events("supervisor.registry_down")
            assert a.events("supervisor.call_started")
            await stop_cleanly(a)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a)


def _feed(watcher: Watcher) -> list[dict]:
    """A watcher's call events, without the remote stream's own notices."""
    return [e for e in watcher.events if not e["type"].startswith("feed.")]


async def test_redis_restarted_without_its_data_mid_call_the_call_its_write_and_its_feed_carry_on(
        tmp_path, redis_server):
    """The holder keeps the call under a new lease; a write after the restart
    is claimed in the new Redis and applied once; a client following the
    call from the other process misses nothing and sees it in order."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    day_file = item_file(journal, item)
    sim = Simulator(None, api_key=KEY)
    # a turn before the restart; the write round well after it and the lease's retake
    sc = sim.add_call(CALL, [{"user_turn": {"text": "hello"}}, {"response": {"text": "Hi."}},
                             {"sleep_until": 10}] + crash_scenario(item.id))
    done = _is("transcript", role="assistant", text="Done.")
    a = b = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            a = ClusterServer(journal, tmp_path / "state_a", sim, redis_server)
            b = ClusterServer(journal, tmp_path / "state_b", sim, redis_server)
            url_a, url_b = await a.start(nursery), await b.start(nursery)
            async with httpx.AsyncClient(base_url=url_a, timeout=10) as client:
                assert (await client.post("/api/voice/connect", json={"call_id": CALL})).status_code == 200
            with trio.fail_after(10):
                await sc.wait_until(lambda c: c.connection is not None)
            here, there = Watcher(url_a, CALL), Watcher(url_b, CALL)    # the holder's client; the other's
            nursery.start_soon(here.run, done)
            nursery.start_soon(there.run, done)
            with trio.fail_after(10):
                await here.connected.wait()
                await there.connected.wait()
            await there.saw(_is("transcript", role="assistant", text="Hi."), timeout_s=10)   # before the restart
            redis_server.stop()                       # every lease, the fence counter, the streams: gone
            redis_server.start()
            with trio.fail_after(TTL_S * 3):
                while not a.events("registry.lease_reacquired"):
                    await trio.sleep(0.05)
            assert "call_w" not in sc.outputs         # the write comes under the new lease
            await trio.sleep(TTL_S)                   # renewed since, under the new token
            async with httpx.AsyncClient(base_url=url_b, timeout=10) as client:
                answer = await client.post("/api/voice/connect", json={"call_id": CALL})
            assert answer.status_code == 200 and answer.json()["status"] == "connected"
            with trio.fail_after(30):
                await here.done.wait()
                await there.done.wait()
            assert b.events("supervisor.call_held_elsewhere") and not b.events("supervisor.call_started")
            assert not a.events("supervisor.lease_lost")
            assert sc.connections == 1 and sc.connection is not None and not sc.closed
            record = await _shared_record(redis_server.url, "call_w")
            nursery.cancel_scope.cancel()
    finally:
        stop_all(a, b)
    assert sc.violations == [] and sc.error_codes == []
    [output] = sc.outputs["call_w"]
    assert "error" not in json.loads(output), output
    assert record is not None and record["output"] == output  # claimed and recorded in the new Redis
    assert len(ledger_close_edits(day_file, item.id)) == 1
    # the other process's client: every event the holder's own client saw, the same ids, in order
    assert any(e["type"] == "tool.finished" and e.get("tool_call_id") == "call_w" for e in here.events)
    assert _feed(there) == here.events
    assert here.events[0]["type"] == "transcript" and here.events[-1]["text"] == "Done."
    kinds = [e["type"] for e in there.events]
    assert kinds.count("feed.interrupted") == kinds.count("feed.resumed") <= 1
