"""The call actor's decode of a tool round's acted-on frames, alone: CPU per round.

What it measures: process CPU time (``time.process_time``, the best of
``--repeats``) per round of ``events.read_server_event(raw, only,
screened=True)`` over the acted-on frames of ``round_cpu``'s rounds (17 a
round), as the call actor's reader calls it. It was written to show that
the lone-surrogate screen (``safe_text``: a frame with no backslash is told
by one memchr, docs/reliability.md § 14.1) costs nothing measurable.

It uses APIs every checkout since issue 14's views has, so the same script
measures an older one (alternate the two, several times)::

    .venv/bin/python -m benchmarks.screened_decode
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/screened_decode.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))   # run as a file: PYTHONPATH first, then here

from benchmarks.round_cpu import round_frames


def run(rounds: int, repeats: int) -> float:
    """µs of CPU per round (the best of ``repeats``)."""
    from voiceactors.actors import call_protocol as cp
    from voiceactors.realtime import events as rt

    only = cp.HANDLED_EVENTS
    acted = [raw for n in range(rounds) for raw in round_frames(n) if not rt.skippable(raw, only)]
    read = rt.read_server_event
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for raw in acted:
            read(raw, only, screened=True)
        best = min(best, time.process_time() - started)
    return round(best / rounds * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import voiceactors

    print(f"{run(args.rounds, args.repeats)} us per round ({Path(voiceactors.__file__).parent})")


if __name__ == "__main__":
    main()
