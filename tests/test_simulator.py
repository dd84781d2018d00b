"""The Realtime simulator, driven over real loopback sockets by a raw
trio-websocket client (and ``open_sideband`` for the handshake outcomes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import httpx
import pytest
import trio
import trio_websocket
from openai import AsyncOpenAI
from openai.types.realtime import ClientSecretCreateResponse

from voiceactors.cli import build_parser
from voiceactors.realtime import events
from voiceactors.realtime.sideband import CallGone, SidebandUnavailable, open_sideband
from voiceactors.simulator import ScenarioError, Simulator, cli_simulate, load_scenario, scenario_names

from simulator_support import AUTH, KEY, Client, answer, calls_in, connect


@pytest.fixture
async def sim(nursery):
    s = Simulator(api_key=KEY, conformance=True)
    await nursery.start(s.serve, 0)
    return s


# -- handshake


async def _handshake_status(sim: Simulator, call_id: str, headers=AUTH, extra: str = "") -> int | None:
    try:
        async with connect(sim, call_id, headers, extra):
            return 101
    except trio_websocket.ConnectionRejected as exc:
        body = json.loads(exc.body)
        assert set(body["error"]) >= {"message", "type", "code"}
        return exc.status_code


async def test_handshake_rejections(sim):
    sim.add_call("rtc_ok")
    assert await _handshake_status(sim, "rtc_ok", [(b"authorization", b"Bearer ek_abcdef123456")]) == 404
    assert await _handshake_status(sim, "rtc_unknown") == 404
    assert await _handshake_status(sim, "rtc_ok", []) == 401
    assert await _handshake_status(sim, "rtc_ok", [(b"authorization", b"Bearer sk-wrong")]) == 401
    assert await _handshake_status(sim, "rtc_ok", AUTH + [(b"openai-beta", b"realtime=v1")]) == 400
    assert await _handshake_status(sim, "rtc_ok", extra="&model=gpt-realtime") == 400
    assert await _handshake_status(sim, "") == 400
    assert sim.calls["rtc_ok"].connections == 0
    assert await _handshake_status(sim, "rtc_ok") == 101
    assert [h["status"] for h in sim.handshakes][-1] == 101


async def test_second_live_connection_is_refused(sim):
    sim.add_call("rtc_1")
    async with connect(sim, "rtc_1"):
        assert await _handshake_status(sim, "rtc_1") == 409
    assert sim.calls["rtc_1"].connections == 1


async def test_open_sideband_sorts_handshake_failures(sim, autojump_clock):
    sim.add_call("rtc_gone", [{"close": 1000}])
    sim.add_call("rtc_410", [{"close": 1001}], gone_status=410)
    for call_id, status in (("rtc_gone", 404), ("rtc_410", 410)):
        async with open_sideband(sim.base_url, KEY, call_id) as ws:
            with pytest.raises(trio_websocket.ConnectionClosed):
                await ws.get_message()
        with pytest.raises(CallGone) as info:
            async with open_sideband(sim.base_url, KEY, call_id):
                pass
        assert info.value.status_code == status
    with pytest.raises(CallGone):
        async with open_sideband(sim.base_url, KEY, "rtc_never_added"):
            pass
    with pytest.raises(SidebandUnavailable) as info:
        async with open_sideband(sim.base_url, "sk-wrong", "rtc_gone"):
            pass
    assert info.value.status_code == 401


async def test_open_sideband_refused_and_timeout(nursery, autojump_clock):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    with pytest.raises(SidebandUnavailable) as info:
        async with open_sideband(f"http://127.0.0.1:{free_port}/v1", KEY, "c", connect_timeout=2):
            pass
    assert info.value.status_code is None

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    mute_port = listeners[0].socket.getsockname()[1]

    async def mute(stream):  # accepts, never answers the handshake
        await trio.sleep_forever()

    await nursery.start(trio.serve_listeners, mute, listeners)
    start = trio.current_time()
    with pytest.raises(SidebandUnavailable, match="timed out"):
        async with open_sideband(f"http://127.0.0.1:{mute_port}/v1", KEY, "c", connect_timeout=7):
            pass
    assert trio.current_time() - start == pytest.approx(7, abs=0.5)


async def test_open_sideband_passes_body_errors_through(sim):
    sim.add_call("rtc_1")
    with pytest.raises(KeyError):
        async with open_sideband(sim.base_url, KEY, "rtc_1"):
            raise KeyError("mine")
    await sim.calls["rtc_1"].wait_until(lambda c: c.connection is None)
    assert sim.calls["rtc_1"].connections == 1


# -- REST


async def test_client_secrets_validates_and_records(sim):
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        r = await http.post("/realtime/client_secrets", json={"session": {"type": "realtime"}})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = await http.post("/realtime/client_secrets", json={}, headers={"authorization": "Bearer ek_123456789"})
        assert r.status_code == 401
        assert sim.client_secret_requests == []

        auth = {"authorization": f"Bearer {KEY}"}
        bad_bodies = [
            {"session": {"type": "bogus"}},
            {"session": {"type": "realtime", "instructions": 5}},
            {"session": {"type": "realtime"}, "expires_after": {"anchor": "created_at", "seconds": 5}},
            {"session": {"type": "realtime"}, "surprise": 1},
        ]
        for body in bad_bodies:
            r = await http.post("/realtime/client_secrets", json=body, headers=auth)
            assert r.status_code == 400, body
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and err["message"]
        r = await http.post("/realtime/client_secrets", content=b"{oops", headers=auth)
        assert r.status_code == 400

        session = {"type": "realtime", "model": "gpt-realtime", "instructions": "Be brief.", "tool_choice": "auto",
                   "tools": [{"type": "function", "name": "briefing.get", "description": "d",
                              "parameters": {"type": "object", "properties": {}}}]}
        body = {"expires_after": {"anchor": "created_at", "seconds": 600}, "session": session}
        r = await http.post("/realtime/client_secrets", json=body, headers=auth)
        assert r.status_code == 200
        out = ClientSecretCreateResponse.model_validate(r.json())
        assert out.value.startswith("ek_") and out.value in sim.minted
        assert out.session.instructions == "Be brief."
    assert [rec["status"] for rec in sim.client_secret_requests] == [400, 400, 400, 400, 200]
    assert sim.client_secret_requests[-1]["body"] == body


async def test_client_secrets_through_the_sdk(sim):
    async with AsyncOpenAI(api_key=KEY, base_url=sim.base_url, max_retries=0) as client:
        secret = await client.realtime.client_secrets.create(session={"type": "realtime", "instructions": "x"})
        assert secret.value.startswith("ek_") and secret.expires_at > 0
        sim.add_call("rtc_h")
        await client.realtime.calls.hangup("rtc_h")
    assert sim.calls["rtc_h"].closed and sim.hangups == ["rtc_h"]


async def test_fail_next_mint(sim, autojump_clock):
    auth = {"authorization": f"Bearer {KEY}"}
    sim.fail_next_mint(503)
    sim.fail_next_mint("garbage")
    sim.fail_next_mint("timeout")
    async with httpx.AsyncClient(base_url=sim.base_url, headers=auth, timeout=httpx.Timeout(5.0)) as http:
        r = await http.post("/realtime/client_secrets", json={})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        r = await http.post("/realtime/client_secrets", json={})
        assert r.status_code == 200
        with pytest.raises(ValueError):
            r.json()
        start = trio.current_time()
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/realtime/client_secrets", json={})
        assert trio.current_time() - start == pytest.approx(5.0, abs=0.5)
        r = await http.post("/realtime/client_secrets", json={})
        assert r.status_code == 200 and r.json()["value"].startswith("ek_")


async def test_hangup_closes_the_sideband(sim):
    sim.add_call("rtc_1")
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        auth = {"authorization": f"Bearer {KEY}"}
        assert (await http.post("/realtime/calls/rtc_1/hangup")).status_code == 401
        async with connect(sim, "rtc_1") as ws:
            r = await http.post("/realtime/calls/rtc_1/hangup", headers=auth)
            assert r.status_code == 200
            assert await Client(ws).closed_code() == 1000
        assert (await http.post("/realtime/calls/rtc_1/hangup", headers=auth)).status_code == 404
        assert (await http.post("/realtime/calls/nope/hangup", headers=auth)).status_code == 404
    assert await _handshake_status(sim, "rtc_1") == 404


async def test_webrtc_offer_registers_a_call(sim):
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        r = await http.post("/realtime/client_secrets", json={}, headers={"authorization": f"Bearer {KEY}"})
        ek = r.json()["value"]
        r = await http.post("/realtime/calls", content=b"v=0\r\n",
                            headers={"authorization": f"Bearer {ek}", "content-type": "application/sdp"})
        assert r.status_code == 201 and r.text.startswith("v=0")
        call_id = r.headers["location"].rsplit("/", 1)[1]
        assert (await http.post("/realtime/calls", content=b"v=0")).status_code == 401
    assert call_id.startswith("rtc_") and call_id in sim.calls
    assert await _handshake_status(sim, call_id) == 101


# -- client events


@pytest.mark.nonconforming_events
async def test_invalid_client_events_get_an_error_echoing_event_id(sim):
    call = sim.add_call("rtc_1")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send({"type": "response.teleport", "event_id": "evt_bad_type"})
        await c.send({"type": "conversation.item.create", "event_id": "evt_bad_item", "item": {"type": "function_call_output"}})
        await ws.send_message("not json at all")
        await ws.send_message(b"\x00binary")
        errors = [await c.until("error") for _ in range(4)]
    assert [e["error"]["event_id"] for e in errors] == ["evt_bad_type", "evt_bad_item", None, None]
    assert all(e["error"]["type"] == "invalid_request_error" for e in errors)
    assert call.error_codes == ["invalid_event"] * 4
    assert [e.get("event_id") for e in call.received] == ["evt_bad_type", "evt_bad_item"]
    assert "session.created" not in call.sent_types()


async def test_session_update(sim):
    call = sim.add_call("rtc_1")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send(events.session_update({"instructions": "Speak like a pirate."}))
        updated = await c.until("session.updated")
    assert updated["session"]["instructions"] == "Speak like a pirate."
    assert call.session["instructions"] == "Speak like a pirate."


async def test_response_create_while_active(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"response": {"text": "Still talking.", "hold_s": 5}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        created = await c.until("response.created")
        early = await c.send(events.response_create())
        error = await c.until("error")
        assert error["error"]["code"] == "conversation_already_has_active_response"
        assert error["error"]["event_id"] == early["event_id"]
        await c.until("response.done", response__id=created["response"]["id"])
        await c.send(events.response_create())
        reply = await c.until("response.done")
        assert reply["response"]["status"] == "completed"
    assert call.response_creates == 2
    assert [r.origin for r in call.responses] == ["scenario", "default"]


async def test_response_cancel(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"response": {"text": "A long story.", "hold_s": 5}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        created = await c.until("response.created")
        await c.send(events.response_cancel(created["response"]["id"]))
        done = await c.until("response.done")
        stray = await c.send(events.response_cancel())
        error = await c.until("error")
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "client_cancelled"
    assert error["error"]["code"] == "response_cancel_not_active"
    assert error["error"]["event_id"] == stray["event_id"]
    assert call.responses[0].status == "cancelled"


async def test_tool_outputs_unknown_duplicate_and_valid(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"response": {"tool_calls": [{"name": "briefing.get", "call_id": "call_A"}]}}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("response.done")
        unknown = await c.send(events.function_call_output("call_nope", "{}"))
        error = await c.until("error")
        assert (error["error"]["code"], error["error"]["event_id"]) == ("invalid_tool_call_id", unknown["event_id"])
        await c.send(events.function_call_output("call_A", '{"text": "briefing"}'))
        added = await c.until("conversation.item.added")
        assert added["item"]["call_id"] == "call_A" and added["item"]["id"].startswith("item_")
        await c.until("conversation.item.done", item__id=added["item"]["id"])
        dup = await c.send(events.function_call_output("call_A", '{"again": true}'))
        error = await c.until("error")
        assert (error["error"]["code"], error["error"]["event_id"]) == ("duplicate_tool_call_output", dup["event_id"])
    assert call.outputs == {"call_nope": ["{}"], "call_A": ['{"text": "briefing"}', '{"again": true}']}
    assert call.answered == {"call_A"} and call.pending_call_ids() == []


async def test_pending_call_ids_are_the_issued_calls_without_output_in_issue_order(sim, autojump_clock):
    """The simulator keeps its open tool calls as outputs land (it asks at
    every event, and a long call's history must not make that cost more)."""
    calls = [{"name": "briefing.get", "call_id": f"call_{x}"} for x in "ABC"]
    call = sim.add_call("rtc_1", [{"response": {"tool_calls": calls}}, {"sleep": 60}])
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("response.done")
        assert call.pending_call_ids() == ["call_A", "call_B", "call_C"]
        await c.send(events.function_call_output("call_B", "{}"))
        await c.until("conversation.item.done")
        assert call.pending_call_ids() == ["call_A", "call_C"]
        await c.send(events.function_call_output("call_nope", "{}"))   # refused: changes nothing
        await c.until("error")
        await c.send(events.function_call_output("call_B", "{}"))      # a duplicate: likewise
        await c.until("error")
        assert call.pending_call_ids() == ["call_A", "call_C"]
        for x in "CA":
            await c.send(events.function_call_output(f"call_{x}", "{}"))
            await c.until("conversation.item.done")
        assert call.pending_call_ids() == [] and call.answered == {"call_A", "call_B", "call_C"}


async def test_early_response_create_is_a_violation(sim, autojump_clock):
    call = sim.add_call("rtc_1", "single_tool")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("response.done")
        await c.send(events.response_create())  # before the output: breaks rule 3
        await c.until("response.done")
    assert len(call.violations) == 1 and "had no output" in call.violations[0]


# -- scenarios


async def test_single_tool_round_trip(sim, autojump_clock):
    call = sim.add_call("rtc_1", "single_tool")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
        [tool] = calls_in(done)
        assert (tool["name"], tool["arguments"], tool["status"]) == ("briefing.get", "{}", "completed")
        args_done = next(e for e in c.seen if e["type"] == "response.function_call_arguments.done")
        assert args_done["call_id"] == tool["call_id"] and args_done["name"] == "briefing.get"
        await answer(c, done)
        final = await c.until("response.done")
        assert final["response"]["status"] == "completed"
        assert final["response"]["output"][0]["content"][0]["transcript"] == "Here is your briefing for today."
        assert await c.closed_code() == 1000
    assert c.seen[0]["type"] == "input_audio_buffer.speech_started"
    assert "session.created" not in [e["type"] for e in c.seen]
    assert call.outputs == {tool["call_id"]: [json.dumps({"ok": tool["call_id"]})]}
    assert call.response_creates == 1 and call.error_codes == [] and call.violations == []
    assert call.closed and call.close_code == 1000
    assert [r.status for r in call.responses] == ["completed", "completed"]
    assert call.responses[1].origin == "client"


async def test_parallel_tools(sim, autojump_clock):
    call = sim.add_call("rtc_1", "parallel_tools")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
        assert [t["name"] for t in calls_in(done)] == ["calendar.today", "commitments.list", "journal.search"]
        call_ids = await answer(c, done)
        await c.until("response.done")
        assert await c.closed_code() == 1000
    assert sorted(call.outputs) == sorted(call_ids) and all(len(v) == 1 for v in call.outputs.values())
    assert call.response_creates == 1 and call.error_codes == [] and call.violations == []


async def test_barge_in_during_tool(sim, autojump_clock):
    call = sim.add_call("rtc_1", "barge_in_during_tool")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        item_done = await c.until("response.output_item.done", item__type="function_call")
        call_id = item_done["item"]["call_id"]
        await c.until("input_audio_buffer.speech_started")
        cancelled = await c.until("response.done")
        assert cancelled["response"]["status"] == "cancelled"
        assert cancelled["response"]["status_details"]["reason"] == "turn_detected"
        assert [t["call_id"] for t in calls_in(cancelled)] == [call_id]
        await c.until("response.done")  # the model answers the new turn itself
        assert call.pending_call_ids() == [call_id]
        await c.send(events.function_call_output(call_id, json.dumps({"error": "cancelled: the user interrupted"})))
        assert await c.closed_code() == 1000
    assert "output_audio_buffer.cleared" in call.sent_types()
    assert call.response_creates == 0 and call.error_codes == [] and call.violations == []
    assert [(r.status, r.reason) for r in call.responses] == [("cancelled", "turn_detected"), ("completed", None)]


async def test_response_create_after_barge_in_is_a_violation(sim, autojump_clock):
    call = sim.add_call("rtc_1", "barge_in_during_tool")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        cancelled = await c.until("response.done")
        await c.until("response.done")  # the model's answer to the new turn
        [tool] = calls_in(cancelled)
        await c.send(events.function_call_output(tool["call_id"], "{}"))
        await c.until("conversation.item.added", item__call_id=tool["call_id"])
        late = await c.send(events.response_create())  # rule 4: the new turn owns the floor
        assert await c.closed_code() == 1000
    assert call.response_creates == 1
    assert len(call.violations) == 1 and late["event_id"] in call.violations[0]
    assert call.tool_calls[tool["call_id"]].turn == 1 and call.turn == 2


async def test_cancel_cuts_a_tool_call_mid_arguments(sim, autojump_clock):
    steps = [{"response": {"tool_calls": [{"name": "journal.search", "arguments": {"query": "q"}}],
                           "delta_interval_s": 1.0}}]
    call = sim.add_call("rtc_1", steps)
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("response.function_call_arguments.delta")
        await c.send(events.response_cancel())
        args_done = await c.until("response.function_call_arguments.done")
        item_done = await c.until("response.output_item.done")
        done = await c.until("response.done")
    assert len(args_done["arguments"]) < len(json.dumps({"query": "q"}))
    assert item_done["item"]["status"] == "incomplete"
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["output"][0]["status"] == "incomplete"
    # the call exists, so it still needs exactly one output
    assert call.pending_call_ids() == [args_done["call_id"]]
    assert not call.tool_calls[args_done["call_id"]].complete


async def test_model_responds_first(sim, autojump_clock):
    call = sim.add_call("rtc_1", "model_responds_first")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
        model_first = await c.until("response.created")
        # a careless client sends response.create right after its output: refused
        call_ids = await answer(c, done)
        error = await c.until("error")
        assert error["error"]["code"] == "conversation_already_has_active_response"
        await c.until("response.done", response__id=model_first["response"]["id"])
        await c.send(events.response_create())
        final = await c.until("response.done")
        assert final["response"]["output"][0]["content"][0]["transcript"] == "Here is your briefing."
        assert await c.closed_code() == 1000
    assert call.response_creates == 2 and call.error_codes == ["conversation_already_has_active_response"]
    assert [r.origin for r in call.responses] == ["scenario", "model_first", "client"]
    assert list(call.outputs) == call_ids


async def test_model_response_first_on_outputs_answered(sim, autojump_clock):
    steps = [{"response": {"tool_calls": [{"name": "calendar.today"}]}},
             {"model_response_first": {"text": "Oh, one more thing.", "when": "outputs_answered", "hold_s": 2}},
             {"wait_outputs": {}},
             {"response": {"text": "Done."}}]
    call = sim.add_call("rtc_1", steps)
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
        [tool] = calls_in(done)
        await c.send(events.function_call_output(tool["call_id"], "{}"))
        eager = await c.send(events.response_create())
        error = await c.until("error")
        assert (error["error"]["code"], error["error"]["event_id"]) == (
            "conversation_already_has_active_response", eager["event_id"])
        await c.until("response.done")
        await c.send(events.response_create())
        final = await c.until("response.done")
    assert final["response"]["output"][0]["content"][0]["transcript"] == "Done."
    assert [r.origin for r in call.responses] == ["scenario", "model_first", "client"]


async def test_transcript_noise(sim, autojump_clock):
    call = sim.add_call("rtc_1", "transcript_noise")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
        await answer(c, done)
        await c.until("response.done")
        assert await c.closed_code() == 1000
    deltas = [e for e in c.seen if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert len(deltas) == 60 + 1  # background traffic plus the user turn's own transcript
    assert call.response_creates == 1 and call.error_codes == []


async def test_clean_close_1001(sim, autojump_clock):
    call = sim.add_call("rtc_1", "clean_close")
    async with connect(sim, "rtc_1") as ws:
        assert await Client(ws).closed_code() == 1001
    assert call.closed and call.close_code == 1001
    assert await _handshake_status(sim, "rtc_1") == 404


async def test_drop_and_resume(sim, autojump_clock):
    call = sim.add_call("rtc_1", "drop_and_resume")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        done = await c.until("response.done")
        [tool] = calls_in(done)
        assert await c.closed_code() == 1006
    assert call.drops == 1 and not call.closed and call.pending_call_ids() == [tool["call_id"]]
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send(events.function_call_output(tool["call_id"], '{"commitments": []}'))
        await c.until("conversation.item.added", item__call_id=tool["call_id"])
        await c.send(events.response_create())
        final = await c.until("response.done")
        assert final["response"]["status"] == "completed"
        assert await c.closed_code() == 1000
    assert call.connections == 2 and call.response_creates == 1
    assert call.outputs == {tool["call_id"]: ['{"commitments": []}']}
    assert call.error_codes == [] and call.violations == []


async def test_programmatic_drop_and_end(sim, autojump_clock):
    call = sim.add_call("rtc_1")
    async with connect(sim, "rtc_1") as ws:
        await call.wait_until(lambda c: c.connection is not None)
        sim.drop("rtc_1")
        assert await Client(ws).closed_code() == 1006
    async with connect(sim, "rtc_1") as ws:
        await call.wait_until(lambda c: c.connection is not None)
        await sim.inject("rtc_1", {"type": "response.teleported", "event_id": "x"})
        assert json.loads(await ws.get_message())["type"] == "response.teleported"
        await sim.end_call("rtc_1", 1001)
        assert await Client(ws).closed_code() == 1001
    assert call.connections == 2 and call.closed


async def test_drop_on_next_output_lost(sim, autojump_clock):
    """The output is swallowed by the drop: no confirmation, the id stays
    pending, and the same output sent again on the next socket is accepted."""
    call = sim.add_call("rtc_1", [{"response": {"tool_calls": [{"name": "briefing.get", "call_id": "call_A"}]}}])
    sim.drop_on_next_output("rtc_1")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("response.done")
        await c.send(events.function_call_output("call_A", '{"v": 1}'))
        assert await c.closed_code() == 1006
    assert not [e for e in c.seen if e.get("item", {}).get("type") == "function_call_output"]
    assert call.drops == 1 and not call.closed and call.output_fault is None
    assert call.lost_outputs == {"call_A": ['{"v": 1}']} and call.outputs == {}
    assert call.pending_call_ids() == ["call_A"]
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.send(events.function_call_output("call_A", '{"v": 1}'))
        await c.until("conversation.item.added", item__call_id="call_A")   # the fault fired once only
    assert call.outputs == {"call_A": ['{"v": 1}']} and call.error_codes == []
    assert call.connections == 2 and call.drops == 1


async def test_drop_on_next_output_applied(sim, autojump_clock):
    """The service applied the output but the socket dropped before the
    confirmation: a resend meets duplicate_tool_call_output."""
    call = sim.add_call("rtc_1", [{"response": {"tool_calls": [{"name": "briefing.get", "call_id": "call_A"}]}}])
    sim.drop_on_next_output("rtc_1", applied=True)
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        await c.until("response.done")
        await c.send(events.function_call_output("call_A", '{"v": 1}'))
        assert await c.closed_code() == 1006
    assert call.outputs == {"call_A": ['{"v": 1}']} and call.lost_outputs == {}
    assert call.pending_call_ids() == [] and call.drops == 1
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        again = await c.send(events.function_call_output("call_A", '{"v": 1}'))
        error = await c.until("error")
    assert (error["error"]["code"], error["error"]["event_id"]) == ("duplicate_tool_call_output", again["event_id"])
    assert call.outputs == {"call_A": ['{"v": 1}', '{"v": 1}']}


async def test_reject_next_response_create_while_idle(sim, autojump_clock):
    call = sim.add_call("rtc_1")
    sim.reject_next_response_create("rtc_1", times=2)
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        for _ in range(2):
            create = await c.send(events.response_create())
            error = await c.until("error")
            assert error["error"]["code"] == "conversation_already_has_active_response"
            assert error["error"]["event_id"] == create["event_id"]
        assert call.active_response_id is None and call.reject_creates == 0
        await c.send(events.response_create())
        done = await c.until("response.done")
    assert done["response"]["status"] == "completed"
    assert call.response_creates == 3 and [r.origin for r in call.responses] == ["default"]
    assert "response.created" not in [e["type"] for e in c.seen[:2]]


async def test_silence(sim, autojump_clock):
    sim.add_call("rtc_1", "silence")
    async with connect(sim, "rtc_1") as ws:
        with trio.move_on_after(3000) as scope:
            await ws.get_message()
        assert scope.cancelled_caught


async def test_wait_outputs_timeout_is_a_violation(sim, autojump_clock):
    call = sim.add_call("rtc_1", [{"response": {"tool_calls": [{"name": "briefing.get"}]}},
                                  {"wait_outputs": {"timeout_s": 3}}, {"close": 1000}])
    async with connect(sim, "rtc_1") as ws:
        assert await Client(ws).closed_code() == 1000
    assert len(call.violations) == 1 and "timed out" in call.violations[0]


async def test_demo_scenario_plays_through(sim, autojump_clock):
    call = sim.add_call("rtc_1", "demo")
    async with connect(sim, "rtc_1") as ws:
        c = Client(ws)
        names: list[str] = []
        while True:
            done = await c.until("response.done")
            names += [t["name"] for t in calls_in(done)]
            if done["response"]["status"] == "cancelled":
                await answer(c, done, create=False)
                break
            if calls_in(done):
                await answer(c, done)
        assert await c.closed_code() == 1000
    assert names == ["briefing.get", "calendar.today", "commitments.list", "journal.search", "journal.search"]
    assert call.response_creates == 2 and call.error_codes == [] and call.violations == []
    assert all(len(v) == 1 for v in call.outputs.values()) and len(call.outputs) == 5


# -- scenario files and CLI


def test_shipped_scenarios_load():
    expected = {"single_tool", "parallel_tools", "barge_in_during_tool", "model_responds_first",
                "transcript_noise", "clean_close", "drop_and_resume", "silence", "demo", "demo_mcp"}
    assert expected <= set(scenario_names())
    for name in scenario_names():
        assert load_scenario(name).steps


def test_bad_scenarios_are_refused(tmp_path):
    with pytest.raises(ScenarioError, match="no scenario named"):
        load_scenario("no_such_scenario")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"steps": [{"close": 1006}]}))
    with pytest.raises(ScenarioError, match="invalid"):
        load_scenario(bad)
    bad.write_text(json.dumps({"steps": [{"respnse": {}}]}))
    with pytest.raises(ScenarioError):
        load_scenario(str(bad))
    bad.write_text("{")
    with pytest.raises(ScenarioError, match="not JSON"):
        load_scenario(bad)
    good = tmp_path / "mine.json"
    good.write_text(json.dumps({"steps": [{"sleep": 1}, {"close": 1000}]}))
    assert load_scenario(good).name == "mine"


