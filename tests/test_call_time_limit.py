"""A call's time limit over the simulator: ``call_wrap_up_s`` before
``call_max_duration_s`` the assistant is asked, once and at a quiet moment,
to say that the call ends soon; at the limit the call ends cleanly
(``max_duration``) and is hung up. The rules alone:
tests/test_call_protocol.py (the time limit)."""

from __future__ import annotations

from calls_support import assert_valid_client_events, rig, steady
from voiceactors.call.protocol import wrap_up_response

LIMIT_S, WRAP_UP_S = 300.0, 120.0


def _wrap_ups(sc) -> list[dict]:
    return [e for e in sc.received if e["type"] == "response.create"
            and e.get("response", {}).get("instructions", "").startswith("This call reaches its time limit")]


async def test_the_assistant_wraps_up_before_the_limit_then_the_call_ends_at_it(tmp_path, autojump_clock):
    scenario = steady([{"user_turn": {"text": "Let us go through my week."}}, {"response": {"text": "Sure."}},
                       {"sleep": 3600}, {"close": 1000}])
    async with rig(tmp_path, call_max_duration_s=LIMIT_S, call_wrap_up_s=WRAP_UP_S) as r:
        actor, sc = await r.run_call("rtc_long", scenario)
        record = r.record("rtc_long")
    assert actor.end_reason == "max_duration"
    assert LIMIT_S <= actor.ended_at - actor.started < LIMIT_S + 1
    [wrap_up] = _wrap_ups(sc)
    assert wrap_up["response"] == wrap_up_response(2) and sc.response_creates == 1
    [line] = [x for x in record if x["kind"] == "wrap_up"]
    assert line["t"] == LIMIT_S - WRAP_UP_S and line["left_s"] == WRAP_UP_S
    assert [(x.origin, x.status) for x in sc.responses] == [("scenario", "completed"), ("default", "completed")]
    assert sc.error_codes == []
    assert record[-1]["kind"] == "end" and record[-1]["reason"] == "max_duration"
    assert r.sim.hangups == ["rtc_long"]
    assert_valid_client_events(sc)


async def test_the_wrap_up_waits_for_the_models_answer_to_end(tmp_path, autojump_clock):
    due = LIMIT_S - WRAP_UP_S
    scenario = steady([{"user_turn": {"text": "Tell me a long story."}}, {"sleep_until": due - 5},
                       {"response": {"items": [{"message": "Once upon a time"}, {"pause": 30},
                                               {"message": "they lived happily."}]}},
                       {"sleep": 3600}, {"close": 1000}])
    async with rig(tmp_path, call_max_duration_s=LIMIT_S, call_wrap_up_s=WRAP_UP_S) as r:
        actor, sc = await r.run_call("rtc_story", scenario)
        record = r.record("rtc_story")
    [wrap_up] = _wrap_ups(sc)
    sent = [x for x in record if x["kind"] == "response_create"]
    assert len(sent) == 1 and sent[0]["result"] == "sent"
    assert sent[0]["t"] >= due + 25               # after the story's response ended, never during it
    assert sc.error_codes == []                   # no conversation_already_has_active_response
    assert actor.end_reason == "max_duration"


async def test_no_wrap_up_when_it_is_off(tmp_path, autojump_clock):
    scenario = steady([{"user_turn": {"text": "Hi."}}, {"response": {"text": "Hello."}},
                       {"sleep": 3600}, {"close": 1000}])
    async with rig(tmp_path, call_max_duration_s=LIMIT_S, call_wrap_up_s=0) as r:
        actor, sc = await r.run_call("rtc_plain", scenario)
    assert actor.end_reason == "max_duration" and _wrap_ups(sc) == [] and sc.response_creates == 0


def test_a_wrap_up_not_shorter_than_the_limit_is_refused():
    from voiceactors.settings import Settings

    problems = Settings(journal=".", state_dir=".", call_max_duration_s=300, call_wrap_up_s=300).problems()
    assert "call_wrap_up_s (300 s) must be less than call_max_duration_s (300 s)" in problems
    assert Settings(journal=".", state_dir=".", call_max_duration_s=300, call_wrap_up_s=0).problems() == []
