"""Bad input on the sideband: garbage frames from the Realtime simulator.

Hypothesis draws lists of frames — non-JSON text, binary frames, JSON that is
not an object, unknown event types, known events with a field missing or of
the wrong type, huge arguments, tool names that do not exist, arguments that
are not objects, the same tool call id twice, outputs for calls never made —
and the simulator injects them (``sim.inject``, raw and unvalidated) on a live
call while a real scenario runs its tool calls. The CallActor must survive all
of it: the real tool calls are answered exactly once and followed by exactly
one ``response.create``, every complete fake tool call gets exactly one answer
(never two), and every frame that is not a valid event is logged as skipped.

Real clock (each example is its own ``trio.run``; nothing here waits on a
timer), a fresh journal and state dir per example, a bounded example count
with a fixed seed (``derandomize``) so the suite stays fast and repeatable.
"""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from typing import Any

import structlog
import trio
from hypothesis import HealthCheck, given, settings, strategies as st

from calls_support import Sideband, real_time_limit, rig
from voiceactors import logs
from voiceactors.realtime.events import SERVER_EVENTS, validate_server_event
from voiceactors.tools import REGISTRY

CALL = "rtc_garbage"
REAL_IDS = ("call_real_a", "call_real_b")
FAKE_IDS = ("call_fake_1", "call_fake_2", "call_fake_3")   # few, so the same id comes twice
NEVER_MADE = "call_never_made"

# The real part of every call: two tool calls in one response, their outputs,
# one response.create, an answer. Then the script stays open (only reacts).
SCENARIO = [
    {"response": {"tool_calls": [
        {"name": "calendar.today", "arguments": {}, "call_id": REAL_IDS[0]},
        {"name": "commitments.list", "arguments": {"state": "open"}, "call_id": REAL_IDS[1]},
    ]}},
    {"wait_outputs": {"timeout_s": 15}},
    {"response": {"text": "Here is what I found."}},
]

# Valid events of every kind the actor handles; the mutation strategies break them.
TEMPLATES: list[dict[str, Any]] = [
    {"type": "response.created", "event_id": "e", "response": {"id": "resp_t", "status": "in_progress"}},
    {"type": "response.output_item.added", "event_id": "e", "response_id": "resp_t", "output_index": 0,
     "item": {"id": "item_t", "type": "function_call", "call_id": "call_t", "name": "calendar.today",
              "arguments": "", "status": "in_progress"}},
    {"type": "response.output_item.done", "event_id": "e", "response_id": "resp_t", "output_index": 0,
     "item": {"id": "item_t", "type": "function_call", "call_id": "call_t", "name": "calendar.today",
              "arguments": "{}", "status": "completed"}},
    {"type": "response.function_call_arguments.done", "event_id": "e", "response_id": "resp_t",
     "item_id": "item_t", "output_index": 0, "call_id": "call_t", "name": "calendar.today", "arguments": "{}"},
    {"type": "response.done", "event_id": "e", "response": {"id": "resp_t", "status": "cancelled",
                                                            "output": []}},
    {"type": "input_audio_buffer.speech_started", "event_id": "e", "audio_start_ms": 10, "item_id": "item_u"},
    {"type": "conversation.item.added", "event_id": "e",
     "item": {"type": "function_call_output", "call_id": "call_t", "output": "{}"}},
    {"type": "error", "event_id": "e", "error": {"type": "invalid_request_error", "message": "m",
                                                  "event_id": "evt_x"}},
    {"type": "conversation.item.input_audio_transcription.completed", "event_id": "e", "item_id": "item_u",
     "content_index": 0, "transcript": "hello"},
]


def _valid(frame: Any) -> bool:
    if not isinstance(frame, str):
        return False
    try:
        validate_server_event(json.loads(frame))
    except Exception:
        return False
    return True


# --- strategies -------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


non_json = st.one_of(
    st.text(max_size=120).filter(_not_json),
    st.text(max_size=60).map(lambda s: '{"type": "response.done", ' + s),   # cut mid-object
    st.just("\x00\x01\x02"), st.just("NaN"), st.just('{"type": "error"'),
)
binary = st.binary(max_size=120)
not_an_object = json_values.filter(lambda v: not isinstance(v, dict)).map(json.dumps)
unknown_type = st.fixed_dictionaries(
    {"type": st.one_of(st.text(max_size=40), st.sampled_from(["response.teleport", "session.deleted",
                                                              "RESPONSE.DONE", "response.done ", ""]))
     .filter(lambda t: t not in SERVER_EVENTS.by_type)},
    optional={"event_id": st.text(max_size=10), "response": json_values},
).map(json.dumps)
no_string_type = st.fixed_dictionaries({"type": json_values.filter(lambda v: not isinstance(v, str))},
                                       optional={"response": json_values}).map(json.dumps)


