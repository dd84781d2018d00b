"""A leased call's fence inside the call actor (``cluster/fence.py``), in
process against the simulator (the sideband in memory), on trio's clock
(``autojump_clock``): once the fence's deadline has passed the actor sends
no frame, opens no new sideband and sends no hangup, and ends ``shutdown``.
(The fence moving with Redis's grants, and a real paused process, are
tests/test_cluster_fence.py.)"""

from __future__ import annotations

import trio

from calls_support import rig, steady
from voiceactors.cluster.fence import SendFence

FENCE_S = 10.0


def _fence_from_now() -> SendFence:
    return SendFence(trio.current_time() + FENCE_S)


async def test_past_the_fence_a_tool_output_is_not_sent_and_the_call_ends_shutdown(tmp_path, autojump_clock):
    scenario = steady([
        {"sleep": 2 * FENCE_S},
        {"user_turn": {"text": "what is on today"}},
        {"response": {"tool_calls": [{"name": "calendar.today", "call_id": "call_r", "arguments": {}}]}},
        {"wait_outputs": {"timeout_s": 60}},
        {"sleep": 3600},
    ])
    # no idle timeout: autojump would jump to it while the read's thread works
    async with rig(tmp_path) as r:
        actor, sc = await r.run_call("rtc_fenced", scenario, fence=_fence_from_now())
        record = r.record("rtc_fenced")
    assert actor.end_reason == "shutdown"
    assert sc.tool_calls and "call_r" not in sc.outputs          # its answer never went out
    assert sc.received == [] and sc.response_creates == 0        # nor any other frame
    assert r.sim.hangups == [] and sc.connections == 1
    assert record[-1]["reason"] == "shutdown"


async def test_past_the_fence_an_idle_end_sends_no_hangup(tmp_path, autojump_clock):
    async with rig(tmp_path, call_idle_timeout_s=3 * FENCE_S) as r:
        actor, sc = await r.run_call("rtc_fenced_idle", "silence", fence=_fence_from_now())
    assert actor.end_reason == "idle_timeout"
    assert r.sim.hangups == [] and sc.received == []              # the hangup would end the call for its new holder


async def test_past_the_fence_a_dropped_sideband_is_not_opened_again(tmp_path, autojump_clock):
    scenario = [{"sleep": 2 * FENCE_S}, {"drop": True}, {"sleep": 3600}]
    async with rig(tmp_path, call_idle_timeout_s=3600.0, reconnect_base_s=0.1) as r:
        actor, sc = await r.run_call("rtc_fenced_drop", scenario, fence=_fence_from_now())
    assert actor.end_reason == "shutdown"
    assert sc.connections == 1 and sc.drops == 1 and r.sim.hangups == []
