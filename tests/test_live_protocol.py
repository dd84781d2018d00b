"""A Live call's sideband rules without I/O: the Live events of a session
(``simulator/live_events.py``) through ``LiveTranslator`` into the call's
``CallProtocol``, and the protocol's client events back through it. Every
Live event played here and every one the translator sends is checked against
the SDK's ``openai.types.live`` unions (a nested one against the Responses
stream's), strictly; every Realtime event the translator makes for the
protocol against the Realtime union. No sockets, no trio."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from voiceactors.call.meter import FAREWELL, GRACE_S, meter_for
from voiceactors.call.protocol import (
    HANDLED_EVENTS, CallProtocol, CancelOlderReads, Connected, CountUsage, Effect, EndCall, Log, RecordLine, Send,
    StartTool, Timer, ToolFinished, Written,
)
from voiceactors.call.call_context import LinkedContext
from voiceactors.call.end_reason import EndReason
from voiceactors.call.record_kind import RecordKind
from voiceactors.call.state import ToolOutcome
from voiceactors.live.names import RESPONSES_NAME, FunctionNames
from voiceactors.live.translate import FAILED_DELEGATION, HELD_MAX, TEXT_MAX, LiveTranslator, write_note
from voiceactors.realtime.events import SERVER_EVENTS, read_server_event
from voiceactors.simulator import live_events as le
from voiceactors.simulator.conformance import conformance_error
from voiceactors.tool_effect import WRITE
from voiceactors.tools.registry import REGISTRY, manifest

SEARCH, ADD = "journal.search", "commitments.complete"
INSTRUCTIONS = "You are the journal's voice.\n" + "Keep answers short.\n" * 20


_CONFORMING: set[str] = set()      # frames checked once (the every-order test plays the same ones again)


def conforms(frame: str, check: Any) -> bool:
    if frame not in _CONFORMING:
        if check(json.loads(frame)) is not None:
            return False
        _CONFORMING.add(frame)
    return True


def realtime_error(event: dict[str, Any]) -> str | None:
    return conformance_error(SERVER_EVENTS, event)[0]


class LiveCall:
    """One Live call's sideband played event by event: the translator and
    the call's protocol joined as the call's transport joins them."""

    def __init__(self, *, instructions: str = INSTRUCTIONS) -> None:
        self.names = FunctionNames.of(REGISTRY)
        self.translator = LiveTranslator(self.names, is_write=lambda tool: REGISTRY[tool].effect == WRITE,
                                         instructions=instructions)
        self.protocol = CallProtocol("live_test", effect_of=lambda tool: REGISTRY[tool].effect
                                     if tool in REGISTRY else None)
        self.now = 0.0
        self.sent: list[dict[str, Any]] = []       # Live client events, in order
        self.effects: list[Effect] = []            # every effect but the sends
        self.feed(Connected())

    # ------------------------------------------------------------ inputs

    def feed(self, message: Any) -> None:
        self._apply(self.protocol.handle(message, self.now))

    def service(self, *events: dict[str, Any]) -> None:
        """Live server events, as the sideband brings them."""
        for event in events:
            frame = json.dumps(event)
            assert conforms(frame, le.live_server_error), event
            translated = self.translator.from_service(frame)
            self._to_service(translated.to_service)
            self._to_call(translated.to_call)

    def finish(self, start: StartTool, output: dict[str, Any] | None = None,
               outcome: ToolOutcome = ToolOutcome.OK) -> None:
        body = output if output is not None else {"ok": start.name}
        self.feed(ToolFinished(start.tool_call_id, start.name, json.dumps(body), outcome))

    # ------------------------------------------------------------ effects

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                translated = self.translator.from_call(json.dumps(effect.event))
                self._to_service(translated.to_service)
                self.feed(Written(effect))
                self._to_call(translated.to_call)
            else:
                self.effects.append(effect)

    def _to_service(self, frames: list[str]) -> None:
        for frame in frames:
            assert conforms(frame, le.live_client_error), frame
            self.sent.append(json.loads(frame))

    def _to_call(self, frames: list[str]) -> None:
        for frame in frames:
            assert conforms(frame, realtime_error), frame
            event = read_server_event(frame, HANDLED_EVENTS)
            assert event is not None, frame
            self._apply(self.protocol.handle_event(event, self.now))

    # ------------------------------------------------------------ reading

    def starts(self) -> list[StartTool]:
        return [e for e in self.effects if isinstance(e, StartTool)]

    def sent_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.sent if e["type"] == kind]

    def lines(self, kind: RecordKind) -> list[dict[str, Any]]:
        return [e.fields for e in self.effects if isinstance(e, RecordLine) and e.kind == kind]


def delegated(call: LiveCall, did: str, rid: str, calls: list[tuple[str, str, str]], *, offset_ms: int = 1000,
              with_id: bool = False) -> None:
    """A delegation whose response calls ``calls`` ((call id, tool, arguments)), in the plain order."""
    call.service(le.delegation_created(did, offset_ms, rid if with_id else None),
                 le.nested(did, le.response_created(rid)))
    for index, (call_id, tool, arguments) in enumerate(calls):
        name = call.names.responses_name(tool)
        call.service(le.nested(did, le.item_added(call_id, name, index)),
                     le.nested(did, le.arguments_done(call_id, arguments, index)),
                     le.nested(did, le.item_done(call_id, name, arguments, index)))
    call.service(le.nested(did, le.response_ended(rid)))


# ------------------------------------------------------------------ names

def test_every_tool_has_one_responses_name_and_back() -> None:
    names = FunctionNames.of(REGISTRY)
    assert names.responses_name(SEARCH) == "journal_search"
    for tool in REGISTRY:
        spelled = names.responses_name(tool)
        assert RESPONSES_NAME.fullmatch(spelled), spelled
        assert names.tool_name(spelled) == tool
    assert len(set(names.to_responses.values())) == len(REGISTRY)


def test_names_that_would_collide_are_told_apart() -> None:
    names = FunctionNames.of(["journal.get_day", "journal_get.day", "journal_get_day", "x" * 80, "x" * 80 + ".y"])
    assert names.to_responses == {
        "journal.get_day": "journal_get_day", "journal_get.day": "journal_get_day_2",
        "journal_get_day": "journal_get_day_3", "x" * 80: "x" * 64, "x" * 80 + ".y": "x" * 62 + "_2"}
    assert {names.tool_name(n) for n in names.to_tool} == set(names.to_responses)
    assert names.tool_name("not_ours") == "not_ours"       # the executor answers it as unknown


def test_the_delegation_declares_every_tool_under_its_responses_name() -> None:
    from openai.types.live import FunctionTool
    names = FunctionNames.of(REGISTRY)
    declared = names.declare(manifest())
    assert [tool["name"] for tool in declared] == [names.responses_name(tool) for tool in REGISTRY]
    for tool in declared:
        FunctionTool.model_validate(tool)
        assert set(tool) == {"type", "name", "description", "parameters"}


# ------------------------------------------------------------------ tool rounds

def test_a_delegated_search_is_answered_then_continued_once() -> None:
    call = LiveCall()
    delegated(call, "del_1", "resp_1", [("call_1", SEARCH, '{"query": "boat"}')])
    [start] = call.starts()
    assert (start.name, start.tool_call_id, start.arguments) == (SEARCH, "call_1", '{"query": "boat"}')
    assert call.sent == []
    call.finish(start, {"results": []})
    assert [e["type"] for e in call.sent] == ["response.item.create", "response.create"]
    assert call.sent[0]["item"] == {"type": "function_call_output", "call_id": "call_1",
                                    "output": json.dumps({"results": []})}
    # the continued response is ours; it ends without calls: nothing more is sent
    call.service(le.nested("del_1", le.response_created("resp_2")), le.nested("del_1", le.response_ended("resp_2")))
    assert [e["type"] for e in call.sent] == ["response.item.create", "response.create"]
    [settled] = call.lines(RecordKind.TOOL_CALL)
    assert settled["tool"] == SEARCH and settled["state"] == "confirmed"


def test_a_delegated_response_s_usage_is_counted_as_text_tokens() -> None:
    call = LiveCall()
    call.service(le.delegation_created("del_1", 1000), le.nested("del_1", le.response_created("resp_1")),
                 le.nested("del_1", le.response_ended("resp_1", usage=(600, 200, 80))))
    [line] = call.lines(RecordKind.USAGE)
    assert line["tokens"] == {"text_in": 400, "text_out": 80, "audio_in": 0, "audio_out": 0, "cached_in": 200}
    [counted] = [e for e in call.effects if isinstance(e, CountUsage)]
    assert counted.tokens == line["tokens"]


AUDIO_PRICES = ("gpt-5-mini=1.0/8.0/0/0/0.1", "gpt-live-1=audio_min:0.06")


def audio_metered(call: LiveCall, budget_usd: float = 0.0, audio_s: float = 0.0) -> None:
    call.protocol.meter = meter_for("gpt-5-mini", AUDIO_PRICES, budget_usd, audio_model="gpt-live-1", audio_s=audio_s)


def test_the_session_s_cumulative_audio_seconds_are_counted_once() -> None:
    """Each report carries the session's total so far: a repeated or an
    out-of-order (lower) one adds nothing, a higher one adds what it is above
    the highest so far, priced per minute and added to the day's total."""
    call = LiveCall()
    audio_metered(call)
    for seconds in (30, 30, 20, 90, 89.0, 90):
        call.service(le.usage_updated(seconds))
    lines = call.lines(RecordKind.AUDIO_USAGE)
    assert [(line["seconds"], line["added_s"], line["cost_usd"]) for line in lines] == [(30, 30, 0.03), (90, 60, 0.06)]
    call.service(le.session_closed("live_1", "remote_hangup", 90))      # its final total, already counted
    assert len(call.lines(RecordKind.AUDIO_USAGE)) == 2
    assert all(line["model"] == "gpt-live-1" for line in lines)
    counted = [e for e in call.effects if isinstance(e, CountUsage)]
    assert [(c.model, c.tokens) for c in counted] == [("gpt-live-1", {}), ("gpt-live-1", {})]
    assert sum(c.cost_usd or 0 for c in counted) == pytest.approx(0.09)
    assert call.protocol.meter.usage.cost_usd == pytest.approx(0.09)
    # with a delegated response's tokens: the call's cost is both, its totals show the seconds
    call.service(le.delegation_created("del_1", 1000), le.nested("del_1", le.response_created("resp_1")),
                 le.nested("del_1", le.response_ended("resp_1", usage=(600, 200, 80))))
    totals = call.protocol.meter.totals()
    assert totals["audio_s"] == 90 and totals["responses"] == 1
    call.service(le.session_closed("live_1", "remote_hangup", 95))      # the final total: its last 5 s
    assert call.lines(RecordKind.AUDIO_USAGE)[-1]["added_s"] == 5
    assert totals["cost_usd"] == pytest.approx(0.09 + (400 * 1.0 + 80 * 8.0 + 200 * 0.1) / 1e6)
    [total] = [line.fields for line in call.protocol.closing_lines() if line.kind == RecordKind.USAGE_TOTAL]
    assert total["audio_s"] == 95


