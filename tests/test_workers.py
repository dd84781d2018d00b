"""``voiceactors serve --workers N`` (issue 18): a real parent process, its
worker processes and its private redis-server, on loopback, the simulator as
the Realtime peer.

* two workers answer on one port, the calls are spread over both (each call
  started once), every worker's history lists every call, and SIGTERM to the
  parent stops the workers and the Redis within the shutdown bound, exit 0;
* kill -9 of the worker holding a call: the parent starts it again, and the
  call is taken over exactly once (its pending write answered once, honestly);
* kill -9 of the parent: the workers (stdin at end of file) and its Redis stop;
* kill -9 of the private Redis, its next start failing: the parent starts it
  again after its back-off, the call is kept under a new lease, a new call starts;
* without redis-server on PATH and without --redis, `serve --workers 2`
  refuses at start with a clear message.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from calls_support import DAY, KEY
from cluster_support import TTL_S, WorkersServer, alive, kill_9, mirrored, started_calls, stop_all, takers
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from test_call_crash import _wait_for_line, crash_scenario
from test_reliability_faults import ROOT, item_file, ledger_close_edits, open_item
from voiceactors.call.record import record_path
from voiceactors.call.recovery import RESTARTED_OUTPUT
from voiceactors.cluster import redis_client as rc
from voiceactors.journal.sample import write_sample_journal
from voiceactors.settings import Settings, shutdown_deadlines
from voiceactors.simulator import Simulator
from voiceactors.workers import worker_state_dir

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

CALLS = 16      # all on one worker by chance: 2 * 2**-16


async def _connect_each_on_its_own_connection(url: str, call_ids: list[str]) -> None:
    # a fresh connection per call: a new source port, so the kernel's hash picks the worker anew
    for call_id in call_ids:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            answer = await client.post("/api/voice/connect", json={"call_id": call_id})
            assert answer.status_code == 200 and answer.json()["status"] == "connected", answer.text


async def _wait_gone(pids: list[int], within_s: float) -> None:
    with trio.fail_after(within_s):
        while any(alive(pid) for pid in pids):
            await trio.sleep(0.05)


async def test_two_workers_share_one_port_spread_the_calls_and_stop_on_sigterm(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    ids = [f"rtc_spread_{i}" for i in range(CALLS)]
    scripted = [sim.add_call(call_id, [{"sleep": 120}]) for call_id in ids]
    state = tmp_path / "state"
    parent = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            parent = WorkersServer(journal, state, sim, workers=2)
            url = await parent.start(nursery)
            await _connect_each_on_its_own_connection(url, ids)
            with trio.fail_after(20):
                for sc in scripted:
                    await sc.wait_until(lambda c: c.connection is not None)
            assert sorted(started_calls(parent)) == sorted(ids)           # each call once
            by_worker = {w: {x["call_id"] for x in parent.worker_events("supervisor.call_started", w)}
                         for w in (0, 1)}
            assert by_worker[0] and by_worker[1], by_worker                 # spread over both
            assert all(sc.connections == 1 for sc in scripted)
            records = [record_path(worker_state_dir(state, w), call_id)      # each its own state folder
                       for w in (0, 1) for call_id in by_worker[w]]
            with trio.fail_after(10):                                      # the record writer's moment
                while not all(path.exists() for path in records):
                    await trio.sleep(0.05)
            # any worker's history shows every worker's calls (fresh connections reach both)
            for _ in range(4):
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    listed = (await client.get("/api/voice/calls?limit=200")).json()["calls"]
                    assert sorted(c["call_id"] for c in listed) == sorted(ids)
                    one = sorted(by_worker[1])[0]
                    detail = await client.get(f"/api/voice/calls/{one}")
                    assert detail.status_code == 200 and detail.json()["call"]["call_id"] == one
            history_workers = {x["worker"] for x in parent.events("http.request")
                               if x.get("path", "").startswith("/api/voice/calls")}
            assert history_workers <= {0, 1} and history_workers
            children = parent.pids()
            assert len(children) == 3 and all(alive(pid) for pid in children)
            parent.proc.terminate()
            bound = shutdown_deadlines(Settings(journal=journal, state_dir=state)).hypercorn_s
            with trio.fail_after(bound + 5):
                assert await parent.proc.wait() == 0
            await _wait_gone(children, 5)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(parent)
    assert [x["returncode"] for x in parent.events("workers.worker_stopped")] == [0, 0]
    assert not parent.events("workers.worker_exited")


async def test_a_killed_worker_is_restarted_and_its_call_taken_over_once(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = open_item(journal)
    day_file = item_file(journal, item)
    before = day_file.read_bytes()
    sim = Simulator(None, api_key=KEY)
    call = "rtc_workers_crash"
    sc = sim.add_call(call, crash_scenario(item.id))
    state = tmp_path / "state"
    parent = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            parent = WorkersServer(journal, state, sim, workers=2)
            url = await parent.start(nursery)
            lock = open(f"{day_file}.lock", "a+b")
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)      # the write waits for it on the holder
            try:
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    assert (await client.post("/api/voice/connect", json={"call_id": call})).status_code == 200
                with trio.fail_after(20):
                    while not started_calls(parent):
                        await trio.sleep(0.05)
                [started] = parent.events("supervisor.call_started")
                holder = started["worker"]
                record = record_path(worker_state_dir(state, holder), call)
                await _wait_for_line(record, "tool_started", "call_w")
                await _wait_for_line(record, "tool_call", "call_r")
                [redis] = parent.events("workers.redis_started")
                await mirrored(f"unix://{redis['socket']}", call, {"call_w"})
                killed_pid = parent.worker_pid(holder)
                kill_9(killed_pid)
                killed = trio.current_time()
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
                lock.close()
            with trio.fail_after(30):                              # the parent starts it again
                while len(parent.worker_events("workers.worker_serving", holder)) < 2:
                    await trio.sleep(0.05)
            [exited] = parent.worker_events("workers.worker_exited", holder)
            assert exited["returncode"] == -9
            assert parent.worker_pid(holder) != killed_pid and alive(parent.worker_pid(holder))
            with trio.fail_after(TTL_S + 20):
                await sc.wait_until(lambda c: "call_w" in c.outputs and c.step_index >= 4)
            await trio.sleep(TTL_S)                                # a second taker would have come by now
            # exactly one taker: another worker's scan (take_over) or, if it came first, the restarted
            # worker's rejoin of its own record; the other one finds the lease held
            assert started_calls(parent) == [call, call]
            taker = parent.events("supervisor.call_started")[1]["worker"]
            assert len(takers(parent)) == (1 if taker != holder else 0)
            assert sc.outputs["call_w"] == [RESTARTED_OUTPUT]      # once, honestly: it never applied
            assert len(sc.outputs["call_r"]) == 1
            assert sc.violations == [] and sc.connections == 2
            assert trio.current_time() - killed < TTL_S + TTL_S / 3 + 15   # a TTL, a scan or a restart, a reconnect
            parent.proc.terminate()
            with trio.fail_after(30):
                assert await parent.proc.wait() == 0
            nursery.cancel_scope.cancel()
    finally:
        stop_all(parent)
    assert ledger_close_edits(day_file, item.id) == [] and day_file.read_bytes() == before


async def test_kill_9_of_the_parent_stops_its_workers_and_its_redis(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    parent = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            parent = WorkersServer(journal, tmp_path / "state", sim, workers=2)
            await parent.start(nursery)
            children = parent.pids()
            parent.proc.kill()
            with trio.fail_after(10):
                assert await parent.proc.wait() == -9
            await _wait_gone(children, 30)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(parent)


async def test_ctrl_c_at_the_terminal_stops_every_worker_gracefully(tmp_path):
    """SIGINT to the whole process group, as a terminal sends it: the workers
    are in their own sessions, so each gets one SIGTERM from the parent and
    shuts down gracefully (a second signal would have cut that short, 130)."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    live = sim.add_call("rtc_ctrl_c", [{"sleep": 120}])
    parent = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            parent = WorkersServer(journal, tmp_path / "state", sim, workers=2)
            parent.session = True
            url = await parent.start(nursery)
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                assert (await client.post("/api/voice/connect", json={"call_id": "rtc_ctrl_c"})).status_code == 200
            with trio.fail_after(20):
                await live.wait_until(lambda c: c.connection is not None)
            children = parent.pids()
            os.killpg(parent.proc.pid, signal.SIGINT)
            with trio.fail_after(60):
                assert await parent.proc.wait() == 0
            await _wait_gone(children, 5)
            nursery.cancel_scope.cancel()
    finally:
        stop_all(parent)
    assert [x["returncode"] for x in parent.events("workers.worker_stopped")] == [0, 0]
    assert live.closed or live.connection is None          # the call was closed, not left hanging


