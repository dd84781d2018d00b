"""An in-step answer's output leaves before its ``tool.run`` line is written.

A fresh reusable read is answered by the executor in the call's own step at
``function_call_arguments.done`` (``ToolExecutor.answer_now``); its output
may go only at the item's ``response.output_item.done``, which the
simulator's coalesced writes put in the same socket read. The answer's
report (the ``tool.run`` line and its metrics) waited in front of the
output: it now runs after the output's write (``CallActor._later``), so
the output's bytes do not wait for a log line. What must hold: the line is
still written, once, with the same fields; the debug lines around it keep
their order (``tests/test_tool_log_order.py``); frames and records are not
touched. Observed at the socket: ``os.write`` on the sideband's descriptor
(``ws_frames.start_send``'s write of a frame the socket takes whole) and
trio's ``SocketStream.send_all`` wrapped to note, at the output's write,
whether its ``tool.run`` line had been logged yet.
"""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from calls_support import BRIEF_ME_ONCE, Sideband, assert_clean_protocol, rig, run_in_step, steady, watch_output_writes

SCENARIO = steady(BRIEF_ME_ONCE)

#: The fields of a ``tool.run`` line (docs/operations.md § Logs), besides the bound ones.
TOOL_RUN_FIELDS = {"call_id", "tool", "tool_call_id", "epoch", "turn", "duration_ms", "outcome", "output_chars",
                   "truncated", "delivered", "reused"}


def _runs(logs: list[dict[str, Any]], call_id: str) -> list[dict[str, Any]]:
    return [x for x in logs if x["event"] == "tool.run" and x.get("call_id") == call_id]


async def test_an_in_step_answers_output_is_written_before_its_tool_run_line(
        tmp_path: Any, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    logged_at_write: list[bool] = []     # at each write of the call's output: its tool.run line logged yet?

    def note(actor: Any, call: Any) -> None:    # the call's output is the frame being written
        logged_at_write.append(bool(_runs(logs, "rtc_step")))

    watched = watch_output_writes(monkeypatch, note)
    with capture_logs() as logs:
        async with rig(tmp_path, sideband=Sideband.LOOPBACK, tool_reuse_s=1e6) as r:
            actor, sc = await run_in_step(r, watched, SCENARIO)
    assert actor.answered_in_step == 1
    assert_clean_protocol(sc, creates=1)
    (tool_call_id,) = sc.tool_calls
    assert logged_at_write == [False]        # the output went first (True before: the line, then the output)
    (line,) = _runs(logs, "rtc_step")        # and the line is written, once, as it was
    assert TOOL_RUN_FIELDS <= set(line), line
    assert line["tool_call_id"] == tool_call_id and line["tool"] == "briefing.get"
    assert line["reused"] is True and line["delivered"] is True and line["outcome"] == "ok"
    (warm,) = _runs(logs, "rtc_warm")        # the inbox path's line: the same fields
    assert set(warm) == set(line), (warm, line)


async def test_a_report_put_off_by_the_reader_is_written_before_the_call_ends(tmp_path: Any,
                                                                                  autojump_clock: Any) -> None:
    """Several rounds, each answered in step: every ``tool.run`` line is
    written, one per tool call, in the order of the calls."""
    rounds = []
    for _ in range(3):
        rounds += [{"user_turn": {"text": "brief me"}},
                   {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
                   {"wait_outputs": {}}, {"response": {"text": "Okay."}}, {"sleep": 0.5}]
    scenario = steady([*rounds, {"close": 1000}])
    with capture_logs() as logs:
        async with rig(tmp_path, sideband=Sideband.LOOPBACK, tool_reuse_s=1e6) as r:
            await r.run_call("rtc_warm", SCENARIO)
            actor, sc = await r.run_call("rtc_three", scenario)
    assert actor.answered_in_step == 3
    assert_clean_protocol(sc, creates=3)
    assert [x["tool_call_id"] for x in _runs(logs, "rtc_three")] == list(sc.tool_calls)
