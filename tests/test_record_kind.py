"""``RecordKind``: the call record's line kinds, one enum for the writer and
every reader.

* the bytes on disk: a record written with the members is byte for byte the
  record written with the bare strings (orjson, and the json fallback for a
  line orjson refuses);
* the writer: every line a real call writes (a CallActor against the
  simulator, the sideband in memory, with a linked context, a selection, tools, a drop
  and a reconnect, and a call that reaches its budget) is a member, and so
  is every literal kind handed to a record writer anywhere in the package;
* the readers: one record holding every kind, written by ``CallRecord``,
  read back by recovery, the history API, the calls report and the
  timeline, each giving what the kinds it names say; and the same lines, as
  the actor hands them over, through the cluster's mirror (a real
  redis-server).
"""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path

import pytest
import trio

from calls_support import rig, steady
from redis_support import REDIS_SERVER, redis_server  # noqa: F401  (the fixture)
from test_budgets import BUDGET_CALL     # a call past a $0.001 budget
from voiceactors.call.call_context import LinkedContext, carried_view
from voiceactors.call.record import CallRecord, read_record, record_path, render_line
from voiceactors.call.state import ToolCallState, ToolOutcome
from voiceactors.call.record_kind import URGENT_KINDS, RecordKind
from voiceactors.call import recovery
from voiceactors.calls_report import report
from voiceactors.cluster import redis_client as rc
from voiceactors.cluster.call_registry import RedisRegistry
from voiceactors.linked_context.references import Reference
from voiceactors.http import history, timeline_svg

PACKAGE = Path(__file__).resolve().parent.parent / "voiceactors"
DANIEL = Reference("entity", "daniel_park", "Daniel Park", entity_type="Person")
SAM = Reference("entity", "sam_okafor", "Sam Okafor", entity_type="Person")
BASE = "You are sol, the journal's voice."


