"""CallProtocol without I/O: feed it server events, tool results, writes,
drops and the time; assert on the effects it returns. No sockets, no trio,
no threads: each test runs in microseconds. (The same rules over real
loopback sockets: test_call_actor.py, test_call_resend.py, test_call_lifecycle.py.)"""

from __future__ import annotations

import json
import re
import math
import subprocess
import gc
import sys
from typing import Any

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from voiceactors.call.protocol import (
    ACTIVE_RESPONSE, BLIND_RETRIES, BLIND_RETRY_S, HANDLED_EVENTS, IDLE_GOODBYE, IDLE_GOODBYE_MAX_S, SERVICE_ANSWER_WAIT_S,
    CallProtocol, CancelOlderReads, Connected,
    Disconnected, Dropped, EndCall, EndReason, Log, Measure, Prefetch, Publish, Received, Recovered, RecordLine,
    Send, SlowTools, StartTool, TOOL_ACK, Timer, ToolAbandoned, ToolFinished, ToolProgress, WakeAt, Written,
    WrittenAtClose, progress_response, wrap_up_response,
)
from voiceactors.call.meter import GRACE_S
from voiceactors.call.refusals import BACKOFF_S
from voiceactors.call.state import ToolOutcome
from voiceactors.realtime.event_view import EventView
from voiceactors.realtime.events import parse_server_event, read_server_event

SYNTHETIC = json.dumps({"error": "cancelled: the user interrupted"})
WRITES = {"commitments.add"}


# ---------------------------------------------------------------- events

def event(obj: dict) -> Any:
    """The event as the call actor's reader hands it over: an ``EventView``
    (``sdk_event`` gives the SDK model of the same frame)."""
    parsed = read_server_event(json.dumps({"event_id": "ev", **obj}), HANDLED_EVENTS)
    assert isinstance(parsed, EventView), obj
    return parsed


def sdk_event(obj: dict) -> Any:
    parsed = parse_server_event(json.dumps({"event_id": "ev", **obj}))
    assert parsed is not None, obj
    return parsed


def fc_item(tool_call_id: str, name: str = "calendar.today", arguments: str | None = "{}",
            status: str = "completed") -> dict:
    item = {"id": f"item_{tool_call_id}", "type": "function_call", "status": status, "name": name,
            "call_id": tool_call_id}
    if arguments is not None:
        item["arguments"] = arguments
    return item


def created(rid: str) -> dict:
    return {"type": "response.created", "response": {"id": rid, "status": "in_progress"}}


def item_added(rid: str, tool_call_id: str, name: str = "calendar.today") -> dict:
    return {"type": "response.output_item.added", "response_id": rid, "output_index": 0,
            "item": fc_item(tool_call_id, name, arguments="", status="in_progress")}


def item_done(rid: str, tool_call_id: str, name: str = "calendar.today", arguments: str = "{}",
              status: str = "completed") -> dict:
    return {"type": "response.output_item.done", "response_id": rid, "output_index": 0,
            "item": fc_item(tool_call_id, name, arguments, status)}


def args_done(rid: str, tool_call_id: str, arguments: str, name: str = "calendar.today") -> dict:
    return {"type": "response.function_call_arguments.done", "response_id": rid, "output_index": 0,
            "item_id": f"item_{tool_call_id}", "call_id": tool_call_id, "arguments": arguments, "name": name}


def done(rid: str, status: str = "completed", output: list[dict] | None = None) -> dict:
    return {"type": "response.done", "response": {"id": rid, "status": status, "output": output or []}}


def speech() -> dict:
    return {"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": "item_user"}


def confirmed(tool_call_id: str) -> dict:
    return {"type": "conversation.item.added",
            "item": {"id": f"out_{tool_call_id}", "type": "function_call_output", "call_id": tool_call_id,
                     "output": "{}"}}