def test_without_redis_server_or_redis_workers_refuse_at_start(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    env.pop("VOICEACTORS_REDIS_URL", None)
    done = subprocess.run([sys.executable, "-m", "voiceactors.cli", "serve", "--journal", str(journal),
                           "--state-dir", str(tmp_path / "state"), "--port", "0", "--workers", "2"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "install redis-server" in done.stderr and "--redis" in done.stderr


async def test_workers_with_an_external_redis_use_it_and_start_no_redis_of_their_own(tmp_path, redis_server):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    ids = [f"rtc_external_{i}" for i in range(CALLS)]
    scripted = [sim.add_call(call_id, [{"sleep": 120}]) for call_id in ids]
    parent = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            parent = WorkersServer(journal, tmp_path / "state", sim, workers=2)
            parent.args += ["--redis", redis_server.url]
            url = await parent.start(nursery)
            await _connect_each_on_its_own_connection(url, ids)
            with trio.fail_after(20):
                for sc in scripted:
                    await sc.wait_until(lambda c: c.connection is not None)
            assert sorted(started_calls(parent)) == sorted(ids)            # each call once, on either worker
            assert not parent.events("workers.redis_started")                # the operator's Redis, not a private one
            assert len(parent.pids()) == 2
            async with rc.client(redis_server.url) as redis:                # every lease is in that Redis
                held = [await redis.exists([rc.lease_key(call_id)]) for call_id in ids]
            assert held == [1] * CALLS
            nursery.cancel_scope.cancel()
    finally:
        stop_all(parent)


def _redis_failing_once(folder: Path) -> Path:
    """A ``redis-server`` for PATH that runs the real one, but exits 1 at its
    second start (the first start after the private Redis died)."""
    folder.mkdir()
    script = folder / "redis-server"
    script.write_text(f"""#!/bin/sh
n=$(cat "{folder}/starts" 2>/dev/null || echo 0)
echo $((n + 1)) > "{folder}/starts"
[ "$n" = 1 ] && exit 1
exec "{REDIS_SERVER}" "$@"
""")
    script.chmod(0o755)
    return folder


async def test_the_private_redis_killed_is_started_again_after_a_failed_start_and_the_call_kept(tmp_path):
    """kill -9 of the private Redis, whose next start fails: the parent tries
    again after its back-off (it used to crash on its own assertion), the
    Redis comes back empty, the call's holder takes its lease again and
    keeps the call, and a new call connects and starts."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    sim = Simulator(None, api_key=KEY)
    sc = sim.add_call("rtc_kept", [{"sleep": 120}])
    after = sim.add_call("rtc_after", [{"sleep": 120}])
    parent = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            parent = WorkersServer(journal, tmp_path / "state", sim, workers=2)
            parent.env["PATH"] = f"{_redis_failing_once(tmp_path / 'bin')}:{parent.env['PATH']}"
            parent.env["VOICEACTORS_REDIS_LEASE_TTL"] = "6"      # outlives the failed start's back-off
            url = await parent.start(nursery)
            await _connect_each_on_its_own_connection(url, ["rtc_kept"])
            with trio.fail_after(20):
                await sc.wait_until(lambda c: c.connection is not None)
            [first] = parent.events("workers.redis_started")
            kill_9(int(first["pid"]))
            with trio.fail_after(30):
                while len(parent.events("workers.redis_started")) < 2:
                    assert parent.proc.poll() is None, parent.lines[-20:]
                    await trio.sleep(0.05)
                while not parent.events("registry.lease_reacquired"):
                    await trio.sleep(0.05)
            [failed] = parent.events("workers.redis_start_failed")
            assert "exited (1)" in failed["error"] and failed["retry_in_s"] == 1.0
            assert [e["returncode"] for e in parent.events("workers.redis_exited")] == [-9]
            with trio.fail_after(20):
                while True:           # a worker may not have seen the new Redis yet: 503 until it has
                    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                        answer = await client.post("/api/voice/connect", json={"call_id": "rtc_after"})
                    if answer.status_code == 200:
                        break
                    await trio.sleep(0.2)
                await after.wait_until(lambda c: c.connection is not None)
            assert not parent.events("supervisor.lease_lost")
            assert sc.connections == 1 and sc.connection is not None and not sc.closed
            assert sorted(started_calls(parent)) == ["rtc_after", "rtc_kept"]
            parent.proc.terminate()
            with trio.fail_after(30):
                assert await parent.proc.wait() == 0
            nursery.cancel_scope.cancel()
    finally:
        stop_all(parent)