def test_audio_without_a_price_is_counted_and_its_cost_unknown() -> None:
    call = LiveCall()
    call.protocol.meter = meter_for("gpt-5-mini", (), 0.01, audio_model="gpt-live-1")
    call.service(le.usage_updated(600))
    [line] = call.lines(RecordKind.AUDIO_USAGE)
    assert (line["added_s"], line["cost_usd"]) == (600, None)
    assert call.protocol.meter.usage.cost_usd is None and not call.lines(RecordKind.BUDGET)
    # a budget no price lets stop: said once, as for tokens without a price
    call.service(le.usage_updated(900))
    warned = [e.fields for e in call.effects if isinstance(e, Log) and e.event == "usage.unpriced"]
    assert warned == [{"model": "gpt-live-1", "budget_usd": 0.01}]


def test_a_rejoined_call_counts_only_what_its_reports_add() -> None:
    """A rejoin starts from the seconds its earlier runs counted (the record's
    last ``audio_usage`` line, ``recovery.carried_context``): the session's
    total reported again is not counted twice."""
    from voiceactors.call.call_context import carried_view
    from voiceactors.call.recovery import carried_context
    from voiceactors.live.session import live_session
    context = carried_view(LinkedContext("base", live=live_session(FunctionNames.of(REGISTRY), "base",
                                                                     lambda tool: False, "gpt-5-mini", "gpt-live-1")))
    block = [{"kind": "start", "call_id": "live_1"}, {"kind": "context", "context": context},
             {"kind": "audio_usage", "model": "gpt-live-1", "seconds": 30.0, "added_s": 30.0, "cost_usd": 0.03},
             {"kind": "audio_usage", "model": "gpt-live-1", "seconds": 75.0, "added_s": 45.0, "cost_usd": 0.045}]
    carried = carried_context(block)
    assert carried is not None and carried.live is not None
    assert (carried.live.live_model, carried.live.audio_s) == ("gpt-live-1", 75.0)
    call = LiveCall()
    audio_metered(call, audio_s=carried.live.audio_s)
    call.service(le.usage_updated(75), le.usage_updated(80))
    [line] = call.lines(RecordKind.AUDIO_USAGE)
    assert (line["seconds"], line["added_s"]) == (80, 5)
    assert call.protocol.meter.totals()["audio_s"] == 5
    # and the rejoined run's own context line carries the total on to a second rejoin
    again = carried_context([{"kind": "start"}, {"kind": "context", "context": carried_view(carried)}])
    assert again is not None and again.live is not None and again.live.audio_s == 75.0