def typed_turn(item_id: str = "msg_1") -> dict:
    return {"type": "conversation.item.added",
            "item": {"id": item_id, "type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "hi"}]}}


def error(code: str, event_id: str | None) -> dict:
    return {"type": "error", "error": {"type": "invalid_request_error", "code": code, "message": "no",
                                       "event_id": event_id}}


# ---------------------------------------------------------------- the rig

class Wire:
    """One protocol and a pretend writer: ``Send`` effects queue up until
    ``write`` reports them written, as the real writer task would."""

    def __init__(self, connect: bool = True) -> None:
        self.p = CallProtocol("rtc_proto", effect_of=lambda name: "write" if name in WRITES else "read")
        self.now = 0.0
        self.effects: list[Any] = []
        self.unwritten: list[Send] = []
        if connect:
            self.feed(Connected())

    def feed(self, message: Any) -> list[Any]:
        out = self.p.handle(message, self.now)
        self.effects.extend(out)
        self.unwritten.extend(e for e in out if isinstance(e, Send))
        return out

    def server(self, *objs: dict) -> list[Any]:
        out: list[Any] = []
        for obj in objs:
            out += self.feed(Received(event(obj)))
        return out

    def finish(self, tool_call_id: str, output: str = '{"ok": true}', outcome: str = "ok",
               duration_ms: float = 1.0, **kw: Any) -> list[Any]:
        name = self.p.calls[tool_call_id].name
        return self.feed(ToolFinished(tool_call_id, name, output, outcome, duration_ms, **kw))

    def write(self, n: int | None = None) -> list[Send]:
        """Report the first ``n`` (all) queued sends written, in order."""
        written = []
        while self.unwritten and (n is None or len(written) < n):
            send = self.unwritten.pop(0)
            written.append(send)
            self.feed(Written(send))
        return written

    def drop(self) -> None:
        self.unwritten.clear()
        self.feed(Disconnected())
        self.feed(Dropped())

    # views
    def of(self, kind: type) -> list[Any]:
        return [e for e in self.effects if isinstance(e, kind)]

    def creates(self) -> list[Send]:
        return [e for e in self.of(Send) if e.event["type"] == "response.create"]

    def outputs(self, tool_call_id: str | None = None) -> list[Send]:
        return [e for e in self.of(Send) if e.tool_call_id is not None
                and (tool_call_id is None or e.tool_call_id == tool_call_id)]

    def started(self) -> list[str]:
        return [e.tool_call_id for e in self.of(StartTool)]

    def records(self, kind: str) -> list[dict]:
        return [e.fields for e in self.of(RecordLine) if e.kind == kind]

    def logs(self, name: str) -> list[dict]:
        return [e.fields for e in self.of(Log) if e.event == name]

    def state(self, tool_call_id: str) -> str:
        return self.p.calls[tool_call_id].state


def one_tool_turn(w: Wire, rid: str = "r1", tool_call_id: str = "c1", name: str = "calendar.today") -> None:
    w.server(created(rid), item_added(rid, tool_call_id, name), item_done(rid, tool_call_id, name), done(rid))


# ----------------------------------------------------------- the basics

def test_single_tool_one_output_then_one_response_create():
    w = Wire()
    w.server(speech())
    one_tool_turn(w)
    assert w.started() == ["c1"] and w.p.epoch == 1
    (start,) = w.of(StartTool)
    assert (start.name, start.arguments, start.epoch, start.turn) == ("calendar.today", "{}", 1, 1)
    assert w.outputs() == [] and w.creates() == []          # nothing before the tool answers
    w.finish("c1")
    (out,) = w.outputs("c1")
    assert out.event["type"] == "conversation.item.create"
    assert out.event["item"] == {"type": "function_call_output", "call_id": "c1", "output": '{"ok": true}'}
    assert w.creates() == []                                 # not before the output is written
    w.write()
    assert len(w.creates()) == 1 and w.state("c1") == "sent"
    w.write()
    w.server(confirmed("c1"), created("r2"), done("r2"))
    assert len(w.creates()) == 1 and w.state("c1") == "confirmed"
    assert w.p.batches["r2"].origin == "ours" and w.p.batches["r1"].follow_up == "ours"
    (settled,) = w.records("tool_call")
    assert settled["delivered"] is True and settled["sends"] == 1 and settled["outcome"] == "ok"


def test_feed_events_and_the_started_record_line():
    w = Wire()
    one_tool_turn(w, name="journal.search")
    w.finish("c1", client_events=({"_nav_target": "x"},))
    kinds = [(e.kind, e.fields["tool_call_id"]) for e in w.of(Publish)]
    assert kinds == [("tool_started", "c1"), ("tool_done", "c1"), ("client_events", "c1")]
    (line,) = w.records("tool_started")
    assert line["effect"] == "read" and line["arguments"] == "{}" and line["tool"] == "journal.search"


def test_a_write_records_no_arguments():
    w = Wire()
    w.server(created("r1"), item_done("r1", "c1", "commitments.add", '{"text": "secret"}'), done("r1"))
    (line,) = w.records("tool_started")
    assert line["effect"] == "write" and "arguments" not in line


@pytest.mark.parametrize("order", ["arguments_first", "item_first"])
def test_both_argument_arrival_orders_run_once_with_the_item_arguments(order):
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"))
    if order == "arguments_first":
        w.server(args_done("r1", "c1", '{"q": 1}'))
        assert w.started() == []                              # arguments.done alone never starts a call
        w.server(item_done("r1", "c1", arguments='{"q": 1}'))
    else:
        w.server(item_done("r1", "c1", arguments='{"q": 1}'), args_done("r1", "c1", '{"q": "late"}'))
    assert w.started() == ["c1"]
    assert w.of(StartTool)[0].arguments == '{"q": 1}'
    w.server(done("r1"))
    assert w.started() == ["c1"]                              # not twice


def test_arguments_from_response_done_alone_start_the_call():
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"), args_done("r1", "c1", '{"a": 1}'))
    assert w.started() == []
    w.server(done("r1", output=[fc_item("c1", arguments='{"a": 1}')]))
    assert w.started() == ["c1"]


def test_call_cut_mid_arguments_never_runs_and_gets_the_synthetic_output():
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"), args_done("r1", "c1", '{"q": "par'), speech(),
             done("r1", status="cancelled", output=[fc_item("c1", arguments='{"q": "par', status="incomplete")]))
    assert w.started() == []
    (out,) = w.outputs("c1")
    assert out.event["item"]["output"] == SYNTHETIC
    assert w.p.calls["c1"].synthetic and w.p.calls["c1"].outcome == "cancelled"
    assert w.p.epoch == 1                                     # the cancel of the same barge-in: no second advance
    w.write()
    assert w.creates() == []


def test_an_incomplete_item_does_not_run():
    w = Wire()
    w.server(created("r1"), item_done("r1", "c1", status="incomplete"), done("r1", status="incomplete"))
    assert w.started() == [] and w.outputs("c1")[0].event["item"]["output"] == SYNTHETIC


def test_parallel_batch_three_outputs_then_exactly_one_create():
    w = Wire()
    w.server(created("r1"), *[item_done("r1", c) for c in ("c1", "c2", "c3")], done("r1"))
    assert w.started() == ["c1", "c2", "c3"]                  # all at once, not one after another
    for c in ("c3", "c1"):
        w.finish(c)
    w.write()
    assert w.creates() == []                                  # c2 still running
    w.finish("c2")
    assert w.creates() == []                                  # c2's output not written yet
    w.write()
    assert len(w.creates()) == 1
    for c in ("c1", "c2", "c3"):
        w.finish(c)                                           # a duplicate answer changes nothing
    assert len(w.outputs()) == 3 and len(w.creates()) == 1


def test_two_finished_batches_share_one_create():
    w = Wire()
    w.server(created("r1"), item_done("r1", "c1"), done("r1"), created("r2"), item_done("r2", "c2"), done("r2"))
    w.server(created("r_model"))                              # holds both batches back
    w.finish("c1")
    w.finish("c2")
    w.write(2)
    assert w.creates() == []
    w.server(done("r_model"))
    (create,) = w.creates()
    assert w.p.creates[create.event["event_id"]].batches == ["r1", "r2"]


# -------------------------------------------------------------- barge-in

def test_barge_in_while_a_read_runs_cancels_it_and_no_create_follows():
    w = Wire()
    one_tool_turn(w)
    w.server(speech())
    assert w.of(CancelOlderReads) == [CancelOlderReads(1)]
    assert w.p.batches["r1"].follow_up == "superseded"
    w.finish("c1", output='{"error": "cancelled"}', outcome="cancelled")   # the late answer still goes out
    w.write()
    assert len(w.outputs("c1")) == 1 and w.creates() == []


def test_no_cancel_reads_when_nothing_runs():
    w = Wire()
    w.server(speech())
    assert w.p.epoch == 1 and w.of(CancelOlderReads) == []


def test_started_write_finishes_after_a_barge_in_with_its_real_result():
    w = Wire()
    w.server(created("r1"), item_done("r1", "c1", "commitments.add"), done("r1"), speech())
    w.finish("c1", output='{"added": 1}')
    (out,) = w.outputs("c1")
    assert out.event["item"]["output"] == '{"added": 1}' and w.p.calls["c1"].outcome == "ok"
    w.write()
    assert w.creates() == []


def test_barge_in_during_the_write_of_an_output_asks_for_no_response():
    w = Wire()
    one_tool_turn(w)
    w.finish("c1")
    assert w.unwritten and w.creates() == []                  # the output is in the writer's queue
    w.server(speech())                                        # the user speaks while it is written
    w.write()
    assert w.state("c1") == "sent" and w.creates() == []


def test_late_results_after_a_barge_in_leave_the_new_turn_alone():
    w = Wire()
    one_tool_turn(w, "r1", "c1")
    w.server(speech())
    one_tool_turn(w, "r2", "c2")                              # the new turn's own tool call
    w.finish("c2")
    w.write()
    (create,) = w.creates()
    assert w.p.creates[create.event["event_id"]].batches == ["r2"]
    w.finish("c1")                                            # the old turn's answer arrives late
    w.write()
    assert len(w.creates()) == 1 and len(w.outputs("c1")) == 1


def test_a_call_of_an_older_epoch_is_never_started():
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"), speech(), item_done("r1", "c1"))
    assert w.started() == [] and w.outputs("c1")[0].event["item"]["output"] == SYNTHETIC


def test_a_cancelled_response_of_the_current_epoch_advances_it():
    w = Wire()
    w.server(created("r1"), done("r1", status="cancelled"))
    assert w.p.epoch == 1 and w.logs("call.epoch")[-1]["why"] == "response_cancelled"


def test_turns_advance_on_speech_and_on_a_typed_turn_only():
    w = Wire()
    w.server(speech(), typed_turn("m1"))                      # the spoken turn's own item: no extra turn
    assert w.p.turn == 1
    w.server(typed_turn("m2"))
    assert w.p.turn == 2


# ---------------------------------------------- the model's own responses

def test_an_active_response_holds_our_create_until_its_done():
    w = Wire()
    w.server(created("r1"), item_done("r1", "c1"), done("r1"), created("r_model"))
    w.finish("c1")
    w.write()
    assert w.creates() == []                                  # r_model is active
    w.server(done("r_model"))
    assert len(w.creates()) == 1                              # it began before the output was confirmed


def test_model_response_started_after_confirmed_outputs_carries_the_turn():
    """Our create meets the active-response error: the response we took for
    ours was the model's, started after the output was confirmed."""
    w = Wire()
    one_tool_turn(w)
    w.finish("c1")
    w.write()
    (create,) = w.creates()
    eid = create.event["event_id"]
    w.server(confirmed("c1"), created("r_model"), error(ACTIVE_RESPONSE, eid))
    assert w.p.batches["r1"].follow_up == "model" and w.p.batches["r_model"].origin == "model"
    assert w.p.creates[eid].result == "rejected_active"
    w.server(done("r_model"))
    assert len(w.creates()) == 1 and w.of(WakeAt) == []
    assert w.logs("response.follow_up_by_model")[0]["by"] == "r_model"


def test_late_active_error_for_an_answered_create_is_not_retried():
    w = Wire()
    one_tool_turn(w)
    w.finish("c1")
    w.write()
    eid = w.creates()[0].event["event_id"]
    w.server(confirmed("c1"), created("r2"), error(ACTIVE_RESPONSE, eid), done("r2"))
    assert len(w.creates()) == 1 and w.p.batches["r1"].follow_up == "model"


def test_another_error_on_our_create_is_retried_a_bounded_number_of_times_then_fails_the_batch():
    # the backoff's own tests: test_call_refusals.py
    w = Wire()
    one_tool_turn(w)
    w.finish("c1")
    w.write()
    for _ in range(len(BACKOFF_S) + 1):
        eid = w.creates()[-1].event["event_id"]
        w.server(error("server_error", eid))
        w.now += max(BACKOFF_S)
        w.feed(Timer())
        w.write()
    assert w.p.creates[eid].result == "error:server_error" and w.p.batches["r1"].follow_up == "failed"
    w.server(created("r9"), done("r9"))
    assert len(w.creates()) == len(BACKOFF_S) + 1


# ----------------------------------------------------------- blind retry

def refused_once(w: Wire) -> str:
    one_tool_turn(w)
    w.finish("c1")
    w.write()
    eid = w.creates()[-1].event["event_id"]
    w.server(error(ACTIVE_RESPONSE, eid))
    return eid


def test_blind_retry_after_an_active_response_error_while_idle():
    w = Wire()
    w.now = 10.0
    refused_once(w)
    assert w.of(WakeAt) == [WakeAt(10.0 + BLIND_RETRY_S)] and len(w.creates()) == 1
    w.now = 11.0
    w.feed(Timer())                                           # too early: nothing
    assert len(w.creates()) == 1
    w.now = 10.0 + BLIND_RETRY_S
    w.feed(Timer())
    assert len(w.creates()) == 2


def test_blind_retries_are_bounded_then_wait_for_the_service():
    w = Wire()
    refused_once(w)
    for _ in range(BLIND_RETRIES):
        w.now = w.of(WakeAt)[-1].at
        w.feed(Timer())
        w.write()
        w.server(error(ACTIVE_RESPONSE, w.creates()[-1].event["event_id"]))
    assert len(w.creates()) == 1 + BLIND_RETRIES and len(w.of(WakeAt)) == BLIND_RETRIES
    assert w.p.retry_at == math.inf
    w.now += 1000
    w.feed(Timer())
    assert len(w.creates()) == 1 + BLIND_RETRIES               # no loop on refusals
    w.server(created("r_busy"), done("r_busy"))               # the service's response ends: decide again
    assert len(w.creates()) == 2 + BLIND_RETRIES


def test_a_response_done_ends_the_blind_wait_early():
    w = Wire()
    refused_once(w)
    w.now = 0.5
    w.server(done("r_unseen"))                                # the response we never saw start
    assert len(w.creates()) == 2 and w.p.retry_at is None
    w.now = 100.0
    w.feed(Timer())
    assert len(w.creates()) == 2


# -------------------------------------------------------- drop and resend

def test_written_but_unconfirmed_output_is_written_again_after_a_drop():
    """Sent-but-unconfirmed goes back to the writer on the next connection,
    confirmed never; a create without its response.created is decided again."""
    w = Wire()
    w.server(created("r1"), item_done("r1", "c1"), item_done("r1", "c2"), done("r1"))
    w.finish("c1", output="{}")
    w.finish("c2", output="{}")
    w.write(2)
    assert len(w.creates()) == 1
    w.server(confirmed("c1"))
    w.drop()
    assert w.state("c1") == "confirmed" and w.state("c2") == "ready"
    assert w.p.batches["r1"].follow_up is None
    assert w.p.creates[w.creates()[0].event["event_id"]].result == "lost"
    before = len(w.of(Send))
    w.feed(Connected())
    (again,) = w.of(Send)[before:]
    assert again.tool_call_id == "c2"                         # the create waits until c2 is written
    w.write()
    assert len(w.creates()) == 2


def test_queued_outputs_are_ready_again_when_the_writer_goes():
    w = Wire()
    one_tool_turn(w)
    w.finish("c1")
    assert w.state("c1") == "queued"
    w.unwritten.clear()
    w.feed(Disconnected())
    assert w.state("c1") == "ready"
    w.feed(Connected())
    assert len(w.outputs("c1")) == 2 and w.state("c1") == "queued"


def test_an_output_done_while_disconnected_waits_for_the_next_connection():
    w = Wire()
    one_tool_turn(w)
    w.drop()
    w.finish("c1")
    assert w.outputs() == [] and w.state("c1") == "ready"
    w.feed(Connected())
    assert len(w.outputs("c1")) == 1


def test_the_service_refusing_a_resent_output_marks_it_rejected_not_looped():
    w = Wire()
    one_tool_turn(w)
    w.finish("c1")
    w.write(1)
    w.drop()
    w.feed(Connected())
    (_, resent) = w.outputs("c1")
    w.server(error("invalid_tool_call_id", resent.event["event_id"]))
    assert w.state("c1") == "rejected"
    (line,) = w.records("tool_call")
    assert line["state"] == "rejected" and line["delivered"] is False
    # rejected counts as answered: the create lost in the drop (never
    # written) is decided again, once
    assert len(w.creates()) == 2 and w.p.creates[w.creates()[0].event["event_id"]].result == "lost"
    w.feed(Disconnected())
    w.feed(Connected())
    assert len(w.outputs("c1")) == 2                           # never sent again


def test_a_response_active_at_a_drop_is_lost_its_complete_calls_run_on():
    w = Wire()
    w.server(created("r1"), item_done("r1", "c1"), item_added("r1", "c2"))
    w.drop()
    assert w.p.batches["r1"].status == "lost" and not w.p.active
    assert w.state("c1") == "running" and w.state("c2") == "ready" and w.p.calls["c2"].synthetic
    w.feed(Connected())
    w.finish("c1")
    w.write()
    assert len(w.creates()) == 1                               # a lost batch is carried forward too


def test_the_reconnect_keeps_the_epoch_and_a_new_turn_after_it_still_supersedes():
    w = Wire()
    w.server(speech())
    one_tool_turn(w)
    w.drop()
    w.feed(Connected())
    assert w.p.epoch == 1                                      # a reconnect is not a barge-in
    w.server(speech())
    w.finish("c1")
    w.write()
    assert w.p.epoch == 2 and w.creates() == []


def test_replaying_the_whole_stream_answers_nothing_twice():
    w = Wire()
    stream = [created("r1"), item_done("r1", "c1"), done("r1")]
    w.server(*stream)
    w.finish("c1")
    w.write()
    w.server(confirmed("c1"), created("r2"), done("r2"))
    w.server(*stream, confirmed("c1"), created("r2"), done("r2"))
    assert w.started() == ["c1"] and len(w.outputs()) == 1 and len(w.creates()) == 1


# ---------------------------------------------------------- ends, records

@pytest.mark.parametrize("code,reason", [("invalid_api_key", EndReason.UNAUTHORIZED),
                                         ("insufficient_quota", EndReason.QUOTA)])
def test_a_fatal_error_ends_the_call(code, reason):
    w = Wire()
    assert w.server(error(code, None))[-1] == EndCall(reason)
    assert reason == code.replace("invalid_api_key", "unauthorized")     # the values stay as they were


def test_peer_error_strings_are_clipped_in_the_log():
    w = Wire()
    w.server(error("x" * 500, "e" * 500))
    (line,) = w.logs("realtime.error")
    assert len(line["code"]) == 64 and len(line["event_id"]) == 64


def test_transcripts_become_a_record_line_and_a_feed_event():
    w = Wire()
    w.server({"type": "response.output_audio_transcript.done", "response_id": "r1", "item_id": "a1",
              "output_index": 0, "content_index": 0, "transcript": "it is sunny"})
    assert w.records("transcript") == [{"role": "assistant", "item_id": "a1", "text": "it is sunny", "order": 1.0}]
    assert w.of(Publish)[-1] == Publish("transcript", {"role": "assistant", "text": "it is sunny", "item_id": "a1"})


def test_a_transcript_delivered_twice_is_one_record_line():
    w = Wire()
    done = {"type": "response.output_audio_transcript.done", "response_id": "r1", "item_id": "a1",
            "output_index": 0, "content_index": 0, "transcript": "it is sunny"}
    heard = {"type": "conversation.item.input_audio_transcription.completed", "item_id": "u1", "content_index": 0,
             "transcript": "weather?", "usage": {"type": "duration", "seconds": 1.0}}
    w.server(heard, done, done, heard)
    assert [(x["item_id"], x["order"]) for x in w.records("transcript")] == [("u1", 1.0), ("a1", 2.0)]


def test_overhead_and_turnaround_are_measured_around_the_tool():
    w = Wire()
    w.now = 1.0
    one_tool_turn(w)
    w.now = 6.0
    w.finish("c1", duration_ms=4900.0)
    w.now = 6.5
    w.write(1)                                                 # the output, at 6.5
    w.now = 7.0
    w.write(1)                                                 # the create, at 7.0
    (overhead, turnaround) = w.of(Measure)
    assert overhead.name == "tool_overhead" and overhead.seconds == pytest.approx(0.6)
    assert turnaround.name == "tool_turnaround" and turnaround.seconds == pytest.approx(6.0)
    assert w.p.calls["c1"].overhead_ms == pytest.approx(600.0)


def test_closing_answers_every_tool_call_and_records_what_is_left():
    w = Wire()
    w.server(created("r1"), item_done("r1", "c1"), item_done("r1", "c2"), item_added("r1", "c3"), done("r1"))
    w.write()                                                  # c3's synthetic output (never complete)
    w.finish("c1")
    w.write()                                                  # c1 written, not confirmed
    w.feed(ToolAbandoned("c2"))                                # the actor gave up on c2
    w.feed(Disconnected())
    sends = w.p.closing_outputs(9.0)
    assert [s.tool_call_id for s in sends] == ["c2"]           # c1 is not written twice; c3 was answered already
    assert sends[0].event["item"]["output"] == SYNTHETIC
    w.feed(WrittenAtClose("c2"))
    assert w.state("c2") == "sent" and w.p.calls["c2"].sends == 1
    lines = w.p.closing_lines()
    assert [line.kind for line in lines] == ["tool_call"] * 3
    assert {line.fields["tool_call_id"]: line.fields["outcome"] for line in lines} == {
        "c1": "ok", "c2": "cancelled", "c3": "cancelled"}


def test_closing_lines_list_every_create():
    w = Wire()
    one_tool_turn(w)
    w.finish("c1")
    w.write()
    w.server(confirmed("c1"))
    (line,) = w.p.closing_lines()
    assert line.kind == "response_create" and line.fields["for"] == ["r1"] and line.fields["result"] == "sent"


def test_an_executor_gone_fails_the_call_with_the_synthetic_output():
    w = Wire()
    one_tool_turn(w)
    w.feed(ToolAbandoned("c1", executor_gone=True))
    assert w.p.calls["c1"].outcome == "failed" and w.outputs("c1")[0].event["item"]["output"] == SYNTHETIC


def test_recovered_calls_are_answered_on_connect_then_one_create():
    w = Wire(connect=False)
    w.feed(Recovered("c_w", "commitments.add", "r_old", None, '{"added": 1}', ToolOutcome.REPLAYED))
    w.feed(Recovered("c_x", "mystery.tool", "r_old", None, '{"error": "restarted"}', ToolOutcome.RESTARTED))
    w.feed(Recovered("c_r", "journal.search", "r_old", '{"q": 1}'))
    assert w.started() == ["c_r"] and w.outputs() == []
    assert [line["tool_call_id"] for line in w.records("tool_started")] == ["c_w", "c_x", "c_r"]
    w.finish("c_r")                                            # the read ran again before the socket was up
    w.feed(Connected())
    assert [s.tool_call_id for s in w.outputs()] == ["c_w", "c_x", "c_r"]
    w.write()
    (create,) = w.creates()
    assert w.p.creates[create.event["event_id"]].batches == ["r_old"]
    assert w.p.calls["c_x"].synthetic and not w.p.calls["c_w"].synthetic


def test_a_recovered_call_without_a_response_id_gets_a_batch_of_its_own():
    w = Wire(connect=False)
    w.feed(Recovered("c_x", "mystery.tool", None, None, '{"error": "restarted"}', ToolOutcome.RESTARTED))
    assert w.p.batches["resp_recovered_c_x"].calls == ["c_x"]
    assert w.p.batches["resp_recovered_c_x"].status == "completed" and w.p.calls["c_x"].outcome == "restarted"


def test_a_bad_input_is_refused():
    with pytest.raises(TypeError):
        CallProtocol("rtc_x").handle("response.done", 0.0)  # type: ignore[arg-type]


def test_skipped_frames_count_in_the_event_sequence():
    w = Wire()
    assert w.feed(Received(None)) == []
    w.p.skipped_frame()
    w.server(created("r1"))
    assert w.p.seq == 3 and w.p.batches["r1"].created_seq == 3


def test_the_protocol_imports_no_trio():
    code = "import sys, voiceactors.call.protocol; print('trio' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# ------------------------------------------------- any order of events

RIDS = ("r1", "r2", "r3")
TIDS = ("c1", "c2", "c3", "c4")
server_steps = st.one_of(
    st.builds(lambda r: ("server", created(r)), st.sampled_from(RIDS)),
    st.builds(lambda r, c: ("server", item_added(r, c)), st.sampled_from(RIDS), st.sampled_from(TIDS)),
    st.builds(lambda r, c, s: ("server", item_done(r, c, status=s)), st.sampled_from(RIDS),
              st.sampled_from(TIDS), st.sampled_from(["completed", "incomplete"])),
    st.builds(lambda r, c: ("server", args_done(r, c, '{"x": 1}')), st.sampled_from(RIDS), st.sampled_from(TIDS)),
    st.builds(lambda r, s: ("server", done(r, status=s)), st.sampled_from(RIDS),
              st.sampled_from(["completed", "completed", "cancelled", "failed", "incomplete"])),
    st.just(("server", speech())),
    st.builds(lambda c: ("server", confirmed(c)), st.sampled_from(TIDS)),
    st.just(("server", typed_turn())),
)
steps = st.lists(st.one_of(server_steps, st.just(("finish", None)), st.just(("write", None))), max_size=40)


@hsettings(max_examples=300, deadline=None)
@given(steps)
def test_any_order_of_events_answers_every_tool_call_exactly_once(script):
    """Whatever the service sends, in whatever order (one connection, no
    errors): a tool call starts at most once, its output is sent at most
    once, and by the end of the call every tool call the service named has
    been answered; one create at most per batch."""
    w = Wire()
    for kind, obj in script:
        if kind == "server":
            w.server(obj)
        elif kind == "finish":
            running = [c for c in w.started() if w.state(c) == "running"]
            if running:
                w.finish(running[0])
        else:
            w.write(1)
    for c in w.started():
        if w.state(c) == "running":
            w.finish(c)
    w.write()
    for rid, batch in list(w.p.batches.items()):
        if batch.status is None:                  # the service ends every response it began
            w.server(done(rid))
    for c in w.started():
        if w.state(c) == "running":
            w.finish(c)
    w.write()
    # a function_call item the service names after its response's
    # response.done waits (unanswered) for the end of the call: the bounded
    # close answers it
    w.feed(Disconnected())
    for send in w.p.closing_outputs(w.now):
        w.effects.append(send)
        w.feed(WrittenAtClose(send.tool_call_id))
    started = w.started()
    assert len(started) == len(set(started))
    sent = [s.tool_call_id for s in w.outputs()]
    assert len(sent) == len(set(sent))
    # answered: sent by us, or echoed by the service as already there (then
    # sending it would be the duplicate)
    assert set(sent) <= set(w.p.calls)
    assert all(c in sent or w.state(c) == "confirmed" for c in w.p.calls)
    assert all(w.state(c) in ("sent", "confirmed") for c in w.p.calls)
    creates = [w.p.creates[s.event["event_id"]] for s in w.creates()]
    carried = [rid for create in creates for rid in create.batches]
    assert len(carried) == len(set(carried))


@hsettings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(server_steps, st.just(("finish", None)), st.just(("write", None)),
                          st.just(("drop", None))), max_size=40))
