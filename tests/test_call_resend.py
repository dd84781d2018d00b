"""CallActor recovery the simulator has to provoke on purpose, the sideband
in memory: an output written but not yet confirmed when the socket
drops (``sim.drop_on_next_output``), and ``conversation_already_has_active_response``
while the actor knows of no active response (``sim.reject_next_response_create``:
the blind retry).

Tool handlers run in worker threads; every deadline these tests meet (the
reconnect backoff, the blind retry) is armed only after the tools finished,
so ``autojump_clock`` cannot jump past a running tool (see ``calls_support``).
"""

from __future__ import annotations

import trio

from calls_support import ACTIVE, assert_clean_protocol, assert_valid_client_events, real_time_limit, rig, steady
from voiceactors.call.actor import BLIND_RETRIES, BLIND_RETRY_S

DUPLICATE = "duplicate_tool_call_output"


def _output_events(sim_call, call_id: str) -> list[dict]:
    return [e for e in sim_call.received
            if e["type"] == "conversation.item.create" and e["item"].get("call_id") == call_id]


def _one_tool(call_id: str, name: str = "calendar.today") -> list[dict]:
    return [
        {"user_turn": {"text": "what about today"}},
        {"response": {"tool_calls": [{"name": name, "arguments": {}, "call_id": call_id}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here you go."}},
    ]


def _creates(record: list[dict]) -> list[dict]:
    return [line for line in record if line["kind"] == "response_create"]


async def test_unconfirmed_output_is_sent_again_confirmed_one_never(tmp_path, autojump_clock):
    """Turn 1's output is confirmed; turn 2's output is written, then the
    socket drops before the service applied it. After the reconnect only
    turn 2's output is written again; one response.create per batch."""
    scenario = steady([
        *_one_tool("call_first"),
        {"user_turn": {"text": "and my commitments"}},
        {"response": {"tool_calls": [{"name": "commitments.list", "arguments": {}, "call_id": "call_second"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "That is all."}},
        {"close": 1000},
    ])
    async with rig(tmp_path) as r:
        sc = r.sim.add_call("rtc_resend", scenario)
        actor = r.actor("rtc_resend")
        with real_time_limit():
            async with trio.open_nursery() as n:
                n.start_soon(actor.run)
                await sc.wait_until(lambda c: c.response_creates == 1)   # turn 1 is confirmed and done
                r.sim.drop_on_next_output("rtc_resend")
        record = r.record("rtc_resend")
    assert actor.end_reason == "closed_by_service"
    assert sc.connections == 2 and sc.drops == 1 and actor.reconnects == 1
    # the service never applied the first write of call_second ...
    lost, resent = _output_events(sc, "call_second")
    assert sc.lost_outputs == {"call_second": [lost["item"]["output"]]}
    assert resent["item"]["output"] == lost["item"]["output"] and resent["event_id"] != lost["event_id"]
    # ... so the resend is accepted; call_first (confirmed before the drop) was written once
    assert len(_output_events(sc, "call_first")) == 1
    assert_clean_protocol(sc, creates=2)
    assert [(x.origin, x.status) for x in sc.responses] == [
        ("scenario", "completed"), ("client", "completed"), ("scenario", "completed"), ("client", "completed")]
    first, second = actor.calls["call_first"], actor.calls["call_second"]
    assert (first.state, first.sends) == ("confirmed", 1)
    assert (second.state, second.sends) == ("confirmed", 2)
    tools = {line["tool_call_id"]: line for line in record if line["kind"] == "tool_call"}
    assert tools["call_second"]["sends"] == 2 and tools["call_second"]["delivered"] is True
    (reconnect,) = [line for line in record if line["kind"] == "reconnect"]
    assert reconnect["close_code"] == 1006


async def test_applied_but_unconfirmed_output_is_rejected_on_resend_not_looped(tmp_path, autojump_clock):
    """The service applied the output but the socket dropped before its
    confirmation: the resend meets duplicate_tool_call_output, the call is
    marked rejected and never written a third time; the batch still gets
    exactly one response.create."""
    scenario = steady([*_one_tool("call_A"), {"sleep": 30.0}, {"close": 1000}])
    async with rig(tmp_path) as r:
        r.sim.add_call("rtc_applied", scenario)
        r.sim.drop_on_next_output("rtc_applied", applied=True)
        actor, sc = await r.run_call("rtc_applied")
        record = r.record("rtc_applied")
    assert actor.end_reason == "closed_by_service"
    assert sc.connections == 2 and sc.drops == 1
    assert_valid_client_events(sc)
    first, again = _output_events(sc, "call_A")
    assert sc.outputs == {"call_A": [first["item"]["output"]] * 2} and sc.lost_outputs == {}
    assert sc.error_codes == [DUPLICATE] and sc.errors_sent[0]["error"]["event_id"] == again["event_id"]
    assert sc.response_creates == 1 and sc.violations == []
    assert [(x.origin, x.status) for x in sc.responses] == [("scenario", "completed"), ("client", "completed")]
    # written at the end, each response_create line (one lost to the drop) keeps the time it was sent
    (end,) = [line for line in record if line["kind"] == "end"]
    lost, sent = _creates(record)
    assert 0 < lost["t"] < sent["t"] < end["t"] - 29
    call = actor.calls["call_A"]
    assert (call.state, call.sends) == ("rejected", 2)
    (line,) = [x for x in record if x["kind"] == "tool_call"]
    assert (line["state"], line["sends"], line["delivered"]) == ("rejected", 2, False)


async def test_blind_retry_after_active_response_error_while_idle(tmp_path, autojump_clock):
    """The service refuses our response.create as if a response were active
    while we saw none: we retry once after BLIND_RETRY_S and exactly one
    response is played."""
    scenario = steady([*_one_tool("call_A"), {"close": 1000}])
    async with rig(tmp_path) as r:
        r.sim.add_call("rtc_blind", scenario)
        r.sim.reject_next_response_create("rtc_blind")
        actor, sc = await r.run_call("rtc_blind")
        record = r.record("rtc_blind")
    assert actor.end_reason == "closed_by_service"
    assert_valid_client_events(sc)
    creates = [e for e in sc.received if e["type"] == "response.create"]
    assert len(creates) == 2 and sc.response_creates == 2
    assert sc.error_codes == [ACTIVE] and sc.errors_sent[0]["error"]["event_id"] == creates[0]["event_id"]
    assert [(x.origin, x.status) for x in sc.responses] == [("scenario", "completed"), ("client", "completed")]
    assert sc.outputs == {"call_A": [sc.outputs["call_A"][0]]} and sc.violations == []
    rejected, retried = _creates(record)
    assert (rejected["result"], retried["result"]) == ("rejected_active", "sent")
    assert rejected["for"] == retried["for"] and rejected["event_id"] == creates[0]["event_id"]
    assert BLIND_RETRY_S - 0.002 <= retried["t"] - rejected["t"] < BLIND_RETRY_S + 0.5   # t: 3 decimals


async def test_blind_retries_are_bounded_then_wait_for_the_service(tmp_path, autojump_clock):
    """Refused every time: at most BLIND_RETRIES retries, BLIND_RETRY_S apart,
    then no more response.create (no loop) until the service shows a response
    ending; then one more, which is played."""
    scenario = steady([*_one_tool("call_A"), {"close": 1000}])
    refusals = 1 + BLIND_RETRIES
    async with rig(tmp_path) as r:
        sc = r.sim.add_call("rtc_bounded", scenario)
        r.sim.reject_next_response_create("rtc_bounded", times=refusals)
        actor = r.actor("rtc_bounded")
        with real_time_limit():
            async with trio.open_nursery() as n:
                n.start_soon(actor.run)
                await sc.wait_until(lambda c: len(c.errors_sent) == refusals)
                await trio.sleep(10 * BLIND_RETRY_S)
                assert sc.response_creates == refusals and sc.responses[-1].origin == "scenario"
                # the response the service was busy with (its response.created
                # never reached us) ends: the actor decides again
                await r.sim.inject("rtc_bounded", {"type": "response.done", "event_id": "event_hidden_done",
                                                   "response": {"id": "resp_hidden", "object": "realtime.response",
                                                                "status": "completed", "output": []}})
        record = r.record("rtc_bounded")
    assert actor.end_reason == "closed_by_service"
    assert_valid_client_events(sc)
    assert sc.response_creates == refusals + 1 and sc.error_codes == [ACTIVE] * refusals
    assert [(x.origin, x.status) for x in sc.responses] == [("scenario", "completed"), ("client", "completed")]
    creates = _creates(record)
    assert [c["result"] for c in creates] == ["rejected_active"] * refusals + ["sent"]
    gaps = [b["t"] - a["t"] for a, b in zip(creates, creates[1:refusals])]
    assert all(BLIND_RETRY_S - 0.002 <= g < BLIND_RETRY_S + 0.5 for g in gaps), gaps
    assert creates[-1]["t"] - creates[-2]["t"] >= 10 * BLIND_RETRY_S


async def test_a_response_done_ends_the_blind_wait_early(tmp_path, autojump_clock):
    """A response.done while the blind retry is pending (the active response
    we could not see ended) sends the retry at once, not BLIND_RETRY_S later,
    and the timer then sends nothing more."""
    scenario = steady([*_one_tool("call_A"), {"sleep": 10 * BLIND_RETRY_S}, {"close": 1000}])
    async with rig(tmp_path) as r:
        sc = r.sim.add_call("rtc_early", scenario)
        r.sim.reject_next_response_create("rtc_early")
        actor = r.actor("rtc_early")
        with real_time_limit():
            async with trio.open_nursery() as n:
                n.start_soon(actor.run)
                await sc.wait_until(lambda c: c.error_codes == [ACTIVE])
                await r.sim.inject("rtc_early", {"type": "response.done", "event_id": "event_hidden_done",
                                                 "response": {"id": "resp_hidden", "object": "realtime.response",
                                                              "status": "completed", "output": []}})
        record = r.record("rtc_early")
    assert sc.response_creates == 2 and sc.error_codes == [ACTIVE]
    assert [(x.origin, x.status) for x in sc.responses] == [("scenario", "completed"), ("client", "completed")]
    rejected, retried = _creates(record)
    assert retried["result"] == "sent" and retried["t"] - rejected["t"] < BLIND_RETRY_S