def every_kind_run(*, ended: bool, tool_call_id: str) -> list[tuple[RecordKind, dict]]:
    """One run's lines after its ``start``, every kind once (``ended``: with
    its ``end``; else a run cut by a crash with its tool call pending)."""
    context = carried_view(LinkedContext(BASE, DANIEL))
    started = {"tool_call_id": tool_call_id, "tool": "journal.get_day", "response_id": "resp_1", "epoch": 0,
               "turn": 0, "effect": "read", "arguments": '{"day": "2026-03-26"}'}
    lines: list[tuple[RecordKind, dict]] = [
        (RecordKind.CONTEXT, {"context": context}),
        (RecordKind.CONNECT, {"reconnects": 0}),
        (RecordKind.TRANSCRIPT, {"role": "user", "item_id": "item_u1", "text": "What happened on Thursday?",
                                 "order": 0}),
        (RecordKind.TOOL_STARTED, started),
    ]
    if not ended:
        return lines
    return lines + [
        (RecordKind.TOOL_CALL, {**{k: v for k, v in started.items() if k not in ("effect", "arguments")},
                                "duration_ms": 12.5, "outcome": ToolOutcome.OK, "output_bytes": 40, "sends": 1,
                                "delivered": True, "synthetic": False, "state": ToolCallState.CONFIRMED,
                                "overhead_ms": 0.4}),
        (RecordKind.SELECTION, {"tool_call_id": tool_call_id, "selection": SAM.view(), "link": DANIEL.view()}),
        (RecordKind.HOSTED_TOOL, {"item_id": "mcp_1", "response_id": "resp_1", "server": "weather",
                                  "tool": "forecast", "status": "failed", "error": "http_error"}),
        (RecordKind.RESPONSE, {"response_id": "resp_1", "status": "completed", "epoch": 0, "origin": "model",
                               "tool_calls": [tool_call_id]}),
        (RecordKind.RESPONSE_CREATE, {"event_id": "evt_1", "epoch": 0, "for": ["resp_1"], "result": "sent",
                                      "response_id": "resp_2", "turnaround_ms": 3.0}),
        (RecordKind.TRANSCRIPT, {"role": "assistant", "item_id": "item_a1", "text": "On Thursday you",
                                 "order": 1}),
        (RecordKind.TRANSCRIPT_CUT, {"item_id": "item_a1"}),
        (RecordKind.RESPONSE, {"response_id": "resp_2", "status": "cancelled", "epoch": 0, "origin": "ours",
                               "tool_calls": []}),
        (RecordKind.USAGE, {"response_id": "resp_1", "model": "gpt-realtime", "tokens": {"text_in": 100,
                                                                                       "text_out": 20},
                            "cost_usd": 0.002}),
        (RecordKind.AUDIO_USAGE, {"model": "gpt-live-1", "seconds": 50.0, "added_s": 50.0, "cost_usd": 0.05}),
        (RecordKind.BUDGET, {"budget_usd": 0.001, "cost_usd": 0.002}),
        (RecordKind.IDLE, {"timeouts": 1, "then": "check_in"}),
        (RecordKind.WRAP_UP, {"left_s": 120.0}),
        (RecordKind.PHONE, {"event": "pin_accepted", "tries_left": 3}),
        (RecordKind.TURN, {"turn": 1, "first_audio_ms": 620.0, "answer_ms": 1400.0, "tools_ms": 500.0,
                           "overhead_ms": 2.0, "service_ms": 898.0}),
        (RecordKind.HANDOFF, {"tool_call_id": "call_h", "tool": "handoff.planner", "response_id": "resp_1",
                              "from": "assistant", "to": "planner", "event_id": "evt_update", "status": "updating"}),
        (RecordKind.HEARD, {"response_id": "resp_2", "turn": 1, "heard": [
            {"item_id": "item_a1", "text": "On Thursday you", "audio_end_ms": 900}], "done": [], "not_done": []}),
        (RecordKind.SLOW_ACK, {"response_id": "resp_1", "tool_call_ids": [tool_call_id], "event_id": "evt_ack",
                               "waited_ms": 700.0}),
        (RecordKind.SLOW_PROGRESS, {"response_id": "resp_1", "tool_call_id": tool_call_id, "progress": 1,
                                    "total": 2, "event_id": "evt_progress"}),
        (RecordKind.SLOW_OUTPUT, {"tool_call_id": tool_call_id, "response_id": "resp_1", "waited_ms": 1500.0,
                                  "after_end": False}),
        (RecordKind.SLOW_DELIVERY, {"response_id": "resp_1", "event_id": "evt_1", "since_ack_ms": 1600.0,
                                    "epoch": 0}),
        (RecordKind.RECONNECT, {"attempt": 1, "delay_s": 0.5, "close_code": 1006}),
        (RecordKind.CONNECT, {"reconnects": 1}),
        (RecordKind.USAGE_TOTAL, {"model": "gpt-realtime", "responses": 1, "tokens": {"text_in": 100,
                                                                                      "text_out": 20},
                                  "cost_usd": 0.002, "budget_usd": 0.001}),
        (RecordKind.END, {"reason": "budget_spent", "duration_s": 9.0, "epoch": 0, "reconnects": 1,
                          "tool_calls": 1, "responses": 2, "close_code": 1000, "feed_dropped": 0}),
    ]


async def write_run(state_dir: Path, call_id: str, lines: list[tuple[RecordKind, dict]], *,
                    as_strings: bool = False, **start_fields) -> CallRecord:
    """One run written by a real ``CallRecord`` (``as_strings``: every kind
    and enum value handed over as the bare string, as before the enums)."""
    async with trio.open_nursery() as nursery:
        record = CallRecord(call_id, state_dir, **start_fields)
        await nursery.start(record.run)
        record.opened()
        for t, (kind, fields) in enumerate(lines, start=1):
            if as_strings:
                kind = str(kind.value)
                fields = {k: str(v.value) if isinstance(v, (ToolOutcome, ToolCallState)) else v
                          for k, v in fields.items()}
                assert type(kind) is str
            record.add_fields(kind, fields, t=float(t))
        await record.close()     # writes no line itself: a run without ``end`` reads as one cut by a crash
    return record


