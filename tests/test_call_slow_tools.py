"""Slow tool calls over the simulator (docs/calls.md § Slow tools): a call
still unanswered ``tool_ack_after_s`` after its response ended is
acknowledged once, the conversation goes on, and its answer is spoken once
at the next quiet moment. Each test also checks the invariants: every tool
call answered exactly once, never a ``response.create`` while a response is
active (no error from the service), every write applied once. The rules
alone: tests/test_call_protocol.py (slow tools)."""

from __future__ import annotations

import json

import trio

from calls_support import Gate, assert_clean_protocol, gated_registry, rig, steady
from voiceactors.call.protocol import TOOL_ACK, progress_response
from voiceactors.http.timeline_svg import render

ACK_S = 0.7


def _acks(sc) -> list[dict]:
    return [e for e in sc.received if e["type"] == "response.create"
            and e.get("response", {}).get("instructions") == TOOL_ACK["instructions"]]


def _plain_creates(sc) -> list[dict]:
    return [e for e in sc.received if e["type"] == "response.create" and "instructions" not in e.get("response", {})]


def _kinds(record: list[dict], kind: str) -> list[dict]:
    return [x for x in record if x["kind"] == kind]


async def _release_when(sc, gate: Gate, ready, after_s: float = 0.0) -> None:
    """Let the gated tool answer once ``ready(sc)`` holds (and ``after_s`` more)."""
    await sc.wait_until(ready)
    await trio.sleep(after_s)
    gate.release.set()


def _ack_heard(sc) -> bool:
    """The acknowledgement's response has ended."""
    return bool(_acks(sc)) and any(r.origin == "default" and r.status != "in_progress" for r in sc.responses)


SLOW_READ = [
    {"async_tools": True},
    {"user_turn": {"text": "When did I last see the dentist?"}},
    {"response": {"tool_calls": [{"name": "journal.search", "arguments": {"query": "dentist"}}]}},
    {"wait_outputs": {}},
    {"response": {"text": "You saw the dentist on Tuesday."}},
    {"sleep": 1},
    {"close": 1000},
]


async def test_a_slow_read_is_acknowledged_once_then_spoken_once(tmp_path, autojump_clock):
    gate = Gate()
    async with rig(tmp_path, registry=gated_registry("journal.search", gate), tool_ack_after_s=ACK_S) as r:
        r.nursery.start_soon(_release_when, r.sim.add_call("rtc_slow", steady(SLOW_READ)), gate, _ack_heard, 3.0)
        actor, sc = await r.run_call("rtc_slow")
        record = r.record("rtc_slow")
    assert_clean_protocol(sc, creates=2)          # one acknowledgement, one delivery
    [ack] = _acks(sc)
    assert ack["response"]["tool_choice"] == "none"
    [delivery] = _plain_creates(sc)
    assert sc.received.index(ack) < sc.received.index(delivery)
    assert [(x.origin, x.status) for x in sc.responses] == [
        ("scenario", "completed"), ("default", "completed"), ("client", "completed")]
    [call_id] = sc.tool_calls
    assert json.loads(sc.outputs[call_id][0]) == {"ok": True}
    [acked] = _kinds(record, "slow_ack")
    assert acked["tool_call_ids"] == [call_id] and acked["waited_ms"] == ACK_S * 1000
    [waited] = _kinds(record, "slow_output")
    assert waited["tool_call_id"] == call_id and waited["waited_ms"] >= 3000
    [spoken] = _kinds(record, "slow_delivery")
    assert spoken["event_id"] == delivery["event_id"]
    assert acked["t"] < waited["t"] <= spoken["t"]
    svg = render(record)             # the timeline's row: acknowledged, the wait, spoken
    assert "slow tools" in svg and "acknowledged after 700 ms" in svg and "answer spoken" in svg


