"""Event models (discriminated unions over the SDK), builders, and the pure
parts of the sideband module."""

from __future__ import annotations

import json
import re
import typing
from typing import Annotated, Literal, Union

import pydantic
import pytest
from openai.types.live import SessionUsageUpdatedEvent
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent
from openai.types.realtime.input_audio_buffer_speech_started_event import InputAudioBufferSpeechStartedEvent
from openai.types.realtime.realtime_error_event import RealtimeErrorEvent
from openai.types.realtime.response_done_event import ResponseDoneEvent
from structlog.testing import capture_logs

from voiceactors.realtime import events
from voiceactors.realtime.events import EventUnion
from voiceactors.realtime.sideband import is_clean_close, ws_url
from voiceactors.simulator import client_events

EVENT_ID = re.compile(r"^evt_[0-9a-f]{20}$")


def _members(union) -> list[type]:
    return list(typing.get_args(typing.get_args(union)[0]))


def test_unions_cover_every_sdk_member():
    """Every member of the SDK's unions; the server's also Live's usage event
    (a Live call's translator hands it to the protocol as it came)."""
    for built, union, extra in ((events.SERVER_EVENTS, RealtimeServerEvent, {SessionUsageUpdatedEvent}),
                                (client_events.CLIENT_EVENTS, RealtimeClientEvent, set())):
        members = _members(union)
        assert set(built.by_type.values()) | {m for ms in built.fallback.values() for m in ms} == set(members) | extra
        assert len(built.by_type) >= 11


def test_unknown_type_fails_cleanly_in_the_adapter():
    with pytest.raises(pydantic.ValidationError) as info:
        events.SERVER_EVENTS.adapter.validate_python({"type": "response.bogus", "event_id": "e"})
    assert info.value.errors()[0]["type"] == "union_tag_invalid"
    with pytest.raises(ValueError, match="unknown server event type"):
        events.validate_server_event({"type": "response.bogus"})


def test_shared_and_non_literal_types_fall_back_to_trying_models():
    class A(pydantic.BaseModel):
        type: Literal["same"]
        a: int

    class B(pydantic.BaseModel):
        type: Literal["same"]
        b: int

    class C(pydantic.BaseModel):
        type: Literal["only.c"]

    class D(pydantic.BaseModel):  # one of its two values is shared: kept out of the adapter
        type: Literal["d.own", "same"]
        d: int

    class Free(pydantic.BaseModel):
        type: str
        free: bool

    union = Annotated[Union[A, B, C, D, Free], "marker"]
    built = EventUnion.build("test", union)
    assert built.by_type == {"only.c": C}
    assert built.fallback == {"same": [A, B, D], "d.own": [D]}
    assert isinstance(built.validate({"type": "d.own", "d": 1}), D)
    assert built.untyped == [Free]
    assert isinstance(built.validate({"type": "same", "b": 1}), B)
    assert isinstance(built.validate({"type": "only.c"}), C)
    assert isinstance(built.validate({"type": "whatever", "free": True}), Free)
    with pytest.raises(pydantic.ValidationError):
        built.validate({"type": "same"})


