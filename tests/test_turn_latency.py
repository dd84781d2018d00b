"""The latency a person feels, per turn (``call/turn_latency.py``): the end
of the user's speech to the reply's first sound, and to the first sound after
a tool's output, split into the tools', our overhead and the service's share.

The rules on the protocol alone, with the times given (exact); then a real
call against the simulator, whose delays are known (its scenario's sleeps,
on trio's autojump clock): the record's ``turn`` lines, the metrics, the
calls report and the timeline."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from calls_support import rig, steady
from test_call_protocol import Wire, args_done, created, done, fc_item, item_added, speech
from voiceactors import metrics
from voiceactors.call.protocol import Measure, Metric, RecordLine
from voiceactors.call.record_kind import RecordKind
from voiceactors.calls_report import render_table, report
from voiceactors.http.timeline_svg import render


def speech_stopped() -> dict:
    return {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 900, "item_id": "item_user"}


def audio_started(rid: str) -> dict:
    return {"type": "output_audio_buffer.started", "response_id": rid}


def measures(effects: list[Any]) -> list[tuple[Metric, float]]:
    return [(e.name, pytest.approx(e.seconds)) for e in effects if isinstance(e, Measure)
            and e.name.startswith("turn_")]


def turn_lines(effects: list[Any]) -> list[RecordLine]:
    return [e for e in effects if isinstance(e, RecordLine) and e.kind == RecordKind.TURN]


# ------------------------------------------------------------------ the rules

def test_a_turn_with_a_tool_splits_the_wait_for_its_answer_by_who_held_it():
    """Speech ends at 11.0; the service's reply starts sounding at 11.4 and
    asks for a write; the write answers at 13.4; our create goes out at 13.5;
    the answer sounds at 13.8."""
    w = Wire()
    w.now = 10.0
    w.server(speech())
    w.now = 11.0
    w.server(speech_stopped())
    w.now = 11.4
    first = w.server(created("r1"), audio_started("r1"), item_added("r1", "c1", "commitments.add"),
                     args_done("r1", "c1", "{}", "commitments.add"))
    assert measures(first) == [(Metric.TURN_FIRST_AUDIO, 0.4)]
    w.server(done("r1", output=[fc_item("c1", "commitments.add")]))      # the write starts
    w.now = 13.4
    w.finish("c1", duration_ms=2000.0)
    w.now = 13.45
    w.write(1)                    # the output
    w.now = 13.5
    w.write()                     # the response.create
    w.now = 13.8
    answered = w.server(created("r2"), audio_started("r2"))
    assert measures(answered) == [(Metric.TURN_ANSWER, 2.8), (Metric.TURN_TOOLS, 2.0),
                                  (Metric.TURN_OVERHEAD, 0.1), (Metric.TURN_SERVICE, 0.7)]
    w.now = 20.0
    [line] = turn_lines(w.server(speech()))     # the next turn settles it, at the time its speech ended
    assert line.t == 11.0
    assert line.fields == {"turn": 1, "first_audio_ms": 400.0, "answer_ms": 2800.0, "tools_ms": 2000.0,
                           "overhead_ms": 100.0, "service_ms": 700.0}


def test_a_tool_that_answered_while_the_service_spoke_held_no_one_up():
    """The read answers before the response ends: the create waits on
    nothing of ours but its own step, so the tools' share is zero."""
    w = Wire()
    w.server(speech())
    w.now = 1.0
    w.server(speech_stopped())
    w.now = 1.5
    w.server(created("r1"), item_added("r1", "c1"), args_done("r1", "c1", "{}"))     # a read: prefetched
    w.now = 1.6
    w.finish("c1", prefetch=True)
    w.now = 2.0
    w.server(done("r1", output=[fc_item("c1")]))
    w.write()
    w.write()
    w.now = 2.5
    heard = w.server(created("r2"), audio_started("r2"))
    # the answer is the first sound too
    assert measures(heard) == [(Metric.TURN_FIRST_AUDIO, 1.5), (Metric.TURN_ANSWER, 1.5), (Metric.TURN_TOOLS, 0.0),
                               (Metric.TURN_OVERHEAD, 0.0), (Metric.TURN_SERVICE, 1.5)]


