"""Linked context: a CallActor against the simulator, the sideband in memory
(``journal.select`` end to end, the tools' defaults, the first
greeting once across a reconnect), and the HTTP API (``/session`` and
``/connect`` with a ``context`` on the sample and the fixture journals)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from calls_support import DAY, Gate, assert_clean_protocol, gated_registry, received_types, rig, steady
from clock_support import serving
from voiceactors.call.call_context import LinkedContext
from voiceactors.linked_context.references import Reference
from voiceactors.http import create_app
from voiceactors.simulator import Simulator
from voiceactors.settings import Settings
from simulator_support import serving_simulator

BASE = "You are sol, the journal's voice."
DANIEL = Reference("entity", "daniel_park", "Daniel Park", entity_type="Person")
SIM_KEY = "sk-test-context-5e6f7a8b9c"


def feed_events(feed: Any) -> list[dict]:
    events = []
    while True:
        try:
            events.append(feed.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return events


def of_type(sim_call: Any, kind: str) -> list[tuple[int, dict]]:
    return [(i, e) for i, e in enumerate(sim_call.received) if e["type"] == kind]


# ------------------------------------------------------------ CallActor + simulator

async def test_select_end_to_end_changes_the_selection_once_and_tools_follow_it(tmp_path, autojump_clock):
    scenario = steady([
        {"user_turn": {"text": "Let's talk about Daniel."}},
        {"response": {"tool_calls": [{"name": "journal.select", "arguments": {"kind": "entity", "id": "daniel"},
                                      "call_id": "call_select"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Daniel Park it is."}},
        {"user_turn": {"text": "What do we know about him?"}},
        {"response": {"tool_calls": [{"name": "entities.get", "arguments": {}, "call_id": "call_get"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "He is ..."}},
        {"user_turn": {"text": "And what happened on Thursday, compared?"}},
        {"response": {"tool_calls": [{"name": "journal.get_day", "arguments": {"day": "2026-03-26"},
                                      "call_id": "call_day"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "On Thursday ..."}},
        {"sleep": 0.5},
        {"close": 1000},
    ])
    async with rig(tmp_path) as r:
        feed = r.hub.open("rtc_select")
        sub = feed.subscribe()
        actor, sc = await r.run_call("rtc_select", scenario, feed=feed,
                                     context=LinkedContext(BASE, None))
    assert actor.end_reason == "closed_by_service"
    assert_clean_protocol(sc, creates=3)
    # one session.update, written before the select's output, naming the verified entity
    [(at, update)] = of_type(sc, "session.update")
    [(output_at, _)] = [(i, e) for i, e in of_type(sc, "conversation.item.create")
                        if e["item"]["call_id"] == "call_select"]
    assert at < output_at
    instructions = update["session"]["instructions"]
    assert instructions.startswith(BASE) and '"Daniel Park"' in instructions
    assert json.loads(sc.outputs["call_select"][0])["selected"]["id"] == "daniel_park"
    assert sc.session["instructions"] == instructions          # the service applied it
    # "him": entities.get without an argument used the selection
    assert json.loads(sc.outputs["call_get"][0])["slug"] == "daniel_park"
    # reading another day does not change the selection
    assert actor.protocol.context is not None and actor.protocol.context.selection.id == "daniel_park"
    events = feed_events(sub)
    [selection] = [e for e in events if e["type"] == "selection"]
    assert selection["selection"]["name"] == "Daniel Park" and selection["link"] is None
    assert {"type": "nav.hint", "target": "entity/daniel_park"}.items() <= next(
        e for e in events if e["type"] == "nav.hint").items()
    lines = [line for line in r.record("rtc_select") if line["kind"] == "selection"]
    assert [line["selection"]["id"] for line in lines] == ["daniel_park"]


async def test_a_failed_select_changes_nothing(tmp_path, autojump_clock):
    scenario = steady([
        {"user_turn": {"text": "Switch to Nobody."}},
        {"response": {"tool_calls": [{"name": "journal.select", "arguments": {"kind": "entity", "id": "nobody"}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "I could not find them."}},
        {"sleep": 0.5},
        {"close": 1000},
    ])
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_select_fail", scenario, context=LinkedContext(BASE, DANIEL))
    assert_clean_protocol(sc, creates=1)
    [call_id] = sc.tool_calls
    assert json.loads(sc.outputs[call_id][0]) == {"error": "not found"}
    assert len(of_type(sc, "session.update")) == 1      # the handover's only
    assert actor.protocol.context is not None
    assert actor.protocol.context.selection == DANIEL and actor.protocol.context.link == DANIEL


def barge_in_during(tool_call: dict) -> Any:
    return steady([
        {"user_turn": {"text": "Switch to Bluefin."}},
        {"response": {"text": "Switching.", "tool_calls": [tool_call], "hold_s": 2.0}},
        {"barge_in": {"after_ms": 300, "text": "No, wait."}},
        {"response": {"text": "Okay."}},
        {"wait_outputs": {"response_create": False}},
        {"sleep": 1.0},
        {"close": 1000},
    ])


async def test_barge_in_during_a_select_leaves_the_selection_consistent(tmp_path, autojump_clock):
    """The select's lookup is still running when the user barges in: it is
    cancelled, the model is told so, and the selection stays the link."""
    bluefin = Reference("entity", "bluefin_capital", "Bluefin Capital", entity_type="Company")
    gate = Gate({"selected": bluefin.view()})
    select_call = {"name": "journal.select", "arguments": {"kind": "entity", "id": "bluefin_capital"}}
    async with rig(tmp_path, registry=gated_registry("journal.select", gate)) as r:
        try:
            actor, sc = await r.run_call("rtc_select_barge", barge_in_during(select_call),
                                         context=LinkedContext(BASE, DANIEL))
        finally:
            gate.release.set()
    assert_clean_protocol(sc, creates=0)
    [call_id] = sc.tool_calls
    assert json.loads(sc.outputs[call_id][0]) == {"error": "cancelled"}
    assert actor.protocol.context is not None
    assert actor.protocol.context.selection == DANIEL and actor.protocol.context.link == DANIEL
    assert len(of_type(sc, "session.update")) == 1          # the handover's only
    assert "Bluefin" not in sc.session["instructions"]


async def test_a_select_that_answers_before_the_barge_in_lands_is_applied_and_said(tmp_path, autojump_clock):
    """The real lookup usually beats the barge-in: the output says it changed,
    so it did, and the session's instructions say so too (no response.create:
    the user's turn owns the floor)."""
    select_call = {"name": "journal.select", "arguments": {"kind": "entity", "id": "bluefin_capital"}}
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_select_barge2", barge_in_during(select_call),
                                     context=LinkedContext(BASE, DANIEL))
    assert_clean_protocol(sc, creates=0)
    [call_id] = sc.tool_calls
    told = json.loads(sc.outputs[call_id][0])
    ctx = actor.protocol.context
    assert ctx is not None and ctx.link == DANIEL
    if "selected" in told:     # answered first: applied, and the service's instructions follow
        assert ctx.selection is not None and ctx.selection.id == "bluefin_capital"
        assert '"Bluefin Capital"' in sc.session["instructions"]
    else:                      # cancelled first: nothing changed
        assert told == {"error": "cancelled"} and ctx.selection == DANIEL


