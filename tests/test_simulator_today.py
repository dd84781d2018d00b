"""The simulator speaks today's Realtime API: responses whose output items mix
spoken preambles with parallel function calls, hosted MCP calls, rate
limits, failed responses, the 60-minute cap, idle timeouts and the
service's refusals. Over its real websocket, with conformance on."""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket

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
    for name in ("preambles", "hosted_mcp", "idle_check_in", "session_cap"):
        assert load_scenario(name).steps


# -- the service's refusals


@pytest.mark.parametrize("code, error_type, message_part", [
    ("conversation_already_has_active_response", "invalid_request_error", "already has an active response"),
    ("session_expired", "invalid_request_error", "maximum duration of 60 minutes"),
    ("inference_rate_limit_exceeded", "invalid_request_error", "try again later"),
    ("rate_limit_exceeded", "invalid_request_error", "try again later"),
    ("some_code_of_tomorrow", "invalid_request_error", "some_code_of_tomorrow"),
])
async def test_a_refused_response_create_gets_the_code_and_starts_nothing(sim, autojump_clock, code, error_type,
                                                                         message_part):
    call = sim.add_call("rtc_1", [{"refuse": {"event": "response.create", "code": code}}, {"user_turn": {}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("conversation.item.done")      # the refusal is armed before the user's turn
        refused = await c.send(events.response_create())
        error = await c.until("error")
        await c.send(events.response_create())          # the refusal was used up: this one plays
        done = await c.until("response.done")
    assert (error["error"]["code"], error["error"]["type"], error["error"]["event_id"]) == (
        code, error_type, refused["event_id"])
    assert message_part in error["error"]["message"]
    assert done["response"]["status"] == "completed"
    assert call.response_creates == 2 and [r.origin for r in call.responses] == ["default"]
    assert [(code_, event["event_id"]) for code_, event in call.refused] == [(code, refused["event_id"])]
    assert call.refusals == []


async def test_invalid_tool_call_id_for_an_issued_call_makes_the_service_forget_it(sim, autojump_clock):
    """As after a barge-in truncated the conversation: the output is refused,
    the call is no longer awaited, and a resend is refused the same way."""
    call = sim.add_call("rtc_1", [{"refuse": {"event": "function_call_output", "code": "invalid_tool_call_id"}},
                                  {"response": {"tool_calls": [{"name": "briefing.get", "call_id": "call_A"}]}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("response.done")
        first = await c.send(events.function_call_output("call_A", "{}"))
        error = await c.until("error")
        again = await c.send(events.function_call_output("call_A", "{}"))
        error_again = await c.until("error")
    assert (error["error"]["code"], error["error"]["event_id"], error["error"]["param"]) == (
        "invalid_tool_call_id", first["event_id"], "item.call_id")
    assert "call_A" in error["error"]["message"]
    assert (error_again["error"]["code"], error_again["error"]["event_id"]) == ("invalid_tool_call_id",
                                                                                again["event_id"])
    assert call.pending_call_ids() == [] and call.forgotten == {"call_A"} and call.answered == set()
    assert call.outputs == {"call_A": ["{}", "{}"]}
    assert not [e for e in c.seen if e["type"] == "conversation.item.added"
                and e["item"].get("type") == "function_call_output"]


async def test_a_refusal_can_leave_the_event_id_out_and_say_its_own_words(sim, autojump_clock):
    sim.add_call("rtc_1")
    sim.refuse_next("rtc_1", "any", "server_busy", times=2, type_="server_error", message="Try later.",
                    echo_event_id=False)
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send(events.session_update({"instructions": "x"}))
        first = await c.until("error")
        await c.send(events.response_cancel())
        second = await c.until("error")
        await c.send(events.session_update({"instructions": "y"}))
        updated = await c.until("session.updated")
    for error in (first, second):
        assert error["error"] == {"type": "server_error", "code": "server_busy", "message": "Try later.",
                                  "param": None, "event_id": None}
    assert updated["session"]["instructions"] == "y"
    assert sim.calls["rtc_1"].error_codes == ["server_busy", "server_busy"]


# -- the 60-minute cap


async def test_the_session_cap_expires_the_session_then_closes(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"user_turn": {"text": "Hello."}}, {"response": {"text": "Hi."}},
                                  {"session_cap": {"close_after_s": 5}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("response.done")
        await c.send(events.response_create())           # well before the cap: answered
        await c.until("response.done")
        expired = await c.until("error", within_s=4000)
        at = trio.current_time()
        late = await c.send(events.response_create())
        refused = await c.until("error")
        assert await c.closed_code() == 1001
        closed_at = trio.current_time()
    assert at - call.started_at == pytest.approx(3600, abs=0.1)
    assert closed_at - at == pytest.approx(5, abs=0.1)
    assert expired["error"] == {"type": "invalid_request_error", "code": "session_expired",
                                "message": "Your session hit the maximum duration of 60 minutes.",
                                "param": None, "event_id": None}
    assert (refused["error"]["code"], refused["error"]["event_id"]) == ("session_expired", late["event_id"])
    assert call.expired and call.closed and call.close_code == 1001
    assert [r.origin for r in call.responses] == ["scenario", "default"]
    with pytest.raises(trio_websocket.ConnectionRejected):    # the call has ended: no new sideband
        async with connect(sim, "rtc_1"):
            pass


async def test_the_cap_cuts_a_response_in_progress_without_response_done(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"response": {"text": "A long story.", "hold_s": 7200, "background": True}},
                                  {"session_cap": {"at_s": 60, "close": 1000}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        assert await c.closed_code(within_s=100) == 1000
    assert "response.done" not in [e["type"] for e in c.seen]
    assert [e["error"]["code"] for e in c.seen if e["type"] == "error"] == ["session_expired"]
    assert call.responses[0].status == "abandoned"


async def test_expire_session_from_the_test(sim, autojump_clock):
    call = sim.add_call("rtc_1")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await call.wait_until(lambda c: c.connection is not None)
        await sim.expire_session("rtc_1")
        assert (await c.until("error"))["error"]["code"] == "session_expired"
        assert await c.closed_code() == 1001
    assert call.closed and call.expired


# -- idle timeouts


def _idle_session(timeout_ms: int, **detection) -> dict:
    return events.session_update({"audio": {"input": {"turn_detection": {
        "type": "server_vad", "idle_timeout_ms": timeout_ms, **detection}}}})


async def test_the_idle_timeout_fires_after_the_sessions_silence_and_the_model_checks_in(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"user_turn": {"text": "Hello."}}, {"response": {"text": "Hi."}},
                                  {"idle_timeout": {}}, {"idle_timeout": {"text": "Still with me?"}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send(_idle_session(8000))
        await c.until("session.updated")
        first_done = await c.until("response.done")
        answered_at = trio.current_time()
        fired = await c.until("input_audio_buffer.timeout_triggered")
        fired_at = trio.current_time()
        committed = await c.recv()
        added = await c.recv()
        check_in = await c.until("response.done")
        second = await c.until("input_audio_buffer.timeout_triggered")
        second_at = trio.current_time()
        last = await c.until("response.done")
    assert first_done["response"]["output"][0]["content"][0]["transcript"] == "Hi."
    assert fired_at - answered_at == pytest.approx(8, abs=0.1)
    assert fired["audio_end_ms"] - fired["audio_start_ms"] == 8000
    assert committed == {**committed, "type": "input_audio_buffer.committed", "item_id": fired["item_id"]}
    assert added["type"] == "conversation.item.added" and added["item"]["id"] == fired["item_id"]
    assert added["item"]["role"] == "user" and added["item"]["content"][0]["type"] == "input_audio"
    assert check_in["response"]["output"][0]["content"][0]["transcript"] == "Are you still there?"
    assert second_at - fired_at == pytest.approx(8, abs=0.1)      # from the check-in's end
    assert last["response"]["output"][0]["content"][0]["transcript"] == "Still with me?"
    assert call.idle_timeouts == 2 and [r.origin for r in call.responses] == ["scenario", "idle_timeout",
                                                                               "idle_timeout"]


async def test_activity_restarts_the_idle_timer(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"idle_timeout": {}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send(_idle_session(10_000, create_response=False))
        await c.until("session.updated")
        await trio.sleep(6)
        await c.send(events.response_create())      # our own response: the timer starts again at its end
        await c.until("response.done")
        done_at = trio.current_time()
        await c.until("input_audio_buffer.timeout_triggered")
        fired_at = trio.current_time()
        await c.until("conversation.item.done")
        with trio.move_on_after(60):
            assert (await c.recv(within_s=120))["type"] != "response.created"   # create_response false: no reply
    assert fired_at - done_at == pytest.approx(10, abs=0.1)
    assert call.idle_timeouts == 1 and [r.origin for r in call.responses] == ["default"]


async def test_without_an_idle_timeout_in_the_session_nothing_fires(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"idle_timeout": {"wait_s": 600}}, {"close": 1000}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send(events.session_update({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}))
        assert await c.closed_code(within_s=700) == 1000
    assert call.idle_timeouts == 0
    assert "input_audio_buffer.timeout_triggered" not in call.sent_types()


async def test_a_partial_session_update_keeps_the_rest_of_the_session(sim):
    call = sim.add_call("rtc_1")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send(_idle_session(5000))
        await c.until("session.updated")
        await c.send(events.session_update({"audio": {"output": {"voice": "marin"}}}))
        updated = await c.until("session.updated")
    assert updated["session"]["audio"] == {
        "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}},
        "output": {"voice": "marin"}}
    assert call.session["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 5000


async def test_the_shipped_cap_and_idle_scenarios_play(sim, autojump_clock):
    sim.add_call("rtc_cap", "session_cap")
    idle = sim.add_call("rtc_idle", "idle_check_in")
    async with connect(sim, "rtc_cap") as ws:
        c = Client(ws)
        assert await c.closed_code(within_s=4000) == 1001
    assert [e["error"]["code"] for e in c.seen if e["type"] == "error"] == ["session_expired"]
    async with connect(sim, "rtc_idle") as ws:
        c = Client(ws)
        await c.send(_idle_session(10_000))
        assert await c.closed_code(within_s=60) == 1000
    assert idle.idle_timeouts == 2