def test_audio_seconds_alone_spend_the_call_s_budget() -> None:
    """A session's audio past the call's budget: the farewell is spoken from
    commentary, and once the service took it in, the call ends after the
    grace (its hangup is the shell's: ``live.sessions.hangup``)."""
    call = LiveCall()
    audio_metered(call, budget_usd=0.05)
    call.service(le.usage_updated(40))
    assert not call.lines(RecordKind.BUDGET) and call.sent == []
    call.service(le.usage_updated(60))
    [budget] = call.lines(RecordKind.BUDGET)
    assert budget["cost_usd"] == pytest.approx(0.06)
    [farewell] = call.sent_of("session.commentary.append")
    assert farewell["content"] == FAREWELL["instructions"]
    call.now = 1.0
    call.service(le.commentary_appended(farewell["event_id"], 1000))
    call.now = 1.0 + GRACE_S
    call.feed(Timer())
    assert [e.reason for e in call.effects if isinstance(e, EndCall)] == [EndReason.BUDGET]


ORDERS = list(itertools.permutations(["created", "a_added", "a_done", "b_added", "b_done", "a_args"]))


@pytest.mark.parametrize("with_id", [False, True], ids=["id_from_stream", "id_from_delegation"])
def test_nested_function_calls_in_every_order_make_one_batch(with_id: bool) -> None:
    """Two calls of one delegated response, their events in each of the 720
    orders (the response's id known only from its ``response.created``, or
    from the delegation already): both run once, each on its final
    arguments, and one ``response.create`` follows both outputs."""
    a, b = ("call_a", SEARCH, '{"query": "a"}'), ("call_b", "calendar.today", "{}")
    names = FunctionNames.of(REGISTRY)
    nested = {
        "created": le.response_created("resp_1"),
        "a_added": le.item_added(a[0], names.responses_name(a[1]), 0),
        "a_done": le.item_done(a[0], names.responses_name(a[1]), a[2], 0),
        "a_args": le.arguments_done(a[0], a[2], 0),
        "b_added": le.item_added(b[0], names.responses_name(b[1]), 1),
        "b_done": le.item_done(b[0], names.responses_name(b[1]), b[2], 1),
    }
    wrapped = {step: le.nested("del_1", event) for step, event in nested.items()}
    delegation = le.delegation_created("del_1", 1000, "resp_1" if with_id else None)
    ended = le.nested("del_1", le.response_ended("resp_1"))
    for order in ORDERS:
        call = LiveCall()
        call.service(delegation, *(wrapped[step] for step in order), ended)
        starts = call.starts()
        assert sorted((s.tool_call_id, s.name, s.arguments) for s in starts) == sorted([a, b]), order
        for start in starts:
            call.finish(start)
        kinds = [e["type"] for e in call.sent]
        assert kinds == ["response.item.create", "response.item.create", "response.create"], order