@st.composite
def missing_field(draw) -> str:
    template = json.loads(json.dumps(draw(st.sampled_from(TEMPLATES))))
    keys = [k for k in template if k != "type"]
    del template[draw(st.sampled_from(keys))]
    return json.dumps(template)


@st.composite
def wrong_type(draw) -> str:
    template = json.loads(json.dumps(draw(st.sampled_from(TEMPLATES))))
    key = draw(st.sampled_from([k for k in template if k not in ("type", "event_id")]))
    if isinstance(template[key], dict) and draw(st.booleans()):
        inner = draw(st.sampled_from(sorted(template[key])))
        template[key][inner] = draw(json_values)
    else:
        template[key] = draw(json_values)
    return json.dumps(template)


huge = st.integers(100_000, 1_500_000).map(lambda n: json.dumps({"query": "x" * n}))
arguments = st.one_of(
    st.just("{}"), st.just('{"state": "open"}'), st.just('{"query": "alice"}'),
    st.sampled_from(["[1, 2]", '"text"', "42", "null", "true"]),      # not objects
    st.sampled_from(["{not json", "", "{\"state\": ", "\x00"]),
    json_values.map(json.dumps),
    huge,
)
tool_names = st.one_of(st.sampled_from(sorted(REGISTRY)), st.sampled_from(["calendar_today", "commitments_list"]),
                       st.text(max_size=30), st.just("../../etc/passwd"), st.just("x" * 5000))


@st.composite
def fake_tool_call(draw) -> str:
    """A valid ``response.output_item.done`` for a tool call the service never
    made (unknown response, an id from a small pool so it repeats)."""
    status = draw(st.sampled_from(["completed", None, "incomplete"]))
    item = {"id": "item_" + draw(st.sampled_from("abc")), "type": "function_call",
            "call_id": draw(st.sampled_from(FAKE_IDS)), "name": draw(tool_names), "arguments": draw(arguments)}
    if status is not None:
        item["status"] = status
    return json.dumps({"type": "response.output_item.done", "event_id": "evt_f",
                       "response_id": "resp_fake_" + draw(st.sampled_from("12")), "output_index": 0, "item": item})


@st.composite
def fake_arguments_done(draw) -> str:
    return json.dumps({"type": "response.function_call_arguments.done", "event_id": "evt_a",
                       "response_id": "resp_fake_3", "item_id": "item_z", "output_index": 0,
                       "call_id": draw(st.sampled_from(FAKE_IDS)), "name": draw(tool_names),
                       "arguments": draw(arguments)})


never_made_output = st.just(json.dumps({"type": "conversation.item.added", "event_id": "evt_o",
                                        "item": {"type": "function_call_output", "call_id": NEVER_MADE,
                                                 "output": "{\"ok\": true}"}}))
unknown_error = st.builds(lambda eid: json.dumps({"type": "error", "event_id": "evt_e", "error": {
    "type": "invalid_request_error", "code": "whatever", "message": "m", "event_id": eid}}),
    st.one_of(st.none(), st.text(max_size=12)))

garbage = st.one_of(
    non_json, binary, not_an_object, unknown_type, no_string_type,
    missing_field().filter(lambda f: not _valid(f)), wrong_type().filter(lambda f: not _valid(f)),
    fake_tool_call(), fake_arguments_done(), never_made_output, unknown_error,
)


# --- checks -----------------------------------------------------------------------

def expected_fake_answers(frames: list[Any]) -> set[str]:
    """Fake call ids the actor must answer: some valid ``output_item.done``
    of it said completed (or no status) with arguments."""
    ids = set()
    for frame in frames:
        if not _valid(frame):
            continue
        event = json.loads(frame)
        item = event.get("item") or {}
        if (event["type"] == "response.output_item.done" and item.get("type") == "function_call"
                and item.get("status") in (None, "completed") and item.get("call_id")):
            ids.add(item["call_id"])
    return ids


