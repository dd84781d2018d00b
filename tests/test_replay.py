"""``voiceactors replay``: the captured calls under tests/replays/ (made by the
tool itself: ``voiceactors replay tests/replays/NAME.jsonl --capture SCENARIO
--journal J --today 2026-03-27 --update`` with J the journal below) replay
against this server with nothing different; a changed tool output is found
and named. Real time (no autojump clock): the replay's gates wait for our
tool threads."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import trio
import trio_websocket

from voiceactors import replay
from voiceactors.cli import build_parser
from voiceactors.journal.sample import write_sample_journal
from voiceactors.realtime import events as rt
from voiceactors.simulator import Simulator
from voiceactors.simulator.capture_player import ReplayDriver, ReplayScript

REPLAYS = Path(__file__).parent / "replays"
DAY = dt.date(2026, 3, 27)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """The journal the captures were made on: reproducible from its seed."""
    return write_sample_journal(tmp_path / "journal", days=3, today=DAY, seed=0)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The command's exit code and what it printed (stdout; for exit 2 its stderr line)."""
    code = replay.run(build_parser().parse_args(["replay", *argv]))
    captured = capsys.readouterr()
    if code == 2:
        return code, captured.err.splitlines()[-1]
    return code, captured.out


@pytest.mark.parametrize("name", ["parallel_batch", "barge_in", "drop", "preambles", "write", "handoff", "slow_tools"])
def test_a_captured_call_replays_with_nothing_different(name, journal, capsys):
    expected = json.loads((REPLAYS / f"{name}.expected.json").read_text())["sent"]
    assert expected["outputs"] and expected["stalls"] == [] and expected["protocol_errors"] == []
    code, out = run(capsys, str(REPLAYS / f"{name}.jsonl"), "--journal", str(journal), "--speed", "4", "--timeout", "60")
    assert code == 0, out
    assert f"OK — {name}.jsonl: what we sent matches the recording" in out


def test_a_changed_tool_output_is_found_and_named(journal, capsys):
    activities = journal / "facets" / "work" / "activities" / "20260327.jsonl"
    text = activities.read_text()
    assert "Standup with the billing team" in text
    activities.write_text(text.replace("Standup with the billing team", "Standup with the payments team"))
    code, out = run(capsys, str(REPLAYS / "parallel_batch.jsonl"), "--journal", str(journal), "--speed", "4", "--timeout", "60")
    assert code == 1, out
    (calendar_id,) = [cid for cid, o in json.loads((REPLAYS / "parallel_batch.expected.json").read_text())
                      ["sent"]["outputs"].items() if o["tool"] == "calendar.today"]
    assert f"output for tool call {calendar_id} (calendar.today) differs" in out
    assert "payments team" in out and "billing team" in out
    # only that output: the other two tools and the response.create still match
    assert out.count("\n- ") == 1, out