def test_parse_server_event_returns_the_sdk_model():
    done = {"type": "response.done", "event_id": "e1",
            "response": {"id": "resp_1", "status": "cancelled",
                         "status_details": {"type": "cancelled", "reason": "turn_detected"},
                         "output": [{"type": "function_call", "id": "i", "call_id": "c1",
                                     "name": "briefing.get", "arguments": "{}", "status": "completed"}]}}
    model = events.parse_server_event(json.dumps(done))
    assert isinstance(model, ResponseDoneEvent)
    assert model.response.status_details.reason == "turn_detected"
    assert model.response.output[0].call_id == "c1"
    err = {"type": "error", "event_id": "e2", "error": {"type": "invalid_request_error",
                                                        "code": "conversation_already_has_active_response",
                                                        "message": "m", "event_id": "evt_x"}}
    assert isinstance(events.parse_server_event(json.dumps(err)), RealtimeErrorEvent)
    started = {"type": "input_audio_buffer.speech_started", "event_id": "e3", "audio_start_ms": 5, "item_id": "i"}
    assert isinstance(events.parse_server_event(json.dumps(started).encode().decode()), InputAudioBufferSpeechStartedEvent)


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b'{"type": "response.done"}', "binary frame"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not an object"),
        ('{"event_id": "x"}', "no type"),
        ('{"type": "response.teleported", "event_id": "x"}', "unknown type"),
        ('{"type": "response.done", "event_id": "x", "response": "sk-secretvalue-123456"}', "invalid fields"),
    ],
)
@pytest.mark.parametrize("only", [None, {"response.done"}])
def test_parse_server_event_skips_and_logs_without_payload(raw, reason, only):
    with capture_logs() as logs:
        assert events.parse_server_event(raw, only=only) is None
    assert len(logs) == 1
    line = logs[0]
    assert line["event"] == "realtime.event_skipped"
    assert line["reason"].startswith(reason)
    assert set(line) <= {"event", "reason", "type", "log_level", "actor"}
    assert "secretvalue" not in json.dumps(line)


def test_builders_validate_and_carry_fresh_event_ids():
    built = [
        events.function_call_output("call_1", json.dumps({"ok": True})),
        events.response_create(),
        events.response_create({"instructions": "be brief"}),
        events.response_cancel(),
        events.response_cancel("resp_1"),
        events.session_update({"instructions": "hi", "tool_choice": "auto",
                               "tools": [{"type": "function", "name": "briefing.get", "description": "d",
                                          "parameters": {"type": "object", "properties": {}}}]}),
    ]
    ids = [e["event_id"] for e in built]
    assert all(EVENT_ID.match(i) for i in ids)
    assert len(set(ids)) == len(ids)
    for event in built:
        model = client_events.validate_client_event(event)
        assert model.type == event["type"]
    assert built[0]["item"] == {"type": "function_call_output", "call_id": "call_1", "output": '{"ok": true}'}
    assert "response_id" not in built[3] and built[4]["response_id"] == "resp_1"
    assert built[5]["session"]["type"] == "realtime"


def test_validate_client_event_rejects_bad_events():
    with pytest.raises(ValueError, match="unknown client event type"):
        client_events.validate_client_event({"type": "response.teleport"})
    with pytest.raises(pydantic.ValidationError):
        client_events.validate_client_event({"type": "conversation.item.create", "item": {"type": "function_call_output"}})
    with pytest.raises(ValueError):
        client_events.validate_client_event(["not", "a", "dict"])  # type: ignore[arg-type]


def test_parse_client_event_reports_a_message():
    model, error = client_events.parse_client_event('{"type": "response.create", "event_id": "evt_1"}')
    assert model is not None and error is None
    for raw in (b"\x00", "nope", '{"type": "x.y"}', '{"type": "session.update", "session": {"type": "bogus"}}'):
        model, error = client_events.parse_client_event(raw)
        assert model is None and error.startswith("Invalid event")


@pytest.mark.parametrize(
    "base, call_id, expected",
    [
        ("https://api.openai.com/v1", "rtc_1", "wss://api.openai.com/v1/realtime?call_id=rtc_1"),
        ("http://127.0.0.1:8766/v1/", "rtc_1", "ws://127.0.0.1:8766/v1/realtime?call_id=rtc_1"),
        ("HTTPS://proxy.example/openai/v1", "rtc a/b&c=d", "wss://proxy.example/openai/v1/realtime?call_id=rtc%20a%2Fb%26c%3Dd"),
        ("http://localhost:1", "x", "ws://localhost:1/realtime?call_id=x"),
    ],
)
def test_ws_url(base, call_id, expected):
    url = ws_url(base, call_id)
    assert url == expected
    assert "model=" not in url


def test_ws_url_rejects_other_schemes():
    for base in ("ftp://x/v1", "api.openai.com/v1", ""):
        with pytest.raises(ValueError):
            ws_url(base, "c")


