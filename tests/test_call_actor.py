"""CallActor against the Realtime simulator, its sideband in memory
(``calls_support.Sideband``): tool batches, barge-in, a model response first,
active-response recovery (one round with the service played event by event
by the test: the first test).

Reconnects, end conditions and the call record: ``test_call_lifecycle.py``.
"""

from __future__ import annotations

import io
import json

import structlog
import trio
from structlog.testing import capture_logs

from voiceactors import logs

from test_call_protocol import args_done, confirmed, created, done, fc_item, item_added, item_done, speech
from voiceactors.simulator.client_events import validate_client_event

from calls_support import (
    ACTIVE, Gate, assert_clean_protocol, assert_valid_client_events, gated_registry, received_types,
    real_time_limit, rig, steady,
)


def _index(sim_call, predicate) -> list[int]:
    return [i for i, e in enumerate(sim_call.received) if predicate(e)]


def _output_indexes(sim_call) -> list[int]:
    return _index(sim_call, lambda e: e["type"] == "conversation.item.create")


def _create_indexes(sim_call) -> list[int]:
    return _index(sim_call, lambda e: e["type"] == "response.create")


async def test_single_tool_one_output_then_one_response_create(tmp_path, autojump_clock):
    """One tool call's round through the shell, the service played in memory
    (the same round against the simulator: the tests below)."""
    async with rig(tmp_path) as r:
        actor, service = r.memory_actor("rtc_single")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            peer = await service.next_connection()
            peer.push(speech(), created("r1"), item_added("r1", "c1"), args_done("r1", "c1", "{}"))
            peer.push(item_done("r1", "c1"), done("r1", output=[fc_item("c1")]))
            output = await peer.next_sent()
            assert (await peer.next_sent())["type"] == "response.create"
            peer.push(confirmed("c1"), created("r2"), done("r2"))
            await trio.testing.wait_all_tasks_blocked()
            peer.close(1000)
    assert actor.end_reason == "closed_by_service"
    for event in peer.sent:
        validate_client_event(event)
    assert [e["type"] for e in peer.sent] == ["conversation.item.create", "response.create"]
    assert output["item"]["call_id"] == "c1"
    assert json.loads(output["item"]["output"])["date"] == "2026-03-27"   # the real tool ran on the journal
    assert actor.calls["c1"].state == "confirmed" and actor.batches["r2"].origin == "ours"


async def test_a_read_starts_on_its_prefetch_and_runs_once(tmp_path, autojump_clock):
    """The simulator sends function_call_arguments.done before the item's
    done: the read is prefetched there, the call starts on that very run
    (no second run at the executor), and its output goes out once."""
    with capture_logs() as logs:
        async with rig(tmp_path) as r:
            actor, sc = await r.run_call("rtc_prefetch", steady("single_tool"))
    assert_clean_protocol(sc, creates=1)
    (call_id,) = sc.tool_calls
    call = actor.calls[call_id]
    assert call.prefetch is not None and call.adopted
    assert [line["tool_call_id"] for line in logs if line["event"] == "tool.run"] == [call_id]
    assert len(sc.outputs[call_id]) == 1 and call.state == "confirmed"


async def test_a_call_logs_its_start_and_end_at_info_and_nothing_per_event(tmp_path, autojump_clock):
    """At the default level a call's own lines are its connect and its end;
    the per-round ones (response.create, call.epoch, ...) are debug."""
    buffer = io.StringIO()
    logs.configure("json", "info", stream=buffer)
    try:
        async with rig(tmp_path) as r:
            actor, sc = await r.run_call("rtc_quiet", steady("single_tool"))
    finally:
        structlog.reset_defaults()
    assert_clean_protocol(sc, creates=1)
    lines = [json.loads(line) for line in buffer.getvalue().splitlines() if line.startswith("{")]
    ours = [line["event"] for line in lines if line.get("actor") == "call"]
    assert ours == ["call.connected", "call.ended"]   # socket_closed and recorded are debug too (docs/operations.md)
    assert all(line["call_id"] == "rtc_quiet" for line in lines if line.get("actor") == "call")