def skipped_lines(text: str) -> list[dict]:
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == "realtime.event_skipped"]


async def run_garbage_call(frames: list[Any], **changes: Any) -> tuple[Any, Any, str]:
    """Serve one call whose sideband gets ``frames`` injected while the real
    scenario runs; end it once everything due is answered. Returns
    (actor, sim call, captured log text)."""
    buffer = io.StringIO()
    logs.configure("json", "debug", stream=buffer)
    try:
        with tempfile.TemporaryDirectory(prefix="va-garbage-") as tmp:
            async with rig(Path(tmp), tool_calls_per_turn=10_000, reconnect_base_s=0.01,
                           tool_timeout_read_s=10.0, **changes) as r:
                sc = r.sim.add_call(CALL, SCENARIO)
                actor = r.actor(CALL)
                due = expected_fake_answers(frames)
                with real_time_limit(30):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(actor.run)
                        await sc.wait_until(lambda c: c.connection is not None)
                        for frame in frames:
                            await r.sim.inject(CALL, frame)
                        await sc.wait_until(lambda c: (
                            c.response_creates >= 1 and len(c.responses) >= 2
                            and c.responses[-1].status == "completed"
                            and due <= set(c.outputs)))
                        await r.sim.end_call(CALL, 1000)
            return actor, sc, buffer.getvalue()
    finally:
        structlog.reset_defaults()


def assert_survived(actor: Any, sc: Any, frames: list[Any], log_text: str) -> None:
    assert actor.end_reason == "closed_by_service"
    # the real tool calls: one output each, a JSON object; one response.create after them
    assert set(REAL_IDS) <= set(sc.tool_calls)
    for call_id in REAL_IDS:
        assert len(sc.outputs.get(call_id, [])) == 1, (call_id, sc.outputs.get(call_id))
        assert isinstance(json.loads(sc.outputs[call_id][0]), dict)
    assert sc.response_creates == 1
    assert sc.violations == []
    # never two answers for any id; the complete fake calls answered once; nothing else
    for call_id, outs in sc.outputs.items():
        assert len(outs) == 1, (call_id, outs)
    assert set(sc.outputs) == set(REAL_IDS) | expected_fake_answers(frames)
    assert NEVER_MADE not in actor.calls
    # the only errors the service sent: our outputs for calls it never made
    assert set(sc.error_codes) <= {"invalid_tool_call_id"}
    # every frame that is not a valid event was logged as skipped (reason, no payload)
    invalid = [f for f in frames if not _valid(f)]
    skipped = skipped_lines(log_text)
    assert len(skipped) == len(invalid), (len(skipped), len(invalid))
    assert all(line.get("reason") for line in skipped)
    assert '"call.event_failed"' not in log_text     # no handler blew up on any of it
    # the record has every tool call, the real ones delivered
    for call_id in REAL_IDS:
        assert actor.calls[call_id].state == "confirmed"


