"""CPU of tool rounds through the call actor and the executor: what tracing costs.

What it measures: process CPU time (``time.process_time``, every thread) per
tool round of one call, ``--rounds`` rounds in a row, played by the
simulator on the in-memory transport (``voiceactors.testing.rig``: the real
``CallActor``, ``ToolExecutor``, record writer and log lines at ``info``, to
``/dev/null``; no sockets). A round: the user's turn, a response with one
``commitments.list`` call, its output, the spoken answer. The simulator's own
CPU is in the figure too; what matters is the difference between runs.

Tracing is off by default (no ``OTEL_*`` variable): every hook is one test
of ``tracing.ON``. Run against the checkout before the hooks (the runner's
side-by-side, or ``PYTHONPATH``), the ratio is what the hooks cost when off;
``--traced`` makes every span into the SDK's in-memory exporter, for scale::

    .venv/bin/python -m benchmarks.tracing_cost --rounds 300
    .venv/bin/python -m benchmarks.tracing_cost --rounds 300 --traced
    git worktree add --detach /tmp/before <commit>
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/tracing_cost.py --rounds 300
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TURN = [
    {"user_turn": {"text": "What do I owe people?", "duration_ms": 0}},
    {"response": {"tool_calls": [{"name": "commitments.list", "arguments": {"state": "open"}}]}},
    {"wait_outputs": {}},
    {"response": {"text": "Three things."}},
]


def _traced() -> Any:
    """Spans into the SDK's in-memory exporter (imported only when asked:
    the checkout before the hooks has no ``voiceactors.tracing``)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from voiceactors import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    return exporter


async def _call(folder: Path, rounds: int) -> tuple[float, int]:
    from voiceactors.testing.rig import rig, steady

    steps = [step for _ in range(rounds) for step in TURN] + [{"close": 1000}]
    async with rig(folder) as r:
        started = time.process_time()
        actor, _sim_call = await r.run_call("rtc_bench", steady(steps))
        return time.process_time() - started, len(actor.calls)


def run(rounds: int, traced: bool) -> dict[str, Any]:
    import trio

    from voiceactors import logs

    with open(os.devnull, "w") as sink, tempfile.TemporaryDirectory(prefix="va-trace-") as folder:
        logs.configure("json", "info", stream=sink)
        exporter = _traced() if traced else None
        try:
            cpu_s, tool_calls = trio.run(_call, Path(folder), rounds)
        finally:
            if exporter is not None:     # the runner's process goes on: no spans for what follows
                from voiceactors import tracing

                tracing.uninstall()
    return {"rounds": rounds, "traced": traced, "tool_calls": tool_calls,
            "spans": len(exporter.get_finished_spans()) if exporter is not None else 0,
            "cpu_s": round(cpu_s, 3), "us_per_round": round(cpu_s / rounds * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--traced", action="store_true", help="make spans (the SDK's in-memory exporter)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    result = run(args.rounds, args.traced)
    print(f"tracing {'on' if result['traced'] else 'off'}: {result['us_per_round']} us CPU per tool round "
          f"({result['rounds']} rounds, {result['tool_calls']} tool calls, {result['spans']} spans)")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
