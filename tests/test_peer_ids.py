"""Peer-sent tool call ids are clipped in the logs (issue 11, leftovers).

A tool call id is the peer's string: the call actor and the executor log
it (``tool.started``, ``tool.finished``, the executor's ``tool_run`` line, …).
A 100 000-character id used to land whole in each of those lines. It must
still be answered with the exact id (the service matches outputs by it),
but every log line stays short: ids clipped to 64 characters, tool names to
128, like the other peer strings. On the real clock: a real tool runs in
a worker thread, and ``autojump_clock`` could jump past the scenario's hold
meanwhile.
"""

from __future__ import annotations

import io
import json

import structlog
import trio

from voiceactors import logs
from voiceactors.call.actor import CallActor
from calls_support import KEY, real_time_limit, rig

TURN_DONE = "conversation.item.input_audio_transcription.completed"
HOLD = [{"user_turn": {"text": "hi"}}, {"sleep": 600.0}, {"close": 1000}]


def _function_call(call_id: str, name: str, n: int) -> dict:
    return {"type": "response.output_item.done", "event_id": f"evt_{n}", "response_id": f"resp_{n}",
            "output_index": 0, "item": {"type": "function_call", "call_id": call_id, "name": name,
                                        "arguments": "{}", "status": "completed"}}


async def test_a_100000_character_tool_call_id_is_answered_and_clipped_in_every_log_line(tmp_path):
    buffer = io.StringIO()
    logs.configure("json", "debug", stream=buffer)
    known_id, unknown_id = "k" * 100_000, "u" * 100_000
    try:
        async with rig(tmp_path) as r:
            sc = r.sim.add_call("rtc_ids", HOLD)
            actor = CallActor(r.settings, "rtc_ids", r.executor.inbox, KEY, open_transport=r.memory_sideband("rtc_ids"))
            with real_time_limit(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(actor.run)
                    await sc.wait_until(lambda c: c.connection is not None)
                    # the user's turn first: its speech_started would cancel a read already running
                    with trio.fail_after(30):
                        while not any(e.get("type") == TURN_DONE for e in sc.sent):
                            await trio.sleep(0.01)
                    await r.sim.inject("rtc_ids", _function_call(known_id, "calendar.today", 1))
                    await r.sim.inject("rtc_ids", _function_call(unknown_id, "z" * 100_000, 2))
                    await sc.wait_until(lambda c: known_id in c.outputs and unknown_id in c.outputs)
                    await r.sim.end_call("rtc_ids", 1000)
    finally:
        structlog.reset_defaults()
    text = buffer.getvalue()
    lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    assert max(len(x) for x in text.splitlines()) < 2000            # no peer-sized id in any line
    # each answered once, with the exact id
    assert len(sc.outputs[known_id]) == 1 and "events" in json.loads(sc.outputs[known_id][0])
    assert json.loads(sc.outputs[unknown_id][0]) == {"error": "unknown tool"}
    runs = [x for x in lines if x.get("event") == "tool.run"]
    assert len(runs) == 2
    for run in runs:
        assert len(run["tool_call_id"]) <= 64 and len(run["tool"]) <= 128
    logged_ids = [x["tool_call_id"] for x in lines if isinstance(x.get("tool_call_id"), str)]
    assert len(logged_ids) > len(runs)                              # the call actor's lines too
    assert all(len(i) <= 64 for i in logged_ids)