def test_is_clean_close():
    assert is_clean_close(1000) and is_clean_close(1001)
    assert not any(is_clean_close(c) for c in (1006, 1011, 4000, None))


def test_parse_server_event_only_skips_other_known_types_quietly():
    delta = {"type": "response.output_audio_transcript.delta", "event_id": "e1"}   # missing fields
    done = {"type": "response.done", "event_id": "e2", "response": {"id": "resp_1", "status": "completed"}}
    only = {"response.done"}
    with capture_logs() as logs:
        assert events.parse_server_event(json.dumps(delta), only=only) is None
    assert logs == []        # known, just not wanted: no validation, no log line
    assert events.parse_server_event(json.dumps(done), only=only).response.id == "resp_1"
    with capture_logs() as logs:
        assert events.parse_server_event(json.dumps({"type": "made.up"}), only=only) is None
    assert logs and logs[0]["reason"] == "unknown type"
    with capture_logs() as logs:
        assert events.parse_server_event(json.dumps({"type": "response.done"}), only=only) is None
    assert logs and logs[0]["event"] == "realtime.event_skipped"      # wanted but invalid: still reported


def test_leading_type_skip_leaves_acted_on_events_as_they_were():
    """Reading a leading type only skips ignored events: acted-on ones give
    the same models with or without ``only``, and an ignored type that is
    not written first is still recognised after decoding."""
    samples = [
        {"type": "response.done", "event_id": "e1",
         "response": {"id": "resp_1", "status": "completed", "output": [
             {"type": "function_call", "id": "i", "call_id": "c1", "name": "briefing.get",
              "arguments": "{\"a\": 1}", "status": "completed"}]}},
        {"type": "error", "event_id": "e2", "error": {"type": "invalid_request_error", "message": "m"}},
        {"type": "input_audio_buffer.speech_started", "event_id": "e3", "audio_start_ms": 5, "item_id": "i"},
    ]
    only = {s["type"] for s in samples}
    for sample in samples:
        raw = json.dumps(sample)
        fast = events.parse_server_event(raw, only=only)
        assert fast == events.parse_server_event(raw) and type(fast).__name__ != "dict"
        reordered = json.dumps({"event_id": sample["event_id"], **{k: v for k, v in sample.items() if k != "event_id"}})
        assert events.parse_server_event(reordered, only=only).type == sample["type"]
    late_delta = json.dumps({"event_id": "e9", "type": "response.output_text.delta"})   # invalid if validated
    with capture_logs() as logs:
        assert events.parse_server_event(late_delta, only=only) is None
    assert logs == []


def test_leading_type_skip_errors():
    only = {"response.done"}
    with capture_logs() as logs:   # ignored type: not decoded at all, so its bad tail goes unnoticed
        assert events.parse_server_event('{"type": "response.output_text.delta", oops', only=only) is None
    assert logs == []
    with capture_logs() as logs:   # acted-on type with a broken tail: reported as not JSON
        assert events.parse_server_event('{"type": "response.done", "response": {', only=only) is None
    assert [(x["event"], x["reason"], x["type"]) for x in logs] == [("realtime.event_skipped", "not JSON", None)]


# --- the call actor's reader: EventView over json.loads, checks from the SDK models

from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402

from voiceactors.call.protocol import HANDLED_EVENTS  # noqa: E402
from voiceactors.realtime.event_view import EventView  # noqa: E402

