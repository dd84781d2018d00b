"""CallActor lifecycle against the simulator: reconnects, end conditions,
bounded close and the call record. Timeouts and backoff on ``autojump_clock``.
The sideband is in memory (``calls_support.Sideband``) but for the handshake's
HTTP status; where the test plays the service itself (a close code, the
reconnect policy, the key asked at every attempt) it is ``Rig.memory_actor``.
(The protocol's own bookkeeping across a drop, without sockets:
test_call_protocol.py.)"""

from __future__ import annotations

import json

import pytest
import trio

from calls_support import (
    KEY, Gate, Sideband, assert_clean_protocol, assert_valid_client_events, gated_registry, real_time_limit, rig,
    steady,
)
from voiceactors.call.actor import CallActor, backoff_delay
from voiceactors.call.record import record_path
from voiceactors.call.transport import TransportUnavailable

SYNTHETIC = json.dumps({"error": "cancelled: the user interrupted"})


async def test_drop_and_resume_sends_the_output_on_the_new_socket(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_drop", steady("drop_and_resume"))
        record = r.record("rtc_drop")
    assert actor.end_reason == "closed_by_service"
    assert sc.connections == 2 and sc.drops == 1
    assert_clean_protocol(sc, creates=1)
    assert actor.reconnects == 1
    (reconnect,) = [line for line in record if line["kind"] == "reconnect"]
    assert reconnect["close_code"] == 1006 and reconnect["attempt"] == 1
    assert [line["kind"] for line in record].count("connect") == 2


async def test_confirmed_outputs_are_not_resent_after_a_drop(tmp_path, autojump_clock):
    scenario = steady([
        {"user_turn": {"text": "first"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "one"}},
        {"drop": True},
        {"user_turn": {"text": "second"}},
        {"response": {"tool_calls": [{"name": "commitments.list", "arguments": {}}]}},
        {"wait_outputs": {}},
        {"response": {"text": "two"}},
        {"close": 1000},
    ])
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_keep", scenario)
    assert sc.connections == 2
    assert_clean_protocol(sc, creates=2)     # no duplicate_tool_call_output: nothing resent
    assert all(c.sends == 1 for c in actor.calls.values())


async def test_clean_close_1001_ends_the_call(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor, service = r.memory_actor("rtc_1001")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            peer = await service.next_connection()
            peer.push({"type": "session.updated", "session": {}})
            await trio.sleep(1)
            peer.close(1001)
        record = r.record("rtc_1001")
    assert actor.end_reason == "closed_by_service"
    assert len(service.keys) == 1 and actor.reconnects == 0
    assert record[-1]["reason"] == "closed_by_service" and record[-1]["close_code"] == 1001
    assert peer.sent == [] and peer.closed_with is None     # nothing to answer; the service closed it


@pytest.mark.parametrize("status", [404, 410])
async def test_gone_at_handshake_ends_without_retry(tmp_path, autojump_clock, status):
    # the status is the websocket handshake's answer: the real one, over a socket
    async with rig(tmp_path, sideband=Sideband.LOOPBACK) as r:
        r.sim.add_call("rtc_gone", [], gone_status=status)
        await r.sim.end_call("rtc_gone")
        actor, sc = await r.run_call("rtc_gone")
    assert actor.end_reason == "call_gone"
    assert [h["status"] for h in r.sim.handshakes] == [status]


async def test_unknown_call_is_gone(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor = r.actor("rtc_never_existed")
        with real_time_limit():
            assert await actor.run() == "call_gone"


async def test_idle_timeout_answers_pending_calls_hangs_up_and_closes(tmp_path, autojump_clock):
    """No server event for the idle timeout: the running read is cancelled and
    answered, the call is hung up and the socket closed cleanly."""
    gate = Gate()
    scenario = [
        {"user_turn": {"text": "search"}},
        {"response": {"tool_calls": [{"name": "journal.search", "arguments": {"query": "x"}}]}},
        {"silence": 3600},
    ]
    async with rig(tmp_path, registry=gated_registry("journal.search", gate), call_idle_timeout_s=30.0) as r:
        start = trio.current_time()
        try:
            actor, sc = await r.run_call("rtc_idle", scenario)
        finally:
            gate.release.set()
        elapsed = actor.ended_at - start
        record = r.record("rtc_idle")
    assert actor.end_reason == "idle_timeout"
    assert 30.0 <= elapsed < 31.0
    assert r.sim.hangups == ["rtc_idle"] and sc.closed
    (call_id,) = sc.tool_calls
    assert [json.loads(o) for o in sc.outputs[call_id]] == [{"error": "cancelled"}]   # the executor's answer
    assert sc.response_creates == 0 and sc.error_codes == []
    assert record[-1]["reason"] == "idle_timeout"


async def test_idle_timeout_with_nothing_pending(tmp_path, autojump_clock):
    async with rig(tmp_path, call_idle_timeout_s=45.0) as r:
        actor, sc = await r.run_call("rtc_silent", "silence")
    assert actor.end_reason == "idle_timeout"
    assert sc.received == [] and r.sim.hangups == ["rtc_silent"]


async def test_max_duration_ends_a_busy_call(tmp_path, autojump_clock):
    """Background traffic keeps the call from idling; the maximum duration ends it."""
    scenario = [{"transcript_deltas": {"rate_hz": 10, "count": 100000}}, {"sleep": 100000}]
    async with rig(tmp_path, call_idle_timeout_s=5.0, call_max_duration_s=20.0) as r:
        start = trio.current_time()
        actor, sc = await r.run_call("rtc_max", scenario)
        elapsed = actor.ended_at - start
    assert actor.end_reason == "max_duration"
    assert 20.0 <= elapsed < 21.0
    assert r.sim.hangups == ["rtc_max"]


async def test_reconnect_attempts_exhausted_with_exponential_backoff(tmp_path, autojump_clock):
    async with rig(tmp_path, reconnect_base_s=0.5, reconnect_max_s=4.0, reconnect_attempts=5) as r:
        actor, service = r.memory_actor("rtc_flaky")
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            peer = await service.next_connection()
            for _ in range(6):                         # the service is unreachable from now on
                service.fail_next(TransportUnavailable("sideband connection failed: OSError"))
            await trio.sleep(1.0)
            peer.close(1006)                           # a drop
        record = r.record("rtc_flaky")
    assert actor.end_reason == "reconnect_exhausted" and len(service.keys) == 6
    delays = [line["delay_s"] for line in record if line["kind"] == "reconnect"]
    assert len(delays) == 5 == actor.reconnects
    caps = [0.5, 1.0, 2.0, 4.0, 4.0]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps))
    assert [line["close_code"] for line in record if line["kind"] == "reconnect"] == [1006] + [None] * 4


def test_backoff_is_bounded_and_deterministic():
    import random

    assert [backoff_delay(n, 0.5, 20.0) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 20, 20]
    a = [backoff_delay(n, 1.0, 8.0, random.Random("rtc_x")) for n in range(1, 6)]
    b = [backoff_delay(n, 1.0, 8.0, random.Random("rtc_x")) for n in range(1, 6)]
    assert a == b


async def test_no_api_key_ends_the_call(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor = r.actor("rtc_nokey", api_key=lambda: None)
        with real_time_limit():
            assert await actor.run() == "no_api_key"


async def test_shutdown_answers_pending_calls_and_closes_within_deadline(tmp_path, autojump_clock):
    gate = Gate()
    scenario = [
        {"user_turn": {"text": "search"}},
        {"response": {"tool_calls": [{"name": "journal.search", "arguments": {"query": "x"}}]}},
        {"sleep": 3600},
    ]
    async with rig(tmp_path, registry=gated_registry("journal.search", gate), close_deadline_s=2.0) as r:
        sc = r.sim.add_call("rtc_stop", scenario)
        actor = r.actor("rtc_stop")
        with real_time_limit():
            async with trio.open_nursery() as n:
                n.start_soon(actor.run)
                while not any(c.state == "running" for c in actor.calls.values()):
                    await trio.sleep(0.01)
                stop = trio.current_time()
                n.cancel_scope.cancel()
            stopped = trio.current_time() - stop
            await sc.wait_until(lambda c: c.connection is None)
        gate.release.set()
        record = r.record("rtc_stop")
    assert actor.end_reason == "shutdown"
    assert stopped <= 2.0 * 2 + 0.5     # tools + socket, then the record: each bounded
    (call_id,) = sc.tool_calls
    assert [json.loads(o) for o in sc.outputs[call_id]] == [{"error": "cancelled"}]
    assert r.sim.hangups == []          # a server restart is not the end of the call
    assert record[-1]["reason"] == "shutdown"


async def test_call_record_content_and_no_secrets(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_rec", steady("parallel_tools"))
        path = record_path(r.settings.state_dir, "rtc_rec")
        text = path.read_text()
        record = r.record("rtc_rec")
    assert KEY not in text and "Bearer" not in text   # no key
    # argument values only where a restart needs them (a read's tool_started
    # line); the words themselves are also in the user's transcript line
    assert {line["kind"] for line in record if "budget" in json.dumps(list(line.values()))} == \
        {"tool_started", "transcript"}
    started = [line for line in record if line["kind"] == "tool_started"]
    assert all(line["effect"] == "read" and "arguments" in line for line in started) and len(started) == 3
    kinds = [line["kind"] for line in record]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("tool_call") == 3
    assert all(isinstance(line["t"], float) for line in record)
    tools = [line for line in record if line["kind"] == "tool_call"]
    assert {t["tool"] for t in tools} == {"calendar.today", "commitments.list", "journal.search"}
    for t in tools:
        assert t["delivered"] is True and t["sends"] == 1 and t["epoch"] == 1 and t["outcome"] in ("ok", "error")
        assert t["output_bytes"] > 0 and t["duration_ms"] is not None and not t["synthetic"]
    responses = [line for line in record if line["kind"] == "response"]
    assert [(x["origin"], x["status"], len(x["tool_calls"])) for x in responses] == [
        ("model", "completed", 3), ("ours", "completed", 0)]
    (create,) = [line for line in record if line["kind"] == "response_create"]
    assert create["result"] == "sent" and create["for"] == [responses[0]["response_id"]]
    end = record[-1]
    assert end["reason"] == "closed_by_service" and end["tool_calls"] == 3 and end["responses"] == 2


async def test_record_path_is_safe_for_odd_call_ids(tmp_path):
    assert record_path(tmp_path, "rtc_ok-1").name == "rtc_ok-1.jsonl"
    odd = record_path(tmp_path, "../../etc/passwd")
    assert odd.parent == tmp_path / "calls" and "/" not in odd.name and odd.name.endswith(".jsonl")


async def test_a_new_actor_for_the_same_call_appends_its_block(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        await r.run_call("rtc_twice", steady("clean_close"))
        actor = r.actor("rtc_twice")
        with real_time_limit():
            assert await actor.run() == "call_gone"
        record = r.record("rtc_twice")
    assert [line["kind"] for line in record].count("start") == 2
    assert [line["reason"] for line in record if line["kind"] == "end"] == ["closed_by_service", "call_gone"]


async def test_actor_api_key_provider_is_called_per_connect(tmp_path, autojump_clock):
    calls = []

    def provider():
        calls.append(1)
        return KEY

    async with rig(tmp_path) as r:
        actor, service = r.memory_actor("rtc_provider", api_key=provider)
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            (await service.next_connection()).close(1006)    # a drop: the next connect asks again
            (await service.next_connection()).close(1000)
    assert actor.end_reason == "closed_by_service" and len(calls) == 2
    assert service.keys == [KEY, KEY] and isinstance(actor, CallActor)


async def test_an_unreadable_key_config_is_a_failed_connect_that_is_retried(tmp_path, autojump_clock):
    """The key provider reads the journal config; an I/O error there
    (``ConfigUnreadable``) is one failed connect attempt, retried after the
    backoff like any other, never a crash of the call."""
    from voiceactors.voice_config import ConfigUnreadable

    attempts = []

    def provider():
        attempts.append(1)
        if len(attempts) == 1:
            raise ConfigUnreadable("could not read config.json: Input/output error")
        return KEY

    async with rig(tmp_path) as r:
        actor, service = r.memory_actor("rtc_unreadable", api_key=provider)
        async with trio.open_nursery() as n:
            n.start_soon(actor.run)
            (await service.next_connection()).close(1000)
        record = r.record("rtc_unreadable")
    assert actor.end_reason == "closed_by_service"
    assert len(attempts) == 2 and actor.reconnects == 1 and len(service.keys) == 1
    (reconnect,) = [line for line in record if line["kind"] == "reconnect"]
    assert reconnect["attempt"] == 1 and reconnect["close_code"] is None
