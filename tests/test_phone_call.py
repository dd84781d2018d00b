"""A whole phone call from the owner's number: the webhook accepts it with
the brain's instruction, the tool manifest and the phone's audio settings;
the call greets first, answers a tool call once, takes a barge-in, and its
record and history show it as a phone call with the number masked. Against
the simulator and a served app over loopback."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from test_phone_webhook import OWNER, SIM_KEY, make_settings, served, write_voice
from voiceactors.call.record import read_record, record_path
from voiceactors.simulator import Simulator
from voiceactors.simulator import phone as sim_phone
from voiceactors.agents import DEFAULT_AGENTS
from voiceactors.tools.registry import REGISTRY
from simulator_support import serving_simulator

MASKED = "+1••••••••67"
SCENARIO = [
    {"sleep": 0.5},                                      # the greeting plays
    {"user_turn": {"text": "Search my journal for the offsite notes."}},
    {"response": {"text": "Let me look that up.", "hold_s": 2.0,
                  "tool_calls": [{"name": "journal.search", "arguments": {"query": "offsite"},
                                  "call_id": "call_search"}]}},
    {"barge_in": {"after_ms": 300, "text": "Actually, never mind that."}},
    {"response": {"text": "Sure, no problem."}},
    {"wait_outputs": {"response_create": False, "timeout_s": 10}},
    {"sleep": 1.0},
    {"close": 1000},
]


@pytest.fixture
async def sim():
    async with serving_simulator(Simulator(SCENARIO, api_key=SIM_KEY)) as simulator:
        yield simulator


def greetings(sim_call) -> list[dict]:
    return [e for e in sim_call.received if e["type"] == "response.create"
            and "Speak first" in (e.get("response") or {}).get("instructions", "")]


async def test_the_owners_call_is_accepted_greeted_served_and_recorded_as_a_phone_call(make_sample, tmp_path, sim):
    journal = make_sample(days=2)
    secret = sim_phone.new_secret()
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER]})
    settings = make_settings(journal, tmp_path / "state", sim)
    async with served(settings) as base:
        call = sim.place_phone_call()
        event = sim_phone.incoming_event(call.call_id, sim_phone.sip_headers(OWNER))
        answer = await sim_phone.post(base, sim_phone.delivery(event, secret))
        assert (answer.status_code, answer.json()) == (200, {"status": "accepted"})
        with trio.fail_after(30):
            await call.wait_until(lambda c: c.closed and c.connection is None)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            with trio.fail_after(10):
                while (await client.get("/api/voice/status")).json()["active_sessions"]:
                    await trio.sleep(0.05)
            listed = (await client.get("/api/voice/calls")).json()

    # the accept: the brain's instruction, the first agent's tools and its handoffs, the phone's audio settings
    accepted = call.accepted
    assert accepted is not None and accepted["type"] == "realtime" and accepted["model"] == "gpt-realtime"
    assert "sol" in accepted["instructions"] and "You are the assistant agent" in accepted["instructions"]
    assert sorted(t["name"] for t in accepted["tools"]) == sorted(
        [*(name for name in REGISTRY if name in DEFAULT_AGENTS.first.tools), "handoff.planner", "handoff.researcher"])
    assert accepted["audio"] == {"input": {"noise_reduction": {"type": "near_field"}}}
    # the greeting first, then the call as any other: the tool answered once, the barge-in taken
    creates = [e for e in call.received if e["type"] == "response.create"]
    assert greetings(call) == creates[:1] and len(greetings(call)) == 1
    assert len(call.outputs["call_search"]) == 1
    assert not call.errors_sent and not call.violations
    # the record and the history: a phone call, the number masked and nowhere in full
    path = record_path(settings.state_dir, call.call_id)
    lines = read_record(path)
    assert lines[0]["kind"] == "start" and lines[0]["arrival"] == "phone" and lines[0]["caller"] == MASKED
    assert OWNER not in path.read_text() and OWNER[1:] not in path.read_text()
    [summary] = [c for c in listed["calls"] if c["call_id"] == call.call_id]
    assert summary["phone"] == {"caller": MASKED}
    assert any(r.get("status") == "cancelled" for r in lines if r["kind"] == "response")
    assert json.dumps(summary).count(OWNER) == 0