async def test_parallel_tools_three_outputs_then_exactly_one_create(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_parallel", steady("parallel_tools"))
    assert_clean_protocol(sc, creates=1)
    assert len(sc.tool_calls) == 3
    outputs, (create,) = _output_indexes(sc), _create_indexes(sc)
    assert len(outputs) == 3 and max(outputs) < create
    # one turn, one epoch for the whole batch
    assert {(c.turn, c.epoch) for c in actor.calls.values()} == {(1, 1)}


async def test_parallel_tools_run_concurrently(tmp_path, autojump_clock):
    """Two gated calls of one response are both running before either answers."""
    gate = Gate({"events": []})
    scenario = steady([
        {"user_turn": {"text": "two things"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}},
                                     {"name": "calendar.today", "arguments": {"x": 1}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "done"}},
        {"close": 1000},
    ])
    async with rig(tmp_path, registry=gated_registry("calendar.today", gate)) as r:
        sc = r.sim.add_call("rtc_conc", scenario)
        actor = r.actor("rtc_conc")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            with real_time_limit():
                while sum(c.state == "running" for c in actor.calls.values()) < 2:
                    await trio.sleep(0.01)
            assert sc.outputs == {}
            gate.release.set()
    assert gate.calls == 2
    assert_clean_protocol(sc, creates=1)


async def test_barge_in_while_tool_runs(tmp_path, autojump_clock):
    """speech_started while a read runs: the read is cancelled at the executor,
    its call id still gets exactly one output, and no response.create follows."""
    gate = Gate()
    async with rig(tmp_path, registry=gated_registry("journal.search", gate)) as r:
        try:
            actor, sc = await r.run_call("rtc_barge", steady("barge_in_during_tool"))
        finally:
            gate.release.set()
    assert_clean_protocol(sc, creates=0)
    (call_id,) = sc.tool_calls
    assert json.loads(sc.outputs[call_id][0]) == {"error": "cancelled"}
    call = actor.calls[call_id]
    assert call.outcome == "cancelled" and call.epoch < actor.epoch
    tool_batch = actor.batches[call.response_id]
    assert tool_batch.status == "cancelled" and tool_batch.follow_up == "superseded"
    assert [(x.origin, x.status) for x in sc.responses] == [("scenario", "cancelled"), ("scenario", "completed")]


async def test_barge_in_with_real_tool(tmp_path, autojump_clock):
    """The same scenario with the real journal.search: whatever finishes first,
    one output and no response.create."""
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_barge_real", steady("barge_in_during_tool"))
    assert_clean_protocol(sc, creates=0)


async def test_write_started_before_barge_in_finishes_and_reports(tmp_path, autojump_clock):
    """A started write is not cancelled by the barge-in: its real result is the
    output; still no response.create (older epoch)."""
    gate = Gate({"ok": True, "written": 1})
    scenario = steady([
        {"user_turn": {"text": "close that"}},
        {"response": {"text": "Closing it.", "tool_calls": [{"name": "commitments.complete",
                                                            "arguments": {"commitment_id": "lg_x", "resolution": "done"}}],
                      "hold_s": 2.0}},
        {"barge_in": {"after_ms": 300, "text": "wait"}},
        {"response": {"text": "Okay, waiting."}},
        {"wait_outputs": {"response_create": False}},
        {"sleep": 1.0},
        {"close": 1000},
    ])
    async with rig(tmp_path, registry=gated_registry("commitments.complete", gate, effect="write")) as r:
        sc = r.sim.add_call("rtc_write", scenario)
        actor = r.actor("rtc_write")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            with real_time_limit():
                while actor.epoch < 2:   # the barge-in reached us while the write runs
                    await trio.sleep(0.01)
            gate.release.set()
    assert_clean_protocol(sc, creates=0)
    (call_id,) = sc.tool_calls
    assert json.loads(sc.outputs[call_id][0]) == {"ok": True, "written": 1}
    assert actor.calls[call_id].outcome == "ok"