def test_any_order_with_drops_never_resends_a_confirmed_output(script):
    """With reconnects in between: a tool call still starts at most once, an
    output is written again only while unconfirmed, and by the end of the
    call every tool call is answered."""
    w = Wire()
    confirmed_before: dict[str, int] = {}      # tool call id -> outputs sent when it was confirmed
    for kind, obj in script:
        if kind == "server":
            w.server(obj)
            if obj["type"] == "conversation.item.added" and obj["item"]["type"] == "function_call_output":
                c = obj["item"]["call_id"]
                if c in w.p.calls:                 # an id it never named is ignored
                    confirmed_before.setdefault(c, len(w.outputs(c)))
        elif kind == "finish":
            running = [c for c in w.started() if w.state(c) == "running"]
            if running:
                w.finish(running[0])
        elif kind == "write":
            w.write(1)
        else:
            w.drop()
            w.feed(Connected())
    for c in w.started():
        if w.state(c) == "running":
            w.finish(c)
    w.write()
    w.feed(Disconnected())
    for send in w.p.closing_outputs(w.now):
        w.effects.append(send)
        w.feed(WrittenAtClose(send.tool_call_id))
    started = w.started()
    assert len(started) == len(set(started))
    for c, count in confirmed_before.items():
        assert len(w.outputs(c)) == count          # nothing sent after the service had it
    assert all(w.outputs(c) or w.state(c) == "confirmed" for c in w.p.calls)


