"""Handoffs between agents as calls against the simulator (the call's
sideband in memory, under ``autojump_clock``): the rules of
``tests/test_call_handoff.py`` with the real call actor, executor, record
and the simulator's session (its ``hold_ack`` step delivers the
acknowledgement after the completion; its ``refuse`` step refuses the
update)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calls_support import assert_valid_client_events, rig
from voiceactors.agents import DEFAULT_AGENTS, CallAgents
from voiceactors.call.call_context import LinkedContext
from voiceactors.http import history, timeline_svg
from voiceactors.simulator import SimCall
from voiceactors.testing import Script, ToolCall
from voiceactors.tools.registry import REGISTRY, manifest

BASE = "You are sol, the journal's voice."
SEARCH = ToolCall("calendar.today", {})


def with_agents(in_charge: str = "assistant") -> LinkedContext:
    ours = manifest("dotted")
    agents = CallAgents(DEFAULT_AGENTS, tuple(ours), "dotted", {t["name"]: n for t, n in zip(ours, REGISTRY)},
                        in_charge)
    return LinkedContext(BASE, None, agents=agents)


def handoff_script(*before: dict[str, Any], words: dict[str, Any] | None = None,
                   to: str = "planner") -> Script:
    """The assistant reads the calendar and hands to ``to`` in one response; the new
    agent's first words answer the ``response.create`` that follows."""
    script = Script("handoff")
    for step in before:
        script.step(step)
    script.model_calls_in_parallel(SEARCH, ToolCall(f"handoff.{to}", {}))
    return script.step({"response": words or {"text": "Planner here: what shall we plan?"}})


def sent_in_order(sim_call: SimCall) -> list[str]:
    """What the call sent, an output named by its tool."""
    names = {call_id: record.name for call_id, record in sim_call.tool_calls.items()}
    return [f"output:{names.get(e['item']['call_id'])}" if e.get("item", {}).get("type") == "function_call_output"
            else e["type"] for e in sim_call.received]


def handoff_lines(record: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(line["to"], line["status"]) for line in record if line["kind"] == "handoff"]


async def play(tmp_path: Any, script: Script, call_id: str) -> tuple[SimCall, list[dict[str, Any]]]:
    async with rig(tmp_path) as r:
        _, sim_call = await r.run_call(call_id, script.scenario(), context=with_agents())
        return sim_call, r.record(call_id)


@pytest.mark.parametrize("hold_ack", [False, True], ids=["ack_then_done", "done_then_ack"])
async def test_a_handoff_over_the_simulator(tmp_path, autojump_clock, hold_ack):
    script = handoff_script(*([{"hold_ack": True}] if hold_ack else []))
    sim_call, record = await play(tmp_path, script, f"rtc_handoff_{int(hold_ack)}")
    order = sent_in_order(sim_call)
    # the business output first, then the update, the handoff's output, the new agent's words
    assert order.index("output:calendar.today") < order.index("session.update") < order.index(
        "output:handoff.planner") < order.index("response.create")
    assert order.count("session.update") == 1
    tools = [t["name"] for t in sim_call.session["tools"]]
    assert "commitments.complete" in tools and "handoff.planner" not in tools
    assert "You are the planner agent" in sim_call.session["instructions"]
    [handoff] = [o for name, o in sim_call.outputs.items() if sim_call.tool_calls[name].name == "handoff.planner"]
    assert json.loads(handoff[0]) == {"handed_to": "planner", "from": "assistant"}
    assert handoff_lines(record) == [("planner", "updating"), ("planner", "done")]
    assert [line["agent"] for line in record if line["kind"] == "response"] == ["assistant", "planner"]
    # the history API and the timeline say who spoke
    assert history.summarize("rtc", record)["agent"] == "planner"
    said = [(e.get("agent"), e["text"]) for e in history.spoken_transcript(record) if e["role"] == "assistant"]
    assert said[-1] == ("planner", "Planner here: what shall we plan?")
    svg = timeline_svg.render(record)
    assert ">agents</text>" in svg and ">assistant</text>" in svg and ">planner</text>" in svg
    acked = [e["type"] for e in sim_call.sent if e["type"] in ("session.updated", "response.done")]
    assert acked == (["response.done", "response.done", "session.updated"] if hold_ack
                     else ["response.done", "session.updated", "response.done"])
    assert_valid_client_events(sim_call)
    assert sim_call.violations == [] and sim_call.error_codes == []