async def test_model_response_first_our_create_waits_for_its_done(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_first", steady("model_responds_first"))
    assert_clean_protocol(sc, creates=1)
    first = next(x for x in sc.responses if x.origin == "model_first")
    ours = next(x for x in sc.responses if x.origin == "client")
    assert first.ended_at is not None and ours.started_at >= first.ended_at


async def test_model_response_started_after_outputs_carries_the_turn(tmp_path, autojump_clock):
    """The model starts a response the instant our output lands, so our
    response.create (right behind it) meets conversation_already_has_active_response.
    That response saw the output: no retry, no second create."""
    scenario = steady([
        {"user_turn": {"text": "brief me"}},
        {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
        {"model_response_first": {"text": "Here it is.", "hold_s": 1.0, "when": "outputs_answered"}},
        {"sleep": 5.0},
        {"close": 1000},
    ])
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_race", scenario)
    assert_valid_client_events(sc)
    assert sc.response_creates == 1 and sc.error_codes == [ACTIVE]
    assert sc.errors_sent[0]["error"]["event_id"] == sc.received[_create_indexes(sc)[0]]["event_id"]
    (call_id,) = sc.tool_calls
    assert len(sc.outputs[call_id]) == 1
    batch = actor.batches[actor.calls[call_id].response_id]
    assert batch.follow_up == "model"
    (create,) = actor.protocol.creates.values()
    assert create.result == "rejected_active"


async def test_active_response_we_see_holds_our_create(tmp_path, autojump_clock):
    """A response.created (injected) before our outputs are written keeps our
    response.create back until that response's response.done."""
    gate = Gate()
    scenario = steady([
        {"user_turn": {"text": "brief me"}},
        {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here."}},
        {"sleep": 1.0},
        {"close": 1000},
    ])
    async with rig(tmp_path, registry=gated_registry("briefing.get", gate)) as r:
        sc = r.sim.add_call("rtc_hold", scenario)
        actor = r.actor("rtc_hold")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            with real_time_limit():
                await sc.wait_until(lambda c: any(x.status == "completed" for x in c.responses))
                while not any(c.state == "running" for c in actor.calls.values()):
                    await trio.sleep(0.01)
                phantom = {"id": "resp_phantom", "object": "realtime.response", "status": "in_progress", "output": []}
                await r.sim.inject("rtc_hold", {"type": "response.created", "event_id": "ev1", "response": phantom})
                while "resp_phantom" not in actor.active:
                    await trio.sleep(0.01)
                gate.release.set()
                await sc.wait_until(lambda c: len(c.outputs) == 1)
                await trio.sleep(1.0)
                assert sc.response_creates == 0          # held back by the active response
                done = {**phantom, "status": "completed"}
                await r.sim.inject("rtc_hold", {"type": "response.done", "event_id": "ev2", "response": done})
    assert_clean_protocol(sc, creates=1)


async def test_late_active_error_for_answered_create_is_not_retried(tmp_path, autojump_clock):
    """An (injected) conversation_already_has_active_response naming a create
    whose response already started does not produce a second create."""
    scenario = steady([
        {"user_turn": {"text": "brief me"}},
        {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Here is a long answer.", "hold_s": 2.0}},
        {"sleep": 4.0},
        {"close": 1000},
    ])
    async with rig(tmp_path) as r:
        sc = r.sim.add_call("rtc_late", scenario)
        actor = r.actor("rtc_late")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            with real_time_limit():
                await sc.wait_until(lambda c: c.response_creates == 1)
                while actor.protocol.create_inflight is not None or not actor.active:
                    await trio.sleep(0.01)
                (event_id,) = actor.protocol.creates
                error = {"type": "invalid_request_error", "code": ACTIVE, "message": "busy", "event_id": event_id}
                await r.sim.inject("rtc_late", {"type": "error", "event_id": "ev9", "error": error})
    assert_clean_protocol(sc, creates=1)


async def test_transcript_noise_does_not_starve_tools(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_noise", steady("transcript_noise"))
    assert_clean_protocol(sc, creates=1)
    assert sc.sent_types().count("conversation.item.input_audio_transcription.delta") >= 40


async def test_invalid_and_unknown_server_events_are_skipped(tmp_path, autojump_clock):
    scenario = steady([{"sleep": 1.0}, {"user_turn": {"text": "hi"}},
                       {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}}]}},
                       {"wait_outputs": {}}, {"response": {"text": "ok"}}, {"close": 1000}])
    async with rig(tmp_path) as r:
        sc = r.sim.add_call("rtc_junk", scenario)
        actor = r.actor("rtc_junk")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            with real_time_limit():
                await sc.wait_until(lambda c: c.connections == 1)
                await r.sim.inject("rtc_junk", "not json")
                await r.sim.inject("rtc_junk", {"type": "brand.new.event", "x": 1})
                await r.sim.inject("rtc_junk", {"type": "response.done", "response": "nope"})
                await r.sim.inject("rtc_junk", b"\x00binary")
    assert actor.end_reason == "closed_by_service"
    assert_clean_protocol(sc, creates=1)


async def test_call_cut_mid_arguments_never_runs_and_gets_synthetic_output(tmp_path, autojump_clock):
    """A tool call cut mid-arguments by a barge-in (partial arguments.done, an
    incomplete item, a cancelled response) never runs; it is answered once
    with the synthetic cancelled output and no response.create follows. The
    events are injected (the simulator does not know this call id, so it
    refuses the output: that is the only error)."""
    gate = Gate()
    resp = {"id": "resp_cut", "object": "realtime.response", "status": "in_progress", "output": []}
    item = {"id": "item_cut", "object": "realtime.item", "type": "function_call", "status": "in_progress",
            "name": "journal.search", "call_id": "call_cut", "arguments": ""}
    common = {"response_id": "resp_cut", "item_id": "item_cut", "output_index": 0, "call_id": "call_cut"}
    script = [
        {"type": "response.created", "response": resp},
        {"type": "response.output_item.added", "response_id": "resp_cut", "output_index": 0, "item": item},
        {"type": "response.function_call_arguments.delta", **common, "delta": '{"query": "off'},
        {"type": "input_audio_buffer.speech_started", "audio_start_ms": 10, "item_id": "item_u"},
        {"type": "response.function_call_arguments.done", **common, "name": "journal.search",
         "arguments": '{"query": "off'},
        {"type": "response.output_item.done", "response_id": "resp_cut", "output_index": 0,
         "item": {**item, "status": "incomplete", "arguments": '{"query": "off'}},
        {"type": "response.done", "response": {**resp, "status": "cancelled",
                                               "status_details": {"type": "cancelled", "reason": "turn_detected"},
                                               "output": [{**item, "status": "incomplete"}]}},
    ]
    async with rig(tmp_path, registry=gated_registry("journal.search", gate)) as r:
        sc = r.sim.add_call("rtc_cut", [])
        actor = r.actor("rtc_cut")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            with real_time_limit():
                await sc.wait_until(lambda c: c.connections == 1)
                for i, event in enumerate(script):
                    await r.sim.inject("rtc_cut", {"event_id": f"ev{i}", **event})
                await sc.wait_until(lambda c: "call_cut" in c.outputs)
                await trio.sleep(1.0)
                await r.sim.end_call("rtc_cut", 1000)
        gate.release.set()
    assert gate.calls == 0
    assert sc.outputs["call_cut"] == [json.dumps({"error": "cancelled: the user interrupted"})]
    assert sc.response_creates == 0
    assert sc.error_codes == ["invalid_tool_call_id"]
    call = actor.calls["call_cut"]
    assert call.synthetic and call.state == "rejected" and actor.epoch == 1


async def test_overhead_and_turnaround_are_timed_around_the_tool(tmp_path, mock_clock):
    """The actors' own share of a round trip is measured apart from the
    tool's: 5 s pass (virtually) while the tool runs, none while messages
    move, so overhead ≈ 0 and the create's turnaround ≈ the tool's 5 s."""
    from voiceactors import metrics

    def count(name: str) -> float:
        return metrics.METRICS.registry.get_sample_value(f"voiceactors_{name}_seconds_count") or 0.0

    before = count("tool_overhead"), count("tool_turnaround")
    gate = Gate()
    scenario = steady([
        {"user_turn": {"text": "what is today", "duration_ms": 0}},
        {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "done"}},
        {"close": 1000},
    ])
    async with rig(tmp_path, registry=gated_registry("calendar.today", gate)) as r:
        sc = r.sim.add_call("rtc_timed", scenario)
        actor = r.actor("rtc_timed")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            with real_time_limit():
                while not any(b.done_t is not None and b.calls for b in actor.batches.values()):
                    await trio.sleep(0)
                await trio.to_thread.run_sync(gate.entered.wait)
                mock_clock.jump(5.0)
                gate.release.set()
    assert_clean_protocol(sc, creates=1)
    (call,) = actor.calls.values()
    assert call.duration_ms >= 5000
    assert call.overhead_ms is not None and 0 <= call.overhead_ms < 1
    (create,) = actor.protocol.creates.values()
    assert 5000 <= create.turnaround_ms < 5001
    assert (count("tool_overhead"), count("tool_turnaround")) == (before[0] + 1, before[1] + 1)
    lines = r.record("rtc_timed")
    assert [x["overhead_ms"] for x in lines if x["kind"] == "tool_call"] == [call.overhead_ms]
    assert [x["turnaround_ms"] for x in lines if x["kind"] == "response_create"] == [create.turnaround_ms]