async def test_first_greeting_once_after_the_handover_and_not_after_a_reconnect(tmp_path, autojump_clock):
    scenario = steady([{"sleep": 2.0}, {"drop": True}, {"sleep": 2.0}, {"close": 1000}])
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_greet", scenario, context=LinkedContext(BASE, DANIEL, greeting=True))
    assert actor.end_reason == "closed_by_service" and sc.connections == 2
    assert received_types(sc)[:2] == ["session.update", "response.create"]
    [(_, create)] = of_type(sc, "response.create")
    opening = create["response"]["instructions"]
    assert opening.startswith(BASE) and "Daniel Park" in opening and "Speak first" in opening
    assert sc.response_creates == 1 and sc.error_codes == [] and sc.violations == []
    assert [resp.origin for resp in sc.responses] == ["default"]   # the service answered the greeting
    assert len(of_type(sc, "session.update")) == 1      # the link is not sent again either


# ------------------------------------------------------------ HTTP + simulator

@pytest.fixture
async def sim():
    async with serving_simulator(Simulator("silence", api_key=SIM_KEY)) as simulator:
        yield simulator


def app_for(journal: Path, tmp_path: Path, sim: Simulator, **changes: Any) -> Any:
    return create_app(Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                               openai_base_url=sim.base_url, rate_limit_per_s=0, close_deadline_s=1.0,
                               **changes))


