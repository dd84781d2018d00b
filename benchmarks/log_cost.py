"""What one log line costs the thread that logs it (issue 14, "cheap logs").

Configures logging exactly as the server does (``voiceactors.logs.configure``,
JSON, level ``info``) writing to a file (as an operator's redirected stderr),
then times, on one thread, ``--lines`` calls of:

* ``info`` — a ``tool.run`` line with the executor's fields, from a logger
  bound once (``get_logger(actor="executor")``), as the executor logs it;
* ``info_bound_call`` — a ``call.connected`` line from a logger bound with a
  ``call_id`` (as a call actor's);
* ``debug_filtered`` — a ``debug`` line with the same fields at level
  ``info`` (dropped: what it costs to not log);
* ``metrics`` — what the executor's per-tool metrics cost
  (``metrics.tool_finished`` as the executor calls it);
* ``scrub`` — the scrubber (``logs._scrub_processor``) alone on a
  ``tool.run`` line's fields (the dict's copy included).

Run as a file with ``PYTHONPATH=<another checkout>`` it times that
checkout's logging (a before/after pair)::

    PYTHONPATH=/tmp/roundcpu-before .venv/bin/python benchmarks/log_cost.py

Reported per kind: microseconds per call, the best of ``--repeats`` runs
(each run ``--lines`` calls; the best is the least disturbed by the
machine's other work) and the median.

Run::

    .venv/bin/python -m benchmarks.log_cost
    .venv/bin/python -m benchmarks.log_cost --lines 50000 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import structlog

from voiceactors import logs, metrics


def _time(fn: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def kinds() -> dict[str, Callable[[], None]]:
    executor = logs.get_logger(actor="executor")
    call = logs.get_logger(actor="call", call_id="rtc_bench-17")
    fields: dict[str, Any] = {"call_id": "rtc_bench-17", "tool_call_id": "call_abc123def456", "tool": "briefing.get",
                              "epoch": 3, "turn": 2, "duration_ms": 0.8, "outcome": "ok",
                              "output_chars": 412, "truncated": False, "delivered": True, "reused": False}
    return {
        "info": lambda: executor.info("tool.run", **fields),
        "info_bound_call": lambda: call.info("call.connected", epoch=0, reconnects=0),
        "debug_filtered": lambda: executor.debug("tool.run", **fields),
        "metrics": lambda: metrics.tool_finished("briefing.get", "ok", 0.0008),
        # the scrubber alone, on the tool.run line's fields as they reach it (the
        # event, actor, level and timestamp added by the processors before it)
        "scrub": lambda: logs._scrub_processor(None, "info", {**fields, **_ADDED}),
    }


_ADDED = {"event": "tool.run", "actor": "executor", "level": "info", "timestamp": "2026-12-02T01:08:14.123456Z"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the cost of one log line")
    p.add_argument("--lines", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    saved = structlog.get_config()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            with open(Path(tmp) / "server.log", "w", encoding="utf-8") as stream:
                logs.configure("json", "info", stream=stream)
                table = kinds()
                for name, fn in table.items():
                    _time(fn, 200)            # warm up (a logger is built on first use)
                    runs = [_time(fn, args.lines) for _ in range(args.repeats)]
                    print(f"{name:16s} best {min(runs):6.2f} µs  median {statistics.median(runs):6.2f} µs  "
                          f"runs {' '.join(f'{r:.2f}' for r in runs)}", flush=True)
    finally:
        structlog.configure(**saved)          # the file is gone: logging goes back where it was
    return 0


if __name__ == "__main__":
    sys.exit(main())