@settings(max_examples=15, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(frames=st.lists(garbage, min_size=1, max_size=10))
async def test_garbage_frames_never_break_the_call(frames):
    actor, sc, log_text = await run_garbage_call(frames)
    assert_survived(actor, sc, frames, log_text)


# --- explicit cases ------------------------------------------------------------------

async def test_every_kind_of_garbage_at_once():
    """One frame of each kind, in one call (the cases hypothesis may not combine)."""
    tool = lambda call_id, name, args, status="completed": json.dumps({  # noqa: E731
        "type": "response.output_item.done", "event_id": "evt_f", "response_id": "resp_fake_1",
        "output_index": 0, "item": {"type": "function_call", "call_id": call_id, "name": name,
                                    "arguments": args, "status": status}})
    frames: list[Any] = [
        "not json at all", b"\x00\xffbinary", "[1, 2, 3]", "null", '"a string"',
        json.dumps({"type": "response.teleport"}), json.dumps({"no_type": True}), json.dumps({"type": 7}),
        json.dumps({"type": "response.done"}),                                     # missing fields
        json.dumps({"type": "response.done", "event_id": "e", "response": "done"}),  # wrong type
        json.dumps({"type": "response.output_item.done", "event_id": "e", "response_id": 5,
                    "output_index": "x", "item": []}),
        tool(FAKE_IDS[0], "no.such_tool", "{}"),                                   # unknown tool
        tool(FAKE_IDS[1], "commitments.list", "[1, 2]"),                          # not an object
        tool(FAKE_IDS[1], "commitments.list", "{}"),                              # same id again
        tool(FAKE_IDS[2], "journal.search", json.dumps({"query": "q" * 1_000_000})),  # huge
        json.dumps({"type": "conversation.item.added", "event_id": "e",
                    "item": {"type": "function_call_output", "call_id": NEVER_MADE, "output": "{}"}}),
        json.dumps({"type": "error", "event_id": "e", "error": {"type": "x", "message": "m",
                                                                "event_id": "evt_nobody"}}),
    ]
    actor, sc, log_text = await run_garbage_call(frames)
    assert_survived(actor, sc, frames, log_text)
    outputs = {k: json.loads(v[0]) for k, v in sc.outputs.items()}
    assert outputs[FAKE_IDS[0]] == {"error": "unknown tool"}
    assert outputs[FAKE_IDS[1]] == {"error": "arguments must be a JSON object"}   # the first one ran, once
    assert set(outputs[FAKE_IDS[2]]) == {"error"}          # a 1 MB query: the schema says no (maxLength)
    reasons = {line["reason"] for line in skipped_lines(log_text)}
    assert {"binary frame", "not JSON", "not an object", "no type", "unknown type"} <= reasons
    assert any(r.startswith("invalid fields") for r in reasons)


async def test_replaying_the_whole_stream_answers_nothing_twice():
    """The service re-sends every event of a finished exchange (the same tool
    call ids, the same responses): no output and no response.create again."""
    with tempfile.TemporaryDirectory(prefix="va-replay-") as tmp:
        async with rig(Path(tmp)) as r:
            sc = r.sim.add_call(CALL, SCENARIO)
            actor = r.actor(CALL)
            with real_time_limit(20):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(actor.run)
                    await sc.wait_until(lambda c: c.response_creates == 1 and len(c.responses) == 2
                                        and c.responses[-1].status == "completed")
                    for event in list(sc.sent):
                        await r.sim.inject(CALL, event)
                    # a sentinel tool call behind the replay: once it is answered,
                    # the actor has handled every replayed event before it
                    await r.sim.inject(CALL, {
                        "type": "response.output_item.done", "event_id": "evt_s", "response_id": "resp_sentinel",
                        "output_index": 0, "item": {"type": "function_call", "call_id": "call_sentinel",
                                                    "name": "calendar.today", "arguments": "{}",
                                                    "status": "completed"}})
                    await sc.wait_until(lambda c: "call_sentinel" in c.outputs)
                    await r.sim.end_call(CALL, 1000)
    assert actor.end_reason == "closed_by_service"
    for call_id in REAL_IDS:
        assert len(sc.outputs[call_id]) == 1
    assert sc.response_creates == 1
    assert sc.violations == []


async def test_a_frame_over_the_size_limit_drops_the_socket_and_the_call_goes_on():
    """A frame over the sideband's 4 MiB limit makes our side close the socket
    (1009); the actor reconnects and the real exchange still completes exactly
    once. (The simulator's own half-sent frame blocks its old session, so the
    test drops that session once we have closed ours, as the service would.)"""

    async def inject_oversized(r) -> None:
        try:
            await r.sim.inject(CALL, "x" * (5 * 1024 * 1024))
        except Exception:   # ConnectionClosed: our side refused it
            pass

    with tempfile.TemporaryDirectory(prefix="va-big-") as tmp:
        # the limit is the websocket's (realtime/sideband.py): only a socket has it
        async with rig(Path(tmp), reconnect_base_s=0.05, sideband=Sideband.LOOPBACK) as r:
            scenario = [{"sleep": 0.2}] + SCENARIO + [{"close": 1000}]
            sc = r.sim.add_call(CALL, scenario)
            actor = r.actor(CALL)
            with real_time_limit(20):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(actor.run)
                    await sc.wait_until(lambda c: c.connection is not None)
                    nursery.start_soon(inject_oversized, r)
                    while actor.reconnects == 0:
                        await trio.sleep(0.01)
                    r.sim.drop(CALL)
            record = r.record(CALL)
    assert actor.end_reason == "closed_by_service"
    assert sc.connections == 2
    for call_id in REAL_IDS:
        assert len(sc.outputs[call_id]) == 1
    assert sc.response_creates == 1 and sc.violations == []
    reconnects = [line for line in record if line["kind"] == "reconnect"]
    assert reconnects[0]["close_code"] == 1009
