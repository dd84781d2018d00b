"""The simulator's Live sessions over real sockets (``simulator/live.py``):
creation from an SDP offer, the attach sideband driven by a bare client and
by the product's call shell, the refusals, the hangup. Every event either
way is held to the SDK's Live types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
import trio_websocket

from voiceactors.call.actor import CallActor
from voiceactors.live.attach import attach_opener, attach_url
from voiceactors.live.names import FunctionNames
from voiceactors.live.translate import LiveTranslator
from voiceactors.live.transport import live_transport
from voiceactors.simulator import Simulator
from voiceactors.simulator import live_events as le
from voiceactors.simulator.live import LiveSession
from voiceactors.testing.rig import KEY as RIG_KEY
from voiceactors.tool_effect import WRITE
from voiceactors.tools.registry import REGISTRY, manifest

from calls_support import rig
from clock_support import real_time_limit
from simulator_support import AUTH, KEY, serving_simulator

SIGNALLING_ONLY = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"


def config(**extra: Any) -> dict[str, Any]:
    names = FunctionNames.of(REGISTRY)
    return {"model": le.LIVE_MODEL, "instructions": "You are the journal's voice.",
            "delegation": {"type": "responses", "responses": {"model": le.RESPONSES_MODEL,
                                                              "tools": names.declare(manifest())}}, **extra}


async def create(http: httpx.AsyncClient, body: dict[str, Any], key: str = KEY) -> httpx.Response:
    return await http.post("/live/sessions", json=body, headers={"authorization": f"Bearer {key}"})


class Attached:
    """A bare attach client: every server event must conform to the SDK's Live types."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws

    async def recv(self) -> dict[str, Any]:
        with trio.fail_after(30):
            event = json.loads(await self.ws.get_message())
        assert le.live_server_error(event) is None, event
        return event

    async def until(self, kind: str, nested: str | None = None) -> dict[str, Any]:
        while True:
            event = await self.recv()
            if event["type"] == kind and (nested is None or event["event"]["type"] == nested):
                return event

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_message(json.dumps(event))


async def test_a_session_is_created_from_an_offer_and_refused_when_wrong(autojump_clock):
    async with serving_simulator(Simulator()) as sim, httpx.AsyncClient(base_url=sim.base_url) as http:
        created = await create(http, {"session": config(), "transport": {"type": "webrtc", "sdp": SIGNALLING_ONLY}})
        assert created.status_code == 200
        body = created.json()
        assert body["session"]["id"].startswith("live_") and body["transport"]["type"] == "webrtc"
        session = sim.live.sessions[body["session"]["id"]]
        assert "journal_search" in session.declared()
        no_model = await create(http, {"session": {}, "transport": {"type": "webrtc", "sdp": SIGNALLING_ONLY}})
        assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "session.model"
        bad_sdp = await create(http, {"session": config(), "transport": {"type": "webrtc", "sdp": "hello"}})
        assert bad_sdp.status_code == 400 and bad_sdp.json()["error"]["code"] == "invalid_offer"
        wrong_key = await create(http, {"session": config(), "transport": {"type": "webrtc", "sdp": SIGNALLING_ONLY}},
                                 key="sk-wrong")
        assert wrong_key.status_code == 401
        gone = await http.post("/live/sessions/live_nope/hangup", headers={"authorization": f"Bearer {KEY}"})
        assert gone.status_code == 404