# ------------------------------------------- the reader's events and logs

def test_views_and_sdk_models_give_the_same_effects():
    """The reader hands the protocol ``EventView``s; the SDK models of the
    same frames must lead to the very same effects (event ids aside)."""
    script = [speech(), created("r1"), item_added("r1", "c1"), args_done("r1", "c1", '{"q": 1}'),
              item_done("r1", "c1", arguments='{"q": 1}'), item_done("r1", "c2", "commitments.add"),
              {"type": "conversation.item.input_audio_transcription.completed", "item_id": "u1",
               "content_index": 0, "transcript": "hi", "usage": {"type": "duration", "seconds": 1.0}},
              done("r1"), error("some_code", "evt_nobody"), confirmed("c1"), typed_turn(), created("r2"),
              done("r2", status="cancelled")]

    def run(make: Any) -> str:
        w = Wire()
        for obj in script:
            w.feed(Received(make(obj)))
            if "c1" in w.p.calls and w.state("c1") == "running":
                w.finish("c1", prefetch=True)
            if "c2" in w.p.calls and w.state("c2") == "running":
                w.finish("c2")
            w.write()
        return re.sub(r"evt_[0-9a-f]{20}", "evt_", repr(w.effects))

    assert run(event) == run(sdk_event)


def test_per_round_log_lines_are_debug_and_skipped_when_debug_is_off():
    w = Wire()
    w.server(speech())
    one_tool_turn(w)
    w.finish("c1")
    w.write()
    levels = {e.event: e.level for e in w.of(Log)}
    assert levels["response.create"] == "debug" and levels["call.epoch"] == "debug"
    quiet = CallProtocol("rtc_quiet", effect_of=lambda name: "read", debug_logs=False)
    effects = quiet.handle(Connected(), 0.0)
    for obj in (speech(), created("r1"), item_done("r1", "c1"), done("r1")):
        effects += quiet.handle(Received(event(obj)), 0.0)
    effects += quiet.handle(ToolFinished("c1", "calendar.today", "{}", "ok", 1.0), 0.0)
    effects += quiet.handle(Written(next(e for e in effects if isinstance(e, Send))), 0.0)
    assert [e for e in effects if isinstance(e, Log) and e.level == "debug"] == []
    assert any(isinstance(e, Send) and e.event["type"] == "response.create" for e in effects)


