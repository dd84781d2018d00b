"""The raw capture of a call's server events (setting ``record_events``):
what the simulator sent, as received, with connections, closes, no secrets,
no audio, bounded."""

from __future__ import annotations

import json

import trio

from calls_support import rig, steady
from voiceactors.call.event_capture import EventCapture, capture_path, read_capture

SECRET_KEY = "sk-proj-capturetest0123456789"
EPHEMERAL = "ek_capturetest0123456789abcdef"


async def test_a_call_is_captured_event_by_event_with_its_connections(tmp_path, autojump_clock):
    async with rig(tmp_path, record_events=True) as r:
        actor, sim_call = await r.run_call("rtc_cap", steady("drop_and_resume"))
    path = capture_path(r.settings.state_dir, "rtc_cap")
    (block,) = read_capture(path)
    head, *lines = block
    assert head["kind"] == "capture" and head["version"] == 1 and head["call_id"] == "rtc_cap"
    events = [line["event"] for line in lines if line["kind"] == "event"]
    # exactly what the simulator sent, in order (it drops once: two connections)
    assert events == sim_call.sent
    kinds = [line["kind"] for line in lines if line["kind"] != "event"]
    assert kinds == ["connect", "close", "connect", "close", "end"]
    closes = [line["code"] for line in lines if line["kind"] == "close"]
    assert closes == [1006, 1000]
    assert [line["connection"] for line in lines if line["kind"] == "connect"] == [1, 2]
    times = [line["t"] for line in lines]
    assert times == sorted(times) and times[0] >= 0
    assert lines[-1] == {**lines[-1], "events": len(events), "dropped": 0, "audio_dropped": 0}


async def test_secrets_are_never_written_and_audio_is_dropped(tmp_path, autojump_clock):
    async with rig(tmp_path, record_events=True) as r:
        r.sim.add_call("rtc_secret", [{"sleep": 0.5}, {"close": 1000}])
        sim_call = r.sim.calls["rtc_secret"]

        async def inject() -> None:
            await sim_call.wait_until(lambda c: c.connection is not None)
            await r.sim.inject("rtc_secret", {"type": "session.updated", "event_id": "e1", "session": {
                "type": "realtime", "client_secret": {"value": EPHEMERAL, "expires_at": 1},
                "instructions": f"never say {SECRET_KEY}"}})
            await r.sim.inject("rtc_secret", {"type": "response.output_audio.delta", "event_id": "e2",
                                              "response_id": "r", "item_id": "i", "output_index": 0,
                                              "content_index": 0, "delta": "AAAA" * 1000})
            await r.sim.inject("rtc_secret", "not json at all")

        r.nursery.start_soon(inject)
        await r.run_call("rtc_secret")
    text = capture_path(r.settings.state_dir, "rtc_secret").read_text()
    assert SECRET_KEY not in text and EPHEMERAL not in text and "[redacted]" in text
    assert "AAAA" not in text
    (block,) = read_capture(capture_path(r.settings.state_dir, "rtc_secret"))
    assert block[-1]["kind"] == "end" and block[-1]["audio_dropped"] == 1
    assert any(line["kind"] == "frame" and "not JSON" in line["note"] for line in block)


async def test_at_the_bound_the_capture_says_truncated_and_counts_the_rest(tmp_path, autojump_clock):
    capture = EventCapture("rtc_big", tmp_path, started=trio.current_time(), max_chars=1000)
    frame = json.dumps({"type": "response.output_audio_transcript.delta", "delta": "x" * 180})
    async with trio.open_nursery() as nursery:
        await nursery.start(capture.run)
        for _ in range(10):
            capture.frame(frame, trio.current_time())
        nursery.cancel_scope.cancel()
    (block,) = read_capture(capture_path(tmp_path, "rtc_big"))
    kinds = [line["kind"] for line in block]
    written = 1000 // len(frame)
    assert kinds == ["capture"] + ["event"] * written + ["truncated", "end"]
    assert block[-1]["dropped"] == 10 - written and block[-1]["events"] == written


async def test_a_capture_that_cannot_be_written_does_not_touch_the_call(tmp_path, autojump_clock):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "captures").write_text("a file where the folder should be")
    async with rig(tmp_path, record_events=True) as r:
        actor, sim_call = await r.run_call("rtc_nodisk", steady("single_tool"))
    assert actor.end_reason == "closed_by_service" and sim_call.response_creates == 1
    assert actor.capture is not None and actor.capture.failed
    assert [line["kind"] for line in r.record("rtc_nodisk")][-1] == "end"


async def test_off_by_default_nothing_is_captured(tmp_path, autojump_clock):
    async with rig(tmp_path) as r:
        actor, _ = await r.run_call("rtc_plain", steady("single_tool"))
    assert actor.capture is None and not (r.settings.state_dir / "captures").exists()