def test_duplicated_events_and_outputs_run_and_answer_a_call_once() -> None:
    call = LiveCall()
    name = call.names.responses_name(SEARCH)
    done = le.nested("del_1", le.item_done("call_1", name, '{"query": "x"}'))
    call.service(le.delegation_created("del_1", 1000), le.nested("del_1", le.response_created("resp_1")),
                 le.nested("del_1", le.item_added("call_1", name)), done, done)
    call.service(le.nested("del_1", le.response_ended("resp_1")), le.nested("del_1", le.response_ended("resp_1")))
    [start] = call.starts()
    call.finish(start)
    call.finish(start)          # a second answer of the same call id changes nothing
    assert [e["type"] for e in call.sent] == ["response.item.create", "response.create"]


def test_events_held_for_a_response_never_named_are_bounded() -> None:
    translator = LiveTranslator(FunctionNames.of(REGISTRY))
    frame = json.dumps(le.nested("del_1", le.item_added("call_1", "journal_search")))
    for _ in range(HELD_MAX + 10):
        assert translator.from_service(frame).to_call == []
    released = translator.from_service(json.dumps(le.nested("del_1", le.response_created("resp_1"))))
    assert len(released.to_call) == 1 + HELD_MAX       # its response.created, then what was held


def test_an_unknown_responses_name_reaches_the_executor_as_it_came() -> None:
    call = LiveCall()
    call.service(le.delegation_created("del_1", 1000), le.nested("del_1", le.response_created("resp_1")),
                 le.nested("del_1", le.item_done("call_1", "no_such_tool", "{}")),
                 le.nested("del_1", le.response_ended("resp_1")))
    [start] = call.starts()
    assert start.name == "no_such_tool"


