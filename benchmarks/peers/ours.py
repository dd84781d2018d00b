"""Peer: the voiceactors runtime (``open_runtime``) joining every call id.

The same actors ``voiceactors serve`` runs (BrainActor, ToolExecutor,
CallSupervisor with one CallActor per call), minus the HTTP front end: each
call is joined with the ``Connect`` message the ``/api/voice/connect`` route
sends. Logs go to ``--log`` as JSON lines at ``--log-level`` (the driver
reads ``tool.run`` lines for each tool's own duration). A probe task
records the event loop's lag (how late a 10 ms sleep wakes) into
``<log>.lag.json``; every garbage collection's pause goes to
``<log>.gc.json`` as ``[generation, ms, wall time]``. Like ``voiceactors serve``, the
peer freezes its startup heap and schedules full collections
(``gc_policy``) unless ``BENCH_NO_FREEZE`` / ``BENCH_GC_FULL_INTERVAL_S=0``
(the before/after experiments).

Started by the drivers; the stdin/stdout protocol is in ``benchmarks.peers``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

import trio

from voiceactors import gc_policy, logs
from voiceactors.messages import Connect, CountCalls, ask
from voiceactors.runtime import Runtime, open_runtime
from voiceactors.settings import Settings

from benchmarks.peers.args import call_ids, join_due, join_rate, peer_parser


async def _stdin_closed(scope: trio.CancelScope) -> None:
    while True:
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if not line or line.strip() == "STOP":
            scope.cancel()
            return


async def _lag_probe(out: list[float], period: float = 0.01) -> None:
    """Event-loop lag: how late a 10 ms sleep wakes up (ms), the time any
    ready task waits for the scheduler."""
    while True:
        t0 = trio.current_time()
        await trio.sleep(period)
        out.append((trio.current_time() - t0 - period) * 1000)


async def main(args: argparse.Namespace) -> None:
    ids = call_ids(args.prefix, args.calls)
    lags: list[float] = []
    settings = Settings(
        # experiment knob: BENCH_GC_FULL_INTERVAL_S=0 leaves full collections to Python
        gc_full_interval_s=float(os.environ.get("BENCH_GC_FULL_INTERVAL_S", Settings.gc_full_interval_s)),
        journal=Path(args.journal), state_dir=Path(args.state_dir), openai_base_url=args.base_url,
        openai_api_key_env=args.api_key, max_calls=max(1000, args.calls + 16),
        call_idle_timeout_s=3600.0, log_level=args.log_level,
        # experiment knob: BENCH_TOOL_REUSE_S=0 makes every read run in a worker thread
        tool_reuse_s=float(os.environ.get("BENCH_TOOL_REUSE_S", Settings.tool_reuse_s)),
    )
    with trio.move_on_after(args.max_seconds) as scope:
        async with open_runtime(settings) as rt:
            if not os.environ.get("BENCH_NO_FREEZE"):
                gc_policy.freeze_startup_heap()   # as serve does once serving
            print("STARTED", flush=True)
            async with trio.open_nursery() as upkeep:   # serve's scheduled full collections
                upkeep.start_soon(gc_policy.collect_on_schedule, settings.gc_full_interval_s)
                await _serve_calls(rt, ids, lags, scope)
                upkeep.cancel_scope.cancel()
    if scope.cancelled_caught:
        print("ours: stopped (stdin closed or --max-seconds)", file=sys.stderr, flush=True)
    if args.log != "/dev/null":
        Path(args.log + ".lag.json").write_text(json.dumps(lags))
        Path(args.log + ".gc.json").write_text(json.dumps(GC_PAUSES))


async def _serve_calls(rt: Runtime, ids: list[str], lags: list[float], scope: trio.CancelScope) -> None:
    """Join every call at GO, then wait until they have all ended."""
    await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)   # GO
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stdin_closed, scope)
        nursery.start_soon(_lag_probe, lags)
        rate, first = join_rate(), trio.current_time()
        for n, cid in enumerate(ids):
            await trio.sleep_until(join_due(first, n, rate))     # BENCH_JOIN_RATE: paced joins
            answer = await ask(rt.calls, lambda r: Connect(cid, r), timeout=10)
            if answer != "connected":
                print(f"connect {cid}: {answer}", file=sys.stderr, flush=True)
        print("JOINED", flush=True)
        while await ask(rt.calls, CountCalls, timeout=10) > 0:
            await trio.sleep(0.25)
        nursery.cancel_scope.cancel()


T = TypeVar("T")

GC_PAUSES: list[tuple[int, float, float]] = []


def _gc_pause(generation: int, seconds: float) -> None:
    GC_PAUSES.append((generation, round(seconds * 1000, 3), time.time()))


def _inline_run_sync() -> None:
    """Experiment only: make the worker-thread hops (``storage.run_sync`` for
    reads, ``storage.run_in_write_slot`` for writes, which the executor runs
    while holding a write-limiter token) call their function on the trio
    thread, to measure what the hop costs under load."""
    from voiceactors import storage

    async def run_sync(fn: Callable[..., T], *args: object, cancellable: bool = True) -> T:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    async def run_in_write_slot(fn: Callable[..., T], *args: object) -> T:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    storage.run_sync = run_sync
    storage.run_in_write_slot = run_in_write_slot


def run(argv: list[str] | None = None) -> int:
    args = peer_parser("voiceactors runtime peer").parse_args(argv)
    if os.environ.get("BENCH_GC_OFF"):   # experiment knob: no cyclic GC (are the stalls collections?)
        import gc
        gc.disable()
    thresholds = os.environ.get("BENCH_GC_THRESHOLD")
    if thresholds:   # experiment knob: "gen0,gen1,gen2" collector thresholds (default 700,10,10)
        import gc
        gc.set_threshold(*(int(x) for x in thresholds.split(",")))
    switch = os.environ.get("BENCH_SWITCH_INTERVAL")
    if switch:   # experiment knob: the GIL switch interval (default 0.005 s)
        sys.setswitchinterval(float(switch))
    if os.environ.get("BENCH_INLINE_SYNC"):   # experiment knob: no worker-thread hop
        _inline_run_sync()
    gc_policy.watch_pauses(_gc_pause)
    Path(args.state_dir).mkdir(parents=True, exist_ok=True)
    log_file = open(args.log, "w", buffering=1 << 16)
    logs.configure("json", args.log_level, stream=log_file)
    try:
        trio.run(main, args)
    finally:
        log_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(run())