async def test_a_bare_client_is_delegated_to_refused_and_hung_up(autojump_clock):
    async with serving_simulator(Simulator()) as sim, httpx.AsyncClient(base_url=sim.base_url) as http:
        session_id = (await create(http, {"session": config(), "transport": {"type": "webrtc",
                                                                             "sdp": SIGNALLING_ONLY}})).json()["session"]["id"]
        session: LiveSession = sim.live.sessions[session_id]
        async with trio_websocket.open_websocket_url(attach_url(sim.base_url, session_id),
                                                     extra_headers=AUTH) as ws:
            client = Attached(ws)
            call = (await client.until("response.event", "response.output_item.done"))["event"]["item"]
            assert call["name"] == "journal_search" and json.loads(call["arguments"]) == {"query": "garden"}
            await client.until("response.event", "response.completed")
            await client.send({"type": "response.create", "event_id": "evt_early"})   # outputs first? no: waits
            refusals = {
                "evt_unknown": {"type": "response.item.create", "event_id": "evt_unknown", "item": {
                    "type": "function_call_output", "call_id": "call_nope", "output": "{}"}},
                "evt_delegated": {"type": "session.thinking.append", "event_id": "evt_delegated",
                                  "content": "x", "delegation_id": "del_sim_1"},
                "evt_long": {"type": "session.commentary.append", "event_id": "evt_long",
                             "content": "x" * 2001, "delegation_id": None},
                "evt_start": {"type": "session.start", "event_id": "evt_start"},
                "evt_wrong": {"type": "response.create", "event_id": "evt_wrong", "response": {}},
            }
            for event in refusals.values():
                await client.send(event)
            codes = {}
            while len(codes) < len(refusals):
                error = await client.until("error")
                codes[error["error"]["client_event_id"]] = error["error"]["code"]
            assert codes == {"evt_unknown": "invalid_tool_call_id", "evt_delegated": "invalid_value",
                             "evt_long": "string_above_max_length", "evt_start": "session_already_started",
                             "evt_wrong": "invalid_request_error"}
            await client.send({"type": "response.item.create", "event_id": "evt_out", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": '{"results": []}'}})
            await client.send({"type": "session.thinking.append", "event_id": "evt_note", "content": "noted",
                               "delegation_id": None})
            seen = []
            while not seen or seen[-1]["type"] != "session.usage.updated":
                seen.append(await client.recv())
            kinds = [e["event"]["type"] if e["type"] == "response.event" else e["type"] for e in seen]
            assert set(kinds) == {"session.thinking.appended", "response.created", "response.completed",
                                  "session.output_transcript.delta", "session.usage.updated"}, kinds
            assert kinds.index("response.created") < kinds.index("response.completed")
            [appended] = [e for e in seen if e["type"] == "session.thinking.appended"]
            assert appended["client_event_id"] == "evt_note"
            await http.post(f"/live/sessions/{session_id}/hangup", headers={"authorization": f"Bearer {KEY}"})
            closed = await client.until("session.closed")
            assert closed["reason"] == "close_requested"
        assert session.closed and sim.live.hangups == [session_id]
        assert session.outputs == {call["call_id"]: ['{"results": []}']} and session.response_creates == 1
        assert [n for n in session.nonconforming if "session.start" not in n and "evt_wrong" not in n] == [
            n for n in session.nonconforming if n.startswith("client 'response.create'")]
        with pytest.raises(trio_websocket.ConnectionRejected) as late:     # the session is over
            async with trio_websocket.open_websocket_url(attach_url(sim.base_url, session_id), extra_headers=AUTH):
                pass
        assert late.value.status_code == 410
    assert sim.live.handshakes[-1] == {"session_id": session_id, "status": 410}


async def test_the_call_shell_serves_a_session_write_once_and_barge_in(tmp_path, autojump_clock):
    """The product's call (``CallActor`` with the Live transport over the
    attach websocket, the real executor on a real journal) serves a
    scenario: a look-up answered and continued, then a write and a read the
    user speaks over at once: the write is answered once, the read too,
    no ``response.create`` for the old work, the write's note as thinking."""
    async with rig(tmp_path) as r:
        sim = r.sim
        sim.live.scenario = "live_write_and_barge_in"
        async with httpx.AsyncClient(base_url=sim.base_url) as http:
            session_id = (await create(http, {"session": config(), "transport": {
                "type": "webrtc", "sdp": SIGNALLING_ONLY}}, key=RIG_KEY)).json()["session"]["id"]
        session = sim.live.sessions[session_id]
        # the write completes an open commitment of the rig's journal
        listed = await trio.to_thread.run_sync(REGISTRY["commitments.list"].handler, r.executor.ctx, {"state": "open"})
        commitment = listed["commitments"][0]["id"]
        [write_step] = [step for step in session.steps if step.get("interrupt")]
        write_step["delegate"] = [{**write_step["delegate"][0], "arguments": {"commitment_id": commitment,
                                                                             "resolution": "done"}},
                                  *write_step["delegate"][1:]]
        names = FunctionNames.of(REGISTRY)
        opener = live_transport(attach_opener(sim.base_url, session_id, connect_timeout=5), lambda: LiveTranslator(
            names, is_write=lambda tool: REGISTRY[tool].effect == WRITE if tool in REGISTRY else False))
        actor: CallActor = r.actor(session_id, open_transport=opener)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            with real_time_limit(30):     # tool threads let the fake clock jump: a real-time bound
                await session.wait_until(lambda s: s.step == len(s.steps))
            nursery.cancel_scope.cancel()
    assert session.nonconforming == []
    types = [e["type"] for e in session.received]
    assert types.count("response.create") == 1                 # the first delegation only
    assert len(session.outputs) == 3 and all(len(o) == 1 for o in session.outputs.values())
    written = json.loads(session.outputs["call_sim_2_0"][0])
    assert written["ok"] is True and written["commitment"]["id"] == commitment   # done once, on the journal
    [note] = [e["content"] for e in session.of_type("session.thinking.append")]
    assert note.startswith("Done in the journal: commitments.complete")
    # the read the user spoke over: cancelled, unless its thread answered first (tests/test_live_call.py holds it)
    assert actor.calls["call_sim_2_1"].outcome in ("cancelled", "ok")
    assert actor.protocol.turn == 3
