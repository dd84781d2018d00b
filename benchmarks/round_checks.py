"""What the compiled checks of a tool round's acted-on frames cost, timed on one thread.

``benchmarks.round_cpu``'s round: its 17 acted-on frames decoded once, then
each checked by its type's check (``events.SERVER_CHECKS``, compiled from
the SDK models by ``event_view.compile_checks``) ``--rounds`` times; the
best of ``--repeats`` runs in microseconds per round (the least disturbed
by the machine's other work), and per event type. With ``--before
<checkout>`` that checkout's ``voiceactors/realtime/event_view.py`` compiles
checks from the same SDK models in this process, and both are timed in
turn (interleaved, this checkout's second): a before/after pair on one
machine, minutes apart at most::

    .venv/bin/python -m benchmarks.round_checks --before /tmp/roundcpu-before
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks import round_cpu


def _checks_of(checkout: Path) -> dict[str, Callable[[Any], bool]]:
    from voiceactors.realtime import events

    spec = importlib.util.spec_from_file_location("before_event_view", checkout / "voiceactors/realtime/event_view.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checks: dict[str, Callable[[Any], bool]] = module.compile_checks(events.SERVER_EVENTS.by_type)
    return checks


def _best_us(pairs: list[tuple[Callable[[Any], bool], Any]], rounds: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(rounds):
            for check, obj in pairs:
                check(obj)
        best = min(best, (time.perf_counter() - t0) / rounds * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    from voiceactors.actors.call_protocol import HANDLED_EVENTS
    from voiceactors.realtime import events

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, help="another checkout whose checks are timed too")
    p.add_argument("--rounds", type=int, default=500)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--pairs", type=int, default=3)
    args = p.parse_args(argv)
    objs = [o for o in (json.loads(raw) for raw in round_cpu.round_frames(0)) if o["type"] in HANDLED_EVENTS]
    series: dict[str, dict[str, Callable[[Any], bool]]] = {}
    if args.before is not None:
        series["before"] = _checks_of(args.before)
    series["this"] = events.SERVER_CHECKS
    for name, checks in series.items():
        assert all(checks[o["type"]](o) for o in objs), name     # every frame of the round passes
    for n in range(args.pairs):
        line = []
        for name, checks in series.items():
            pairs = [(checks[o["type"]], o) for o in objs]
            line.append(f"{name} {_best_us(pairs, args.rounds, args.repeats):6.2f}")
        print(f"pair {n + 1}: µs per round ({len(objs)} checks): " + "  ".join(line), flush=True)
    for o in objs:
        cells = []
        for name, checks in series.items():
            cells.append(f"{name} {_best_us([(checks[o['type']], o)], args.rounds, args.repeats):5.2f}")
        print(f"  {o['type']:55s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