async def test_a_refused_update_leaves_the_assistant_in_charge_and_it_says_so(tmp_path, autojump_clock):
    script = handoff_script({"refuse": {"event": "session.update", "code": "invalid_value"}},
                            words={"text": "Planner here.", "hold_s": 1.0})
    script.step({"sleep": 2.0})      # the assistant's words that it did not work: the simulator's default reply
    sim_call, record = await play(tmp_path, script, "rtc_handoff_refused")
    assert handoff_lines(record) == [("planner", "updating"), ("planner", "failed")]
    assert "You are the planner agent" not in sim_call.session.get("instructions", "")
    assert "response.cancel" in sent_in_order(sim_call)        # the planner's words, spoken as refused, cut
    said = [e["response"]["instructions"] for e in sim_call.received
            if e["type"] == "response.create" and "did not work" in e.get("response", {}).get("instructions", "")]
    assert len(said) == 1 and "You are the assistant agent" in said[0]


async def test_a_barge_in_during_the_new_agents_words_keeps_the_committed_effects(tmp_path, autojump_clock):
    script = handoff_script(words={"text": "Planner here, let me look at your commitments.", "hold_s": 2.0})
    script.barge_in("wait").step({"sleep": 1.0})
    sim_call, record = await play(tmp_path, script, "rtc_handoff_barge_in")
    assert handoff_lines(record)[-1] == ("planner", "done")
    # each output written once, none taken back
    assert all(len(outs) == 1 for outs in sim_call.outputs.values()) and len(sim_call.outputs) == 2
    assert [line["status"] for line in record if line["kind"] == "response"][-1] == "cancelled"
    assert sim_call.violations == []


async def test_a_handoff_during_a_handoff_is_refused(tmp_path, autojump_clock):
    # the acknowledgement held: the planner's first words hand over again before the first handoff is over
    script = handoff_script({"hold_ack": True},
                            words={"tool_calls": [{"name": "handoff.researcher", "arguments": {}}]})
    script.step({"wait_outputs": {}}).model_says("Still the planner.")
    sim_call, record = await play(tmp_path, script, "rtc_handoff_twice")
    assert handoff_lines(record) == [("planner", "updating"), ("researcher", "refused"), ("planner", "done")]
    assert sent_in_order(sim_call).count("session.update") == 1
    [refused] = [o for name, o in sim_call.outputs.items() if sim_call.tool_calls[name].name == "handoff.researcher"]
    assert json.loads(refused[0])["error"].startswith("another handoff is under way")


async def test_a_response_the_model_started_first_carries_the_handoff(tmp_path, autojump_clock):
    # the model starts a response of its own the instant the handoff's output lands: our create, right
    # behind it, is refused; that response (after the update, so the planner's) carries the handoff,
    # which is done only once it has ended
    script = Script("handoff_model_first").step({"response": {"tool_calls": [
        {"name": "calendar.today", "arguments": {}}, {"name": "handoff.planner", "arguments": {}}]}})
    script.step({"model_response_first": {"when": "outputs_answered", "text": "Planner here.", "hold_s": 1.0}})
    script.step({"sleep": 2.0})
    sim_call, record = await play(tmp_path, script, "rtc_handoff_model_first")
    [create] = [e for e in sim_call.received if e["type"] == "response.create"]
    assert "taken over this call" in create["response"]["instructions"]
    assert sim_call.error_codes == ["conversation_already_has_active_response"]
    kinds = [(line["kind"], line.get("status")) for line in record if line["kind"] in ("handoff", "response")]
    assert kinds == [("response", "completed"), ("handoff", "updating"), ("response", "completed"),
                     ("handoff", "done")]
    assert [(r["origin"], r["agent"]) for r in record if r["kind"] == "response"] == [
        ("model", "assistant"), ("model", "planner")]
    assert sim_call.violations == []


async def test_a_handoff_to_an_agent_it_may_not_hand_to_is_refused(tmp_path, autojump_clock):
    script = Script("handoff_self").model_calls("handoff.assistant").model_says("Still me.")
    sim_call, record = await play(tmp_path, script, "rtc_handoff_self")
    [refused] = sim_call.outputs[next(iter(sim_call.tool_calls))]
    assert json.loads(refused) == {"error": "the assistant agent cannot hand the call to assistant"}
    assert handoff_lines(record) == [("assistant", "refused")]
    assert "session.update" not in sent_in_order(sim_call)
