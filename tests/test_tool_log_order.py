"""A call's tool log lines come in the order things happened.

A fresh reusable read is answered by the executor inside the call's own
step (``ToolExecutor.answer_now``, which writes its ``tool.run`` line at
once). The protocol's ``tool.prefetched`` / ``tool.started`` lines, emitted
as effects after the ``Prefetch`` / ``StartTool`` effect they describe,
came *after* that ``tool.run``: a log that said the read ran before it was
asked for. Whole calls against the simulator (the sideband in memory), debug lines
captured in order.
"""

from __future__ import annotations

from structlog.testing import capture_logs

from calls_support import BRIEF_ME_ONCE, assert_clean_protocol, rig, steady


def _brief_scenario() -> object:
    return steady(BRIEF_ME_ONCE)


def _tool_lines(logs: list[dict], call_id: str) -> list[str]:
    """The call's tool lines, in the order they were logged."""
    ids = {x["tool_call_id"] for x in logs if x.get("call_id") == call_id and x["event"] == "tool.run"}
    return [x["event"] for x in logs if x["event"].startswith("tool.") and x.get("tool_call_id") in ids]


async def test_an_in_step_answer_is_logged_after_the_prefetch_and_start_it_answers(tmp_path, autojump_clock):
    with capture_logs() as logs:
        async with rig(tmp_path, tool_reuse_s=1e6) as r:
            await r.run_call("rtc_warm", _brief_scenario())
            actor, sc = await r.run_call("rtc_step", _brief_scenario())
    assert actor.answered_in_step == 1
    assert_clean_protocol(sc, creates=1)
    lines = _tool_lines(logs, "rtc_step")
    assert "tool.prefetched" in lines, lines        # the simulator sends the arguments before the item's end
    assert lines.index("tool.prefetched") < lines.index("tool.run"), lines
    assert lines.index("tool.run") < lines.index("tool.finished"), lines
    warm = _tool_lines(logs, "rtc_warm")           # through the inbox: the same order
    assert warm.index("tool.prefetched") < warm.index("tool.run") < warm.index("tool.finished"), warm


def _position(effects: list, kind: type, event: str | None = None) -> int:
    from voiceactors.call.protocol import Log
    for n, effect in enumerate(effects):
        if isinstance(effect, kind) and (event is None or (isinstance(effect, Log) and effect.event == event)):
            return n
    raise AssertionError(f"no {kind.__name__} {event or ''} in {effects}")


def test_the_protocol_logs_a_prefetch_and_a_start_before_handing_them_over():
    """The actor carries out effects in order, and a ``Prefetch`` or a
    ``StartTool`` may be answered (and its ``tool.run`` logged) while it
    is carried out: the line saying it was asked for goes first."""
    from voiceactors.call.protocol import Log, Prefetch, StartTool
    from test_call_protocol import Wire, args_done, created, done, item_added, item_done

    w = Wire()
    effects = w.server(created("r1"), item_added("r1", "c1"), args_done("r1", "c1", "{}"))
    assert _position(effects, Log, "tool.prefetched") < _position(effects, Prefetch)
    w = Wire()     # no arguments before the item's end: no prefetch, the start runs it
    effects = w.server(created("r1"), item_added("r1", "c1"), item_done("r1", "c1"), done("r1"))
    assert _position(effects, Log, "tool.started") < _position(effects, StartTool)
