"""Several output items in one response, over the simulator in memory:
gpt-realtime-2's spoken preambles before, between and after parallel
function calls, a barge-in in each gap, and OpenAI-hosted MCP calls (run by
the service, never answered by us)."""

from __future__ import annotations

from typing import Any

import pytest

from calls_support import assert_clean_protocol, rig, steady
from voiceactors.call.record_kind import RecordKind
from voiceactors.http.history import call_detail
from voiceactors.http.timeline_svg import render

USER = "What's on today, and what do I owe people?"
BEFORE, BETWEEN, AFTER = "Let me check your calendar.", "And your open commitments.", "One moment."
CALENDAR = {"function_call": {"name": "calendar.today", "arguments": {}}}
COMMITMENTS = {"function_call": {"name": "commitments.list", "arguments": {"state": "open"}}}
#: The gaps of the mixed response a barge-in lands in: the items before it.
GAPS = {"before_the_calls": 1, "between_the_calls": 3, "after_the_calls": 4}


def mixed_items(pause_after: int | None = None) -> list[dict[str, Any]]:
    """A preamble before, between and after two parallel calls; with
    ``pause_after``, a pause after that many items (where a barge-in lands)."""
    items: list[dict[str, Any]] = [{"message": BEFORE}, CALENDAR, {"message": BETWEEN}, COMMITMENTS,
                                   {"message": AFTER}]
    if pause_after is not None:
        items.insert(pause_after, {"pause": 2.0})
    return items


def spoken(r: Any, call_id: str) -> list[tuple[str, str, bool]]:
    detail = call_detail(r.settings.state_dir, call_id)
    return [(e["role"], e["text"], e["cut_short"]) for e in detail["transcript"]]


async def test_preambles_around_parallel_calls_get_one_output_each_and_one_create(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        _, sim_call = await r.run_call("rtc_preambles", steady("preambles"))
    assert_clean_protocol(sim_call, creates=1)
    assert len(sim_call.tool_calls) == 2
    # the one response.create came after both outputs (one sent while the
    # mixed response was active would have been refused: no error came)
    types = [e["type"] for e in sim_call.received]
    outputs = [i for i, e in enumerate(sim_call.received) if e["type"] == "conversation.item.create"]
    assert len(outputs) == 2 and types.index("response.create") > max(outputs)
    assert spoken(r, "rtc_preambles") == [
        ("user", USER, False), ("assistant", BEFORE, False), ("assistant", BETWEEN, False),
        ("assistant", AFTER, False), ("assistant", "You have two meetings and three open commitments.", False)]
    # the timeline marks each preamble where it was spoken, its words in the mark's tooltip
    svg = render(r.record("rtc_preambles"))
    at = [svg.index(f"<title>assistant: {text}</title>") for text in (BEFORE, BETWEEN, AFTER)]
    assert at == sorted(at) and f"<title>you: {USER}</title>" in svg


@pytest.mark.parametrize("gap", GAPS)
async def test_a_barge_in_in_each_gap_of_a_mixed_response(tmp_path, autojump_clock, gap):
    """The user barges in while the mixed response is paused after
    ``GAPS[gap]`` items: the response ends cancelled; every call it issued
    still gets exactly one output (run, or cancelled), no ``response.create``
    follows a cancelled batch, and the model answers the new turn itself."""
    scenario = [
        {"user_turn": {"text": USER}},
        {"response": {"items": mixed_items(GAPS[gap]), "background": True}},
        {"barge_in": {"after_ms": 1000, "text": "Actually, never mind."}},
        {"response": {"text": "Sure."}},
        {"sleep": 1.0},
        {"close": 1000},
    ]
    async with rig(tmp_path) as r:
        _, sim_call = await r.run_call(f"rtc_gap_{gap}", steady(scenario))
    assert_clean_protocol(sim_call, creates=0)
    issued = {"before_the_calls": 0, "between_the_calls": 1, "after_the_calls": 2}[gap]
    assert len(sim_call.tool_calls) == issued
    cancelled = [e for e in sim_call.sent if e["type"] == "response.done"
                 and e["response"]["status"] == "cancelled"]
    assert len(cancelled) == 1
    said = {"before_the_calls": [BEFORE], "between_the_calls": [BEFORE, BETWEEN],
            "after_the_calls": [BEFORE, BETWEEN]}[gap]
    # spoken order, every preamble of the cut response marked cut short
    assert spoken(r, f"rtc_gap_{gap}") == [
        ("user", USER, False), *[("assistant", text, True) for text in said],
        ("user", "Actually, never mind.", False), ("assistant", "Sure.", False)]
    record = r.record(f"rtc_gap_{gap}")
    svg = render(record)
    assert all(f"<title>assistant: {text} (cut short)</title>" in svg for text in said)
    assert "<title>assistant: Sure.</title>" in svg
    settled = [line for line in record if line["kind"] == RecordKind.TOOL_CALL]
    assert sorted(line["tool_call_id"] for line in settled) == sorted(sim_call.tool_calls)


HOSTED_FAILED = [
    {"user_turn": {"text": "And tomorrow?"}},
    {"response": {"items": [
        {"message": "Let me look."},
        {"mcp_call": {"server_label": "weather", "name": "forecast", "arguments": {"day": "tomorrow"},
                      "error": {"type": "tool_execution_error", "message": "the forecast is down"}}},
        {"message": "The forecast is not available."}]}},
    {"sleep": 1.0},
    {"close": 1000},
]


async def test_hosted_mcp_calls_are_never_answered_and_are_recorded_and_shown(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        _, sim_call = await r.run_call("rtc_hosted", steady("hosted_mcp"))
        _, failed_call = await r.run_call("rtc_hosted_failed", steady(HOSTED_FAILED))
    for call in (sim_call, failed_call):
        # nothing of ours answered the service's own tool call: no output, no response.create
        assert_clean_protocol(call, creates=0)
        assert call.tool_calls == {} and call.outputs == {}
        assert [e["type"] for e in call.received if e["type"] != "session.update"] == []
    [ran] = [line for line in r.record("rtc_hosted") if line["kind"] == RecordKind.HOSTED_TOOL]
    mcp_item = next(e["item"] for e in sim_call.sent
                    if e["type"] == "response.output_item.done" and e["item"]["type"] == "mcp_call")
    assert {k: ran[k] for k in ("item_id", "server", "tool", "status", "error")} == {
        "item_id": mcp_item["id"], "server": "weather", "tool": "forecast", "status": "completed", "error": None}
    [failed] = [line for line in r.record("rtc_hosted_failed") if line["kind"] == RecordKind.HOSTED_TOOL]
    assert (failed["status"], failed["error"]) == ("failed", "tool_execution_error")
    # the history lists it beside the spoken turns; the timeline draws it
    detail = call_detail(r.settings.state_dir, "rtc_hosted")
    assert [(h["server"], h["tool"], h["status"]) for h in detail["hosted_tools"]] == [
        ("weather", "forecast", "completed")]
    assert spoken(r, "rtc_hosted") == [
        ("user", "What's the weather in Lyon?", False), ("assistant", "Let me check.", False),
        ("assistant", "It is sunny in Lyon, with a high of 21 degrees.", False)]
    assert detail["call"]["tool_calls"] == 0       # not one of our tool calls
    svg = render(r.record("rtc_hosted_failed"))
    assert "weather · forecast" in svg and "hosted · failed" in svg