async def mint(client: Any, sim: Simulator, body: Any) -> tuple[int, dict, str | None]:
    before = len(sim.client_secret_requests)
    response = await client.post("/api/voice/session", json=body)
    data = await response.get_json()
    instructions = None
    if len(sim.client_secret_requests) > before:
        instructions = sim.client_secret_requests[-1]["body"]["session"]["instructions"]
    return response.status_code, data, instructions


async def test_session_context_on_the_sample_journal(make_sample, tmp_path, sim, pin_today):
    pin_today(DAY.isoformat())
    journal = make_sample(days=3)
    from voiceactors.journal import ledger
    item = ledger.derive(journal)[0]
    app = app_for(journal, tmp_path, sim)
    async with serving(app) as test_app:
        client = test_app.test_client()
        _, plain, generic = await mint(client, sim, {})
        assert list(plain) == ["ephemeral_key"] and generic is not None
        for kind, ident, name in (("entity", "daniel_park", "Daniel Park"),
                                  ("day", "2026-03-26", "Thursday 26 March 2026"),
                                  ("commitment", item.id, item.action),
                                  ("facet", "studio", None)):
            status, data, instructions = await mint(client, sim, {"context": {"kind": kind, "id": ident}})
            assert status == 200 and data["context"]["verified"] is True and data["context"]["id"] == ident
            # the brain's instruction, the context's section, then the agent's (agents.py)
            assert instructions is not None and instructions.startswith(generic.split("\n\n<<<agent")[0])
            assert instructions.endswith(generic[generic.index("<<<agent"):])
            assert f'"{name or data["context"]["name"]}"' in instructions
        # unknown: the generic conversation and a brief explanation, never the asked id
        status, data, instructions = await mint(client, sim, {"context": {"kind": "entity", "id": "qqxq_nobody"}})
        assert status == 200 and data["context"] == {"kind": "entity", "verified": False, "reason": "not_found"}
        assert instructions is not None and "could not be verified" in instructions and "qqxq" not in instructions


async def test_session_context_on_the_fixture_journal(fixture_copy, tmp_path, sim):
    app = app_for(fixture_copy, tmp_path, sim)
    async with serving(app) as test_app:
        client = test_app.test_client()
        for kind, ident, name in (("entity", "romeo_montague", "Romeo Montague"),
                                  ("day", "2026-03-04", "Wednesday 4 March 2026"),
                                  ("facet", "montague", "Montague Tech")):
            status, data, instructions = await mint(client, sim, {"context": {"kind": kind, "id": ident}})
            assert status == 200 and data["context"]["name"] == name
            assert instructions is not None and f'"{name}"' in instructions
        status, data, instructions = await mint(client, sim, {"context": {"kind": "commitment",
                                                                          "id": "93478d83ac54dfd6"}})
        assert data["context"]["verified"] is False and instructions is not None
        assert "93478d83ac54dfd6" not in instructions


