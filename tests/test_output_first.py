"""An output leaves before the frames behind it in the same socket read are handled.

The simulator writes a whole turn at once (coalesced writes), so the
tool's ``response.output_item.done`` and the ``response.done`` behind it
reach our reader in one read. With the answer already there (a fresh
reusable read, answered in the call's step at
``function_call_arguments.done``), the output is ready at the item's done:
its bytes go to the socket in that frame's step, not after the rest of the
read (the ``response.done``'s usage, record line and feed event) has been
handled. Observed at the socket: trio's ``SocketStream.send_all`` (the
library's) and ``os.write`` on the sideband's descriptor (``ws_frames.start_send``'s
write of a frame the socket takes whole) wrapped to note, at each of the
call's sends, whether the protocol had seen the ``response.done`` yet (its
batch's status).
"""

from __future__ import annotations

from typing import Any

import pytest

from calls_support import BRIEF_ME_ONCE, Sideband, assert_clean_protocol, rig, run_in_step, steady, watch_output_writes

SCENARIO = steady(BRIEF_ME_ONCE)


async def test_an_in_step_output_leaves_before_its_response_done_is_handled(tmp_path: Any, autojump_clock: Any,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, Any]] = []    # (call state, its batch's status) at each of the call's socket writes

    def note(actor: Any, call: Any) -> None:    # the call's output is the frame being written
        seen.append((call.tool_call_id, actor.batches[call.response_id].status))

    watched = watch_output_writes(monkeypatch, note)
    async with rig(tmp_path, sideband=Sideband.LOOPBACK, tool_reuse_s=1e6) as r:
        actor, sc = await run_in_step(r, watched, SCENARIO)
    assert actor.answered_in_step == 1
    assert_clean_protocol(sc, creates=1)
    (tool_call_id,) = sc.tool_calls
    # written while its response was still open to the protocol (status None:
    # the response.done behind it in the same read not handled yet)
    assert seen == [(tool_call_id, None)]
