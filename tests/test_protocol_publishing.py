"""``CallProtocol.publishing``: while the shell's feed has no listener, the
protocol builds none of the feed's events but ``client_events`` (queued for
polling either way); every other effect of every step is the same as with a
listener. Sans-IO: the benchmark round's frames fed to two protocols."""

from __future__ import annotations

import json
from typing import Any

from benchmarks import round_cpu
from voiceactors.call import protocol as cp
from voiceactors.realtime import events as rt

CLIENT_EVENTS = ({"type": "nav", "target": "today/journal/2026-03-26"},)


def _play(listened: bool, rounds: int = 3) -> list[list[Any]]:
    """Every step's effects over ``rounds`` rounds, the tool answered with a nav hint."""
    protocol = cp.CallProtocol("rtc_pub", effect_of=lambda name: "read", debug_logs=False)
    protocol.publishing = lambda: listened
    steps = [protocol.handle(cp.Connected(), 0.0)]
    for n in range(rounds):
        for raw in round_cpu.round_frames(n):
            event = rt.read_server_event(raw, cp.HANDLED_EVENTS)
            if event is None:
                continue
            steps.append(protocol.handle_event(event, 1.0 + n))
            sends = [e for e in steps[-1] if isinstance(e, cp.Send)]
            if json.loads(raw)["type"] == "response.function_call_arguments.done":
                steps.append(protocol.handle(cp.ToolFinished(f"call_{n}", "briefing.get", '{"ok": true}', "ok",
                                                             0.3, CLIENT_EVENTS), 1.0 + n))
                sends += [e for e in steps[-1] if isinstance(e, cp.Send)]
            for send in sends:
                steps.append(protocol.handle(cp.Written(send), 1.0 + n))
    return steps


def _comparable(effect: Any) -> Any:
    if isinstance(effect, cp.Send):   # fresh event ids
        return ("send", effect.event["type"], effect.tool_call_id)
    return effect


def test_an_unlistened_feed_gets_only_client_events_and_every_other_effect_is_the_same():
    heard, alone = _play(True), _play(False)
    assert len(heard) == len(alone)
    for with_listener, without in zip(heard, alone):
        kept = [_comparable(e) for e in with_listener
                if not isinstance(e, cp.Publish) or e.kind == "client_events"]
        assert [_comparable(e) for e in without] == kept
    published = {e.kind for step in heard for e in step if isinstance(e, cp.Publish)}
    assert {"transcript", "tool_started", "tool_done", "usage", "client_events"} <= published
    assert {e.kind for step in alone for e in step if isinstance(e, cp.Publish)} == {"client_events"}


def test_a_protocol_publishes_by_default():
    assert cp.CallProtocol("rtc_default").publishing() is True
