"""The round (issue 14): a fresh reusable read answered in the call's own
step, and frames skipped before they wake the call's reader.

``ToolExecutor.answer_now`` answers a reusable read from its kept answer in
the caller's step; the call actor asks it before sending a request to the
executor's inbox. These tests hold the in-step path to the inbox path's rules:
the executor on its own (same result, same log line, same turn count, the
turn's output budget, nothing counted when it cannot answer), then whole calls
against the simulator, the sideband in memory (same outputs, same record lines,
identical-call rejection, the turn bound, barge-in, a stale answer and a
request still on its way both going through the inbox), then the protocol
alone. Last, the sideband's hand-off dropping the frames the reader would
skip unread: the event sequence still counts them (the idle timeout's side:
``test_call_lifecycle.test_max_duration_ends_a_busy_call``).
"""

from __future__ import annotations

import dataclasses
import json
import math

import trio
from structlog.testing import capture_logs

from voiceactors.executor.actor import DUPLICATE_CALL, TOO_MANY_CALLS, ToolExecutor
from voiceactors.messages import ToolRequest, ToolResult, ask
from voiceactors.settings import Settings
from voiceactors.tools import REGISTRY, ToolContext, make_registry

from calls_support import Sideband, assert_clean_protocol, rig, steady

ANY_ARGS = {"type": "object"}


# ------------------------------------------------------------ the executor

def _counting_registry(runs: list[str], *names: str):
    specs = list(REGISTRY.values())
    for name in names:
        spec = next(s for s in specs if s.name == name)
        specs = [s for s in specs if s.name != name]

        def handler(ctx, args, _spec=spec):
            runs.append(_spec.name)
            return _spec.handler(ctx, args)

        specs.append(dataclasses.replace(spec, handler=handler))
    return make_registry(specs)


def _request(tool_call_id: str, name: str = "briefing.get", arguments: str = "{}", *, turn: int = 0,
             call_id: str = "rtc_x", reply=None) -> ToolRequest:
    if reply is None:
        reply, _ = trio.open_memory_channel[ToolResult](1)
    return ToolRequest(call_id=call_id, tool_call_id=tool_call_id, name=name, arguments=arguments, epoch=0,
                       turn=turn, reply=reply)


async def _via_inbox(executor: ToolExecutor, tool_call_id: str, name: str = "briefing.get", *,
                     turn: int = 0, call_id: str = "rtc_x") -> ToolResult:
    return await ask(executor.inbox, lambda reply: _request(tool_call_id, name, turn=turn, call_id=call_id,
                                                            reply=reply), timeout=math.inf)


async def _executor(nursery, tmp_path, runs: list[str], **changes) -> ToolExecutor:
    from calls_support import DAY
    from voiceactors.journal.sample import write_sample_journal

    journal = tmp_path / "journal"
    write_sample_journal(journal, days=3, today=DAY)
    settings = Settings(journal=journal, state_dir=tmp_path / "state", tool_timeout_read_s=math.inf,
                        tool_timeout_write_s=math.inf, **changes)
    ctx = ToolContext(journal=journal, state_dir=settings.state_dir, today=lambda: DAY)
    executor = ToolExecutor(settings, ctx, _counting_registry(runs, "briefing.get", "calendar.today"))
    await nursery.start(executor.run)
    return executor


async def test_answer_now_gives_the_inbox_paths_result_and_log_line(nursery, autojump_clock, tmp_path):
    runs: list[str] = []
    executor = await _executor(nursery, tmp_path, runs)
    assert executor.answer_now(_request("c0")) is None          # nothing kept yet: the inbox runs it
    first = await _via_inbox(executor, "c1", call_id="rtc_a")
    assert runs == ["briefing.get"]
    with capture_logs() as logs:
        in_step = executor.answer_now(_request("c2", call_id="rtc_b"))
        via_inbox = await _via_inbox(executor, "c3", call_id="rtc_c")
    assert runs == ["briefing.get"]                              # both from the kept answer
    assert in_step is not None
    assert (in_step.tool, in_step.output, in_step.outcome) == (via_inbox.tool, via_inbox.output, "ok")
    assert in_step.output == first.output and in_step.call_id == "rtc_b" and in_step.tool_call_id == "c2"
    lines = [line for line in logs if line["event"] == "tool.run"]
    assert [line["tool_call_id"] for line in lines] == ["c2", "c3"]
    same = [{k: v for k, v in line.items() if k not in ("call_id", "tool_call_id", "duration_ms")}
            for line in lines]
    assert same[0] == same[1] and same[0]["reused"] is True and same[0]["delivered"] is True


