"""End to end: create_app + the Realtime simulator on loopback.

Session mint carries the instruction and the ten tools; connect starts a
call actor that joins the simulator's call; a tool call flows back; status
counts the call; the client feed streams over SSE; shutdown leaves no task
behind; and no key ever reaches the log stream.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import httpx
import pytest
import trio

from calls_support import our_tasks
from clock_support import serving
from voiceactors.http import create_app, voice_state
from voiceactors.simulator import Simulator
from voiceactors.server import run_server
from voiceactors.settings import Settings
from voiceactors.agents import DEFAULT_AGENTS
from voiceactors.tools.registry import REGISTRY
from simulator_support import serving_simulator

DAY = dt.date(2026, 3, 27)
SIM_KEY = "sk-test-e2e-4f9a8b7c6d5e"


@pytest.fixture
def journal(make_sample) -> Path:
    """A fresh copy per test: tests edit the voice config and the brain writes its session file."""
    return make_sample(days=3)


@pytest.fixture
async def sim():
    async with serving_simulator(Simulator("single_tool", api_key=SIM_KEY)) as simulator:
        yield simulator


def make_settings(journal: Path, tmp_path: Path, sim: Simulator, **changes) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                    openai_base_url=sim.base_url).replace(**changes)




async def test_session_connect_tool_status_and_clean_shutdown(journal, tmp_path, sim, log_stream, pin_today):
    pin_today(DAY.isoformat())
    settings = make_settings(journal, tmp_path, sim, close_deadline_s=1.0)
    app = create_app(settings)
    async with serving(app) as test_app:
        client = test_app.test_client()
        runtime = voice_state(app).runtime
        assert runtime is not None and len(runtime.nursery.child_tasks) == 4   # mcp hub, brain, executor, supervisor

        # session mint: the instruction and the ten tools
        response = await client.post("/api/voice/session")
        assert response.status_code == 200
        body = await response.get_json()
        assert list(body) == ["ephemeral_key"] and body["ephemeral_key"] == sim.minted[-1]
        request = sim.client_secret_requests[-1]
        assert request["status"] == 200
        session = request["body"]["session"]
        assert session["type"] == "realtime" and session["model"] == "gpt-realtime"
        assert session["tool_choice"] == "auto" and session["output_modalities"] == ["audio"]
        # the first agent's tools (docs/agents.md): the journal's reads and the select, then its handoffs
        assert sorted(t["name"] for t in session["tools"]) == sorted(
            [*(name for name in REGISTRY if name in DEFAULT_AGENTS.first.tools), "handoff.planner",
             "handoff.researcher"])
        assert len(session["tools"]) == 11
        refreshed = await (await client.post("/api/voice/refresh-brain")).get_json()
        assert session["instructions"].startswith(refreshed["instruction_preview"])
        assert "sol" in session["instructions"]

        # connect: a call actor joins the simulator's call; the tool call flows back
        call = sim.add_call("rtc_e2e_1")
        response = await client.post("/api/voice/connect", json={"call_id": " rtc_e2e_1 "})
        assert response.status_code == 200 and await response.get_json() == {"status": "connected"}
        status = await (await client.get("/api/voice/status")).get_json()
        assert status == {"brain_ready": True, "brain_age_seconds": status["brain_age_seconds"],
                          "openai_configured": True, "active_sessions": 1,
                          "daily_cost_usd": status["daily_cost_usd"], "daily_budget_usd": None,
                          "budget_spent": False, "phone_configured": False}
        assert isinstance(status["brain_age_seconds"], int)
        # connecting the same live call again does not start a second actor
        assert (await client.post("/api/voice/connect", json={"call_id": "rtc_e2e_1"})).status_code == 200
        assert (await (await client.get("/api/voice/status")).get_json())["active_sessions"] == 1

        with trio.fail_after(10):
            await call.wait_until(lambda c: c.closed and c.connection is None)
        [(tool_call_id, record)] = call.tool_calls.items()
        assert record.name == "briefing.get"
        [output] = call.outputs[tool_call_id]
        assert isinstance(json.loads(output), dict)
        assert call.response_creates == 1 and not call.errors_sent and not call.violations
        with trio.fail_after(5):
            while (await (await client.get("/api/voice/status")).get_json())["active_sessions"]:
                await trio.sleep(0.02)

        # a second call stays live through shutdown
        sim.add_call("rtc_e2e_2", "silence")
        assert (await client.post("/api/voice/connect", json={"call_id": "rtc_e2e_2"})).status_code == 200
        with trio.fail_after(5):
            await sim.calls["rtc_e2e_2"].wait_until(lambda c: c.connection is not None)
        assert our_tasks()

    # serving stopped: every actor was cancelled and joined
    assert voice_state(app).runtime is None
    assert not runtime.nursery.child_tasks
    assert our_tasks() == []
    record = (settings.state_dir / "calls" / "rtc_e2e_2.jsonl").read_text().splitlines()
    assert json.loads(record[-1])["reason"] == "shutdown"
    assert sim.calls["rtc_e2e_2"].connection is None

    # no key in the logs: the standard key, and the minted ephemeral ones
    text = log_stream.getvalue()
    assert '"http.session_minted"' in text and '"call.ended"' in text
    assert SIM_KEY not in text
    for minted in sim.minted:
        assert minted not in text


@pytest.mark.parametrize("fault", [500, 503, 401, "garbage", "timeout"])
async def test_any_mint_failure_is_500_voice_session_unavailable(journal, tmp_path, sim, log_stream, fault):
    app = create_app(make_settings(journal, tmp_path, sim, mint_timeout_s=0.5))
    async with serving(app) as test_app:
        sim.fail_next_mint(fault)
        response = await test_app.test_client().post("/api/voice/session")
        assert response.status_code == 500
        assert await response.get_json() == {"error": "voice session unavailable"}
    text = log_stream.getvalue()
    assert '"http.session_mint_failed"' in text
    assert SIM_KEY not in text


async def test_wrong_key_is_a_mint_failure_and_never_echoed(journal, tmp_path, sim, log_stream):
    wrong = "sk-wrong-key-0000000000"
    app = create_app(make_settings(journal, tmp_path, sim, openai_api_key_env=wrong))
    async with serving(app) as test_app:
        response = await test_app.test_client().post("/api/voice/session")
        assert response.status_code == 500
        assert wrong.encode() not in await response.get_data()
    assert wrong not in log_stream.getvalue()


async def test_stale_instruction_is_used_while_a_refresh_runs(journal, tmp_path, sim):
    app = create_app(make_settings(journal, tmp_path, sim, brain_max_age_s=0.2))
    async with serving(app) as test_app:
        client = test_app.test_client()
        assert (await client.post("/api/voice/refresh-brain")).status_code == 200
        brain = voice_state(app).runtime.actors["brain"]
        runs = brain.runs
        await trio.sleep(0.3)
        response = await client.post("/api/voice/session")
        assert response.status_code == 200       # no wait for the refresh
        assert brain.runs == runs + 1            # ...which was queued
        with trio.fail_after(5):
            while (await (await client.get("/api/voice/status")).get_json())["brain_age_seconds"] != 0:
                await trio.sleep(0.02)


async def test_event_stream_and_nav_hints_over_a_real_server(journal, tmp_path, sim, pin_today):
    pin_today(DAY.isoformat())
    settings = make_settings(journal, tmp_path, sim, port=0)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        call = sim.add_call("rtc_sse_1", "single_tool")
        events: list[dict] = []
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            assert (await client.post("/api/voice/connect", json={"call_id": "rtc_sse_1"})).status_code == 200
            with trio.fail_after(15):
                async with client.stream("GET", "/api/voice/events", params={"call_id": "rtc_sse_1"}) as stream:
                    assert stream.status_code == 200
                    assert stream.headers["content-type"].startswith("text/event-stream")
                    async for line in stream.aiter_lines():
                        if line.startswith("data: "):
                            events.append(json.loads(line[6:]))
                            if events[-1]["type"] == "call.ended":
                                break
            hints = (await client.get("/api/voice/nav-hints", params={"call_id": "rtc_sse_1"})).json()
            assert hints["consumed"] is True and isinstance(hints["hints"], list)
        kinds = [e["type"] for e in events]
        assert "tool.started" in kinds and "tool.finished" in kinds and kinds[-1] == "call.ended"
        finished = next(e for e in events if e["type"] == "tool.finished")
        assert finished["tool"] == "briefing.get" and finished["tool_call_id"] in call.outputs
        stop.set()


# --- floods (issue 11, items 9b and 9c) -----------------------------------------------------------

HOLD = [{"user_turn": {"text": "hi"}}, {"sleep": 60.0}, {"close": 1000}]


async def _open_stream(client: httpx.AsyncClient, call_id: str, stack) -> httpx.Response:
    response = await stack.enter_async_context(
        client.stream("GET", "/api/voice/events", params={"call_id": call_id}))
    if response.status_code == 200:
        lines = response.aiter_lines()
        assert await lines.__anext__() == ": connected"
        _KEEP.append(lines)   # a collected line iterator would close its stream
    return response


_KEEP: list = []


async def test_event_streams_are_capped_per_call_and_in_all(journal, tmp_path, sim):
    import contextlib

    settings = make_settings(journal, tmp_path, sim, port=0, feed_max_subscribers_per_call=2,
                             feed_max_subscribers=3)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        for call_id in ("rtc_cap_a", "rtc_cap_b"):
            sim.add_call(call_id, HOLD)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            for call_id in ("rtc_cap_a", "rtc_cap_b"):
                assert (await client.post("/api/voice/connect", json={"call_id": call_id})).status_code == 200
            with trio.fail_after(15):
                async with contextlib.AsyncExitStack() as stack:
                    assert (await _open_stream(client, "rtc_cap_a", stack)).status_code == 200
                    assert (await _open_stream(client, "rtc_cap_a", stack)).status_code == 200
                    refused = await client.get("/api/voice/events", params={"call_id": "rtc_cap_a"})
                    assert refused.status_code == 503
                    assert refused.json() == {"error": "too many event streams for this call"}
                    assert (await _open_stream(client, "rtc_cap_b", stack)).status_code == 200
                    refused = await client.get("/api/voice/events", params={"call_id": "rtc_cap_b"})
                    assert refused.status_code == 503 and refused.json() == {"error": "too many event streams"}
                _KEEP.clear()
                # the streams closed: their slots are free again
                async with contextlib.AsyncExitStack() as stack:
                    for _ in range(2):
                        await trio.sleep(0.05)   # the server notices the closed stream
                    assert (await _open_stream(client, "rtc_cap_a", stack)).status_code == 200
                    _KEEP.clear()
        stop.set()


async def test_connects_for_calls_the_service_does_not_know_leave_no_record(journal, tmp_path, sim):
    # 41 connects from one client: the per-client rate limit is not what this tests
    settings = make_settings(journal, tmp_path, sim, port=0, rate_limit_per_s=0)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        sim.add_call("rtc_real", HOLD)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            for i in range(40):
                response = await client.post("/api/voice/connect", json={"call_id": f"rtc_bogus_{i}"})
                assert response.status_code == 200
            assert (await client.post("/api/voice/connect", json={"call_id": "rtc_real"})).status_code == 200
            with trio.fail_after(15):
                while (await client.get("/api/voice/status")).json()["active_sessions"] != 1:
                    await trio.sleep(0.05)
        assert sum(1 for h in sim.handshakes if h["status"] == 404) == 40
        stop.set()
    files = sorted(p.name for p in (tmp_path / "state" / "calls").iterdir())
    assert files == ["rtc_real.jsonl"]     # one record: the call that connected