# ------------------------------------------------ reads prefetched early

def test_a_read_is_prefetched_at_arguments_done_and_its_answer_goes_out_at_the_start():
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"))
    out = w.server(args_done("r1", "c1", '{"q": 1}'))
    assert w.of(Prefetch) == [Prefetch("c1", "calendar.today", '{"q": 1}', 0, 0)]
    assert w.started() == [] and w.p.tools_running()
    assert w.finish("c1", prefetch=True) == []         # held: the arguments may still be partial
    assert w.outputs() == [] and w.of(Publish) == [] and not w.p.tools_running()
    out = w.server(item_done("r1", "c1", arguments='{"q": 1}'))
    (start,) = [e for e in out if isinstance(e, StartTool)]
    assert start.prefetched and start.arguments == '{"q": 1}'
    assert [e.tool_call_id for e in out if isinstance(e, Send)] == ["c1"]    # in the same step
    assert [p.kind for p in w.of(Publish)] == ["tool_started", "tool_done"]
    w.write()
    w.server(done("r1"))
    w.write()
    assert len(w.creates()) == 1 and len(w.outputs("c1")) == 1
    assert len(w.records("tool_started")) == 1
    w.now = 0.5
    w.finish("c1", prefetch=True)                       # a duplicate answer: nothing new
    assert len(w.outputs("c1")) == 1


def test_a_prefetch_still_running_at_the_start_is_the_calls_run():
    w = Wire()
    w.server(created("r1"), args_done("r1", "c1", "{}"))
    w.now = 1.0
    w.server(item_done("r1", "c1"))
    (start,) = w.of(StartTool)
    assert start.prefetched and w.outputs() == []       # the shell starts nothing new
    w.now = 1.25
    w.finish("c1", prefetch=True, duration_ms=200.0)
    (out,) = w.outputs("c1")
    w.write()
    assert w.p.calls["c1"].overhead_ms == pytest.approx(1050.0)   # from the prefetch's own start
    w.server(done("r1"))
    w.write()
    assert len(w.creates()) == 1


def test_a_write_is_never_prefetched():
    w = Wire()
    w.server(created("r1"), args_done("r1", "c1", '{"text": "x"}', name="commitments.add"))
    assert w.of(Prefetch) == []
    w.server(item_done("r1", "c1", "commitments.add", '{"text": "x"}'))
    assert not w.of(StartTool)[0].prefetched


def test_other_final_arguments_run_afresh_and_the_prefetch_answer_is_dropped():
    w = Wire()
    w.server(created("r1"), args_done("r1", "c1", '{"q": "par'))
    w.server(item_done("r1", "c1", arguments='{"q": "partial"}'))
    (start,) = w.of(StartTool)
    assert not start.prefetched and start.arguments == '{"q": "partial"}'
    assert w.finish("c1", output='{"stale": true}', prefetch=True) == []    # the prefetch's: dropped
    assert w.p.tools_running()                                              # the real run goes on
    w.finish("c1", output='{"fresh": true}')
    (out,) = w.outputs("c1")
    assert out.event["item"]["output"] == '{"fresh": true}'


@pytest.mark.parametrize("answer", ["before_the_cancel", "after_the_cancel"])
def test_a_cancelled_response_never_sends_its_prefetched_answer(answer):
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"), args_done("r1", "c1", '{"q": "par'))
    if answer == "before_the_cancel":
        w.finish("c1", output='{"leaked": true}', prefetch=True)
    w.server(speech(), done("r1", status="cancelled",
                            output=[fc_item("c1", arguments='{"q": "par', status="incomplete")]))
    if answer == "after_the_cancel":
        w.finish("c1", output='{"leaked": true}', prefetch=True)
    w.write()
    assert w.started() == []
    (out,) = w.outputs("c1")
    assert out.event["item"]["output"] == SYNTHETIC
    assert w.creates() == [] and w.p.calls["c1"].state == "sent"


def test_a_barge_in_cancels_a_running_prefetch_and_its_response_gets_no_create():
    w = Wire()
    w.server(created("r1"), args_done("r1", "c1", "{}"), speech())
    assert w.of(CancelOlderReads) == [CancelOlderReads(1)]
    w.server(item_done("r1", "c1"), done("r1"))          # the service finished it anyway
    w.finish("c1", output='{"error": "cancelled"}', outcome="cancelled", prefetch=True)
    w.write()
    assert w.started() == []                              # an older epoch's call never starts
    assert [o.event["item"]["output"] for o in w.outputs("c1")] == [SYNTHETIC]
    assert w.creates() == []


def test_a_drop_during_a_prefetch_abandons_the_call_once():
    w = Wire()
    w.server(created("r1"), args_done("r1", "c1", "{}"))
    w.drop()
    w.finish("c1", prefetch=True)
    w.feed(Connected())
    w.write()
    assert [o.event["item"]["output"] for o in w.outputs("c1")] == [SYNTHETIC]
    assert w.started() == []


def test_a_prefetch_that_ended_without_an_answer_runs_again_at_the_start():
    w = Wire()
    w.server(created("r1"), args_done("r1", "c1", "{}"))
    w.feed(ToolAbandoned("c1", executor_gone=True, prefetch=True))
    assert not w.p.tools_running() and w.outputs() == []
    w.server(item_done("r1", "c1"))
    (start,) = w.of(StartTool)
    assert not start.prefetched
    w.finish("c1")
    assert len(w.outputs("c1")) == 1


# --------------------------------------- work per round does not grow

def _lines_traced(fn: Any) -> int:
    """Python lines run outside this test module while ``fn`` runs (the
    protocol, the event reader, the helpers they call): a count of work,
    not a time."""
    count = 0

    def tracer(frame: Any, what: str, _arg: Any) -> Any:
        nonlocal count
        if frame.f_code.co_filename == __file__:
            return tracer
        if what == "line":
            count += 1
        return tracer

    # no collection inside: a finalizer of an earlier test's garbage (Python
    # code) would count as this round's work
    enabled = gc.isenabled()
    gc.disable()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
        if enabled:
            gc.enable()
    return count


