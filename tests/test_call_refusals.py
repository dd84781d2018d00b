"""What the call does with each ``error`` the service sends in reply to us
(``call/refusals.py``'s table): sans-IO on ``CallProtocol`` with the
protocol tests' ``Wire``, then over the simulator's refusals on real
loopback sockets (``sim.refuse_next``), on ``autojump_clock``."""

from __future__ import annotations

import pytest

from calls_support import assert_valid_client_events, rig, steady
from test_call_protocol import Wire, confirmed, created, done, error, event, item_added, item_done
from voiceactors import metrics
from voiceactors.call.protocol import EndCall, EndReason, Log, RateLimits, Received, Send, Timer, WakeAt
from voiceactors.call.refusals import BACKOFF_S, REFUSALS, UNKNOWN, RefusalAction, refusal_of
from voiceactors.simulator.refusal_errors import KNOWN_CODES

RATE_LIMIT = "rate_limit_exceeded"


def _refused_create(w: Wire, code: str, rid: str = "r1", tool_call_id: str = "c1") -> str:
    """A tool turn answered and confirmed; its response.create written and refused with ``code``."""
    if rid not in w.p.batches:
        w.server(created(rid), item_added(rid, tool_call_id), item_done(rid, tool_call_id), done(rid))
    w.finish(tool_call_id)
    w.write()
    eid = w.creates()[-1].event["event_id"]
    w.server(error(code, eid))
    return eid


def _at(w: Wire, t: float) -> list:
    w.now = t
    return w.feed(Timer())


# ----------------------------------------------------------------- the table

def test_every_code_the_service_refuses_with_has_its_own_row():
    assert set(KNOWN_CODES) <= set(REFUSALS)
    assert refusal_of("server_busy") is UNKNOWN and refusal_of(None) is UNKNOWN
    ends = {code: row.end for code, row in REFUSALS.items() if row.action == RefusalAction.END_CALL}
    assert ends == {"session_expired": EndReason.SESSION_EXPIRED, "invalid_api_key": EndReason.UNAUTHORIZED,
                    "insufficient_quota": EndReason.QUOTA}
    assert EndReason.SESSION_EXPIRED == "session_expired"


# ------------------------------------------------------------ rate limits

def test_a_rate_limited_create_is_not_sent_and_is_asked_again_after_the_backoff():
    w = Wire()
    eid = _refused_create(w, RATE_LIMIT)
    assert w.p.creates[eid].result == f"error:{RATE_LIMIT}"
    assert w.of(WakeAt)[-1].at == BACKOFF_S[0] and len(w.creates()) == 1
    assert _at(w, BACKOFF_S[0] - 0.1) == [] and len(w.creates()) == 1      # not before its time
    _at(w, BACKOFF_S[0])
    (_, again) = w.creates()
    assert again.event["event_id"] != eid and w.p.creates[again.event["event_id"]].batches == ["r1"]
    (line,) = w.logs("realtime.error")
    assert line["action"] == "backoff" and line["code"] == RATE_LIMIT


def test_rate_limits_past_the_retries_give_the_batch_up_and_the_call_goes_on():
    w = Wire()
    eid = _refused_create(w, "inference_rate_limit_exceeded")
    for delay in BACKOFF_S:
        _at(w, w.now + delay)
        w.write()
        eid = w.creates()[-1].event["event_id"]
        w.server(error("inference_rate_limit_exceeded", eid))
    assert len(w.creates()) == 1 + len(BACKOFF_S)
    assert w.p.batches["r1"].follow_up == "failed" and not w.of(EndCall)
    (given_up,) = w.logs("response.create_given_up")
    assert given_up["batches"] == ["r1"] and given_up["retries"] == len(BACKOFF_S)
    _at(w, w.now + 60)
    assert len(w.creates()) == 1 + len(BACKOFF_S)                      # no loop
    # the next turn is carried forward as usual
    w.server(created("r2"), item_added("r2", "c2"), item_done("r2", "c2"), done("r2"))
    w.finish("c2")
    w.write()
    assert w.p.creates[w.creates()[-1].event["event_id"]].batches == ["r2"]


