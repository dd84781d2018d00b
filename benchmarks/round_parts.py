"""Where a tool round's CPU goes on the call's own path, part by part, without sockets.

What it measures: process CPU time (``time.process_time``, the best of
``--repeats``) per tool round of each part of what our server does with a
round's frames that the do-nothing server (``benchmarks/peers/nothing.py``)
does not, each part alone over ``--rounds`` rounds of ``round_cpu``'s 28
frames:

* ``skip_check``: the hand-off's ``skippable`` on every frame (the deltas
  it drops, the acted-on ones it lets through);
* ``json_loads``: decoding the acted-on frames;
* ``checks``: the plain checks compiled from the SDK models, on the decoded frames;
* ``protocol``: ``CallProtocol`` on the views (the tool's answer and the
  writes reported as the shell reports them), effects collected, not carried out;
* ``usage``: a ``response.done``'s usage counted, its record line and feed
  event built (twice a round);
* ``record_lines``: the round's nine call-record lines rendered as the record
  writer renders them (``CallRecord.render``), and the block built;
* ``frames_out``: the round's two frames we write, encoded.

Not here: sockets, trio-websocket and wsproto (the do-nothing server pays
them too), the scheduler, the record's writes and fsyncs in worker threads
(``benchmarks.record_cpu``), the ``tool.run`` line (``benchmarks.log_cost``).
The parts are measured apart, so their sum is not ``round_cpu``'s figure
(that one also pays the harness and the interaction of the parts).

It uses APIs every checkout since issue 14's views has, so the same script
measures an older one::

    .venv/bin/python -m benchmarks.round_parts
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/round_parts.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))   # run as a file: PYTHONPATH first, then here

from benchmarks.round_cpu import round_frames

#: The nine lines a burst round writes to its call record (as the burst's records hold them).
_USAGE_LINE = {"response_id": "resp_f81e7fc6d7cc912374b9", "model": "gpt-realtime",
               "tokens": {"text_in": 422, "text_out": 2, "audio_in": 0, "audio_out": 16, "cached_in": 56},
               "cost_usd": 0.002766}
ROUND_LINES: list[dict[str, Any]] = [
    {"kind": "transcript", "t": 0.179, "role": "user", "item_id": "item_b07103827d499f6cb88c",
     "text": "What does my day look like?", "order": 5.0},
    {"kind": "tool_started", "t": 0.179, "tool_call_id": "call_18c8b339584e6325", "tool": "briefing.get",
     "response_id": "resp_2763ed258805f524131e", "epoch": 2, "turn": 2, "effect": "read", "arguments": "{}"},
    {"kind": "response", "t": 0.18, "response_id": "resp_2763ed258805f524131e", "status": "completed", "epoch": 2,
     "origin": "model", "tool_calls": ["call_18c8b339584e6325"]},
    {"kind": "usage", "t": 0.18, **_USAGE_LINE},
    {"kind": "tool_call", "t": 0.19, "tool_call_id": "call_18c8b339584e6325", "tool": "briefing.get",
     "response_id": "resp_2763ed258805f524131e", "epoch": 2, "turn": 2, "duration_ms": 0.2, "outcome": "ok",
     "output_bytes": 1672, "sends": 1, "delivered": True, "synthetic": False, "state": "confirmed",
     "overhead_ms": 1.1},
    {"kind": "response_create", "t": 0.19, "event_id": "evt_6f1d2c3b4a5968778695", "epoch": 2,
     "for": ["resp_2763ed258805f524131e"], "result": "sent", "response_id": "resp_a1", "turnaround_ms": 0.9},
    {"kind": "transcript", "t": 0.2, "role": "assistant", "item_id": "item_8d3d072a042457e68b2d", "text": "Okay.",
     "order": 8.0},
    {"kind": "response", "t": 0.2, "response_id": "resp_a1", "status": "completed", "epoch": 2, "origin": "ours",
     "tool_calls": []},
    {"kind": "usage", "t": 0.2, **_USAGE_LINE},
]
USAGE = {"total_tokens": 500, "input_tokens": 478, "output_tokens": 22,
         "input_token_details": {"text_tokens": 422, "audio_tokens": 56, "image_tokens": 0, "cached_tokens": 56,
                                 "cached_tokens_details": {"text_tokens": 0, "audio_tokens": 56, "image_tokens": 0}},
         "output_token_details": {"text_tokens": 2, "audio_tokens": 20}}
OUTPUT = json.dumps({"date": "2026-03-27", "events": [{"title": "Standup", "at": "09:30"}] * 24})


def _best(fn: Callable[[], None], rounds: int, repeats: int) -> float:
    """µs of CPU per round: the best of ``repeats`` runs of ``fn`` (which does ``rounds`` rounds)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return round(best / rounds * 1e6, 1)


