"""CPU of one tool round on the call actor's per-frame path, without sockets.

What it measures: process CPU time (``time.process_time``) per tool round of
what the call actor's reader does with each frame — decode it
(``read_server_event``, or ``parse_server_event`` on a checkout that has no
view), hand it to the ``CallProtocol`` and collect the effects — plus the
tool result and the writes being reported, for ``--rounds`` rounds of one
call in a row. A round is 28 frames as the service sends them: the user's
turn, a response with one ``briefing.get`` call (three argument deltas), its
output echoed, the spoken answer (eight transcript deltas). No sockets,
no scheduler, no executor: the protocol and the decoding only. Printing the
cost of the first and of the last ``--window`` rounds shows whether a long
call costs more per round than a short one.

It uses only APIs every version of the protocol has, so the same script
measures an older checkout::

    .venv/bin/python -m benchmarks.round_cpu --rounds 3000
    git worktree add --detach /tmp/before <commit>
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/round_cpu.py --rounds 3000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def round_frames(n: int) -> list[str]:
    r, c, a = f"resp_{n}", f"call_{n}", f"resp_{n}a"
    item = {"id": f"i{n}", "type": "function_call", "object": "realtime.item", "name": "briefing.get", "call_id": c}
    events: list[dict[str, Any]] = [
        {"type": "input_audio_buffer.speech_started", "event_id": "e", "audio_start_ms": 0, "item_id": f"u{n}"},
        {"type": "conversation.item.added", "event_id": "e", "previous_item_id": None,
         "item": {"id": f"u{n}", "type": "message", "role": "user", "status": "completed", "object": "realtime.item",
                  "content": [{"type": "input_audio", "transcript": None}]}},
        {"type": "conversation.item.input_audio_transcription.completed", "event_id": "e", "item_id": f"u{n}",
         "content_index": 0, "transcript": "what is on today", "usage": {"type": "duration", "seconds": 1.2}},
        {"type": "response.created", "event_id": "e",
         "response": {"id": r, "object": "realtime.response", "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "event_id": "e", "response_id": r, "output_index": 0,
         "item": {**item, "status": "in_progress", "arguments": ""}},
        {"type": "conversation.item.added", "event_id": "e", "previous_item_id": None,
         "item": {**item, "status": "in_progress", "arguments": ""}},
        *[{"type": "response.function_call_arguments.delta", "event_id": "e", "response_id": r, "item_id": f"i{n}",
           "output_index": 0, "call_id": c, "delta": "{"} for _ in range(3)],
        {"type": "response.function_call_arguments.done", "event_id": "e", "response_id": r, "item_id": f"i{n}",
         "output_index": 0, "call_id": c, "name": "briefing.get", "arguments": "{}"},
        {"type": "conversation.item.done", "event_id": "e", "previous_item_id": None,
         "item": {**item, "status": "completed", "arguments": "{}"}},
        {"type": "response.output_item.done", "event_id": "e", "response_id": r, "output_index": 0,
         "item": {**item, "status": "completed", "arguments": "{}"}},
        {"type": "response.done", "event_id": "e",
         "response": {"id": r, "object": "realtime.response", "status": "completed",
                      "usage": {"total_tokens": 10, "input_tokens": 5, "output_tokens": 5},
                      "output": [{**item, "status": "completed", "arguments": "{}"}]}},
        *[{"type": t, "event_id": "e", "previous_item_id": None,
           "item": {"id": f"o{n}", "type": "function_call_output", "object": "realtime.item", "call_id": c,
                    "output": "{\"ok\": true}"}} for t in ("conversation.item.added", "conversation.item.done")],
        {"type": "response.created", "event_id": "e",
         "response": {"id": a, "object": "realtime.response", "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "event_id": "e", "response_id": a, "output_index": 0,
         "item": {"id": f"m{n}", "type": "message", "role": "assistant", "object": "realtime.item",
                  "status": "in_progress", "content": []}},
        *[{"type": "response.output_audio_transcript.delta", "event_id": "e", "response_id": a, "item_id": f"m{n}",
           "output_index": 0, "content_index": 0, "delta": "word "} for _ in range(8)],
        {"type": "response.output_audio_transcript.done", "event_id": "e", "response_id": a, "item_id": f"m{n}",
         "output_index": 0, "content_index": 0, "transcript": "here is your day"},
        {"type": "response.output_item.done", "event_id": "e", "response_id": a, "output_index": 0,
         "item": {"id": f"m{n}", "type": "message", "role": "assistant", "object": "realtime.item",
                  "status": "completed", "content": [{"type": "output_audio", "transcript": "here is your day"}]}},
        {"type": "response.done", "event_id": "e",
         "response": {"id": a, "object": "realtime.response", "status": "completed", "output": []}},
    ]
    return [json.dumps(e) for e in events]


def run(rounds: int, window: int) -> dict[str, Any]:
    from voiceactors.call import protocol as cp
    from voiceactors.call.state import ToolOutcome
    from voiceactors.realtime import events as rt
    from voiceactors.tools.registry import READ   # (where an older commit has it too)

    protocol = cp.CallProtocol("rtc_bench", effect_of=lambda name: READ)
    viewed = hasattr(rt, "read_server_event")
    if hasattr(protocol, "debug_logs"):
        protocol.debug_logs = False        # as under the default log level

    def feed(message: Any) -> list[Any]:
        return [e for e in protocol.handle(message, 0.0) if isinstance(e, cp.Send)]

    def frame(raw: str) -> list[Any]:
        if viewed:
            event = rt.read_server_event(raw, cp.HANDLED_EVENTS, protocol.log_budget)
        else:
            event = rt.parse_server_event(raw, only=cp.HANDLED_EVENTS, budget=protocol.log_budget)
        if event is None:
            protocol.skipped_frame()
            return []
        return feed(cp.Received(event))

    def written(sends: list[Any]) -> None:
        while sends:
            sends = sends[1:] + feed(cp.Written(sends[0]))

    feed(cp.Connected())
    per_round: list[float] = []
    frames = [round_frames(n) for n in range(rounds)]
    # the call's response.done: there the tool answers and the writes are reported
    answer_at = next(i for i, raw in enumerate(frames[0]) if json.loads(raw)["type"] == "response.done")
    for n, raws in enumerate(frames):
        started = time.process_time()
        for i, raw in enumerate(raws):
            sends = frame(raw)
            if i == answer_at:
                tool_call_id = f"call_{n}"
                if protocol.calls[tool_call_id].state == "running":
                    sends += feed(cp.ToolFinished(tool_call_id, "briefing.get", '{"ok": true}', ToolOutcome.OK, 0.3))
            written(sends)
        per_round.append(time.process_time() - started)
    first, last = per_round[:window], per_round[-window:]
    return {"rounds": rounds, "frames_per_round": len(frames[0]), "view": viewed,
            "creates": len(protocol.creates), "tool_calls": len(protocol.calls),
            "us_per_round_all": round(sum(per_round) / rounds * 1e6, 1),
            "us_per_round_first": round(sum(first) / len(first) * 1e6, 1),
            "us_per_round_last": round(sum(last) / len(last) * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--window", type=int, default=100, help="rounds averaged at the start and at the end")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    result = run(args.rounds, min(args.window, args.rounds))
    print(f"{'view' if result['view'] else 'sdk models'}: {result['us_per_round_all']} us CPU per round "
          f"({result['frames_per_round']} frames); first {result['us_per_round_first']}, "
          f"last {result['us_per_round_last']} (of {result['rounds']} rounds); creates {result['creates']}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