# ------------------------------------------------------------------ bytes on disk

def test_a_member_renders_as_its_string_through_orjson_and_the_fallback():
    for kind in RecordKind:
        as_string = {"kind": kind.value, "t": 1.5, "outcome": "ok"}
        as_member = {"kind": kind, "t": 1.5, "outcome": ToolOutcome.OK}
        assert render_line(as_member) == render_line(as_string) == (
            b'{"kind":"%s","t":1.5,"outcome":"ok"}\n' % kind.value.encode())
        # an int past 64 bits: orjson refuses the line, the json encoder writes it
        huge = {"tokens": {"text_in": 2 ** 70}}
        assert render_line({**as_member, **huge}) == render_line({**as_string, **huge})
        assert b"1180591620717411303424" in render_line({**as_member, **huge})


async def test_a_record_written_with_the_members_is_byte_for_byte_the_one_written_with_strings(
        tmp_path, autojump_clock):
    lines = [(k, {**f, "tokens": {"text_in": 2 ** 70}}) if k == RecordKind.USAGE else (k, f)
             for k, f in every_kind_run(ended=True, tool_call_id="call_1")]
    for attempt in range(3):   # the start line's ``at`` is the wall clock's second: both in the same one
        members = await write_run(tmp_path / f"members{attempt}", "rtc_same", lines)
        strings = await write_run(tmp_path / f"strings{attempt}", "rtc_same", lines, as_strings=True)
        if members.lines[0]["at"] == strings.lines[0]["at"]:
            break
    written = members.path.read_bytes()
    assert written == strings.path.read_bytes()
    assert written.count(b"\n") == len(lines) + 1
    assert [line["kind"] for line in read_record(members.path)] == ["start", *(k.value for k, _ in lines)]


# ------------------------------------------------------------------ the writer

CALL = [
    {"user_turn": {"text": "Let's talk about Daniel."}},
    {"response": {"tool_calls": [{"name": "journal.select", "arguments": {"kind": "entity", "id": "daniel"},
                                  "call_id": "call_select"}]}},
    {"wait_outputs": {}},
    {"response": {"items": [{"message": "Daniel Park it is."},
                            {"mcp_call": {"server_label": "weather", "name": "forecast"}}]}},
    {"drop": True},
    {"user_turn": {"text": "And Thursday?"}},
    {"response": {"tool_calls": [{"name": "journal.get_day", "arguments": {"day": "2026-03-26"},
                                  "call_id": "call_day"}]}},
    {"wait_outputs": {}},
    {"response": {"text": "On Thursday ..."}},
    {"sleep": 0.5},
    {"close": 1000},
]