def run(rounds: int, repeats: int) -> dict[str, Any]:
    from voiceactors.actors import call_protocol as cp
    from voiceactors.actors.call_record import CallRecord
    from voiceactors.actors.call_usage import meter_for
    from voiceactors.realtime import events as rt

    only = cp.HANDLED_EVENTS
    frames = [round_frames(n) for n in range(rounds)]
    acted = [[raw for raw in raws if not rt.skippable(raw, only)] for raws in frames]
    decoded = [[json.loads(raw) for raw in raws] for raws in acted]
    answer_at = next(i for i, raw in enumerate(acted[0]) if json.loads(raw)["type"] == "response.done")
    parts: dict[str, float] = {}

    def skip_check() -> None:
        skippable = rt.skippable
        for raws in frames:
            for raw in raws:
                skippable(raw, only)

    def json_loads() -> None:
        loads = json.loads
        for raws in acted:
            for raw in raws:
                loads(raw)

    def checks() -> None:
        table = rt.SERVER_CHECKS
        for objs in decoded:
            for obj in objs:
                table[obj["type"]](obj)

    views = [[rt.read_server_event(raw, only) for raw in raws] for raws in acted]

    def protocol() -> None:
        p = cp.CallProtocol("rtc_parts", effect_of=lambda name: "read")
        p.debug_logs = False

        def sends_of(effects: list[Any]) -> list[Any]:
            return [e for e in effects if isinstance(e, cp.Send)]

        sends_of(p.handle(cp.Connected(), 0.0))
        for n, round_views in enumerate(views):
            for i, view in enumerate(round_views):
                sends = sends_of(p.handle(cp.Received(view), 0.0))
                if i == answer_at and p.calls[f"call_{n}"].state == "running":
                    sends += sends_of(p.handle(cp.ToolFinished(f"call_{n}", "briefing.get", OUTPUT, "ok", 0.3), 0.0))
                while sends:
                    sends = sends[1:] + sends_of(p.handle(cp.Written(sends[0]), 0.0))

    def usage() -> None:
        meter = meter_for("gpt-realtime", (), 0.0)
        for n in range(rounds):
            for rid in (f"resp_{n}", f"resp_{n}a"):
                entry, _malformed = meter.count(rid, USAGE)
                line = meter.line(entry)
                _feed_event = {**line, "call": meter.totals()}
                meter.budget_reached_now(0.0)

    from voiceactors.actors import call_record as call_record_module
    render_line = getattr(call_record_module, "render_line", None)   # older checkouts: CallRecord.render
    record = CallRecord.__new__(CallRecord)      # its render alone: no file, no writer

    def record_lines() -> None:
        if render_line is not None:
            for _ in range(rounds):
                b"".join(map(render_line, ROUND_LINES))
            return
        render = getattr(record, "render")   # the older checkouts' method: not on today's CallRecord
        for _ in range(rounds):
            ("\n".join(render(ROUND_LINES)) + "\n").encode("utf-8")

    out_events = [rt.function_call_output("call_18c8b339584e6325", OUTPUT), rt.response_create()]

    from voiceactors.actors import call as call_module
    send_encoder = getattr(call_module, "_SEND_ENCODER", None)   # older checkouts: json.dumps per frame

    def frames_out() -> None:
        def dumps(event: Any) -> str:
            return json.dumps(event, ensure_ascii=False)
        encode = send_encoder.encode if send_encoder is not None else dumps
        for _ in range(rounds):
            for event in out_events:
                encode(event)

    for name, fn in [("skip_check", skip_check), ("json_loads", json_loads), ("checks", checks),
                     ("protocol", protocol), ("usage", usage), ("record_lines", record_lines),
                     ("frames_out", frames_out)]:
        parts[name] = _best(fn, rounds, repeats)
    return {"rounds": rounds, "repeats": repeats, "us_per_round": parts,
            "sum_us": round(sum(parts.values()), 1), "load_1m": os.getloadavg()[0],
            "when_utc": time.strftime("%H:%M:%S", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    result = run(args.rounds, args.repeats)
    import voiceactors
    result["code"] = str(Path(voiceactors.__file__).parent.parent)
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