async def test_answer_now_counts_the_turn_like_the_inbox(nursery, autojump_clock, tmp_path):
    runs: list[str] = []
    executor = await _executor(nursery, tmp_path, runs, tool_calls_per_turn=2)
    await _via_inbox(executor, "w1", call_id="rtc_warm")
    await _via_inbox(executor, "w2", "calendar.today", call_id="rtc_warm")
    ok = executor.answer_now(_request("c1"))
    duplicate = executor.answer_now(_request("c2"))
    over = executor.answer_now(_request("c3", "calendar.today"))
    assert ok is not None and ok.outcome == "ok"
    assert duplicate is not None and json.loads(duplicate.output) == DUPLICATE_CALL
    assert over is not None and json.loads(over.output) == {**TOO_MANY_CALLS, "limit": 2}
    retry = executor.answer_now(_request("c1"))                  # the same tool call id: a retry, not a new call
    assert retry is not None and retry.outcome == "ok"
    via_inbox = await _via_inbox(executor, "c4", "calendar.today")   # the bound holds on the inbox path too
    assert json.loads(via_inbox.output) == {**TOO_MANY_CALLS, "limit": 2}
    fresh_turn = executor.answer_now(_request("c5", turn=1))
    assert fresh_turn is not None and fresh_turn.outcome == "ok"


async def test_answer_now_counts_nothing_when_it_cannot_answer(nursery, autojump_clock, tmp_path):
    runs: list[str] = []
    executor = await _executor(nursery, tmp_path, runs, tool_calls_per_turn=1, tool_reuse_s=1.0)
    await _via_inbox(executor, "w1", call_id="rtc_warm")
    await trio.sleep(1.0)                                        # the kept answer is stale now
    assert executor.answer_now(_request("c1")) is None
    assert executor.answer_now(_request("c2", "calendar.today")) is None    # never run
    assert executor.answer_now(_request("c3", "journal.get_day", '{"day": "2026-03-27"}')) is None  # not reusable
    result = await _via_inbox(executor, "c4")                   # still the turn's first call
    assert result.outcome == "ok" and runs == ["briefing.get", "briefing.get"]


async def test_answer_now_spends_the_turns_output_budget(nursery, autojump_clock, tmp_path):
    runs: list[str] = []
    executor = await _executor(nursery, tmp_path, runs)
    size = len((await _via_inbox(executor, "w1", call_id="rtc_warm")).output)
    await _via_inbox(executor, "w2", "calendar.today", call_id="rtc_warm")
    executor.settings = executor.settings.replace(turn_output_cap=size + 10)
    in_step = [executor.answer_now(_request("c1", call_id="rtc_a")),
               executor.answer_now(_request("c2", "calendar.today", call_id="rtc_a"))]
    via_inbox = [await _via_inbox(executor, "c1", call_id="rtc_b"),
                 await _via_inbox(executor, "c2", "calendar.today", call_id="rtc_b")]
    assert [(r.output, r.outcome) for r in in_step if r is not None] == [(r.output, r.outcome) for r in via_inbox]
    assert len(in_step[0].output) == size and in_step[1].outcome == "rejected"   # the turn's budget was spent


async def test_answer_now_answers_nothing_once_the_executor_stopped(autojump_clock, tmp_path):
    runs: list[str] = []
    async with trio.open_nursery() as nursery:
        executor = await _executor(nursery, tmp_path, runs)
        await _via_inbox(executor, "w1")
        assert executor.answer_now(_request("c1")) is not None
        executor.inbox.close()
    assert executor.answer_now(_request("c2")) is None


