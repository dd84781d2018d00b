"""A phone call's PIN and transfer (``call/phone_line.py``), played by the
simulator over loopback against a served app: before the PIN every tool
call is refused honestly and nothing reads the journal; the right PIN opens
the line; three wrong ones end the call (a goodbye, then the hangup); the
``call.transfer`` tool and keypad 0 refer the call after the model said so,
and the record keeps each step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from test_phone_webhook import OWNER, SIM_KEY, make_settings, served, write_voice
from voiceactors.call.phone_line import LOCKED, PhoneLine, Keyed
from voiceactors.call.record import read_record, record_path
from voiceactors.simulator import Simulator
from voiceactors.simulator import phone as sim_phone

PIN = "2468"
TRANSFER_TO = "tel:+15557654321"


def lines_of(settings, call) -> list[dict]:
    return read_record(record_path(settings.state_dir, call.call_id))


async def place(journal: Path, tmp_path: Path, scenario: list[dict], *, phone: dict[str, Any],
                style: str = "dotted") -> tuple[Any, Any, Simulator]:
    """One phone call from the owner, played to its end; (settings, sim call, simulator)."""
    secret = sim_phone.new_secret()
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER], **phone})
    sim = Simulator(scenario, api_key=SIM_KEY)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        settings = make_settings(journal, tmp_path / "state", sim, tool_name_style=style)
        async with served(settings) as base:
            call = sim.place_phone_call()
            event = sim_phone.incoming_event(call.call_id, sim_phone.sip_headers(OWNER))
            answer = await sim_phone.post(base, sim_phone.delivery(event, secret))
            assert answer.json() == {"status": "accepted"}
            with trio.fail_after(40):
                await call.wait_until(lambda c: c.closed and c.connection is None)
            with trio.fail_after(10):      # the record's end line
                while not any(line["kind"] == "end" for line in lines_of(settings, call)):
                    await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    return settings, call, sim


def test_the_line_counts_tries_and_never_tells_the_pins_length():
    line = PhoneLine(PIN, TRANSFER_TO)
    assert [line.key(k) for k in "24"] == [Keyed.NOTHING] * 2      # no answer before '#': the length stays unknown
    assert line.key("*") == Keyed.NOTHING                           # cleared
    assert [line.key(k) for k in "24#"] == [Keyed.NOTHING, Keyed.NOTHING, Keyed.WRONG] and line.left == 2
    assert line.key("0") == Keyed.NOTHING                           # a digit of the entry, not a transfer
    assert line.key("*") == Keyed.NOTHING
    assert [line.key(k) for k in "2468#"][-1] == Keyed.ACCEPTED and line.open
    assert line.key("0") == Keyed.TRANSFER
    refused = PhoneLine(PIN, None)
    assert [refused.key(k) for k in "1#2#3#"][1::2] == [Keyed.WRONG, Keyed.WRONG, Keyed.REFUSED]
    assert refused.key("2") == Keyed.NOTHING and not refused.open   # no try after the last
    locked = PhoneLine(None, None, locked=True)                      # a rejoin whose config could not be read
    assert [locked.key(k) for k in "2468#"][-1] == Keyed.WRONG and not locked.open


async def test_tools_are_refused_until_the_right_pin_then_answer(make_sample, tmp_path):
    scenario = [
        {"sleep": 0.5},                                      # the greeting asks for the PIN
        {"user_turn": {"text": "What's on today?"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}, "call_id": "call_locked"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "I need your PIN first."}},
        {"dtmf": "9999#"},                                   # wrong: two tries left
        {"sleep": 1.0},
        {"dtmf": PIN + "#"},
        {"sleep": 1.0},
        {"user_turn": {"text": "What's on today?"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}, "call_id": "call_open"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here is your day."}},
        {"close": 1000},
    ]
    settings, call, _sim = await place(make_sample(days=2), tmp_path, scenario, phone={"pin": PIN})
    greeting = next(e for e in call.received if e["type"] == "response.create")
    assert "key their PIN" in greeting["response"]["instructions"]
    assert call.outputs["call_locked"] == [LOCKED]
    opened = json.loads(call.outputs["call_open"][0])
    assert "error" not in opened
    lines = lines_of(settings, call)
    phone = [(line["event"], line["tries_left"]) for line in lines if line["kind"] == "phone"]
    assert phone == [("pin_wrong", 2), ("pin_accepted", 2)]
    tools = {line["tool_call_id"]: line["outcome"] for line in lines if line["kind"] == "tool_call"}
    assert tools == {"call_locked": "rejected", "call_open": "ok"}
    assert PIN not in record_path(settings.state_dir, call.call_id).read_text()
    assert not call.errors_sent and not call.violations


async def test_three_wrong_pins_say_goodbye_and_hang_up(make_sample, tmp_path):
    scenario = [
        {"sleep": 0.5},
        {"dtmf": "1111#"}, {"sleep": 1.0},
        {"dtmf": "2222#"}, {"sleep": 1.0},
        {"dtmf": "3333#"},
        {"sleep": 30},                                       # the server hangs up well before
        {"close": 1000},
    ]
    settings, call, sim = await place(make_sample(days=2), tmp_path, scenario, phone={"pin": PIN})
    assert sim.hangups == [call.call_id]
    lines = lines_of(settings, call)
    assert [line["event"] for line in lines if line["kind"] == "phone"] == ["pin_wrong", "pin_wrong", "pin_refused"]
    assert lines[-1]["kind"] == "end" and lines[-1]["reason"] == "pin_refused"
    goodbye = [e for e in call.received if e["type"] == "response.create"][-1]
    assert "cannot open the journal" in goodbye["response"]["instructions"]


@pytest.mark.parametrize("style", ["dotted", "underscore"])
async def test_the_transfer_tool_is_spoken_recorded_then_referred(make_sample, tmp_path, style):
    name = "call.transfer" if style == "dotted" else "call_transfer"
    scenario = [
        {"sleep": 0.5},
        {"user_turn": {"text": "Can I talk to a person?"}},
        {"response": {"tool_calls": [{"name": name, "arguments": {}, "call_id": "call_transfer_1"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Transferring you now."}},
        {"sleep": 30},                                       # the refer ends the call first
        {"close": 1000},
    ]
    settings, call, sim = await place(make_sample(days=2), tmp_path, scenario,
                                      phone={"transfer_to": TRANSFER_TO}, style=style)
    assert name in [t["name"] for t in call.accepted["tools"]]
    assert call.referred_to == TRANSFER_TO
    assert json.loads(call.outputs["call_transfer_1"][0])["ok"] is True
    lines = lines_of(settings, call)
    [transfer] = [line for line in lines if line["kind"] == "phone"]
    assert (transfer["event"], transfer["target"], transfer["why"]) == ("transfer", TRANSFER_TO, "tool")
    # spoken before: the response that says so ended before the refer closed the call
    said = [r for r in lines if r["kind"] == "response" and r["status"] == "completed"]
    assert said and said[-1]["t"] >= transfer["t"]
    assert sim.hangups == []


async def test_keypad_zero_asks_for_a_person_once_the_line_is_open(make_sample, tmp_path):
    scenario = [
        {"sleep": 0.5},
        {"dtmf": "0*"},                                      # before the PIN: a digit, cleared; no transfer
        {"sleep": 0.5},
        {"dtmf": PIN + "#"},
        {"sleep": 1.0},
        {"dtmf": "0"},
        {"sleep": 30},
        {"close": 1000},
    ]
    settings, call, _sim = await place(make_sample(days=2), tmp_path, scenario,
                                       phone={"pin": PIN, "transfer_to": TRANSFER_TO})
    assert call.referred_to == TRANSFER_TO
    events = [(line["event"], line.get("why")) for line in lines_of(settings, call) if line["kind"] == "phone"]
    assert events == [("pin_accepted", None), ("transfer", "keypad")]
    creates = [e["response"]["instructions"] for e in call.received if e["type"] == "response.create"]
    assert any("transferring them now" in text for text in creates)


async def test_without_a_transfer_target_the_tool_is_not_offered_and_refused(make_sample, tmp_path):
    scenario = [
        {"sleep": 0.5},
        {"user_turn": {"text": "Put me through to someone."}},
        {"response": {"tool_calls": [{"name": "call.transfer", "arguments": {}, "call_id": "call_nobody"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "I can't transfer you."}},
        {"close": 1000},
    ]
    _settings, call, _sim = await place(make_sample(days=2), tmp_path, scenario, phone={})
    assert "call.transfer" not in [t["name"] for t in call.accepted["tools"]]
    assert "transfer unavailable" in json.loads(call.outputs["call_nobody"][0])["error"]
    assert call.referred_to is None


async def test_a_phone_call_past_its_budget_says_farewell_and_hangs_up(make_sample, tmp_path):
    """The call's budget as for any call: the greeting alone costs past it,
    the farewell is asked, then the service is told to hang the phone up."""
    from voiceactors.call.meter import FAREWELL

    journal = make_sample(days=2)
    secret = sim_phone.new_secret()
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER]})
    sim = Simulator([{"sleep": 600}, {"close": 1000}], api_key=SIM_KEY)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        settings = make_settings(journal, tmp_path / "state", sim, call_budget_usd=0.0001)
        async with served(settings) as base:
            call = sim.place_phone_call()
            event = sim_phone.incoming_event(call.call_id, sim_phone.sip_headers(OWNER))
            assert (await sim_phone.post(base, sim_phone.delivery(event, secret))).json() == {"status": "accepted"}
            with trio.fail_after(40):
                await call.wait_until(lambda c: c.closed and c.connection is None)
            with trio.fail_after(10):
                while not any(line["kind"] == "end" for line in lines_of(settings, call)):
                    await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    creates = [e["response"] for e in call.received if e["type"] == "response.create"]
    assert len(creates) == 2 and "Speak first" in creates[0]["instructions"] and creates[1] == FAREWELL
    assert sim.hangups == [call.call_id]
    assert lines_of(settings, call)[-1]["reason"] == "budget_spent"
