"""``POST /api/voice/live`` end to end: create_app and the simulator's Live
sessions on loopback. The route creates the session with the brain's
instruction and the journal's tools under Responses names, the supervisor
attaches its sideband at once, the call is recorded as a Live call; the
refusals; the OpenAI key in no answer to the browser. A Live call rejoined
after a crash and one hung up at its time limit, through the supervisor."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from calls_support import KEY, Gate, gated_registry, real_time_limit, rig
from clock_support import serving
from voiceactors.call.arrival import ArrivalKind, arrive
from voiceactors.call.call_context import LinkedContext, carried_view, taken_over_context
from voiceactors.call.meter import FAREWELL
from voiceactors.call.record import append_block, read_record, record_path
from voiceactors.call.supervisor import CallSupervisor, arrival_of
from voiceactors.executor import write_log
from voiceactors.http import create_app
from voiceactors.http import errors as E
from voiceactors.http.history import summarize
from voiceactors.live.names import FunctionNames
from voiceactors.live.session import live_session
from voiceactors.messages import Connect, ConnectOutcome, ask
from voiceactors.settings import Settings
from voiceactors.simulator import Simulator
from voiceactors.simulator import live_events as le
from voiceactors.tool_effect import WRITE
from voiceactors.tools.registry import REGISTRY

from simulator_support import serving_simulator

SIM_KEY = "sk-test-live-5e6f7a8b9c0d"
OFFER = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"


@pytest.fixture
def journal(make_sample) -> Path:
    return make_sample(days=3)


def make_settings(journal: Path, tmp_path: Path, sim: Simulator, **changes: Any) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                    openai_base_url=sim.base_url).replace(**changes)


async def test_a_live_call_through_the_route_and_the_key_in_no_answer(journal, tmp_path, log_stream):
    async with serving_simulator(Simulator(api_key=SIM_KEY, live_scenario="live_search")) as sim:
        # the delegated model priced: its tokens are the call's cost; the default
        # tool_ack_after_s: a Live call speaks no acknowledgement of ours, however slow the search
        app = create_app(make_settings(journal, tmp_path, sim, close_deadline_s=1.0,
                                       prices=("gpt-5-mini=1.0/8.0/0/0/0.1",)))
        answers: list[bytes] = []
        async with serving(app) as test_app:
            client = test_app.test_client()

            async def answer(response: Any) -> Any:
                answers.append(await response.get_data() + str(dict(response.headers)).encode())
                return response

            created = await answer(await client.post("/api/voice/live", json={
                "sdp": OFFER, "context": {"kind": "day", "id": "2026-03-27"}, "greeting": "first"}))
            assert created.status_code == 200
            body = await created.get_json()
            assert set(body) == {"sdp", "session_id", "context"} and body["sdp"].startswith("v=")
            session = sim.live.sessions[body["session_id"]]
            names = FunctionNames.of(REGISTRY)
            assert session.config["model"] == "gpt-live-1"
            assert session.declared() == set(names.to_tool)
            assert "2026-03-27" in session.config["instructions"]      # the linked context's section
            with real_time_limit(20):
                await session.wait_until(lambda s: s.step == len(s.steps))
            assert session.attaches == 1 and session.nonconforming == []
            assert session.response_creates == 1 and len(session.outputs) == 1
            # the first greeting: its opening alone as commentary (the session has the instruction and the link)
            [greeting] = session.of_type("session.commentary.append")
            assert greeting["content"] and greeting["content"] not in session.config["instructions"]
            assert len(greeting["content"]) < 600 and not session.of_type("session.instructions.append")
            status = await answer(await client.get("/api/voice/status"))
            assert (await status.get_json())["active_sessions"] == 1
            for path in ("/api/voice/console-config", "/api/voice/calls", f"/api/voice/calls/{session.session_id}"):
                assert (await answer(await client.get(path))).status_code == 200, path
            # the history reads the Live call's record as any call's
            history = await (await client.get(f"/api/voice/calls/{session.session_id}")).get_json()
            assert history["call"]["tool_calls"] == 1 and history["call"]["live"] is True, history["call"]
        record = read_record(record_path(tmp_path / "state", session.session_id))
        assert record[0]["kind"] == "start" and record[0]["arrival"] == "live"
        usage = [line for line in record if line["kind"] == "usage"]
        assert len(usage) == 2 and {line["model"] for line in usage} == {"gpt-5-mini"}   # the search, its answer
        # 400 text in, 80 out, 200 cached: (400 * 1 + 80 * 8 + 200 * 0.1) / 1e6 dollars each
        assert {line["cost_usd"] for line in usage} == {0.00106}
    for data in answers:
        assert SIM_KEY.encode() not in data
    assert SIM_KEY not in log_stream.getvalue()


async def test_the_route_refuses_as_session_does(journal, tmp_path, log_stream):
    async with serving_simulator(Simulator(api_key=SIM_KEY)) as sim:
        wrong = "sk-wrong-live-0000000000"
        app = create_app(make_settings(journal, tmp_path, sim, openai_api_key_env=wrong))
        async with serving(app) as test_app:
            client = test_app.test_client()
            for body, message in (({}, E.SDP_REQUIRED), ({"sdp": 7}, E.SDP_INVALID), ({"sdp": "hello"}, E.SDP_INVALID),
                                  ({"sdp": OFFER, "context": 3}, "context must be a JSON object")):
                response = await client.post("/api/voice/live", json=body)
                assert (response.status_code, await response.get_json()) == (400, {"error": message})
            failed = await client.post("/api/voice/live", json={"sdp": OFFER})     # the service refuses the key
            assert (failed.status_code, await failed.get_json()) == (500, {"error": E.SESSION_UNAVAILABLE})
            assert wrong.encode() not in await failed.get_data()
        assert sim.live.sessions == {}
        app = create_app(make_settings(journal, tmp_path, sim, openai_api_key_env=None))
        async with serving(app) as test_app:
            unset = await test_app.test_client().post("/api/voice/live", json={"sdp": OFFER})
            assert (unset.status_code, await unset.get_json()) == (503, {"error": E.KEY_NOT_CONFIGURED})
        app = create_app(make_settings(journal, tmp_path, sim, max_calls=0))
        async with serving(app) as test_app:
            full = await test_app.test_client().post("/api/voice/live", json={"sdp": OFFER})
            assert (full.status_code, await full.get_json()) == (503, {"error": E.AT_CAPACITY})
        [created] = sim.live.sessions          # created, then hung up: not left running unserved
        assert sim.live.hangups == [created] and sim.live.sessions[created].closed
    logged = log_stream.getvalue()
    assert '"http.live_create_failed"' in logged and wrong not in logged


def _live_context(instructions: str = "You are the journal's voice.") -> LinkedContext:
    names = FunctionNames.of(REGISTRY)
    return LinkedContext(instructions, live=live_session(names, instructions,
                                                         lambda tool: REGISTRY[tool].effect == WRITE))


async def connect_live(r: Any, session: Any, context: LinkedContext) -> CallSupervisor:
    """A supervisor of the rig's executor serving in the rig's nursery, with
    the Live ``session``'s call connected on ``context`` (as the route's)."""
    sup = CallSupervisor(r.settings, r.executor.inbox, KEY)
    await r.nursery.start(sup.run)
    connected = await ask(sup.inbox, lambda reply: Connect(session.session_id, reply, context=context), timeout=10)
    assert connected == ConnectOutcome.CONNECTED
    return sup


def test_a_live_call_s_context_carries_its_session_to_a_rejoin_or_a_taker():
    """What the record's context line and the cluster's mirror keep
    (``carried_view``) makes the same Live call again: the same kind of
    arrival, the same names, instructions, writes and model."""
    context = LinkedContext("You are the journal's voice.", live=replace(_live_context().live, model="gpt-5-mini"))
    again = taken_over_context(json.loads(json.dumps(carried_view(context))))
    assert again is not None and again.live == context.live
    assert arrival_of(again) is ArrivalKind.LIVE and arrival_of(LinkedContext("x")) is ArrivalKind.BROWSER
    assert arrive(ArrivalKind.LIVE, Settings(journal=Path("."), state_dir=Path(".")), "live_1", again).hangup_path \
        == "/live/sessions/live_1/hangup"


async def test_a_live_call_rejoined_after_a_crash_answers_its_pending_write_once(tmp_path, autojump_clock):
    """A record a killed server left: a Live call (its context line) with a
    write started and applied (the write log has it) and a read started.
    The supervisor rejoins the session over its attach sideband at start-up
    and answers both: the write from the write log, the read run again."""
    state = tmp_path / "state"
    applied = {"output": json.dumps({"ok": True, "commitment": "c_1"}), "outcome": "ok",
               "tool": "commitments.complete"}
    write_log.apply_once(state, "call_sim_1_0", lambda: applied)
    async with rig(tmp_path) as r:
        session = r.sim.live.add({"model": le.LIVE_MODEL})
        session.steps = [{"usage": True}]
        session.issued |= {"call_sim_1_0", "call_sim_1_1"}
        context = _live_context()
        lines = [{"kind": "start", "t": 0.0, "call_id": session.session_id, "at": "2026-03-27T10:00:00+00:00",
                  "arrival": "live"},
                 {"kind": "context", "t": 0.0, "context": carried_view(context)},
                 {"kind": "connect", "t": 0.01, "reconnects": 0},
                 {"kind": "tool_started", "t": 1.0, "tool_call_id": "call_sim_1_0", "tool": "commitments.complete",
                  "response_id": "resp_sim_1_1", "epoch": 0, "turn": 1, "effect": "write"},
                 {"kind": "tool_started", "t": 1.0, "tool_call_id": "call_sim_1_1", "tool": "calendar.today",
                  "response_id": "resp_sim_1_1", "epoch": 0, "turn": 1, "effect": "read", "arguments": "{}"}]
        append_block(record_path(state, session.session_id), [json.dumps(x) for x in lines])
        sup = CallSupervisor(r.settings, r.executor.inbox, KEY)
        with real_time_limit():
            await r.nursery.start(sup.run)
            await session.wait_until(lambda s: len(s.outputs) == 2)
            sup_calls = dict(sup.calls)
            r.nursery.cancel_scope.cancel()
    assert session.attaches == 1 and session.nonconforming == []
    assert session.outputs["call_sim_1_0"] == [applied["output"]]            # replayed, not applied again
    assert "error" not in json.loads(session.outputs["call_sim_1_1"][0])     # the read ran again
    assert list(sup_calls) == [session.session_id]


async def test_a_live_call_at_its_time_limit_is_hung_up_through_live_sessions(tmp_path, autojump_clock):
    async with rig(tmp_path, call_max_duration_s=5.0, call_wrap_up_s=0.0) as r:
        session = r.sim.live.add({"model": le.LIVE_MODEL})
        session.steps = []
        with real_time_limit():
            await connect_live(r, session, _live_context())
            await session.wait_until(lambda s: s.closed)
            r.nursery.cancel_scope.cancel()
    assert r.sim.live.hangups == [session.session_id] and session.close_reason == "close_requested"


async def test_a_live_call_past_its_budget_says_farewell_and_is_hung_up(tmp_path, autojump_clock):
    """The delegated model's tokens priced past the call's budget: the
    farewell is spoken from commentary, then the session is hung up through
    ``live.sessions.hangup``."""
    async with rig(tmp_path, call_budget_usd=0.001, prices=("gpt-5-mini=1.0/8.0/0/0/0.1",)) as r:
        session = r.sim.live.add({"model": le.LIVE_MODEL})
        # a delegation with no function call: no tool thread for the fake clock to jump over
        session.steps = [{"user": "What is on today?"}, {"delegate": [], "answer": "Here."}]
        context = _live_context()
        context = LinkedContext(context.base_instruction, live=replace(context.live, model="gpt-5-mini"))
        with real_time_limit():
            await connect_live(r, session, context)
            await session.wait_until(lambda s: s.closed)
            r.nursery.cancel_scope.cancel()
    [farewell] = session.of_type("session.commentary.append")
    assert farewell["content"] == FAREWELL["instructions"] and farewell["delegation_id"] is None
    assert r.sim.live.hangups == [session.session_id]


async def test_a_live_call_whose_audio_spends_its_budget_is_hung_up(tmp_path, autojump_clock):
    """The session's audio alone (``session.usage.updated``, cumulative,
    priced per minute by the Live model's ``audio_min`` entry) past the
    call's budget: the farewell from commentary, the hangup through
    ``live.sessions.hangup``; a repeated and a late report count nothing; the
    day's total and the record's ``audio_usage`` lines have the seconds."""
    prices = ("gpt-5-mini=1.0/8.0/0/0/0.1", f"{le.LIVE_MODEL}=audio_min:0.06")
    async with rig(tmp_path, call_budget_usd=0.05, prices=prices) as r:
        session = r.sim.live.add({"model": le.LIVE_MODEL})
        session.steps = [{"user": "Hello there."}, {"usage": 30}, {"usage": 30}, {"usage": 20}, {"usage": 90}]
        context = _live_context()
        context = LinkedContext(context.base_instruction,
                                live=replace(context.live, model="gpt-5-mini", live_model=le.LIVE_MODEL))
        with real_time_limit():
            sup = await connect_live(r, session, context)
            await session.wait_until(lambda s: s.closed)
            daily = sup.daily.state()
            r.nursery.cancel_scope.cancel()
    [farewell] = session.of_type("session.commentary.append")
    assert farewell["content"] == FAREWELL["instructions"]
    assert r.sim.live.hangups == [session.session_id] and session.nonconforming == []
    assert daily.cost_usd == pytest.approx(0.09)
    record = read_record(record_path(r.settings.state_dir, session.session_id))
    audio = [(line["seconds"], line["added_s"]) for line in record if line["kind"] == "audio_usage"]
    assert audio == [(30, 30), (90, 60)]
    [budget] = [line for line in record if line["kind"] == "budget"]
    assert budget["cost_usd"] == pytest.approx(0.09)
    [total] = [line for line in record if line["kind"] == "usage_total"]
    assert total["audio_s"] == 90 and total["cost_usd"] == pytest.approx(0.09)
    assert [line["reason"] for line in record if line["kind"] == "end"] == ["budget_spent"]
    summary = summarize(session.session_id, record)      # the history's
    assert summary["audio_s"] == 90 and summary["cost_usd"] == pytest.approx(0.09) and summary["live"] is True


async def test_a_live_call_s_slow_tool_is_acknowledged_by_live_alone(tmp_path, autojump_clock):
    """Live speaks its own acknowledgement of a delegation: a search held far
    past ``tool_ack_after_s`` on a Live call brings no acknowledgement of
    ours (no commentary), only its output and the continuation; the same
    setting on a Realtime call acknowledges (``tests/test_call_slow_tools.py``)."""
    gate = Gate({"results": []})
    async with rig(tmp_path, registry=gated_registry("journal.search", gate), tool_ack_after_s=0.7) as r:
        session = r.sim.live.add({"model": le.LIVE_MODEL})
        session.steps = [{"user": "What did I write about the boat?"},
                         {"delegate": [{"name": "journal_search", "arguments": {"query": "boat"}}],
                          "answer": "Nothing about a boat."}]
        with real_time_limit():
            sup = await connect_live(r, session, _live_context())
            await trio.to_thread.run_sync(gate.entered.wait, 10)
            await trio.sleep(5 * r.settings.tool_ack_after_s)       # the fake clock: far past the acknowledgement
            gate.release.set()
            await session.wait_until(lambda s: s.response_creates == 1)
            actor = sup.calls[session.session_id]
            r.nursery.cancel_scope.cancel()
    assert session.outputs and session.of_type("session.commentary.append") == []
    assert actor.protocol.slow_tools.ack_after_s == 0.0
    assert arrive(ArrivalKind.BROWSER, r.settings, "rtc_1").service_acknowledges is False