async def test_an_acknowledgement_after_a_barged_in_turn_is_no_follow_up_of_that_turn(tmp_path, autojump_clock):
    """Found by the soak with acknowledgements at once: turn 1's read, cut by
    a barge-in, is answered with no response.create after it; turn 2's slow
    read is acknowledged. The simulator took that acknowledgement for a
    follow-up of turn 1's output (its rule 4) and called it a violation."""
    scenario = [
        {"async_tools": True},
        {"user_turn": {"text": "Find the launch notes."}},
        {"response": {"text": "Let me look.", "hold_s": 0.3,
                      "tool_calls": [{"name": "journal.search", "arguments": {"query": "launch"}}]}},
        {"barge_in": {"after_ms": 50, "text": "never mind"}},
        {"response": {"text": "Sure."}},
        {"wait_outputs": {"response_create": False}},
        {"user_turn": {"text": "What is on today?"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Your standup, at half past nine."}},
        {"sleep": 1},
        {"close": 1000},
    ]
    gate = Gate()
    async with rig(tmp_path, registry=gated_registry("calendar.today", gate), tool_ack_after_s=ACK_S) as r:
        r.nursery.start_soon(_release_when, r.sim.add_call("rtc_after_barge", steady(scenario)), gate, _ack_heard, 1.0)
        actor, sc = await r.run_call("rtc_after_barge")
        record = r.record("rtc_after_barge")
    assert_clean_protocol(sc, creates=2)          # the acknowledgement of turn 2's read, its delivery
    cut, slow = sc.tool_calls
    assert [line["tool_call_ids"] for line in _kinds(record, "slow_ack")] == [[slow]]
    assert cut in sc.outputs and json.loads(sc.outputs[slow][0]) == {"ok": True}


async def test_a_second_question_is_answered_while_the_first_tool_still_runs(tmp_path, autojump_clock):
    scenario = [
        {"async_tools": True},
        {"user_turn": {"text": "When did I last see the dentist?"}},
        {"response": {"tool_calls": [{"name": "journal.search", "arguments": {"query": "dentist"}}]}},
        {"sleep": 2},
        {"user_turn": {"text": "And what time is it?"}},
        {"response": {"text": "It is ten past nine."}},
        {"wait_outputs": {}},
        {"response": {"text": "And the dentist was on Tuesday."}},
        {"sleep": 1},
        {"close": 1000},
    ]
    gate = Gate()

    def second_answered(sc) -> bool:
        return sum(1 for x in sc.responses if x.status == "completed") >= 3

    async with rig(tmp_path, registry=gated_registry("journal.search", gate), tool_ack_after_s=ACK_S) as r:
        r.nursery.start_soon(_release_when, r.sim.add_call("rtc_two", steady(scenario)), gate, second_answered, 1.0)
        actor, sc = await r.run_call("rtc_two")
        record = r.record("rtc_two")
    assert_clean_protocol(sc, creates=2)          # the acknowledgement, then the delivery
    [search] = sc.tool_calls
    assert json.loads(sc.outputs[search][0]) == {"ok": True}   # kept through the second turn, not cancelled
    assert [(x.origin, x.status) for x in sc.responses] == [
        ("scenario", "completed"), ("default", "completed"), ("scenario", "completed"), ("client", "completed")]
    assert sc.violations == []
    [spoken] = _kinds(record, "slow_delivery")
    assert spoken["response_id"] == sc.tool_calls[search].response_id
    assert actor.calls[search].epoch < actor.epoch


def _completed(n: int):
    def ready(sc) -> bool:
        return sum(1 for x in sc.responses if x.status == "completed") >= n
    return ready


async def _slow_call(tmp_path, call_id: str, scenario: list, ready, after_s: float = 1.0):
    gate = Gate()
    async with rig(tmp_path, registry=gated_registry("journal.search", gate), tool_ack_after_s=ACK_S) as r:
        r.nursery.start_soon(_release_when, r.sim.add_call(call_id, steady(scenario)), gate, ready, after_s)
        actor, sc = await r.run_call(call_id)
        record = r.record(call_id)
    return actor, sc, record


ASKED = [
    {"async_tools": True},
    {"user_turn": {"text": "When did I last see the dentist?"}},
    {"response": {"tool_calls": [{"name": "journal.search", "arguments": {"query": "dentist"}}]}},
]


async def test_a_barge_in_during_the_acknowledgement_keeps_the_read_and_its_answer_is_spoken(tmp_path, autojump_clock):
    scenario = ASKED + [
        {"wait_create": {}},
        {"response": {"text": "One moment, I am looking that up for you.", "hold_s": 5}},
        {"barge_in": {"after_ms": 500, "text": "And what time is it?"}},
        {"response": {"text": "It is ten past nine."}},
        {"wait_outputs": {}},
        {"response": {"text": "And the dentist was on Tuesday."}},
        {"sleep": 1},
        {"close": 1000},
    ]
    actor, sc, record = await _slow_call(tmp_path, "rtc_cut_ack", scenario, _completed(2))
    assert_clean_protocol(sc, creates=2)
    [search] = sc.tool_calls
    assert json.loads(sc.outputs[search][0]) == {"ok": True}
    assert [(x.origin, x.status) for x in sc.responses] == [
        ("scenario", "completed"), ("client", "cancelled"), ("scenario", "completed"), ("client", "completed")]
    assert len(_acks(sc)) == 1 and len(_kinds(record, "slow_delivery")) == 1


async def test_a_barge_in_during_the_wait_keeps_the_read_and_its_answer_is_spoken(tmp_path, autojump_clock):
    scenario = ASKED + [
        {"sleep": 3},
        {"barge_in": {"text": "Oh, and what time is it?"}},
        {"response": {"text": "It is ten past nine."}},
        {"wait_outputs": {}},
        {"response": {"text": "And the dentist was on Tuesday."}},
        {"sleep": 1},
        {"close": 1000},
    ]
    actor, sc, record = await _slow_call(tmp_path, "rtc_cut_wait", scenario, _completed(3))
    assert_clean_protocol(sc, creates=2)
    [search] = sc.tool_calls
    assert json.loads(sc.outputs[search][0]) == {"ok": True}
    assert [(x.origin, x.status) for x in sc.responses] == [
        ("scenario", "completed"), ("default", "completed"), ("scenario", "completed"), ("client", "completed")]
    [spoken] = _kinds(record, "slow_delivery")
    assert spoken["t"] > _kinds(record, "slow_output")[0]["t"] - 1e-9


async def test_a_write_in_the_next_turn_runs_and_is_answered_while_the_slow_read_waits(tmp_path, autojump_clock):
    scenario = ASKED + [
        {"sleep": 3},
        {"barge_in": {"text": "And mark the dentist follow-up done."}},
        {"response": {"tool_calls": [{"name": "commitments.complete",
                                      "arguments": {"commitment_id": "lg_dentist", "resolution": "done"}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "And the dentist was on Tuesday."}},
        {"sleep": 1},
        {"close": 1000},
    ]
    search, write = Gate(), Gate({"ok": True, "written": 1})
    write.release.set()                      # the write answers at once
    specs = [s for s in gated_registry("journal.search", search).values() if s.name != "commitments.complete"]
    specs.append(gated_registry("commitments.complete", write, effect="write")["commitments.complete"])
    registry = {s.name: s for s in specs}
    async with rig(tmp_path, registry=registry, tool_ack_after_s=ACK_S) as r:
        r.nursery.start_soon(_release_when, r.sim.add_call("rtc_write_meanwhile", steady(scenario)), search,
                             _completed(4), 1.0)
        actor, sc = await r.run_call("rtc_write_meanwhile")
        record = r.record("rtc_write_meanwhile")
    assert_clean_protocol(sc, creates=3)     # the acknowledgement, the write's follow-up, the read's delivery
    assert write.calls == 1                  # applied once, never acknowledged (a write answers first)
    read_id, write_id = sc.tool_calls
    assert json.loads(sc.outputs[write_id][0]) == {"ok": True, "written": 1}
    assert json.loads(sc.outputs[read_id][0]) == {"ok": True}
    assert [line["tool_call_ids"] for line in _kinds(record, "slow_ack")] == [[read_id]]
    assert [(x.origin, x.status) for x in sc.responses] == [
        ("scenario", "completed"), ("default", "completed"), ("scenario", "completed"), ("default", "completed"),
        ("client", "completed")]


async def test_a_barge_in_during_the_delivery_is_not_followed_by_a_second_delivery(tmp_path, autojump_clock):
    scenario = ASKED + [
        {"wait_outputs": {}},
        {"response": {"text": "The dentist was on Tuesday, at ten in the morning, with", "hold_s": 5}},
        {"barge_in": {"after_ms": 500, "text": "Thanks, that is enough."}},
        {"response": {"text": "Sure."}},
        {"sleep": 5},
        {"close": 1000},
    ]
    actor, sc, record = await _slow_call(tmp_path, "rtc_cut_delivery", scenario, _ack_heard, 2.0)
    assert_clean_protocol(sc, creates=2)
    assert [(x.origin, x.status) for x in sc.responses] == [
        ("scenario", "completed"), ("default", "completed"), ("client", "cancelled"), ("scenario", "completed")]
    assert len(_kinds(record, "slow_delivery")) == 1


# ------------------------------------------------------- interrupted, truthful

def _system_items(sc) -> list[str]:
    return [e["item"]["content"][0]["text"] for e in sc.received if e["type"] == "conversation.item.create"
            and e["item"].get("type") == "message" and e["item"].get("role") == "system"]


async def test_a_write_cut_off_mid_report_is_followed_by_one_truthful_item(tmp_path, autojump_clock):
    scenario = steady([
        {"user_turn": {"text": "Mark the dentist follow-up done."}},
        {"response": {"tool_calls": [{"name": "commitments.complete",
                                      "arguments": {"commitment_id": "lg_dentist", "resolution": "done"}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Done, I marked the dentist follow-up as", "hold_s": 5}},
        {"barge_in": {"after_ms": 300, "text": "Wait, did that work?"}},
        {"response": {"text": "Yes, it is marked done."}},
        {"sleep": 1},
        {"close": 1000},
    ])
    gate = Gate({"ok": True, "written": 1})
    gate.release.set()                       # the write answers at once
    async with rig(tmp_path, registry=gated_registry("commitments.complete", gate, effect="write"),
                   tool_ack_after_s=ACK_S) as r:
        actor, sc = await r.run_call("rtc_truth", scenario)
        record = r.record("rtc_truth")
    assert_clean_protocol(sc, creates=1)
    assert gate.calls == 1                   # applied once
    [write] = sc.tool_calls
    [report] = sc.responses[1:2]
    assert (report.origin, report.status) == ("client", "cancelled")
    [item] = _system_items(sc)
    assert item.startswith("The user interrupted your reply") and "Done: commitments.complete" in item
    assert "lg_dentist" in item and "Not done: none." in item
    kinds = [e["type"] for e in sc.received]
    assert kinds.index("conversation.item.create", kinds.index("response.create")) < len(kinds)
    [heard] = _kinds(record, "heard")
    assert heard["response_id"] == report.id and heard["done"] == [write] and heard["not_done"] == []
    [said] = heard["heard"]
    assert said["text"] == "Done, I marked the dentist follow-up as"
    assert _acks(sc) == []                   # a write is never acknowledged


# ------------------------------------------------------------------ bounds

async def test_at_most_tool_slow_max_calls_are_acknowledged_at_once(tmp_path, autojump_clock):
    scenario = ASKED + [
        {"sleep": 2},
        {"user_turn": {"text": "And who is Daniel?"}},
        {"response": {"tool_calls": [{"name": "entities.get", "arguments": {"entity_slug": "daniel"}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Daniel Park is a friend of yours."}},
        {"sleep": 1},
        {"close": 1000},
    ]
    search, person = Gate(), Gate()
    specs = [s for s in gated_registry("journal.search", search).values() if s.name != "entities.get"]
    specs.append(gated_registry("entities.get", person)["entities.get"])
    registry = {s.name: s for s in specs}

    async def release_in_turn(sc) -> None:
        await _release_when(sc, search, _completed(3), 2.0)     # the second read is past its ack time by then
        await _release_when(sc, person, _completed(5), 1.0)

    async with rig(tmp_path, registry=registry, tool_ack_after_s=ACK_S, tool_slow_max=1) as r:
        r.nursery.start_soon(release_in_turn, r.sim.add_call("rtc_bound", steady(scenario)))
        actor, sc = await r.run_call("rtc_bound")
        record = r.record("rtc_bound")
    assert_clean_protocol(sc, creates=4)
    acked = _kinds(record, "slow_ack")
    first, second = sc.tool_calls
    assert [line["tool_call_ids"] for line in acked] == [[first], [second]]
    # the second was acknowledged only once the first had answered
    [first_done] = [x for x in _kinds(record, "slow_output") if x["tool_call_id"] == first]
    assert acked[1]["t"] >= first_done["t"] and acked[1]["waited_ms"] >= 2000
    assert len(_kinds(record, "slow_delivery")) == 2


async def test_a_result_after_the_call_ended_is_recorded_not_spoken(tmp_path, autojump_clock):
    scenario = ASKED + [{"wait_create": {}}, {"sleep": 2}, {"close": 1000}]
    gate = Gate()
    async with rig(tmp_path, registry=gated_registry("journal.search", gate), tool_ack_after_s=ACK_S) as r:
        try:
            actor, sc = await r.run_call("rtc_after", steady(scenario))
        finally:
            gate.release.set()
        record = r.record("rtc_after")
    assert actor.end_reason == "closed_by_service"
    assert sc.response_creates == 1 and len(_acks(sc)) == 1 and sc.error_codes == []
    assert sc.outputs == {}                                   # the service had ended the call
    [call_id] = sc.tool_calls
    [line] = _kinds(record, "slow_output")
    assert line["tool_call_id"] == call_id and line["after_end"] is True
    [settled] = [x for x in _kinds(record, "tool_call") if x["tool_call_id"] == call_id]
    assert settled["delivered"] is False and _kinds(record, "slow_delivery") == []


# ---------------------------------------------------------------- progress

async def test_an_mcp_sources_progress_is_shown_and_one_progress_line_is_spoken(tmp_path, autojump_clock):
    from mcp_support import McpTestServer, ToolDef, mcp_rig, text_result

    async def crawl(args: dict, ctx) -> object:
        for step in range(1, 4):
            await ctx.session.send_progress_notification(ctx.meta["progress_token"], step, 4, f"page {step} of 4",
                                                         related_request_id=ctx.request_id)
            await trio.sleep(2.0)      # notes at 0, 2 and 4 s: none at the 5 s threshold itself
        return text_result("four pages read")

    autojump_clock.autojump_threshold = 0.1     # loopback answers take real milliseconds (test_mcp_hostile.py)
    server = McpTestServer([ToolDef("crawl", crawl, with_context=True)], event_stream=True)   # a stream: room for notifications
    scenario = steady([
        {"async_tools": True},
        {"user_turn": {"text": "Read the site for me."}},
        {"response": {"tool_calls": [{"name": "crm.crawl", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "It has four pages."}},
        {"sleep": 1},
        {"close": 1000},
    ])
    async with mcp_rig(tmp_path, {"crm": server}, tool_ack_after_s=ACK_S, tool_progress_after_s=5.0) as (r, _):
        feed = r.hub.open("rtc_progress")
        events = feed.subscribe()
        actor, sc = await r.run_call("rtc_progress", scenario, feed=feed)
        record = r.record("rtc_progress")
    assert_clean_protocol(sc, creates=3)          # the acknowledgement, one progress line, the answer
    [call_id] = sc.tool_calls
    assert "four pages read" in sc.outputs[call_id][0]
    creates = [e for e in sc.received if e["type"] == "response.create"]
    assert creates[0]["response"] == TOOL_ACK
    assert creates[1]["response"] == progress_response(3, 4)   # the latest at 5 s: page 3 of 4
    assert "page" not in creates[1]["response"]["instructions"]
    [spoken] = _kinds(record, "slow_progress")
    assert (spoken["progress"], spoken["total"]) == (3, 4)
    shown = []
    while True:
        try:
            event = events.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        if event["type"] == "tool.progress":
            shown.append((event["progress"], event["total"], event["message"]))
    assert shown == [(1, 4, "page 1 of 4"), (2, 4, "page 2 of 4"), (3, 4, "page 3 of 4")]


# ------------------------------------------------- the simulator's slow tool source

async def test_the_simulators_tool_source_makes_a_tool_slow_and_streams_its_progress(tmp_path, autojump_clock):
    from mcp_support import mcp_rig
    from voiceactors.simulator.tool_source import SlowTool, ToolSource

    # the clock jumps only after 0.5 s of real idleness: the quick call's loopback round trip must
    # not be taken for a slow one under load (its acknowledgement is due 0.7 s on)
    autojump_clock.autojump_threshold = 0.5
    source = ToolSource([SlowTool("lookup", text="found it")])
    scenario = steady([
        {"async_tools": True},
        {"user_turn": {"text": "Look it up, quickly."}},
        {"response": {"tool_calls": [{"name": "sim.lookup", "arguments": {}}]}},     # quick: answered in time
        {"wait_outputs": {}},
        {"response": {"text": "Found it."}},
        {"slow_tool": {"name": "lookup", "run_s": 9, "progress_every_s": 3}},
        {"user_turn": {"text": "Now look it up properly."}},
        {"response": {"tool_calls": [{"name": "sim.lookup", "arguments": {"deep": True}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Found it, properly."}},
        {"sleep": 1},
        {"close": 1000},
    ])
    async with mcp_rig(tmp_path, {"sim": source}, env={"SIM_TOKEN": source.token}, tool_ack_after_s=ACK_S,
                       tool_progress_after_s=5.0) as (r, _):
        r.sim.tool_source = source
        r.sim.add_call("rtc_sim_source", scenario)
        actor, sc = await r.run_call("rtc_sim_source")
        record = r.record("rtc_sim_source")
    assert_clean_protocol(sc, creates=4)          # the first answer; then acknowledged, progress, the answer
    quick, slow = sc.tool_calls
    assert [line["tool_call_ids"] for line in _kinds(record, "slow_ack")] == [[slow]]
    assert source.calls == [("lookup", {}), ("lookup", {"deep": True})]
    assert source.progress_sent == [("lookup", 1.0, 3.0), ("lookup", 2.0, 3.0)]
    [spoken] = _kinds(record, "slow_progress")
    assert (spoken["tool_call_id"], spoken["progress"], spoken["total"]) == (slow, 1.0, 3.0)
    assert "found it" in sc.outputs[slow][0]