# ------------------------------------------------------------------ the user speaks over the work

def test_speech_the_delegation_was_made_from_cancels_nothing() -> None:
    call = LiveCall()
    call.service(le.input_delta("look up the boat", 200, 900))
    delegated(call, "del_1", "resp_1", [("call_1", SEARCH, '{"query": "boat"}')], offset_ms=1000)
    call.service(le.input_delta(" please", 600, 950))     # transcribed late, spoken before the delegation
    assert not [e for e in call.effects if isinstance(e, CancelOlderReads)]
    [start] = call.starts()
    call.finish(start)
    assert [e["type"] for e in call.sent] == ["response.item.create", "response.create"]


def test_a_stale_result_after_the_user_spoke_is_answered_but_not_continued() -> None:
    """The user speaks after the delegation was made, while its read and
    its write run: the reads are cancelled (``CancelOlderReads``), the
    write finishes; both outputs go to the delegated model, the write's note
    to the Live model, and no ``response.create`` asks to speak the old work."""
    call = LiveCall()
    delegated(call, "del_1", "resp_1", [("call_r", SEARCH, '{"query": "boat"}'),
                                        ("call_w", ADD, '{"commitment_id": "c_9", "resolution": "done"}')])
    read, write = call.starts()
    call.service(le.input_delta("actually, never mind", 1500))
    [cancel] = [e for e in call.effects if isinstance(e, CancelOlderReads)]
    assert cancel.before_epoch == call.protocol.epoch == 1
    call.finish(read, {"error": "cancelled: the user interrupted"}, ToolOutcome.CANCELLED)
    call.finish(write, {"ok": True, "id": "c_9"})
    kinds = [e["type"] for e in call.sent]
    assert kinds == ["response.item.create", "response.item.create", "session.thinking.append"]
    assert call.sent[2]["content"] == write_note(ADD, write.arguments, json.dumps({"ok": True, "id": "c_9"}))
    call.feed(Timer())
    assert not call.sent_of("response.create")


def test_the_users_turns_are_counted_by_the_timeline() -> None:
    call = LiveCall()
    call.service(le.input_delta("hello", 100))
    assert call.protocol.turn == 1
    call.service(le.input_delta(" there", 400))                 # the same turn
    call.service(le.output_delta("Hi!", 900), le.input_delta("what's on today", 2000))
    assert call.protocol.turn == 2
    call.service(le.output_delta("Let me see.", 2600), le.session_closed("live_1", "remote_hangup", 3.0))
    # a user's transcript is complete when the next turn starts (late fragments join it): in spoken order
    lines = sorted(call.lines(RecordKind.TRANSCRIPT), key=lambda line: line["order"])
    assert [(line["role"], line["text"]) for line in lines] == [
        ("user", "hello there"), ("assistant", "Hi!"), ("user", "what's on today"), ("assistant", "Let me see.")]


# ------------------------------------------------------------------ failures and refusals

def test_a_failed_delegation_is_answered_through_commentary_once() -> None:
    call = LiveCall()
    call.service(le.delegation_created("del_1", 1000), le.nested("del_1", le.response_created("resp_1")),
                 le.nested("del_1", le.responses_error("upstream failed")),
                 le.nested("del_1", le.response_ended("resp_1", "failed")))
    [said] = call.sent
    assert said["type"] == "session.commentary.append" and said["content"] == FAILED_DELEGATION
    assert said["delegation_id"] is None


def test_a_call_of_a_failed_response_never_runs() -> None:
    call = LiveCall()
    name = call.names.responses_name(SEARCH)
    call.service(le.delegation_created("del_1", 1000), le.nested("del_1", le.response_created("resp_1")),
                 le.nested("del_1", le.item_added("call_1", name)),
                 le.nested("del_1", le.response_ended("resp_1", "failed")))
    assert call.starts() == []
    assert [e["type"] for e in call.sent] == ["session.commentary.append", "response.item.create"]
    assert "error" in json.loads(call.sent[1]["item"]["output"])     # its call is answered, never run