# ------------------------------------------------------------ whole calls

def _brief_scenario(*calls: tuple[str, dict]) -> object:
    return steady([
        {"user_turn": {"text": "brief me"}},
        {"response": {"tool_calls": [{"name": name, "arguments": args} for name, args in calls]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here it is."}},
        {"sleep": 0.5},
        {"close": 1000},
    ])


def _record_shape(lines: list[dict]) -> list[dict]:
    """The record's lines without what differs between two calls (ids, times)."""
    varying = {"t", "call_id", "tool_call_id", "response_id", "event_id", "started", "ended", "duration_s",
               "duration_ms", "overhead_ms", "turnaround_ms", "for", "tool_calls", "item_id", "at", "ts"}
    return [{k: v for k, v in line.items() if k not in varying} for line in lines]


async def test_a_fresh_read_goes_out_from_the_calls_step_as_the_inbox_would_answer(tmp_path, autojump_clock):
    runs: list[str] = []
    registry = _counting_registry(runs, "briefing.get")
    scenario = _brief_scenario(("briefing.get", {}))
    with capture_logs() as logs:
        async with rig(tmp_path, registry=registry, tool_reuse_s=1e6) as r:
            warm, warm_sc = await r.run_call("rtc_warm", scenario)
            step, step_sc = await r.run_call("rtc_step", scenario)
            inbox, inbox_sc = await r.run_call("rtc_inbox", scenario, answer_now=None)
            records = [r.record(c) for c in ("rtc_warm", "rtc_step", "rtc_inbox")]
    assert runs == ["briefing.get"]                       # one run; the other two calls reused it
    assert (warm.answered_in_step, step.answered_in_step, inbox.answered_in_step) == (0, 1, 0)
    for sc in (warm_sc, step_sc, inbox_sc):
        assert_clean_protocol(sc, creates=1)
    outputs = [next(iter(sc.outputs.values())) for sc in (warm_sc, step_sc, inbox_sc)]
    assert outputs[0] == outputs[1] == outputs[2]
    assert _record_shape(records[1]) == _record_shape(records[2])
    assert [line["kind"] for line in records[1]] == [line["kind"] for line in records[0]]
    tool_runs = {line["call_id"]: line for line in logs if line["event"] == "tool.run"}
    assert set(tool_runs) == {"rtc_warm", "rtc_step", "rtc_inbox"}
    shape = [{k: v for k, v in tool_runs[c].items() if k not in ("call_id", "tool_call_id", "duration_ms")}
             for c in ("rtc_step", "rtc_inbox")]
    assert shape[0] == shape[1] and shape[0]["reused"] is True


async def test_identical_calls_and_the_turn_bound_hold_in_step(tmp_path, autojump_clock):
    runs: list[str] = []
    registry = _counting_registry(runs, "briefing.get", "calendar.today")
    warmup = _brief_scenario(("briefing.get", {}), ("calendar.today", {}))
    batch = _brief_scenario(("briefing.get", {}), ("briefing.get", {}), ("calendar.today", {}))
    outputs = {}
    async with rig(tmp_path, registry=registry, tool_reuse_s=1e6, tool_calls_per_turn=2) as r:
        await r.run_call("rtc_warm", warmup)
        for call_id, answer_now in (("rtc_step", r.executor.answer_now), ("rtc_inbox", None)):
            actor, sc = await r.run_call(call_id, batch, answer_now=answer_now)
            assert_clean_protocol(sc, creates=1)
            outputs[call_id] = [json.loads(sc.outputs[c][0]) for c in sc.tool_calls]
            assert actor.answered_in_step == (3 if answer_now else 0)
    assert sorted(runs) == ["briefing.get", "calendar.today"]
    step, inbox = outputs["rtc_step"], outputs["rtc_inbox"]
    assert step == inbox
    assert "error" not in step[0]
    assert step[1:] == [DUPLICATE_CALL, {**TOO_MANY_CALLS, "limit": 2}]


async def test_a_barge_in_after_an_in_step_answer_asks_for_no_response(tmp_path, autojump_clock):
    """The answer was there when the call started, so its output goes out at
    once; the user then barges in and the service cancels the response: the
    call id is answered once and no response.create follows (the model
    answers the new turn by itself)."""
    runs: list[str] = []
    registry = _counting_registry(runs, "briefing.get")
    barge_in = steady([
        {"user_turn": {"text": "Brief me."}},
        {"response": {"text": "Let me look.", "tool_calls": [{"name": "briefing.get", "arguments": {}}],
                      "hold_s": 2.0}},
        {"barge_in": {"after_ms": 300, "text": "Actually, never mind."}},
        {"response": {"text": "Sure."}},
        {"wait_outputs": {"response_create": False}},
        {"sleep": 2.0},
        {"close": 1000},
    ])
    async with rig(tmp_path, registry=registry, tool_reuse_s=1e6) as r:
        await r.run_call("rtc_warm", _brief_scenario(("briefing.get", {})))
        actor, sc = await r.run_call("rtc_barge", barge_in)
    assert actor.answered_in_step == 1 and runs == ["briefing.get"]
    assert_clean_protocol(sc, creates=0)
    (call,) = actor.calls.values()
    assert call.state == "confirmed" and actor.epoch >= 1


async def test_a_stale_answer_runs_at_the_executor(tmp_path, autojump_clock):
    runs: list[str] = []
    registry = _counting_registry(runs, "briefing.get")
    scenario = _brief_scenario(("briefing.get", {}))
    with capture_logs() as logs:
        async with rig(tmp_path, registry=registry, tool_reuse_s=1.0) as r:
            await r.run_call("rtc_warm", scenario)
            await trio.sleep(2.0)
            actor, sc = await r.run_call("rtc_late", scenario)
    assert actor.answered_in_step == 0 and runs == ["briefing.get", "briefing.get"]
    assert_clean_protocol(sc, creates=1)
    (line,) = [x for x in logs if x["event"] == "tool.run" and x["call_id"] == "rtc_late"]
    assert line["reused"] is False


async def test_a_request_on_its_way_keeps_the_next_from_overtaking_it(tmp_path, autojump_clock):
    """While a read of the call is at the executor, a fresh read behind it in
    the same response goes through the inbox too: the executor counts the
    turn's calls in arrival order, so with a bound of one call per turn the
    first call runs and the fresh one behind it is the one refused, as on
    the inbox path."""
    runs: list[str] = []
    registry = _counting_registry(runs, "briefing.get", "journal.search")
    batch = _brief_scenario(("journal.search", {"query": "offsite"}), ("briefing.get", {}))
    outputs = {}
    with capture_logs() as logs:
        async with rig(tmp_path, registry=registry, tool_reuse_s=1e6, tool_calls_per_turn=1) as r:
            await r.run_call("rtc_warm", _brief_scenario(("briefing.get", {})))
            for call_id, answer_now in (("rtc_step", r.executor.answer_now), ("rtc_inbox", None)):
                actor, sc = await r.run_call(call_id, batch, answer_now=answer_now)
                assert_clean_protocol(sc, creates=1)
                outputs[call_id] = [json.loads(sc.outputs[c][0]) for c in sc.tool_calls]
                assert actor.answered_in_step == 0
    assert outputs["rtc_step"] == outputs["rtc_inbox"]
    assert "error" not in outputs["rtc_step"][0] and outputs["rtc_step"][1] == {**TOO_MANY_CALLS, "limit": 1}
    assert runs == ["briefing.get", "journal.search", "journal.search"]
    reused = {x["tool"]: x["reused"] for x in logs if x["event"] == "tool.run" and x["call_id"] == "rtc_step"}
    assert reused == {"journal.search": False, "briefing.get": True}   # refused from memory at the executor


# ------------------------------------------------------------ the protocol

def _protocol_round(answer_at_once: bool) -> tuple[list, list]:
    """One response with two reads, through ``CallProtocol`` alone: each
    answer fed right after the step that started it (as the in-step answer
    comes) or only after the response's last frame (as the inbox's does).
    Returns the sends (without event ids) and the record lines."""
    from voiceactors.call.protocol import (
        CallProtocol, Connected, Prefetch, Received, RecordLine, Send, StartTool, ToolFinished, Written,
    )
    from voiceactors.call.protocol import HANDLED_EVENTS
    from voiceactors.realtime.events import read_server_event

    p = CallProtocol("rtc_proto", effect_of=lambda name: "read")
    sends: list[Send] = []
    records: list[RecordLine] = []
    waiting: list[ToolFinished] = []

    def take(effects: list) -> None:
        for e in effects:
            if isinstance(e, Send):
                sends.append(e)
            elif isinstance(e, RecordLine):
                records.append(e)
            elif isinstance(e, (StartTool, Prefetch)) and not getattr(e, "prefetched", False):
                answer = ToolFinished(e.tool_call_id, e.name, '{"ok": true}', "ok", 0.0,
                                      prefetch=isinstance(e, Prefetch))
                if answer_at_once:
                    take(p.handle(answer, 0.0))
                else:
                    waiting.append(answer)

    def server(obj: dict) -> None:
        take(p.handle(Received(read_server_event(json.dumps({"event_id": "ev", **obj}), HANDLED_EVENTS)), 0.0))

    def item(cid: str, status: str, arguments: str) -> dict:
        return {"id": f"i_{cid}", "type": "function_call", "status": status, "name": "briefing.get",
                "call_id": cid, "arguments": arguments}

    take(p.handle(Connected(), 0.0))
    server({"type": "response.created", "response": {"id": "r1", "status": "in_progress"}})
    for cid in ("c1", "c2"):
        server({"type": "response.output_item.added", "response_id": "r1", "output_index": 0,
                "item": item(cid, "in_progress", "")})
        server({"type": "response.function_call_arguments.done", "response_id": "r1", "output_index": 0,
                "item_id": f"i_{cid}", "call_id": cid, "arguments": "{}", "name": "briefing.get"})
        server({"type": "response.output_item.done", "response_id": "r1", "output_index": 0,
                "item": item(cid, "completed", "{}")})
    server({"type": "response.done", "response": {"id": "r1", "status": "completed", "output": []}})
    for answer in waiting:
        take(p.handle(answer, 0.0))
    written = 0
    while written < len(sends):
        take(p.handle(Written(sends[written]), 0.0))
        written += 1
    return ([(s.tool_call_id, {k: v for k, v in s.event.items() if k != "event_id"}) for s in sends],
            [(r.kind, r.fields) for r in records])


def test_the_protocol_answers_an_in_step_answer_as_a_later_one():
    """The same outputs in the same order, one response.create, the same
    record lines, whether each read's answer comes in the step that started
    it or after the response ended."""
    at_once, later = _protocol_round(True), _protocol_round(False)
    assert at_once == later
    sends, records = at_once
    assert [cid for cid, _ in sends] == ["c1", "c2", None]
    assert [kind for kind, _ in records].count("tool_started") == 2


# ------------------------------------------------ frames skipped at the hand-off

async def test_frames_skipped_at_the_hand_off_still_count_in_the_event_sequence(tmp_path, autojump_clock):
    """Deltas never reach the call's reader (the hand-off drops them unread),
    but the protocol's event sequence counts every frame the service sent,
    as when the reader skipped them itself; a capture still sees them all."""
    scenario = steady([
        {"user_turn": {"text": "brief me"}},
        {"response": {"text": "One moment, let me look that up for you.",
                      "tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here it is, the whole day."}},
        {"sleep": 0.5},
        {"close": 1000},
    ])
    # the hand-off is the websocket's (realtime/ws_frames.py), so this call crosses a socket
    async with rig(tmp_path, sideband=Sideband.LOOPBACK) as r:
        actor, sc = await r.run_call("rtc_seq", scenario)
    assert_clean_protocol(sc, creates=1)
    deltas = [e for e in sc.sent if e["type"].endswith(".delta")]
    assert deltas, "the scenario sends deltas"
    assert actor.protocol.seq == len(sc.sent)