@pytest.mark.parametrize("barge_in", [True, False])
def test_a_long_call_costs_no_more_per_round_than_a_short_one(barge_in):
    """A tool round after 3,000 rounds runs the same protocol code as the
    fifth: nothing per event walks the call's history."""
    w = Wire()
    rounds = iter(range(10_000))

    def one_round() -> None:
        n = next(rounds)
        rid, tid = f"r{n}", f"c{n}"
        if barge_in:
            w.server(speech())
        else:
            w.server(typed_turn(f"msg_{n}"))
        w.server(created(rid), item_added(rid, tid), args_done(rid, tid, "{}"), item_done(rid, tid), done(rid))
        w.finish(tid, prefetch=True)
        w.write()
        w.server(confirmed(tid), created(f"{rid}_answer"), done(f"{rid}_answer"))
        w.effects.clear()

    for _ in range(5):
        one_round()
    early = [_lines_traced(one_round) for _ in range(3)]
    for _ in range(3_000):
        one_round()
    late = [_lines_traced(one_round) for _ in range(3)]
    assert len(w.p.calls) > 3_000
    assert max(late) <= max(early), (early, late)


def test_an_expired_call_token_queues_the_output_then_ends_the_call():
    """A source refused the call's own token (outcome auth_expired, docs/mcp.md):
    the model still gets the output, then the call ends auth_expired."""
    w = Wire()
    one_tool_turn(w, name="crm.lookup")
    out = w.finish("c1", '{"error": "authentication with crm expired; the conversation ends"}', "auth_expired")
    assert out[-1] == EndCall(EndReason.AUTH_EXPIRED)
    (output,) = w.outputs("c1")
    assert "expired" in output.event["item"]["output"]
    assert w.logs("call.auth_expired") == [{"tool": "crm.lookup", "tool_call_id": "c1"}]


def test_other_outcomes_never_end_the_call():
    for outcome in ("ok", "error", "timeout", "failed", "invalid", "rejected", "replayed"):
        w = Wire()
        one_tool_turn(w)
        assert not [e for e in w.finish("c1", outcome=outcome) if isinstance(e, EndCall)], outcome


# ------------------------------------------------------------- idle calls

def idle_timeout() -> dict:
    return {"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": 0, "audio_end_ms": 5000,
            "item_id": "item_silence"}


def test_the_first_idle_timeout_leaves_the_check_in_to_the_service():
    w = Wire()
    w.server(idle_timeout())
    assert w.creates() == []                                  # the service answers a timeout itself
    assert w.records("idle") == [{"timeouts": 1, "then": "check_in"}]
    assert w.p.idle_wake == math.inf


def test_a_second_idle_timeout_says_goodbye_after_the_services_answer_then_ends_the_call():
    w = Wire()
    w.server(idle_timeout(), created("r_check"), done("r_check"))
    w.now = 30.0
    w.server(idle_timeout())
    assert w.records("idle")[-1] == {"timeouts": 2, "then": "goodbye"}
    assert w.creates() == [] and w.of(WakeAt) == [WakeAt(30.0 + SERVICE_ANSWER_WAIT_S)]
    w.server(created("r_auto"))                               # the service answers the timeout itself
    assert w.p.idle_wake == 30.0 + IDLE_GOODBYE_MAX_S         # no wake-up for a wait already over
    [cancel] = [e.event for e in w.of(Send) if e.event["type"] == "response.cancel"]
    assert cancel["response_id"] == "r_auto"                  # its second check-in is not heard
    w.now = 30.0 + SERVICE_ANSWER_WAIT_S
    w.feed(Timer())
    assert w.creates() == []                                  # never while a response is active
    w.server(done("r_auto"))
    [goodbye] = w.creates()
    assert goodbye.event["response"] == IDLE_GOODBYE
    w.write()
    w.now = 33.0
    w.server(created("r_bye"), done("r_bye"))
    assert w.of(WakeAt)[-1] == WakeAt(33.0 + GRACE_S)         # its audio plays out first
    w.feed(Timer())
    assert w.of(EndCall) == []
    w.now = 33.0 + GRACE_S
    w.feed(Timer())
    w.feed(Timer())
    assert w.of(EndCall) == [EndCall(EndReason.USER_IDLE)]    # once
    assert w.p.idle_wake == math.inf


def test_without_an_answer_from_the_service_the_goodbye_goes_after_the_wait_and_is_asked_again_when_refused():
    w = Wire()
    w.server(idle_timeout(), idle_timeout())
    assert w.creates() == [] and w.p.idle_wake == SERVICE_ANSWER_WAIT_S
    w.now = SERVICE_ANSWER_WAIT_S
    w.feed(Timer())
    [goodbye] = w.creates()
    w.write()
    # a response of the service's began before ours came in
    w.server(created("r_auto"), error(ACTIVE_RESPONSE, goodbye.event["event_id"]))
    assert len(w.creates()) == 1
    w.server(done("r_auto"))
    again = w.creates()[1]
    assert again.event["response"] == IDLE_GOODBYE
    w.write()
    w.server(created("r_bye"), done("r_bye"))
    w.now += GRACE_S
    w.feed(Timer())
    assert w.of(EndCall) == [EndCall(EndReason.USER_IDLE)]


def test_user_speech_resets_the_idle_count():
    w = Wire()
    w.server(idle_timeout(), created("r_check"), done("r_check"), speech(), idle_timeout())
    assert w.creates() == []
    assert [r["then"] for r in w.records("idle")] == ["check_in", "check_in"]


def test_speech_during_the_goodbye_keeps_the_call():
    w = Wire()
    w.server(idle_timeout(), created("r_check"), done("r_check"), idle_timeout())
    w.now = SERVICE_ANSWER_WAIT_S
    w.feed(Timer())
    assert len(w.creates()) == 1
    w.write()
    w.server(created("r_bye"), speech(), done("r_bye", status="cancelled"))   # the user is back
    assert w.p.idle_wake == math.inf
    w.now = IDLE_GOODBYE_MAX_S
    w.feed(Timer())
    assert w.of(EndCall) == []
    w.server(idle_timeout())                                  # a new silence starts over
    assert w.records("idle")[-1] == {"timeouts": 1, "then": "check_in"} and len(w.creates()) == 1


def test_the_call_ends_at_the_latest_when_the_goodbye_is_never_answered():
    w = Wire()
    w.server(idle_timeout(), idle_timeout())
    w.now = SERVICE_ANSWER_WAIT_S
    w.feed(Timer())
    w.write()
    assert w.p.idle_wake == IDLE_GOODBYE_MAX_S
    w.now = IDLE_GOODBYE_MAX_S
    w.feed(Timer())
    assert w.of(EndCall) == [EndCall(EndReason.USER_IDLE)]


# ------------------------------------------------- hosted MCP tools

def mcp_item(item_id: str, **fields: Any) -> dict:
    return {"id": item_id, "type": "mcp_call", "server_label": "weather", "name": "forecast", "arguments": "{}",
            **fields}


def test_hosted_mcp_items_among_function_calls_are_recorded_never_answered():
    """An OpenAI-hosted MCP call between two function calls of one response:
    the two calls get one output each and the batch one response.create;
    the hosted ones (done, completed or failed) only get a ``hosted_tool``
    line each (a long name clipped as a tool name is)."""
    w = Wire()
    w.server(speech(), created("r1"), item_added("r1", "c1"), item_done("r1", "c1"))
    added = {"type": "response.output_item.added", "response_id": "r1", "output_index": 1,
             "item": mcp_item("mcp_1")}
    w.server(added)
    assert w.records("hosted_tool") == []                   # shown once it is done
    w.server({**added, "type": "response.output_item.done", "item": mcp_item("mcp_1", output="sunny")},
             {"type": "response.output_item.done", "response_id": "r1", "output_index": 2,
              "item": mcp_item("mcp_2", name="x" * 500,
                               error={"type": "tool_execution_error", "message": "down"})},
             item_added("r1", "c2", "commitments.list"), item_done("r1", "c2", "commitments.list"),
             done("r1", output=[fc_item("c1"), mcp_item("mcp_1", output="sunny"),
                                fc_item("c2", "commitments.list")]))
    assert sorted(w.started()) == ["c1", "c2"] and set(w.p.calls) == {"c1", "c2"}
    w.finish("c1")
    w.finish("c2")
    w.write()
    assert [o.tool_call_id for o in w.outputs()] == ["c1", "c2"] and len(w.creates()) == 1
    completed, failed = w.records("hosted_tool")
    assert completed == {"item_id": "mcp_1", "response_id": "r1", "server": "weather", "tool": "forecast",
                         "status": "completed", "error": None}
    assert (failed["server"], failed["status"], failed["error"]) == ("weather", "failed", "tool_execution_error")
    assert len(failed["tool"]) == 128
    (response,) = w.records("response")
    assert response["tool_calls"] == ["c1", "c2"]


