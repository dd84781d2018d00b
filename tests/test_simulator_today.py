"""The simulator speaks today's Realtime API: responses whose output items mix
spoken preambles with parallel function calls, hosted MCP calls, rate
limits, failed responses, the 60-minute cap, idle timeouts and the
service's refusals. Over its real websocket, with conformance on."""

from __future__ import annotations

import json

import pytest
import trio

from voiceactors.realtime import events
from voiceactors.simulator import Simulator, ScenarioError, load_scenario
from voiceactors.simulator.scenario import Scenario

from simulator_support import KEY, Client, calls_in, connect


@pytest.fixture
async def sim(nursery):
    s = Simulator(api_key=KEY, conformance=True)
    await nursery.start(s.serve, 0)
    return s


def _say(text: str) -> dict:
    return {"message": text}


def _call(name: str, call_id: str) -> dict:
    return {"function_call": {"name": name, "call_id": call_id}}


def _output_kinds(done: dict) -> list[tuple[str, str]]:
    """(type, transcript or name) of each output item of a response.done, in order."""
    kinds = []
    for item in done["response"]["output"]:
        if item["type"] == "message":
            kinds.append(("message", item["content"][0]["transcript"]))
        else:
            kinds.append((item["type"], item["name"]))
    return kinds


def _of_response(seen: list[dict], response_id: str, *types: str) -> list[dict]:
    return [e for e in seen if e.get("response_id") == response_id and e["type"] in types]


# -- several output items per response


