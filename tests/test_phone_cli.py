"""``voiceactors phone-call``: a child process asks the simulator a served
app talks to (found through the app's console configuration) to place a
call; the simulator posts the signed webhook, the app accepts the owner's
call, the keys pressed open its PIN, and the command prints what became of
it. A stranger's call is rejected and said so."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from child_support import Child
from test_phone_webhook import OWNER, SIM_KEY, STRANGER, make_settings, served, write_voice
from voiceactors.simulator import Simulator
from voiceactors.simulator import phone as sim_phone

SCENARIO = [
    {"sleep": 0.5},
    {"sleep": 4.0},                        # the caller keys the PIN meanwhile (--dtmf)
    {"user_turn": {"text": "What's on today?"}},
    {"response": {"tool_calls": [{"name": "calendar.today", "arguments": {}, "call_id": "call_today"}]}},
    {"wait_outputs": {}},
    {"response": {"text": "A quiet day."}},
    {"close": 1000},
]


async def phone_call(*args: str) -> tuple[int, str]:
    child = Child([sys.executable, "-m", "voiceactors.cli", "phone-call", *args],
                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert child.stdout is not None
    out = b""
    with trio.fail_after(60):
        while chunk := await child.stdout.receive_some():
            out += chunk
        code = await child.wait()
    return code, out.decode()


@pytest.mark.parametrize("caller, expected", [(OWNER, "accepted"), (STRANGER, "rejected")])
async def test_phone_call_places_a_call_through_the_servers_simulator(make_sample, tmp_path, caller, expected):
    journal = make_sample(days=2)
    secret = sim_phone.new_secret()
    write_voice(journal, webhook_secret=secret, phone={"allowed_callers": [OWNER], "pin": "2468"})
    sim = Simulator(SCENARIO, api_key=SIM_KEY)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        async with served(make_settings(journal, tmp_path / "state", sim)) as base:
            code, out = await phone_call("--server", base, "--from", caller, "--secret", secret, "--key", SIM_KEY,
                                         "--dtmf", "2468#", "--dtmf-after", "1", "--timeout", "40")
        nursery.cancel_scope.cancel()
    assert code == 0, out
    [call] = sim.calls.values()
    assert f"call {call.call_id} from {caller}" in out and f"'status': '{expected}'" in out
    if expected == "accepted":
        assert "pressed 2468#" in out and "tool calls: call_today; the call ended" in out
        assert "error" not in call.outputs["call_today"][0]
    else:
        assert "the call rejected with SIP 403" in out and call.rejected_with == 403