# ---------------------------------------------------------- the time limit

def _wrapping(at: float = 100.0, ends_at: float = 220.0) -> Wire:
    w = Wire()
    w.p.schedule_wrap_up(at=at, ends_at=ends_at)
    return w


def test_the_wrap_up_is_asked_for_once_when_due_and_says_how_long_is_left():
    w = _wrapping()
    assert w.p.wrap_up_wake == 100.0
    w.now = 99.0
    w.feed(Timer())
    assert w.creates() == [] and w.records("wrap_up") == []
    w.now = 100.0
    w.feed(Timer())
    [wrap_up] = w.creates()
    assert wrap_up.event["response"] == wrap_up_response(2)
    assert "2 minutes" in wrap_up.event["response"]["instructions"]
    assert w.records("wrap_up") == [{"left_s": 120.0}] and w.p.wrap_up_wake == math.inf
    w.write()
    w.server(created("r_wrap"), done("r_wrap"))
    w.now = 150.0
    w.feed(Timer())
    assert len(w.creates()) == 1                               # once


def test_the_wrap_up_waits_for_an_active_response_and_a_write_in_flight():
    w = _wrapping()
    w.server(created("r1"), item_done("r1", "c1", "commitments.add"))     # a write, its response still on
    w.now = 100.0
    w.feed(Timer())
    assert w.creates() == []                                   # never while a response is active
    w.server(done("r1"))
    assert w.creates() == [] and w.started() == ["c1"]        # the write is still running
    w.finish("c1", output='{"added": 1}')
    assert w.creates() == []                                   # its output is written first
    w.write()
    [wrap_up] = w.creates()
    assert wrap_up.event["response"] == wrap_up_response(2)
    assert w.p.creates[wrap_up.event["event_id"]].batches == ["r1"]   # it is the write's follow-up too


def test_a_refused_wrap_up_is_asked_for_again():
    w = _wrapping()
    w.now = 100.0
    w.feed(Timer())
    w.write()
    [first] = w.creates()
    w.server(created("r_other"), error(ACTIVE_RESPONSE, first.event["event_id"]))
    w.server(done("r_other"))
    assert [c.event["response"] for c in w.creates()] == [wrap_up_response(2)] * 2


def test_without_a_schedule_there_is_no_wrap_up():
    w = Wire()
    assert w.p.wrap_up_wake == math.inf
    w.now = 1e9
    w.feed(Timer())
    assert w.creates() == [] and w.records("wrap_up") == []


def test_a_rate_limited_wrap_up_is_asked_again_after_the_backoff_not_at_once():
    w = _wrapping(at=0.0)
    w.feed(Timer())
    for n, wait in enumerate(BACKOFF_S):
        w.write()
        w.server(error("rate_limit_exceeded", w.creates()[-1].event["event_id"]))
        assert len(w.creates()) == n + 1                        # not at once
        assert w.of(WakeAt)[-1] == WakeAt(w.now + wait)
        w.now += wait
        w.feed(Timer())
        assert len(w.creates()) == n + 2
    w.write()
    w.server(error("rate_limit_exceeded", w.creates()[-1].event["event_id"]))
    w.now += 100
    w.feed(Timer())
    assert len(w.creates()) == len(BACKOFF_S) + 1               # retries spent: no loop of refusals
    w.server(created("r_user"), done("r_user"))                 # a response event decides again
    assert len(w.creates()) == len(BACKOFF_S) + 2


# ------------------------------------------------------------ slow tools

def slow_wire(ack_after_s: float = 0.7) -> Wire:
    w = Wire()
    w.p._may_defer = lambda name: name not in WRITES
    w.p.slow_tools = SlowTools(ack_after_s=ack_after_s)
    return w


def acknowledged_wire() -> Wire:
    """One slow read's turn, acknowledged at 0.7 s, the acknowledgement's
    response (``r_ack``) done: the read still runs."""
    w = slow_wire()
    one_tool_turn(w)
    w.now = 0.7
    w.feed(Timer())
    w.write()
    w.server(created("r_ack"), done("r_ack"))
    return w


def acks(w: Wire) -> list[Send]:
    return [c for c in w.creates() if c.event.get("response", {}).get("instructions") == TOOL_ACK["instructions"]]


def test_a_slow_read_is_acknowledged_once_when_due_then_spoken_once():
    w = slow_wire()
    w.server(speech())
    w.now = 10.0
    one_tool_turn(w)
    assert WakeAt(10.7) in w.effects and w.p.slow_wake == 10.7
    w.now = 10.5
    w.feed(Timer())
    assert w.creates() == []                       # not due yet
    w.now = 10.7
    w.feed(Timer())
    [ack] = w.creates()
    assert ack.event["response"] == TOOL_ACK and w.p.creates[ack.event["event_id"]].batches == []
    [line] = w.records("slow_ack")
    assert line["tool_call_ids"] == ["c1"] and line["waited_ms"] == 700.0
    w.write()
    w.server(created("r_ack"), done("r_ack"))
    w.now = 13.0
    w.feed(Timer())
    assert len(w.creates()) == 1                   # one acknowledgement per batch
    w.finish("c1")
    w.write()
    [_, delivery] = w.creates()
    assert "response" not in delivery.event or "instructions" not in delivery.event.get("response", {})
    assert w.p.batches["r1"].follow_up == "ours"
    assert w.records("slow_output")[0]["waited_ms"] == 2300.0
    assert w.records("slow_delivery")[0]["event_id"] == delivery.event["event_id"]


def test_a_read_answering_in_time_is_never_acknowledged():
    w = slow_wire()
    one_tool_turn(w)
    w.now = 0.3
    w.finish("c1")
    w.write()
    w.now = 0.7
    w.feed(Timer())
    assert len(w.creates()) == 1 and acks(w) == [] and w.records("slow_ack") == []


def test_no_acknowledgement_while_a_response_is_active_nor_for_a_write():
    w = slow_wire()
    one_tool_turn(w)
    w.server(created("r_model"))                   # the model speaks on its own
    w.now = 1.0
    w.feed(Timer())
    assert w.creates() == []
    w.server(done("r_model"))                      # the quiet moment: then it goes
    assert len(acks(w)) == 1
    v = slow_wire()
    one_tool_turn(v, name="commitments.add")
    v.now = 1.0
    v.feed(Timer())
    assert v.creates() == [] and v.records("slow_ack") == []     # a write answers before anything is said


def test_off_at_zero():
    w = slow_wire(ack_after_s=0.0)
    one_tool_turn(w)
    assert w.of(WakeAt) == [] and w.p.slow_wake == math.inf
    w.now = 5.0
    w.feed(Timer())
    assert w.creates() == []


def test_an_acknowledged_read_outlives_the_users_next_turn_and_waits_for_its_answer_to_end():
    w = slow_wire()
    w.server(speech())
    one_tool_turn(w)
    w.now = 0.7
    w.feed(Timer())
    w.write()
    w.server(created("r_ack"), done("r_ack"))
    w.now = 2.0
    w.server(speech())                             # the user asks something else
    [cancel] = w.of(CancelOlderReads)
    assert cancel == CancelOlderReads(2, keep=frozenset({"c1"}))
    assert w.p.batches["r1"].follow_up is None     # kept, not superseded
    w.finish("c1")
    w.write()
    assert len(w.creates()) == 1                   # not over the user: the floor is theirs
    w.server(typed_turn("u2"))
    w.server(created("r_answer"))                  # the service answers the new turn
    assert len(w.creates()) == 1
    w.server(done("r_answer"))
    [_, delivery] = w.creates()                    # then the kept answer is spoken
    assert w.p.creates[delivery.event["event_id"]].batches == ["r1"]


def test_a_kept_answer_is_spoken_when_no_answer_to_the_users_turn_comes():
    w = acknowledged_wire()
    w.now = 1.0
    w.server(speech())
    w.finish("c1")
    w.write()
    w.server({"type": "conversation.item.added",
              "item": {"id": "u2", "type": "message", "role": "user", "content": []}})
    assert WakeAt(1.0 + SERVICE_ANSWER_WAIT_S) in w.effects
    w.now = 1.0 + SERVICE_ANSWER_WAIT_S
    w.feed(Timer())
    assert len(w.creates()) == 2