def test_the_tool_captures_a_scenario_and_holds_the_server_to_it(tmp_path, journal, capsys):
    scenario = tmp_path / "quick.json"
    scenario.write_text(json.dumps({"steps": [
        {"user_turn": {"text": "What's on today?", "duration_ms": 100}},
        {"response": {"tool_calls": [{"name": "calendar.today"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "A quiet day."}},
        {"close": 1000},
    ]}))
    capture = tmp_path / "quick.jsonl"
    code, out = run(capsys, str(capture), "--capture", str(scenario), "--journal", str(journal),
                    "--today", "2026-03-27", "--update")
    assert code == 0, out
    expectation = json.loads((tmp_path / "quick.expected.json").read_text())
    assert expectation["today"] == "2026-03-27"
    (only,) = expectation["sent"]["outputs"].values()
    assert only["tool"] == "calendar.today" and "2026-03-27" in only["outputs"][0]
    assert len(expectation["sent"]["response_creates"]) == 1
    code, out = run(capsys, str(capture), "--journal", str(journal))
    assert code == 0, out
    # an update keeps the expectation's day (the tools' outputs depend on it)
    code, out = run(capsys, str(capture), "--journal", str(journal), "--update")
    assert code == 0 and json.loads((tmp_path / "quick.expected.json").read_text())["today"] == "2026-03-27"
    # an expectation edited by hand is held against the server too
    expectation["sent"]["response_creates"] = []
    (tmp_path / "quick.expected.json").write_text(json.dumps(expectation))
    code, out = run(capsys, str(capture), "--journal", str(journal))
    assert code == 1 and "response creates: recorded [], sent [{\"answered_by\"" in out, out


def test_conditions_that_cannot_be_met_are_a_usage_error(tmp_path, journal, capsys):
    capture = tmp_path / "slow.jsonl"
    capture.write_bytes((REPLAYS / "slow_tools.jsonl").read_bytes())
    expected = json.loads((REPLAYS / "slow_tools.expected.json").read_text())
    expected["conditions"]["settings"]["tool_timeout_read_s"] = 0.1      # not a setting conditions may set
    (tmp_path / "slow.expected.json").write_text(json.dumps(expected))
    code, line = run(capsys, str(capture), "--journal", str(journal))
    assert code == 2 and "settings: numbers for tool_ack_after_s" in line, line
    del expected["conditions"]["settings"]["tool_timeout_read_s"]
    expected["conditions"]["tool_source"]["tools"][0]["run_s"] = "three seconds"
    (tmp_path / "slow.expected.json").write_text(json.dumps(expected))
    code, line = run(capsys, str(capture), "--journal", str(journal))
    assert code == 2 and "tool_source: a name and at least one tool" in line, line


def test_no_expectation_or_no_capture_is_a_usage_error(tmp_path, capsys):
    capture = tmp_path / "none.jsonl"
    code, out = run(capsys, str(capture))       # a missing capture is said first, not its expectation
    assert code == 2 and f"no capture at {capture}" in out and "--update" not in out
    capture.write_text("")
    code, out = run(capsys, str(capture))
    assert code == 2 and "no expectation" in out and "--update" in out
    capture.write_text('{"kind": "event", "t": 0}\n')
    code, out = run(capsys, str(capture), "--update", "--journal", str(tmp_path))
    assert code == 2 and "not an event capture" in out


def _block(*events: dict) -> list[dict]:
    lines: list[dict] = [{"kind": "capture", "version": 1, "call_id": "rtc_x"}, {"kind": "connect", "t": 0.0}]
    lines += [{"kind": "event", "t": 0.1 * i, "event": e} for i, e in enumerate(events)]
    return lines


def test_a_response_after_our_outputs_waits_for_our_create_one_after_a_user_turn_does_not():
    echo = {"type": "conversation.item.added", "item": {"id": "o1", "type": "function_call_output", "call_id": "c1"}}
    ours = {"type": "response.created", "response": {"id": "r2"}}
    user = {"type": "input_audio_buffer.committed", "item_id": "u2"}
    model = {"type": "response.created", "response": {"id": "r3"}}
    # a second response with no turn between: ours (a slow tool's acknowledgement, then its progress line)
    progress = {"type": "response.created", "response": {"id": "r4"}}
    refusal = {"type": "error", "error": {"code": "conversation_already_has_active_response", "event_id": "evt_1"}}
    script = ReplayScript.from_block(_block(
        {"type": "response.created", "response": {"id": "r1"}}, echo, refusal, ours, user, model, progress))
    assert [s.kind for s in script.steps] == ["connect", "send", "await_output", "await_create", "send", "send",
                                              "await_create"]
    assert script.steps[2].call_id == "c1"
    # a close 1006, or a new connection with no close, is a drop; 1000 ends the call
    dropped = ReplayScript.from_block(_block() + [{"kind": "close", "t": 1, "code": 1006}, {"kind": "connect", "t": 2},
                                                  {"kind": "connect", "t": 3}, {"kind": "close", "t": 4, "code": 1000}])
    assert [(s.kind, s.code) for s in dropped.steps] == [
        ("connect", None), ("drop", None), ("connect", None), ("drop", None), ("connect", None), ("close", 1000)]


async def _recv(ws) -> dict:
    return json.loads(await ws.get_message())


async def _until(ws, type_: str) -> dict:
    while True:
        event = await _recv(ws)
        if event["type"] == type_:
            return event


async def test_the_replay_answers_our_events_live_and_echoes_our_output(autojump_clock):
    """The driver over a real socket: our early response.create is refused
    while the recorded response is active, our output opens the echo's gate
    and is echoed (not the recorded one), a second output is a duplicate, a
    session.update is acknowledged, and our response.create opens the gate
    of the response that answered it."""
    call = {"type": "function_call", "id": "i1", "call_id": "c1", "name": "calendar.today", "arguments": "{}",
            "status": "completed"}
    recorded_echo = {"id": "o1", "type": "function_call_output", "call_id": "c1", "output": "RECORDED"}
    block = _block(
        {"type": "response.created", "response": {"id": "r1", "status": "in_progress"}},
        {"type": "response.output_item.done", "response_id": "r1", "output_index": 0, "item": call},
        {"type": "response.done", "response": {"id": "r1", "status": "completed", "output": [call]}},
        {"type": "conversation.item.added", "previous_item_id": "i1", "item": recorded_echo},
        {"type": "conversation.item.done", "previous_item_id": "i1", "item": recorded_echo},
        {"type": "response.created", "response": {"id": "r2", "status": "in_progress"}},
        {"type": "response.done", "response": {"id": "r2", "status": "completed", "output": []}},
    ) + [{"kind": "close", "t": 9.0, "code": 1000}]
    driver = ReplayDriver(ReplayScript.from_block(block), timeout_s=30)
    sim = Simulator(None, api_key=None, validate_sent=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        sim.add_call("rtc_x").replay = driver
        url = sim.base_url.replace("http://", "ws://") + "/realtime?call_id=rtc_x"
        async with trio_websocket.open_websocket_url(url, extra_headers=[("Authorization", "Bearer sk-x")]) as ws:
            await _until(ws, "response.created")
            early = rt.response_create()
            await ws.send_message(json.dumps(early))
            refusal = await _until(ws, "error")
            assert refusal["error"]["code"] == "conversation_already_has_active_response"
            assert refusal["error"]["event_id"] == early["event_id"]
            await _until(ws, "response.done")
            await ws.send_message(json.dumps(rt.function_call_output("c1", "OURS")))
            echo = await _until(ws, "conversation.item.added")
            assert echo["item"]["output"] == "OURS" and echo["item"]["id"] == "o1"
            assert (await _recv(ws))["item"]["output"] == "OURS"          # its .done carries ours too
            again = rt.function_call_output("c1", "AGAIN")
            await ws.send_message(json.dumps(again))
            assert (await _until(ws, "error"))["error"]["code"] == "duplicate_tool_call_output"
            # a session.update (a handoff's) is applied and acknowledged live, as the service does
            await ws.send_message(json.dumps(rt.session_update({"instructions": "You are the planner."})))
            assert (await _until(ws, "session.updated"))["session"]["instructions"] == "You are the planner."
            await ws.send_message(json.dumps(rt.response_create()))
            assert (await _until(ws, "response.created"))["response"]["id"] == "r2"
            await _until(ws, "response.done")
        nursery.cancel_scope.cancel()
    result = driver.result()
    assert result["outputs"] == {"c1": {"tool": "calendar.today", "outputs": ["OURS"]}}
    assert result["response_creates"] == [{"result": "rejected_active"}, {"answered_by": "r2"}]
    assert result["protocol_errors"] == ["conversation_already_has_active_response", "duplicate_tool_call_output"]
    assert result["other_client_events"] == ["session.update"]
    assert result["stalls"] == []
