"""Function calls a tool round costs on the call's per-frame path, counted, not timed.

``benchmarks.round_cpu``'s round of 28 frames on the server's path: the
hand-off's ``skippable`` on every frame, the 17 it lets through decoded with
``read_server_event(..., screened=True)`` and handed to ``CallProtocol``
(``handle_event``), the tool's answer and the writes reported, effects
collected, not carried out (the protocol's feed unlistened, as in the
burst, where no one subscribes); run under ``sys.setprofile``, which
sees every call: Python functions (``call``) and built-in ones (``c_call``); the Python functions' calls (a
frame each, the dearer kind) are reported on their own too.
Each is counted under the module of the function called (a built-in under
the module of its caller, so ``json.loads`` from ``events.py`` counts as
``voiceactors/realtime/events.py``'s). The harness's own calls
(``round_cpu.py``, the profiler hook) are not counted.

A count does not depend on the machine's load, unlike the CPU numbers of
``round_cpu`` and ``round_parts``, so it shows a cut of a few calls per
event exactly on a shared machine; what a call costs is theirs to say.
It uses only APIs every checkout since issue 14's views has, so the same
script counts an older one::

    .venv/bin/python -m benchmarks.round_calls
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/round_calls.py
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))   # run as a file: PYTHONPATH first, then here

from benchmarks import round_cpu
import voiceactors

_HARNESS = ("round_cpu.py", "round_calls.py")
_OURS = str(Path(voiceactors.__file__).parent) + "/"


def _module(filename: str) -> str:
    """``voiceactors/...`` for ours, the package for a library, ``stdlib:<module>`` for the standard library."""
    if filename.startswith(_OURS):     # by the package's own folder: a checkout may itself be named voiceactors
        return "voiceactors/" + filename[len(_OURS):]
    i = filename.find("site-packages/")
    if i >= 0:
        return filename[i + len("site-packages/"):].split("/")[0]
    i = filename.find("/lib/python3")
    if i >= 0:
        return "stdlib:" + filename[i + 1:].split("/", 2)[-1]
    return filename


def _rounds(rounds: int) -> Any:
    """The rounds' frames, and the function that plays them (the server's path)."""
    from voiceactors.actors import call_protocol as cp
    from voiceactors.realtime import events as rt

    protocol = cp.CallProtocol("rtc_bench", effect_of=lambda name: "read", debug_logs=False)
    if hasattr(protocol, "publishing"):
        protocol.publishing = lambda: False     # as the server's call with no feed subscriber (the burst's)
    only, budget = cp.HANDLED_EVENTS, protocol.log_budget

    def feed(message: Any) -> list[Any]:
        return [e for e in protocol.handle(message, 0.0) if isinstance(e, cp.Send)]

    def written(sends: list[Any]) -> None:
        while sends:
            sends = sends[1:] + feed(cp.Written(sends[0]))

    frames = [round_cpu.round_frames(n) for n in range(rounds)]
    answer_at = next(i for i, raw in enumerate(frames[0]) if json.loads(raw)["type"] == "response.done")

    def play() -> None:
        feed(cp.Connected())
        for n, raws in enumerate(frames):
            for i, raw in enumerate(raws):
                if rt.skippable(raw, only):       # the hand-off's screen (ws_frames)
                    protocol.skipped_frames(1)
                    continue
                event = rt.read_server_event(raw, only, budget, screened=True)
                if event is None:
                    protocol.skipped_frame()
                    continue
                sends = [e for e in protocol.handle_event(event, 0.0) if isinstance(e, cp.Send)]
                if i == answer_at and protocol.calls[f"call_{n}"].state == "running":
                    sends += feed(cp.ToolFinished(f"call_{n}", "briefing.get", '{"ok": true}', "ok", 0.3))
                written(sends)
    return frames, play, protocol


def count(rounds: int) -> dict[str, Any]:
    """Calls per round by module, over ``rounds`` rounds after 20 unmeasured ones."""
    _rounds(20)[1]()     # imports and first-use caches out of the count
    frames, play, protocol = _rounds(rounds)
    calls: collections.Counter[str] = collections.Counter()
    python_calls = [0]      # of them, calls of Python functions (a frame each), not of built-ins

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            filename = frame.f_code.co_filename
        elif event == "c_call":
            filename = frame.f_code.co_filename   # the caller's: a built-in has no frame of its own
        else:
            return
        if not filename.endswith(_HARNESS):
            calls[_module(filename)] += 1
            if event == "call":
                python_calls[0] += 1

    sys.setprofile(hook)
    try:
        play()
    finally:
        sys.setprofile(None)
    by_module = {name: round(n / rounds, 2) for name, n in calls.most_common()}
    return {"rounds": rounds, "frames_per_round": len(frames[0]), "creates": len(protocol.creates),
            "tool_calls": len(protocol.calls), "calls_per_round": round(sum(calls.values()) / rounds, 2),
            "python_calls_per_round": round(python_calls[0] / rounds, 2), "by_module": by_module}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    result = count(args.rounds)
    print(f"{result['calls_per_round']} calls per round ({result['frames_per_round']} frames, "
          f"{result['rounds']} rounds), {result['python_calls_per_round']} of them of Python functions")
    for name, n in list(result["by_module"].items())[:args.top]:
        print(f"  {n:8.2f}  {name}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
