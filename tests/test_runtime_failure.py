"""A failed runtime is a failed process (docs/reliability.md § 14.1): once
the runtime crashed (``http.runtime_failed``), ``/api/voice/status`` answers
503 ``voice unavailable — runtime failed``, the server stops and
``voiceactors serve`` exits 3, and ``serve --workers``' parent starts that
worker again.

No input can fail the runtime since text comes in through ``safe_text``:
the failure is planted below it (``planted_surrogate``: coredis's packer
given a lone surrogate for a marker, raising what it raised for the
reproduction's input before the fix). Real redis-server, our simulator,
real processes for the workers."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import trio

import planted_surrogate
from calls_support import DAY, KEY
from clock_support import serving
from cluster_support import WorkersServer, stop_all
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from test_context_calls import SIM_KEY, sim  # noqa: F401  (the fixture)
from voiceactors.http import create_app
from voiceactors.http.app import voice_state
from voiceactors.http.errors import RUNTIME_FAILED
from voiceactors.journal.sample import write_sample_journal
from voiceactors.server import RuntimeFailed, run_server
from voiceactors.settings import Settings
from voiceactors.simulator import Simulator

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")

TESTS = Path(__file__).resolve().parent
#: A call whose user says the marker: its transcript goes through the shared feed's batch.
FAILING_CALL = [{"user_turn": {"text": f"say {planted_surrogate.MARKER}"}}, {"sleep": 0.3}, {"close": 1000}]


def settings_for(journal: Path, tmp_path: Path, sim: Simulator, redis_url: str) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                    openai_base_url=sim.base_url, rate_limit_per_s=0, close_deadline_s=1.0, redis_url=redis_url,
                    port=0)


async def test_a_failed_runtime_makes_status_503(make_sample, tmp_path, sim, pin_today, redis_server,  # noqa: F811
                                                 monkeypatch):
    pin_today(DAY.isoformat())
    planted_surrogate.install(monkeypatch)
    app = create_app(settings_for(make_sample(days=2), tmp_path, sim, redis_server.url))
    async with serving(app) as test_app:
        client = test_app.test_client()
        assert (await client.get("/api/voice/status")).status_code == 200
        call = sim.add_call("rtc_fails_runtime", FAILING_CALL)
        assert (await client.post("/api/voice/connect", json={"call_id": "rtc_fails_runtime"})).status_code == 200
        with trio.fail_after(20):
            await voice_state(app).runtime_failed.wait()
        assert voice_state(app).runtime is None
        response = await client.get("/api/voice/status")
        assert response.status_code == 503
        assert await response.get_json() == {"error": RUNTIME_FAILED}
        assert call.connections == 1


async def test_a_failed_runtime_stops_the_server(make_sample, tmp_path, sim, pin_today, redis_server,  # noqa: F811
                                                 monkeypatch):
    """``run_server``: the runtime's failure starts the graceful shutdown by
    itself (no signal) and ``RuntimeFailed`` comes out after it (the command
    maps it to exit 3)."""
    pin_today(DAY.isoformat())
    planted_surrogate.install(monkeypatch)
    settings = settings_for(make_sample(days=2), tmp_path, sim, redis_server.url)
    sim.add_call("rtc_stops_server", FAILING_CALL)
    never = trio.Event()
    with pytest.RaisesGroup(RuntimeFailed, flatten_subgroups=True):
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                [base] = await nursery.start(
                    lambda task_status: run_server(settings, shutdown_trigger=never.wait, task_status=task_status))
                async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                    answer = await client.post("/api/voice/connect", json={"call_id": "rtc_stops_server"})
                    assert answer.status_code == 200


async def test_a_worker_whose_runtime_failed_exits_3_and_is_started_again(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=2, today=DAY)
    simulator = Simulator(None, api_key=KEY)
    simulator.add_call("rtc_worker_fails", FAILING_CALL)
    later = [simulator.add_call(f"rtc_after_{n}", [{"user_turn": {"text": "Hello."}}, {"response": {"text": "Hi."}},
                                                   {"sleep": 0.3}, {"close": 1000}]) for n in range(4)]
    parent = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(simulator.serve, 0)
            parent = WorkersServer(journal, tmp_path / "state", simulator, workers=2)
            site = planted_surrogate.site_folder(tmp_path)
            parent.env["PYTHONPATH"] = os.pathsep.join([str(site), str(TESTS), parent.env.get("PYTHONPATH", "")])
            url = await parent.start(nursery)
            with trio.fail_after(60):
                while len(parent.events("workers.worker_serving")) < 2:
                    await trio.sleep(0.05)
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                assert (await client.post("/api/voice/connect", json={"call_id": "rtc_worker_fails"})).status_code == 200
            with trio.fail_after(60):
                while not parent.events("workers.worker_exited"):
                    await trio.sleep(0.05)
            [failed] = parent.events("http.runtime_failed")
            index = failed["worker"]
            [exited] = parent.worker_events("workers.worker_exited", index)
            assert exited["returncode"] == 3
            with trio.fail_after(60):                       # started again, after its back-off
                while len(parent.worker_events("workers.worker_serving", index)) < 2:
                    await trio.sleep(0.05)
            # every later connect is served (fresh connections: either worker)
            for sc in later:
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    assert (await client.get("/api/voice/status")).status_code == 200
                    answer = await client.post("/api/voice/connect", json={"call_id": sc.call_id})
                    assert answer.status_code == 200, answer.text
            with trio.fail_after(30):
                for sc in later:
                    await sc.wait_until(lambda c: c.closed and len(c.responses) == 1)
            parent.proc.terminate()
            with trio.fail_after(30):
                assert await parent.proc.wait() == 0
            nursery.cancel_scope.cancel()
    finally:
        stop_all(parent)
    assert len(parent.events("http.runtime_failed")) == 1