def test_cli_simulate_refuses_an_unknown_scenario(capsys):
    args = build_parser().parse_args(["simulate", "--port", "0", "--scenario", "no_such_scenario"])
    assert cli_simulate(args) == 2
    assert "no scenario named" in capsys.readouterr().out


def test_cli_simulate_reports_a_busy_port(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = build_parser().parse_args(["simulate", "--port", str(port)])
        assert cli_simulate(args) == 1
    assert "cannot listen" in capsys.readouterr().out


async def test_cli_simulate_serves_any_call():
    """The real command in a subprocess: auto_calls, any standard key, the
    chosen scenario, one log line per connection."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "voiceactors.cli", "simulate", "--port", "0", "--scenario", "clean_close"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
            base_url = line.decode().split(" on ", 1)[1].split(" ", 1)[0]
            assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
            async with open_sideband(base_url, "sk-anything", "rtc_whatever") as ws:
                assert await Client(ws).closed_code() == 1001
            with pytest.raises(CallGone):
                async with open_sideband(base_url, "sk-anything", "rtc_whatever"):
                    pass
    finally:
        proc.kill()
        await proc.wait()
    log = b""
    while chunk := await proc.stderr.receive_some(65536):
        log += chunk
    assert log.count(b"simulator.connection ") == 2 and b"outcome=rejected" in log and b"sk-anything" not in log