async def test_every_line_a_call_writes_is_a_record_kind(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        await r.run_call("rtc_kinds", steady(CALL), context=LinkedContext(BASE, None))
        rich = r.record("rtc_kinds")
    async with rig(tmp_path, call_budget_usd=0.001) as r:
        await r.run_call("rtc_budget", steady(BUDGET_CALL))
        budget = r.record("rtc_budget")
    written = [line["kind"] for line in rich + budget]
    assert all(kind in set(RecordKind) for kind in written), set(written) - set(RecordKind)
    # every kind but a cut transcript (a barge-in's timing: test_transcript_order.py), the
    # service's idle timeout (a silent user: test_call_idle.py), the time limit's wrap-up (a
    # long call: test_call_time_limit.py), a phone call's PIN and transfer (a phone call:
    # test_phone_pin.py), a slow tool call's lines and a cut reply's heard line
    # (test_call_slow_tools.py), a handoff between agents (test_call_handoff.py) and a Live call's
    # audio usage (test_live_route.py) came up
    assert set(RecordKind) - set(written) == {RecordKind.TRANSCRIPT_CUT, RecordKind.IDLE, RecordKind.WRAP_UP,
                                              RecordKind.PHONE, RecordKind.HEARD, RecordKind.SLOW_PROGRESS,
                                              RecordKind.SLOW_ACK, RecordKind.SLOW_OUTPUT,
                                              RecordKind.SLOW_DELIVERY, RecordKind.HANDOFF, RecordKind.AUDIO_USAGE}


def literal_record_kinds() -> list[tuple[str, int, str]]:
    """Every string literal handed as a record line's kind anywhere in the
    package: to ``RecordLine``, ``_record``, ``record_line``,
    ``_record_fields`` or a record's ``add``/``add_fields``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            if name in ("RecordLine", "_record", "record_line", "_record_fields") or (
                    name in ("add", "add_fields") and receiver.endswith("record")):
                found.append((str(path.relative_to(PACKAGE)), node.lineno, node.args[0].value))
    return found


def test_every_literal_kind_handed_to_a_record_is_a_member():
    unknown = [(where, line, kind) for where, line, kind in literal_record_kinds() if kind not in set(RecordKind)]
    assert unknown == []


def test_the_urgent_kinds_are_members_and_match_their_strings():
    assert URGENT_KINDS == {RecordKind.START, RecordKind.TOOL_STARTED, RecordKind.TOOL_CALL, RecordKind.HANDOFF,
                            RecordKind.END}
    assert {"start", "tool_started", "tool_call", "handoff", "end"} == URGENT_KINDS   # a line read back is a str
    assert all(type(kind) is RecordKind for kind in URGENT_KINDS)


# ------------------------------------------------------------------ the readers

async def test_every_reader_reads_a_record_holding_every_kind(tmp_path, autojump_clock):
    state = tmp_path / "state"
    first = every_kind_run(ended=True, tool_call_id="call_1")
    await write_run(state, "rtc_every", first)
    second = every_kind_run(ended=False, tool_call_id="call_2")
    second.append((RecordKind.SELECTION, {"tool_call_id": "call_x", "selection": SAM.view(),
                                          "link": DANIEL.view()}))
    second.append((RecordKind.HANDOFF, {"tool_call_id": "call_h2", "tool": "handoff.planner", "response_id": "resp_3",
                                        "from": "assistant", "to": "planner", "event_id": "evt_u",
                                        "status": "updating"}))
    await write_run(state, "rtc_every", second, write_now=True, rejoined=True, recovered=[])
    lines = read_record(record_path(state, "rtc_every"))
    assert {line["kind"] for line in lines} == set(RecordKind)

    # recovery: the last run (no end) has its read pending and its context with the later selection
    block = recovery.last_block(lines)
    assert block[0]["kind"] == "start" and block[0]["rejoined"] is True
    [pending] = recovery.pending_calls(block)
    assert (pending.tool_call_id, pending.effect, pending.arguments) == (
        "call_2", "read", '{"day": "2026-03-26"}')
    assert recovery.pending_calls(lines[:len(first) + 1]) is None              # the first run ended
    carried = recovery.carried_context(block)
    assert carried is not None and carried.base_instruction == BASE and carried.selection == SAM
    assert carried.carried_agent == "planner"                                  # the handoff line's target
    [crashed] = recovery.find_crashed(state, max_age_s=3600, limit=10)
    assert crashed.call_id == "rtc_every" and [p.tool_call_id for p in crashed.pending] == ["call_2"]

    # history: two runs, one reconnect, a settled and a pending tool call, the usage, the cut reply
    summary = history.summarize("rtc_every", lines)
    assert {k: summary[k] for k in ("runs", "reconnects", "responses", "barge_ins", "tool_calls",
                                    "tool_failures", "ended", "duration_s", "first_words", "total_tokens",
                                    "cost_usd", "audio_s")} == {
        "runs": 2, "reconnects": 1, "responses": 2, "barge_ins": 1, "tool_calls": 2, "tool_failures": 0,
        "ended": None, "duration_s": 9.0 + len(second), "first_words": "What happened on Thursday?",
        "total_tokens": 120, "cost_usd": 0.052, "audio_s": 50.0}
    assert summary["agent"] == "planner"
    rows = history.settled_and_pending_tool_calls(lines)
    assert [(row["kind"], row["tool_call_id"], row["outcome"]) for row in rows] == [
        ("tool_call", "call_1", "ok"), ("tool_call", "call_2", "pending")]
    spoken = history.spoken_transcript(lines)
    assert [(e["role"], e["text"], e["cut_short"]) for e in spoken] == [
        ("user", "What happened on Thursday?", False), ("assistant", "On Thursday you", True),
        ("user", "What happened on Thursday?", False)]
    detail = history.call_detail(state, "rtc_every")
    assert detail["lines"] == lines and len(detail["usage"]) == 1
    assert [(h["server"], h["tool"], h["status"], h["error"]) for h in detail["hosted_tools"]] == [
        ("weather", "forecast", "failed", "http_error")]
    assert summary["tool_calls"] == 2          # the hosted one is not among ours
    assert json.loads(json.dumps(detail)) == detail            # the API's answer: plain JSON

    # the calls report: the same summary, on the terminal and as JSON
    out = io.StringIO()
    report(state, 10, True, out)
    [call] = json.loads(out.getvalue())["calls"]
    assert call["call_id"] == "rtc_every" and call["reconnects"] == 1 and call["runs"] == 2
    assert call["turns"] == {"count": 1, "median_ms": 620.0, "worst_ms": 620.0}

    # the timeline: the settled and the pending tool call, the reconnect, the second run, no end
    svg = timeline_svg.render(lines)
    assert "reconnect 1" in svg and "new run" in svg and "end: budget_spent" in svg
    assert "no end recorded" in svg
    assert "journal.get_day" in svg and "pending · " in svg and "ok · " in svg
    assert "weather · forecast" in svg and "hosted · failed" in svg
    assert "slow tools" in svg and "acknowledged after 700 ms" in svg and "waited 1500 ms" in svg
    assert "answer spoken · 1600 ms after the acknowledgement" in svg and "progress spoken · 1 of 2" in svg
    assert "turn 1 · first sound after 620 ms · the answer after a tool after 1400 ms" in svg
    assert ">agents</text>" in svg and "agent planner in charge" in svg


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
async def test_the_cluster_mirror_keeps_the_tool_and_selection_lines_of_every_kind(redis_server):
    """The lines as the actor hands them to the registry (``on_record``: the
    kind a member): only the tool lines and the selection reach the mirror,
    the pending read as the JSON its string line gave, the context with the
    last selection, for a taker."""
    holder = RedisRegistry(redis_server.url, 5.0, node="holder")
    taker = RedisRegistry(redis_server.url, 5.0, node="taker")
    call_id = "rtc_every"
    async with trio.open_nursery() as nursery, rc.client(redis_server.url) as redis:
        await nursery.start(holder.run)
        await nursery.start(taker.run)
        assert await holder.acquire(call_id) is not None
        holder.note_context(call_id, LinkedContext(BASE, DANIEL))
        for kind, fields in every_kind_run(ended=True, tool_call_id="call_1")[:-1]:   # not the end
            holder.note_record(call_id, {"kind": kind, **fields})
        started = dict(every_kind_run(ended=False, tool_call_id="call_2"))[RecordKind.TOOL_STARTED]
        holder.note_record(call_id, {"kind": RecordKind.TOOL_STARTED, **started})
        # the handoff's call rides too, with the output a taker answers it with (its update went)
        with trio.fail_after(5):
            while set(pending := await redis.hgetall(rc.pending_key(call_id))) != {rc.CONTEXT_FIELD, "call_2",
                                                                                   "call_h"}:
                await trio.sleep(0.01)
        assert pending["call_2"] == json.dumps({"kind": "tool_started", **started})
        carried = await taker.carried(call_id)
        assert sorted(p.tool_call_id for p in carried.pending) == ["call_2", "call_h"]
        assert [p.output for p in carried.pending if p.tool_call_id == "call_h"] == [
            json.dumps({"handed_to": "planner", "from": "assistant"})]
        assert carried.context == LinkedContext(BASE, DANIEL, selection=SAM, taken_over=True,
                                                carried_agent="planner")
        nursery.cancel_scope.cancel()