async def test_invalid_context_and_greeting_are_400_with_a_clear_error(make_sample, tmp_path, sim):
    app = app_for(make_sample(days=2), tmp_path, sim)
    async with serving(app) as test_app:
        client = test_app.test_client()
        cases = [
            ("/api/voice/session", {"context": "daniel_park"}, "context must be a JSON object"),
            ("/api/voice/session", {"context": {"kind": "person", "id": "x"}},
             "context.kind must be one of day, entity, commitment, facet"),
            ("/api/voice/session", {"context": {"kind": "entity", "id": "x", "title": "y"}},
             "context has an unknown field (allowed: kind, id)"),
            ("/api/voice/connect", {"call_id": "rtc_x", "context": {"kind": "day", "id": "2026-13-01"}},
             "context.id is invalid"),
            ("/api/voice/connect", {"call_id": "rtc_x", "context": {"kind": "day"}}, "context.id is required"),
            ("/api/voice/connect", {"call_id": "rtc_x", "greeting": "always"}, 'greeting must be "first"'),
        ]
        for path, body, message in cases:
            response = await client.post(path, json=body)
            assert response.status_code == 400, body
            assert await response.get_json() == {"error": message}
        assert sim.client_secret_requests == [] and "rtc_x" not in sim.calls


async def test_connect_with_context_and_greeting_end_to_end(make_sample, tmp_path, sim, pin_today):
    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=3), tmp_path, sim)
    async with serving(app) as test_app:
        client = test_app.test_client()
        status, _, minted = await mint(client, sim, {"context": {"kind": "entity", "id": "daniel_park"}})
        assert status == 200
        call = sim.add_call("rtc_ctx_e2e", [{"sleep": 1.0}, {"close": 1000}])
        response = await client.post("/api/voice/connect", json={
            "call_id": "rtc_ctx_e2e", "context": {"kind": "entity", "id": "daniel_park"}, "greeting": "first"})
        assert response.status_code == 200
        assert await response.get_json() == {"status": "connected", "context": DANIEL.view()}
        with trio.fail_after(10):
            await call.wait_until(lambda c: c.closed and c.connection is None)
    assert received_types(call)[:2] == ["session.update", "response.create"]
    [(_, update)] = of_type(call, "session.update")
    assert update["session"]["instructions"] == minted          # the same link: the same instruction
    [(_, create)] = of_type(call, "response.create")
    assert "Daniel Park" in create["response"]["instructions"]
    assert call.response_creates == 1 and call.error_codes == [] and call.violations == []


async def test_connect_reads_the_brains_instruction_without_asking_its_inbox(make_sample, tmp_path, sim, pin_today):
    """``/connect`` takes the brain's instruction for the call in its own
    step (``Runtime.brain_now``), not by an ask through the brain's inbox
    (two scheduler turns and a channel per connect): with that inbox closed,
    a linked call still gets its ``session.update`` with the instruction."""
    from voiceactors.http.app import voice_state

    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=3), tmp_path, sim)
    async with serving(app) as test_app:
        client = test_app.test_client()
        status, _, minted = await mint(client, sim, {"context": {"kind": "entity", "id": "daniel_park"}})
        assert status == 200 and minted
        runtime = voice_state(app).runtime
        closed, _unused = trio.open_memory_channel[Any](0)
        closed.close()
        runtime.brain = closed      # an ask to the brain now fails at once
        call = sim.add_call("rtc_ctx_brain_now", [{"sleep": 1.0}, {"close": 1000}])
        response = await client.post("/api/voice/connect", json={
            "call_id": "rtc_ctx_brain_now", "context": {"kind": "entity", "id": "daniel_park"}})
        assert response.status_code == 200
        with trio.fail_after(10):
            await call.wait_until(lambda c: c.closed and c.connection is None)
    [(_, update)] = of_type(call, "session.update")
    assert update["session"]["instructions"] == minted
