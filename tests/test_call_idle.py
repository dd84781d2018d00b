"""Idle calls over the simulator: the service's idle timeout
(``input_audio_buffer.timeout_triggered``) is answered by the service's own
check-in the first time; a second with the user silent in between gets our
spoken goodbye, then the call ends ``user_idle`` and is hung up. The rules
alone: tests/test_call_protocol.py (idle calls)."""

from __future__ import annotations

import trio

from calls_support import assert_valid_client_events, rig, steady
from voiceactors.call.call_context import LinkedContext
from voiceactors.call.protocol import IDLE_GOODBYE
from voiceactors.realtime.session_settings import SessionSettings

BASE = "You are sol, the journal's voice."
IDLE_MS = 8000
IDLE_SESSION = LinkedContext(BASE, None, session=SessionSettings(idle_timeout_ms=IDLE_MS))


def _goodbyes(sc) -> list[dict]:
    return [e for e in sc.received if e["type"] == "response.create" and e.get("response") == IDLE_GOODBYE]


async def test_a_silent_user_is_checked_in_on_then_told_goodbye_and_the_call_ends(tmp_path, autojump_clock):
    scenario = steady([{"user_turn": {"text": "Hello."}}, {"response": {"text": "Hi! What can I do for you?"}},
                       {"idle_timeout": {"text": "Are you still there?"}},
                       {"idle_timeout": {"text": "Are you still there?"}},
                       {"sleep": 600}, {"close": 1000}])
    async with rig(tmp_path) as r:
        started = trio.current_time()
        actor, sc = await r.run_call("rtc_silent_user", scenario, context=IDLE_SESSION)
        record = r.record("rtc_silent_user")
    assert actor.end_reason == "user_idle"
    assert sc.idle_timeouts == 2
    assert 2 * IDLE_MS / 1000 <= actor.ended_at - started < 600      # ended by us, not the scenario
    assert len(_goodbyes(sc)) == 1 and sc.response_creates == 1      # the check-in was the service's own
    # the service's own answer to each timeout (the second cancelled: one
    # check-in is heard, not two), then the goodbye after it (the
    # simulator's default reply to our create), never refused
    assert [(x.origin, x.status) for x in sc.responses] == [
        ("scenario", "completed"), ("idle_timeout", "completed"), ("idle_timeout", "cancelled"),
        ("default", "completed")]
    assert [e["type"] for e in sc.received if e["type"] == "response.cancel"] == ["response.cancel"]
    assert sc.error_codes == []
    assert r.sim.hangups == ["rtc_silent_user"] and sc.closed
    assert [(line["timeouts"], line["then"]) for line in record if line["kind"] == "idle"] == [
        (1, "check_in"), (2, "goodbye")]
    assert record[-1]["kind"] == "end" and record[-1]["reason"] == "user_idle"
    assert_valid_client_events(sc)


async def test_the_user_speaking_between_two_idle_timeouts_keeps_the_call(tmp_path, autojump_clock):
    scenario = steady([{"user_turn": {"text": "Hello."}}, {"response": {"text": "Hi!"}},
                       {"idle_timeout": {}},
                       {"user_turn": {"text": "Sorry, I am here."}}, {"response": {"text": "Welcome back."}},
                       {"idle_timeout": {}},
                       {"sleep": 60}, {"close": 1000}])
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_back", scenario, context=IDLE_SESSION)
        record = r.record("rtc_back")
    assert actor.end_reason == "closed_by_service"
    assert sc.idle_timeouts == 2 and _goodbyes(sc) == [] and r.sim.hangups == []
    assert [line["then"] for line in record if line["kind"] == "idle"] == ["check_in", "check_in"]
