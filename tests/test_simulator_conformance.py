"""Conformance: the simulator holds the events it sends and receives to the
SDK's types exactly (strict types, no undeclared field), over its real
websocket; the suite's fixture (tests/conftest.py) fails a test that meets
an event that does not conform."""

from __future__ import annotations

import json

import pytest
import trio_websocket

from voiceactors.realtime import events
from voiceactors.realtime.events import SERVER_EVENTS
from voiceactors.simulator import Simulator, conformance
from voiceactors.simulator.client_events import CLIENT_EVENTS
from voiceactors.simulator.conformance import Direction

KEY = "sk-test"
AUTH = [(b"authorization", f"Bearer {KEY}".encode())]

SPEECH_STARTED = {"type": "input_audio_buffer.speech_started", "event_id": "event_1", "audio_start_ms": 5,
                  "item_id": "item_1"}


def test_a_conforming_event_has_no_error():
    assert conformance.conformance_error(SERVER_EVENTS, SPEECH_STARTED) == (None, None)
    assert conformance.conformance_error(CLIENT_EVENTS, events.function_call_output("call_1", "{}")) == (None, None)


def test_undeclared_fields_are_named_at_any_depth():
    reason, first = conformance.conformance_error(SERVER_EVENTS, {**SPEECH_STARTED, "loudness": 3})
    assert (reason, first) == ("undeclared fields: loudness", "loudness")
    item = {"id": "item_2", "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_audio", "transcript": None, "pitch": 1}]}
    added = {"type": "conversation.item.added", "event_id": "event_2", "previous_item_id": None, "item": item}
    assert conformance.conformance_error(SERVER_EVENTS, added)[1] == "item.content[0].pitch"
    update = events.session_update({"instructions": "x", "temprature": 0.6})
    assert conformance.conformance_error(CLIENT_EVENTS, update)[1] == "session.temprature"


def test_values_the_models_would_coerce_do_not_conform():
    """The SDK's models read "5" as 5; the wire must carry the number."""
    assert events.validate_server_event({**SPEECH_STARTED, "audio_start_ms": "5"})   # lax: accepted
    reason, first = conformance.conformance_error(SERVER_EVENTS, {**SPEECH_STARTED, "audio_start_ms": "5"})
    assert reason is not None and "audio_start_ms" in reason and first is None


def test_unknown_types_and_non_events_do_not_conform():
    assert conformance.conformance_error(SERVER_EVENTS, {"type": "response.teleported", "event_id": "e"})[0] == (
        "unknown server event type")
    assert conformance.conformance_error(CLIENT_EVENTS, [1])[0] is not None
    with pytest.raises(conformance.NonconformingEvent, match="loudness"):
        conformance.check_server_event({**SPEECH_STARTED, "loudness": 3})


def test_the_environment_turns_it_on_for_every_simulator(monkeypatch):
    monkeypatch.delenv(conformance.ENV_FLAG, raising=False)
    assert Simulator(api_key=KEY).conformance is False
    monkeypatch.setenv(conformance.ENV_FLAG, "1")
    assert Simulator(api_key=KEY).conformance is True
    assert Simulator(api_key=KEY, conformance=False).conformance is False


@pytest.mark.nonconforming_events
async def test_a_client_event_with_an_undeclared_field_is_recorded_and_still_answered(nursery):
    sim = Simulator(api_key=KEY, conformance=True)
    await nursery.start(sim.serve, 0)
    call = sim.add_call("rtc_1")
    url = sim.base_url.replace("http://", "ws://") + "/realtime?call_id=rtc_1"
    async with trio_websocket.open_websocket_url(url, extra_headers=AUTH) as ws:
        good = events.session_update({"instructions": "Be brief."})
        await ws.send_message(json.dumps(good))
        assert json.loads(await ws.get_message())["type"] == "session.updated"
        bad = events.response_create()
        bad["response"] = {"instructions": "x", "voice_speed": 2}
        await ws.send_message(json.dumps(bad))
        created = json.loads(await ws.get_message())
    assert created["type"] == "response.created"       # the simulator's answer does not change
    [entry] = call.nonconforming
    assert (entry.call_id, entry.direction, entry.type) == ("rtc_1", Direction.CLIENT, "response.create")
    assert entry.reason == "undeclared fields: response.voice_speed"
    assert entry in conformance.recorded()