def test_a_refusal_of_our_words_ends_them_and_reaches_the_protocol() -> None:
    translator = LiveTranslator(FunctionNames.of(REGISTRY))
    ack = {"type": "response.create", "event_id": "evt_ack", "response": {"instructions": "Say you are on it."}}
    [started] = [json.loads(f) for f in translator.from_call(json.dumps(ack)).to_call]
    refused = translator.from_service(json.dumps(le.error_event("rate_limit_exceeded", "slow down",
                                                          client_event_id="evt_ack")))
    done, error = [json.loads(f) for f in refused.to_call]
    assert done["type"] == "response.done" and done["response"] == {
        "id": started["response"]["id"], "object": "realtime.response", "status": "failed", "output": []}
    assert error["type"] == "error" and error["error"] == {
        "type": "invalid_request_error", "message": "slow down", "code": "rate_limit_exceeded", "event_id": "evt_ack"}
    for event in (done, error):
        assert realtime_error(event) is None


# ------------------------------------------------------------------ words and context

def test_words_of_ours_are_spoken_through_commentary() -> None:
    """A ``response.create`` with instructions (here the greeting, which
    repeats the session's instructions) becomes commentary of the part
    the session does not have; its response ends when the service takes it."""
    translator = LiveTranslator(FunctionNames.of(REGISTRY), instructions=INSTRUCTIONS)
    greeting = {"type": "response.create", "event_id": "evt_greet",
                "response": {"instructions": INSTRUCTIONS + "\n\nGreet the user in one short sentence."}}
    translated = translator.from_call(json.dumps(greeting))
    [said] = [json.loads(f) for f in translated.to_service]
    assert le.live_client_error(said) is None
    assert said == {"type": "session.commentary.append", "event_id": "evt_greet",
                    "content": "Greet the user in one short sentence.", "delegation_id": None}
    [started] = [json.loads(f) for f in translated.to_call]
    assert started["type"] == "response.created"
    ended = translator.from_service(json.dumps(le.commentary_appended("evt_greet", 10)))
    [done] = [json.loads(f) for f in ended.to_call]
    assert done["type"] == "response.done" and done["response"]["id"] == started["response"]["id"]
    assert done["response"]["status"] == "completed"


def test_a_changed_instruction_is_appended_and_a_system_note_is_silent() -> None:
    translator = LiveTranslator(FunctionNames.of(REGISTRY), instructions=INSTRUCTIONS)
    update = {"type": "session.update", "event_id": "evt_u", "session": {
        "type": "realtime", "instructions": INSTRUCTIONS + "## The current selection\nThe day 2026-12-01.\n"}}
    [appended] = [json.loads(f) for f in translator.from_call(json.dumps(update)).to_service]
    assert appended == {"type": "session.instructions.append", "event_id": "evt_u",
                        "content": "## The current selection\nThe day 2026-12-01.", "delegation_id": None}
    same = {**update, "event_id": "evt_same"}           # the instruction the session has already: nothing
    assert translator.from_call(json.dumps(same)).to_service == []
    note = {"type": "conversation.item.create", "event_id": "evt_n", "item": {
        "type": "message", "role": "system", "content": [{"type": "input_text", "text": "x" * 5000}]}}
    [thinking] = [json.loads(f) for f in translator.from_call(json.dumps(note)).to_service]
    assert thinking["type"] == "session.thinking.append" and len(thinking["content"]) == TEXT_MAX
    for event in (appended, thinking):
        assert le.live_client_error(event) is None
    cancel = {"type": "response.cancel", "event_id": "evt_c"}
    assert translator.from_call(json.dumps(cancel)).to_service == []


def test_what_live_does_not_say_becomes_nothing() -> None:
    translator = LiveTranslator(FunctionNames.of(REGISTRY))
    for frame in (b"\x00", "not json", "[]", json.dumps({"type": "session.usage.updated", "usage": 2.0}),
                  json.dumps(le.nested("del_1", {"type": "response.output_text.delta", "delta": "hi"}))):
        translated = translator.from_service(frame)
        assert translated.to_call == [] and translated.to_service == []


def test_the_conformance_checks_refuse_a_wrong_event() -> None:
    assert le.live_client_error({"type": "response.create", "event_id": "e", "response": {}}) is not None
    assert le.live_client_error({"type": "session.thinking.append", "content": ["x"]}) is not None
    assert le.live_server_error(le.nested("d", {"type": "response.created", "response": {}})) is not None