def test_a_turn_without_a_reply_heard_has_no_line_and_the_last_turn_is_written_at_the_end():
    w = Wire()
    w.server(speech(), speech_stopped())
    assert turn_lines(w.server(speech())) == []         # the user spoke on: no reply, no latency
    w.now = 3.0
    w.server(speech_stopped())
    w.now = 3.25
    w.server(created("r1"), audio_started("r1"))
    w.now = 3.5
    assert measures(w.server(audio_started("r1"))) == []     # only the first sound counts
    [line] = [x for x in w.p.closing_lines() if x.kind == RecordKind.TURN]
    assert (line.t, line.fields) == (3.0, {"turn": 2, "first_audio_ms": 250.0})


# ------------------------------------------------------------------ a call

CALL = [
    {"user_turn": {"text": "Hello there.", "duration_ms": 500}},
    {"sleep": 0.6},
    {"response": {"text": "Hi."}},
    {"user_turn": {"text": "What is on today?", "duration_ms": 500}},
    {"sleep": 0.4},
    {"response": {"text": "Let me look.", "tool_calls": [{"name": "calendar.today", "arguments": {}}]}},
    {"wait_outputs": {}},
    {"response": {"text": "Two meetings."}},
    {"sleep": 1.0},
    {"close": 1000},
]


def _count(name: str, **labels: str) -> float:
    return metrics.METRICS.registry.get_sample_value(f"voiceactors_turn_{name}_seconds_count", labels) or 0.0


async def test_a_call_records_its_turns_against_the_simulators_delays(tmp_path, autojump_clock):
    families = {"first": ("first_audio", {}), "answer": ("answer", {}),
                **{part: ("share", {"part": part}) for part in ("tools", "overhead", "service")}}
    before = {key: _count(name, **labels) for key, (name, labels) in families.items()}
    async with rig(tmp_path) as r:
        await r.run_call("rtc_felt", steady(CALL))
        record = r.record("rtc_felt")
    after = {key: _count(name, **labels) for key, (name, labels) in families.items()}
    assert {key: after[key] - before[key] for key in families} == {
        "first": 2, "answer": 1, "tools": 1, "overhead": 1, "service": 1}

    plain, with_tool = [line for line in record if line["kind"] == "turn"]
    assert (plain["turn"], plain["first_audio_ms"]) == (1, pytest.approx(600, abs=0.2))
    assert "answer_ms" not in plain
    assert (with_tool["turn"], with_tool["first_audio_ms"]) == (2, pytest.approx(400, abs=0.2))
    # the service's delay, exactly: 0.4 s to the reply with the tool call (none after our create)
    assert with_tool["service_ms"] == pytest.approx(400, abs=0.2)
    parts = with_tool["tools_ms"] + with_tool["overhead_ms"] + with_tool["service_ms"]
    assert with_tool["answer_ms"] == pytest.approx(parts, abs=0.2)
    assert with_tool["t"] > plain["t"]

    out = io.StringIO()
    report(tmp_path / "state", 10, True, out)
    [call] = json.loads(out.getvalue())["calls"]
    assert call["turns"] == {"count": 2, "median_ms": pytest.approx(500, abs=0.2),
                             "worst_ms": pytest.approx(600, abs=0.2)}
    table = render_table([call])
    assert "turn median" in table and "worst turn" in table and "0.50 s" in table and "0.60 s" in table

    svg = render(record)
    assert "turns (first sound)" in svg and "turn 2 · first sound after 400 ms" in svg
    assert "the service 400 ms" in svg


def test_the_report_and_the_timeline_without_turn_lines_are_as_before():
    call = {"call_id": "rtc_old", "started_at": None, "duration_s": 1.0, "ended": "hangup", "tool_calls": 0,
            "total_tokens": 0, "cost_usd": 0.0, "turns": {"count": 0, "median_ms": None, "worst_ms": None}}
    assert render_table([call]).splitlines()[1].endswith("$0.0000  —            —")
    assert "turns (first sound)" not in render([{"kind": "start", "t": 0.0}, {"kind": "end", "t": 1.0}])