ACTED_ON = [
    {"type": "response.created", "event_id": "e", "response": {"id": "r", "status": "in_progress", "output": []}},
    {"type": "response.done", "event_id": "e", "response": {
        "id": "r", "status": "completed", "object": "realtime.response",
        "usage": {"total_tokens": 3, "input_tokens": 1, "output_tokens": 2},
        "output": [{"type": "function_call", "id": "i", "call_id": "c", "name": "briefing.get", "arguments": "{}",
                    "status": "completed"},
                   {"type": "message", "id": "m", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_audio", "transcript": "hi"}]}]}},
    {"type": "response.output_item.done", "event_id": "e", "response_id": "r", "output_index": 0,
     "item": {"type": "function_call", "id": "i", "call_id": "c", "name": "n", "arguments": "{}", "status": "completed"}},
    {"type": "response.function_call_arguments.done", "event_id": "e", "response_id": "r", "item_id": "i",
     "output_index": 0, "call_id": "c", "name": "n", "arguments": "{}"},
    {"type": "conversation.item.added", "event_id": "e", "previous_item_id": None,
     "item": {"type": "function_call_output", "call_id": "c", "output": "{}"}},
    {"type": "conversation.item.done", "event_id": "e",
     "item": {"type": "message", "role": "user", "id": "u", "content": [{"type": "input_text", "text": "hi"}]}},
    {"type": "error", "event_id": "e", "error": {"type": "invalid_request_error", "message": "m", "code": None,
                                                 "event_id": "evt_x"}},
    {"type": "input_audio_buffer.speech_started", "event_id": "e", "audio_start_ms": 1, "item_id": "u"},
    {"type": "conversation.item.input_audio_transcription.completed", "event_id": "e", "item_id": "u",
     "content_index": 0, "transcript": "hi", "usage": {"type": "duration", "seconds": 1.5}},
    {"type": "response.output_text.done", "event_id": "e", "response_id": "r", "item_id": "m", "output_index": 0,
     "content_index": 0, "text": "hi"},
]


def _same_reading(view, model, obj) -> None:
    """Every field of ``obj`` reads the same from the view as from the model."""
    for key, value in obj.items():
        got, want = getattr(view, key), getattr(model, key)
        if isinstance(value, dict):
            _same_reading(got, want, value)
        elif isinstance(value, list):
            assert len(got) == len(want)
            for g, w, v in zip(got, want, value):
                if isinstance(v, dict):
                    _same_reading(g, w, v)
                else:
                    assert g == w
        else:
            assert got == want, key


@pytest.mark.parametrize("obj", ACTED_ON, ids=[o["type"] for o in ACTED_ON])
def test_read_server_event_gives_a_view_that_reads_like_the_sdk_model(obj):
    raw = json.dumps(obj)
    view = events.read_server_event(raw, HANDLED_EVENTS)
    assert isinstance(view, EventView)
    _same_reading(view, events.parse_server_event(raw), obj)
    assert view.no_such_field is None and getattr(view, "nothing", "x") is None   # missing reads None
    with pytest.raises(AttributeError):
        view.type = "other"
    assert "hi" not in repr(view)                          # no payload in a repr (it may reach a log)


def test_a_screened_frame_reads_as_an_unscreened_one():
    """``screened=True`` (the hand-off asked ``skippable`` already) only saves
    the second ask: every kind of frame reads the same, with the same lines."""
    frames = [json.dumps(obj) for obj in ACTED_ON] + [
        json.dumps({"type": "response.output_audio_transcript.delta", "event_id": "e", "response_id": "r",
                    "item_id": "m", "output_index": 0, "content_index": 0, "delta": "hi"}),   # ignored
        ' {"type": "rate_limits.updated", "event_id": "e", "rate_limits": []}',               # ignored
        json.dumps({"event_id": "e", "type": "response.done", "response": {"id": "r"}}),     # type not leading
        json.dumps({"type": "made.up"}), '{"type": "response.done", oops', b"\x00binary",
        json.dumps({"type": "input_audio_buffer.speech_started", "event_id": "e", "audio_start_ms": "5",
                    "item_id": "u"}),                                                       # the models coerce it
    ]
    for raw in frames:
        with capture_logs() as plain_logs:
            plain = events.read_server_event(raw, HANDLED_EVENTS)
        with capture_logs() as screened_logs:
            screened = events.read_server_event(raw, HANDLED_EVENTS, screened=True)
        assert type(screened) is type(plain) and screened == plain, raw
        assert screened_logs == plain_logs


def test_the_screened_short_path_reads_every_edge_as_the_general_path():
    """``screened=True`` decodes one-object text with ``json.loads``'s own
    scanner and returns its view in one call; text around or after the
    object, a type that is no string, or a frame the checks refuse goes the
    general path, so every frame reads as unscreened, with the same lines."""
    speech = {"type": "input_audio_buffer.speech_started", "event_id": "e", "audio_start_ms": 0, "item_id": "u"}
    text = json.dumps(speech)
    frames = [
        text, " " + text, text + "\n", text + " {}", text + "}", text[:-1], text + "\ufeff",
        json.dumps({**speech, "type": 5}), json.dumps({**speech, "type": ["x"]}), json.dumps({**speech, "type": None}),
        json.dumps({**speech, "audio_start_ms": "5"}),            # refused by the checks, coerced by the models
        text.replace('"audio_start_ms": 0', '"audio_start_ms": ' + "9" * 5000),   # past int's digit limit
        json.dumps({"type": "input_audio_buffer.committed", "event_id": "e", "item_id": "u"}),   # known, not acted on
        "{}", "{", '{"type": "response.done", oops', json.dumps({**speech, "extra": [1, {"a": None}]}),
    ]
    for raw in frames:
        with capture_logs() as plain_logs:
            plain = events.read_server_event(raw, HANDLED_EVENTS)
        with capture_logs() as screened_logs:
            screened = events.read_server_event(raw, HANDLED_EVENTS, screened=True)
        assert type(screened) is type(plain) and screened == plain, raw[:80]
        assert screened_logs == plain_logs, raw[:80]
    assert type(events.read_server_event(text, HANDLED_EVENTS, screened=True)) is EventView


def test_a_frame_the_checks_refuse_but_the_models_accept_is_the_model():
    coerced = {"type": "input_audio_buffer.speech_started", "event_id": "e", "audio_start_ms": "5", "item_id": "u"}
    parsed = events.read_server_event(json.dumps(coerced), HANDLED_EVENTS)
    assert isinstance(parsed, InputAudioBufferSpeechStartedEvent) and parsed.audio_start_ms == 5


def test_read_server_event_skips_like_parse_server_event():
    bad = json.dumps({"type": "response.done", "event_id": "x", "response": "sk-secretvalue-123456"})
    with capture_logs() as logs:
        assert events.read_server_event(bad, HANDLED_EVENTS) is None
        assert events.read_server_event('{"type": "response.output_text.delta", oops', HANDLED_EVENTS) is None
        assert events.read_server_event(json.dumps({"type": "made.up"}), HANDLED_EVENTS) is None
    assert [(x["event"], x["reason"].split(":")[0]) for x in logs] == [
        ("realtime.event_skipped", "invalid fields"), ("realtime.event_skipped", "unknown type")]
    assert "secretvalue" not in json.dumps(logs)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=5,
)


#: Values of the wrong JSON type for most fields (and a few the models coerce)
NEAR_VALUES = [None, True, False, 0, 1, 1.5, "", "x", "5", "completed", [], {}, [1], ["x"], {"a": 1},
               {"type": "function_call"}, {"type": "message"}]


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield prefix + (i,)
            yield from _paths(value, prefix + (i,))


@st.composite
def mutated(draw, events: list[dict] | None = None, most: int = 2):
    """One of ``events`` (the acted-on ones by default) with one to ``most``
    fields removed or replaced by a value of a near or arbitrary JSON type."""
    obj = json.loads(json.dumps(draw(st.sampled_from(ACTED_ON if events is None else events))))
    for _ in range(draw(st.integers(1, most))):
        paths = [p for p in _paths(obj) if p != ("type",)]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.integers(0, 3)) == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = json.loads(json.dumps(draw(st.sampled_from(NEAR_VALUES) | json_values)))
    return obj


@hsettings(max_examples=800, deadline=None)
@given(mutated())
def test_the_compiled_checks_are_at_least_as_strict_as_the_sdk_models(obj):
    """Whatever the checks let through as a view, the SDK models accept too."""
    check = events.SERVER_CHECKS[obj["type"]]
    if check(obj):
        events.validate_server_event(obj)