@pytest.mark.parametrize("order", [
    pytest.param(["say", "call", "call"], id="before"),
    pytest.param(["call", "say", "call"], id="between"),
    pytest.param(["call", "call", "say"], id="after"),
    pytest.param(["say", "call", "say", "call", "say"], id="everywhere"),
])
async def test_a_preamble_in_any_position_among_parallel_calls(sim, autojump_clock, order):
    items, names, said = [], iter(["calendar.today", "commitments.list"]), iter(["One.", "Two.", "Three."])
    for kind in order:
        items.append(_say(next(said)) if kind == "say" else _call(next(names), f"call_{len(items)}"))
    call = sim.add_call("rtc_1", [{"response": {"items": items}}, {"wait_outputs": {}},
                                  {"response": {"text": "All done."}}, {"close": 1000}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
        rid = done["response"]["id"]
        expected = [("message", i["message"]) if "message" in i else ("function_call", i["function_call"]["name"])
                    for i in items]
        assert _output_kinds(done) == expected
        # each item announced and finished at its own index, in spoken order
        added = _of_response(c.seen, rid, "response.output_item.added")
        finished = _of_response(c.seen, rid, "response.output_item.done")
        assert [e["output_index"] for e in added] == [e["output_index"] for e in finished] == list(range(len(items)))
        transcripts = [e["transcript"] for e in _of_response(c.seen, rid, "response.output_audio_transcript.done")]
        assert transcripts == [t for kind, t in expected if kind == "message"]
        # both calls are issued once the response is done; exactly one response.create answers them
        assert sorted(call.pending_call_ids()) == sorted(i["function_call"]["call_id"] for i in items
                                                         if "function_call" in i)
        for tool in calls_in(done):
            await c.send(events.function_call_output(tool["call_id"], "{}"))
        for tool in calls_in(done):
            await c.until("conversation.item.added", item__call_id=tool["call_id"])
        await c.send(events.response_create())
        final = await c.until("response.done")
        assert _output_kinds(final) == [("message", "All done.")]
        assert await c.closed_code() == 1000
    assert call.response_creates == 1 and call.error_codes == [] and call.violations == []
    assert call.responses[0].call_ids == [i["function_call"]["call_id"] for i in items if "function_call" in i]


@pytest.mark.parametrize("gap", [0, 1, 2])
async def test_a_barge_in_in_each_gap_cuts_the_response_there(sim, autojump_clock, gap):
    """Pauses put gaps between the items of a response playing in the
    background; a barge-in lands in the chosen gap: the items before it are
    out (a call among them is issued and needs its output), the rest never."""
    items = [_say("Let me look."), {"pause": 2}, _call("calendar.today", "call_A"), {"pause": 2},
             _say("And the other one."), {"pause": 2}, _call("journal.search", "call_B")]
    call = sim.add_call("rtc_1", [{"response": {"items": items, "background": True}},
                                  {"barge_in": {"after_ms": 1000 + 2000 * gap}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    spoken = [("message", "Let me look."), ("function_call", "calendar.today"), ("message", "And the other one.")]
    assert _output_kinds(done) == spoken[:gap + 1]
    assert call.pending_call_ids() == (["call_A"] if gap >= 1 else [])


async def test_the_short_form_and_items_do_not_mix():
    with pytest.raises(ScenarioError):
        Scenario.from_obj([{"response": {"text": "Hi.", "items": [_say("Hi.")]}}])
    with pytest.raises(ScenarioError):
        Scenario.from_obj([{"response": {"items": [{"message": "a", "function_call": {"name": "x"}}]}}])
    with pytest.raises(ScenarioError):
        Scenario.from_obj([{"response": {"error": {"code": "x"}}}])   # an error needs status failed


# -- hosted MCP calls


async def test_a_hosted_mcp_call_is_played_and_never_expects_an_answer(sim, autojump_clock):
    items = [_say("Checking the weather."),
             {"mcp_call": {"server_label": "weather", "name": "forecast", "arguments": {"city": "Lyon"},
                           "output": "Sunny, 21 C", "run_s": 2}},
             _say("It is sunny.")]
    call = sim.add_call("rtc_1", [{"response": {"items": items}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
        mcp = done["response"]["output"][1]
        assert _output_kinds(done) == [("message", "Checking the weather."), ("mcp_call", "forecast"),
                                       ("message", "It is sunny.")]
        assert (mcp["server_label"], json.loads(mcp["arguments"]), mcp["output"]) == (
            "weather", {"city": "Lyon"}, "Sunny, 21 C")
        # answering it as if it were ours is refused: the service ran it
        ours = await c.send(events.function_call_output(mcp["id"], "{}"))
        error = await c.until("error")
    types = [e["type"] for e in c.seen if e.get("item_id") == mcp["id"] or e.get("item", {}).get("id") == mcp["id"]]
    assert types == ["response.output_item.added", "conversation.item.added", "response.mcp_call.in_progress",
                     "response.mcp_call_arguments.delta", "response.mcp_call_arguments.delta",
                     "response.mcp_call_arguments.done", "response.mcp_call.completed",
                     "response.output_item.done", "conversation.item.done"]
    in_progress = next(e for e in c.seen if e["type"] == "response.mcp_call.in_progress")
    completed = next(e for e in c.seen if e["type"] == "response.mcp_call.completed")
    assert completed["output_index"] == in_progress["output_index"] == 1
    assert (error["error"]["code"], error["error"]["event_id"]) == ("invalid_tool_call_id", ours["event_id"])
    assert call.pending_call_ids() == [] and call.tool_calls == {}


async def test_a_failed_hosted_mcp_call_carries_its_error(sim, autojump_clock):
    failure = {"type": "http_error", "code": 502, "message": "Bad gateway"}
    sim.add_call("rtc_1", [{"response": {"items": [
        {"mcp_call": {"server_label": "weather", "name": "forecast", "error": failure}}]}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
    [mcp] = done["response"]["output"]
    assert mcp["error"] == failure and "output" not in mcp
    assert "response.mcp_call.failed" in [e["type"] for e in c.seen]
    assert "response.mcp_call.completed" not in [e["type"] for e in c.seen]


# -- rate limits and failed responses


LIMITS = [{"name": "requests", "limit": 1000, "remaining": 999, "reset_seconds": 0.06},
          {"name": "tokens", "limit": 40000, "remaining": 38000, "reset_seconds": 3.0}]


async def test_rate_limits_as_a_response_begins_and_as_a_step(sim, autojump_clock):
    sim.add_call("rtc_1", [{"response": {"text": "Hi.", "rate_limits": LIMITS}},
                           {"rate_limits": [{"name": "tokens", "limit": 40000, "remaining": 0, "reset_seconds": 9}]}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        created = await c.until("response.created")
        first = await c.recv()
        assert first["type"] == "rate_limits.updated" and first["rate_limits"] == LIMITS
        await c.until("response.done", response__id=created["response"]["id"])
        later = await c.until("rate_limits.updated")
    assert later["rate_limits"] == [{"name": "tokens", "limit": 40000, "remaining": 0, "reset_seconds": 9}]


async def test_a_response_failed_on_a_rate_limit(sim, autojump_clock):
    error = {"type": "invalid_request_error", "code": "inference_rate_limit_exceeded",
             "message": "Too many requests; try again later."}
    call = sim.add_call("rtc_1", [{"response": {"status": "failed", "error": error}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
    assert done["response"]["status"] == "failed" and done["response"]["output"] == []
    assert done["response"]["status_details"] == {"type": "failed", "reason": None, "error": error}
    assert call.responses[0].status == "failed"


def test_shipped_scenarios_of_todays_api_load():
    for name in ("preambles", "hosted_mcp"):
        assert load_scenario(name).steps