def test_an_accepted_create_starts_the_retry_count_afresh():
    w = Wire()
    _refused_create(w, RATE_LIMIT)
    _at(w, BACKOFF_S[0])
    w.write()
    w.server(created("r1b"), done("r1b"))               # accepted
    _refused_create(w, RATE_LIMIT, rid="r2", tool_call_id="c2")
    assert w.of(WakeAt)[-1].at == w.now + BACKOFF_S[0]


def test_an_unknown_code_on_our_create_is_logged_retried_and_keeps_the_call():
    w = Wire()
    eid = _refused_create(w, "server_busy")
    assert w.p.creates[eid].result == "error:server_busy" and not w.of(EndCall)
    _at(w, BACKOFF_S[0])
    assert len(w.creates()) == 2


def test_an_unknown_code_naming_nothing_of_ours_is_only_logged():
    w = Wire()
    effects = w.server(error("something_new", None))
    assert [type(e) for e in effects] == [Log] and effects[0].fields["code"] == "something_new"


# -------------------------------------------------------- refused outputs

def test_an_output_refused_outright_is_not_answered_and_asks_for_no_response():
    """The create waits for an active response (a preamble still playing)
    when the service refuses the batch's only output: the service awaits
    nothing, so no response.create follows that response's end."""
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"), item_done("r1", "c1"), done("r1"), created("r2"))
    w.finish("c1")
    (output,) = w.write()
    w.server(error("invalid_tool_call_id", output.event["event_id"]))
    assert w.state("c1") == "rejected" and w.p.batches["r1"].follow_up == "refused"
    w.server(done("r2"))
    assert w.creates() == []
    (line,) = w.records("tool_call")
    assert (line["state"], line["delivered"]) == ("rejected", False)


def test_an_output_refused_after_the_create_went_out_leaves_that_create_counted():
    """Outputs and their create leave together (nothing waits for the echo):
    a refusal arriving after them rejects the output; the create stands."""
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"), item_done("r1", "c1"), done("r1"))
    w.finish("c1")
    output, create = w.write()
    w.server(error("invalid_tool_call_id", output.event["event_id"]))
    assert w.state("c1") == "rejected" and w.p.batches["r1"].follow_up == "ours"
    assert w.creates() == [create]


def test_one_refused_output_of_two_still_gets_the_other_its_response():
    w = Wire()
    w.server(created("r1"), item_added("r1", "c1"), item_done("r1", "c1"), item_added("r1", "c2"),
             item_done("r1", "c2"), done("r1"))
    w.finish("c1")
    (first,) = w.write()
    w.server(error("invalid_tool_call_id", first.event["event_id"]))
    assert w.creates() == []
    w.finish("c2")
    w.write()
    w.server(confirmed("c2"))
    (create,) = w.creates()
    assert w.p.creates[create.event["event_id"]].batches == ["r1"] and w.state("c1") == "rejected"


# ------------------------------------------------------------------- ends

def test_session_expired_ends_the_call_with_its_own_reason():
    w = Wire()
    effects = w.server(error("session_expired", None))
    assert [e.reason for e in effects if isinstance(e, EndCall)] == [EndReason.SESSION_EXPIRED]
    (line,) = w.logs("realtime.fatal_error")
    assert line["end"] == "session_expired"


# ------------------------------------------------------------- rate limits

def test_rate_limits_updated_reaches_the_gauges():
    w = Wire()
    (limits,) = w.feed(Received(event({"type": "rate_limits.updated", "rate_limits": [
        {"name": "requests", "limit": 5000, "remaining": 4321, "reset_seconds": 0.01},
        {"name": "tokens", "limit": 40000, "remaining": 39000, "reset_seconds": 1.5}]})))
    assert limits == RateLimits(requests=4321, tokens=39000)
    m = metrics.Metrics()
    m.rate_limits(limits.requests, limits.tokens)
    text = m.render()[0].decode()
    assert 'voiceactors_rate_limit_remaining{limit="requests"} 4321.0' in text
    assert 'voiceactors_rate_limit_remaining{limit="tokens"} 39000.0' in text
    # a list without the two names changes nothing
    assert w.feed(Received(event({"type": "rate_limits.updated", "rate_limits": []}))) == []


# --------------------------------------------------- over the simulator