def test_before_the_acknowledgement_a_barge_in_cancels_the_read_as_before():
    w = slow_wire()
    one_tool_turn(w)
    w.now = 0.5
    w.server(speech())
    assert w.of(CancelOlderReads) == [CancelOlderReads(1)]
    assert w.p.batches["r1"].follow_up == "superseded"
    w.now = 0.7
    w.feed(Timer())
    assert w.creates() == [] and w.records("slow_ack") == []


# ------------------------------------------------- interrupted, truthful

def system_items(w: Wire) -> list[str]:
    return [e.event["item"]["content"][0]["text"] for e in w.of(Send)
            if e.event["type"] == "conversation.item.create" and e.event["item"].get("role") == "system"]


def test_a_report_of_writes_cut_short_tells_the_model_which_were_done():
    w = Wire()
    w.server(speech(), created("r1"), item_added("r1", "w1", "commitments.add"),
             item_done("r1", "w1", "commitments.add", '{"text": "call mum"}'))
    w.server(item_added("r1", "w2", "commitments.add"),
             item_done("r1", "w2", "commitments.add", '{"text": "buy milk"}'), done("r1"))
    w.finish("w1")
    w.finish("w2", output='{"error": "journal busy"}', outcome="busy")
    w.write()
    w.server(created("r2"))                        # our follow-up: the report
    w.server({"type": "response.output_item.added", "response_id": "r2", "output_index": 0,
              "item": {"id": "msg_r2", "type": "message", "role": "assistant", "status": "in_progress",
                       "content": []}})
    w.server({"type": "response.output_audio_transcript.done", "response_id": "r2", "item_id": "msg_r2",
              "output_index": 0, "content_index": 0, "transcript": "I added both"})
    w.server(speech(), {"type": "conversation.item.truncated", "item_id": "msg_r2", "content_index": 0,
                        "audio_end_ms": 640})
    assert system_items(w) == []
    w.server(done("r2", status="cancelled"))
    [item] = system_items(w)
    assert 'Done: commitments.add {"text": "call mum"}.' in item
    assert 'Not done: commitments.add {"text": "buy milk"}.' in item
    [heard] = w.records("heard")
    assert heard == {"response_id": "r2", "turn": 2, "done": ["w1"], "not_done": ["w2"],
                     "heard": [{"item_id": "msg_r2", "text": "I added both", "audio_end_ms": 640}]}


def test_the_truthful_item_waits_for_a_write_still_running_and_reads_are_left_out():
    w = Wire()
    w.server(speech(), created("r1"), item_added("r1", "w1", "commitments.add"),
             item_done("r1", "w1", "commitments.add"), item_added("r1", "c1"), item_done("r1", "c1"))
    w.server(speech(), done("r1", status="cancelled"))      # cut while the write runs
    assert system_items(w) == [] and w.records("heard") == []
    w.finish("c1")
    assert system_items(w) == []
    w.finish("w1")
    [item] = system_items(w)
    assert "Done: commitments.add {}" in item and "calendar.today" not in item
    assert w.records("heard")[0]["done"] == ["w1"]


def test_a_reply_cut_short_without_writes_is_recorded_but_sends_no_item():
    w = Wire()
    w.server(speech(), created("r1"), done("r1", status="cancelled"))
    assert system_items(w) == []
    assert w.records("heard") == [{"response_id": "r1", "turn": 1, "heard": [], "done": [], "not_done": []}]


def test_at_most_max_in_flight_slow_calls_are_acknowledged_at_once():
    w = slow_wire()
    w.p.slow_tools = SlowTools(ack_after_s=0.7, max_in_flight=1)
    w.server(speech())
    one_tool_turn(w, "r1", "c1")
    w.now = 0.7
    w.feed(Timer())
    w.write()
    w.server(created("r_ack1"), done("r_ack1"))
    w.now = 1.0
    w.server(speech(), typed_turn("u2"))
    w.now = 1.1
    one_tool_turn(w, "r2", "c2", "entities.get")             # the second question needs a slow read too
    w.now = 1.8
    w.feed(Timer())
    assert len(acks(w)) == 1                                  # c1 is still in flight: no second acknowledgement
    assert w.logs("tool.ack_bounded")[0]["in_flight"] == 1
    w.finish("c1")                                            # one fewer in flight: c2 is acknowledged now
    w.write()
    assert len(acks(w)) == 2 and len(w.creates()) == 2
    assert [line["tool_call_ids"] for line in w.records("slow_ack")] == [["c1"], ["c2"]]
    w.server(created("r_ack2"), done("r_ack2"))               # then, at the next quiet moment, c1's answer
    delivery = w.creates()[-1]
    assert w.p.creates[delivery.event["event_id"]].batches == ["r1"]


def test_a_result_after_the_calls_end_is_recorded_not_spoken():
    w = acknowledged_wire()
    w.p.end_decided()
    w.now = 5.0
    w.finish("c1")
    w.write()
    assert len(w.creates()) == 1                              # the acknowledgement only
    [line] = w.records("slow_output")
    assert line["after_end"] is True and w.records("slow_delivery") == []


def test_progress_is_published_and_one_progress_line_is_spoken_past_the_threshold():
    w = slow_wire()
    w.p.slow_tools = SlowTools(ack_after_s=0.7, progress_after_s=5.0)
    one_tool_turn(w)                                          # c1 starts at 0
    w.now = 0.7
    w.feed(Timer())
    w.write()
    w.server(created("r_ack"), done("r_ack"))
    w.now = 2.0
    w.feed(ToolProgress("c1", 1, 4, "reading page 1"))
    [shown] = [e for e in w.of(Publish) if e.kind == "tool_progress"]
    assert shown.fields == {"tool": "calendar.today", "tool_call_id": "c1", "epoch": 0, "progress": 1,
                            "total": 4, "message": "reading page 1"}
    assert len(w.creates()) == 1 and WakeAt(5.0) in w.effects and w.p.slow_wake == 5.0
    w.now = 5.0
    w.feed(Timer())                                           # past the threshold: the latest progress, once
    [_, line] = w.creates()
    assert line.event["response"] == progress_response(1, 4)
    assert "25 percent" in line.event["response"]["instructions"]
    assert "reading page" not in line.event["response"]["instructions"]   # a source's words are data
    w.write()
    w.server(created("r_progress"), done("r_progress"))
    w.now = 8.0
    w.feed(ToolProgress("c1", 3, 4, "reading page 3"))
    w.feed(Timer())
    assert len(w.creates()) == 2                              # one progress line per batch
    assert w.records("slow_progress") == [{"response_id": "r1", "tool_call_id": "c1", "progress": 1, "total": 4,
                                           "event_id": line.event["event_id"]}]
    w.finish("c1")
    w.write()
    assert len(w.creates()) == 3                              # then the answer


def test_no_progress_line_before_the_acknowledgement_nor_after_the_answer():
    w = slow_wire(ack_after_s=0.0)                            # never acknowledged
    w.p.slow_tools = SlowTools(ack_after_s=0.0, progress_after_s=5.0)
    one_tool_turn(w)
    w.now = 6.0
    w.feed(ToolProgress("c1", 0.5, None, None))
    w.feed(Timer())
    assert w.creates() == []
    w.finish("c1")
    w.feed(ToolProgress("c1", 0.9, None, None))               # late: the call has answered
    assert [e for e in w.of(Publish) if e.kind == "tool_progress"][-1].fields["progress"] == 0.5


def test_a_typed_turn_holds_a_kept_answer_back_until_its_answer_has_started_and_ended():
    w = acknowledged_wire()
    w.now = 3.0
    w.server(typed_turn("u2"))                     # no speech: the client asks for its answer
    w.finish("c1")
    w.write()
    assert len(w.creates()) == 1 and WakeAt(3.0 + SERVICE_ANSWER_WAIT_S) in w.effects
    w.server(created("r_typed"), done("r_typed"))
    assert len(w.creates()) == 2


def test_a_write_that_answers_after_the_end_is_decided_is_recorded_and_asks_for_no_response():
    w = Wire()
    w.server(speech())
    one_tool_turn(w, name="commitments.add")
    w.p.end_decided()
    w.finish("c1")
    w.write()
    assert w.creates() == []                                  # the close writes the output; nobody speaks it
    assert [line["outcome"] for line in (e.fields for e in w.p.closing_lines()
                                         if e.kind == "tool_call")] == ["ok"]