def _one_tool(call_id: str) -> list[dict]:
    return [
        {"user_turn": {"text": "what about today"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}, "call_id": call_id}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here you go."}},
    ]


@pytest.mark.parametrize("code", [RATE_LIMIT, "inference_rate_limit_exceeded", "server_busy"])
async def test_a_refused_create_is_retried_and_the_answer_spoken(tmp_path, autojump_clock, code):
    """Before, a rate limit or an unknown code failed the batch for good: the
    model never spoke the answer."""
    scenario = steady([*_one_tool("call_A"), {"close": 1000}])
    async with rig(tmp_path) as r:
        r.sim.add_call("rtc_rate", scenario)
        r.sim.refuse_next("rtc_rate", "response.create", code, times=2)
        actor, sc = await r.run_call("rtc_rate")
        record = r.record("rtc_rate")
    assert actor.end_reason == "closed_by_service"
    assert_valid_client_events(sc)
    assert [code_ for code_, _ in sc.refused] == [code, code]
    assert sc.response_creates == 3
    assert [(x.origin, x.status) for x in sc.responses] == [("scenario", "completed"), ("client", "completed")]
    lines = [line for line in record if line["kind"] == "response_create"]
    assert [line["result"] for line in lines] == [f"error:{code}", f"error:{code}", "sent"]
    # each retry waited its backoff (record times are rounded to the millisecond)
    waits = [round(later["t"] - earlier["t"], 3) for earlier, later in zip(lines, lines[1:])]
    assert waits[0] >= BACKOFF_S[0] and waits[1] >= BACKOFF_S[1]


async def test_an_output_the_service_forgot_is_rejected_never_resent(tmp_path, autojump_clock):
    scenario = steady([{"user_turn": {"text": "what about today"}},
                       {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {},
                                                     "call_id": "call_A"}]}},
                       {"wait_outputs": {"response_create": False}}, {"sleep": 1.0}, {"close": 1000}])
    async with rig(tmp_path) as r:
        r.sim.add_call("rtc_forgot", scenario)
        r.sim.refuse_next("rtc_forgot", "function_call_output", "invalid_tool_call_id")
        actor, sc = await r.run_call("rtc_forgot")
        record = r.record("rtc_forgot")
    assert actor.end_reason == "closed_by_service"
    assert [code for code, _ in sc.refused] == ["invalid_tool_call_id"]
    # the create left with the output, before the refusal came back; nothing is resent
    assert sc.response_creates == 1 and len(sc.received) == len(set(e["event_id"] for e in sc.received))
    (line,) = [x for x in record if x["kind"] == "tool_call"]
    assert (line["state"], line["delivered"]) == ("rejected", False)


async def test_session_expired_ends_the_call_as_session_expired(tmp_path, autojump_clock):
    scenario = steady([*_one_tool("call_A"), {"session_cap": {"at_s": 30, "close_after_s": 5}}, {"sleep": 60}])
    async with rig(tmp_path) as r:
        r.sim.add_call("rtc_cap", scenario)
        actor, sc = await r.run_call("rtc_cap")
        record = r.record("rtc_cap")
    assert actor.end_reason == "session_expired"
    (end,) = [line for line in record if line["kind"] == "end"]
    assert end["reason"] == "session_expired"
    assert sc.response_creates == 1


async def test_rate_limits_from_the_service_reach_the_process_gauges(tmp_path, autojump_clock):
    limits = [{"name": "requests", "limit": 5000, "remaining": 4987, "reset_seconds": 0.2},
              {"name": "tokens", "limit": 40000, "remaining": 31234, "reset_seconds": 3.5}]
    scenario = steady([{"user_turn": {"text": "hello"}}, {"response": {"text": "Hi.", "rate_limits": limits}},
                       {"close": 1000}])
    async with rig(tmp_path) as r:
        actor, _ = await r.run_call("rtc_limits", scenario)
    assert actor.end_reason == "closed_by_service"
    text = metrics.render()[0].decode()
    assert 'voiceactors_rate_limit_remaining{limit="requests"} 4987.0' in text
    assert 'voiceactors_rate_limit_remaining{limit="tokens"} 31234.0' in text
