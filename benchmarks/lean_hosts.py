"""The lean peer's two roles and their reports (``benchmarks/lean_sim.py``
runs them: ``python -m benchmarks.lean_sim burst|host``).

* ``burst`` — the burst's sim side (``benchmarks.burst --sim lean``): the
  same ``PORT`` / ``JOIN`` / ``PHASE_DONE`` / ``STOP`` / ``DONE`` protocol and
  phase reports as ``benchmarks.burst.sim_run`` (without its queue
  measures: this peer has none), plus ``sim_loop_lag_ms``;
* ``host`` — ``benchmarks.sim_host``'s protocol, arguments and aggregate keys
  (``benchmarks.roundtrip`` / ``capacity --sim lean``), workloads
  ``roundtrip`` and ``idle``.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gc
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import percentile, summary
from benchmarks.lean_sim import LeanCall, LeanPeer


# --- reports (the simulator's keys, from the lean stamps) ------------------------------------------

def analyse(call: LeanCall) -> dict[str, Any]:
    """``benchmarks.sim_host.analyse`` of one call, on the wire (the lean peer has no queue)."""
    outputs: list[tuple[str, float]] = []
    create_ms: list[float] = []
    create_at: list[float] = []
    missing_create = 0
    creates = call.creates_at
    for batch in call.batches:
        t0 = batch.done_at[0]
        if t0 is None:
            continue
        outputs += [(i, (call.output_at[i] - t0) * 1000) for i in batch.call_ids if i in call.output_at]
        if all(i in call.output_at for i in batch.call_ids):
            last = max(call.output_at[i] for i in batch.call_ids)
            k = bisect.bisect_left(creates, last)
            if k < len(creates):
                create_ms.append((creates[k] - t0) * 1000)
                create_at.append(t0)
            else:
                missing_create += 1
    return {
        "outputs": outputs, "create_ms": create_ms, "create_at": create_at, "missing_create": missing_create,
        "error_codes": list(call.errors_sent), "violations": list(call.violations),
        "unanswered": call.pending_call_ids(), "tool_calls": len(call.tool_calls),
        "duplicate_outputs": sum(n - 1 for n in call.output_counts.values() if n > 1),
        "response_creates": call.response_creates, "connections": call.connections, "closed": call.closed,
        "responses": collections.Counter(f"{r.origin}:{r.status}" for r in call.responses),
    }


def output_times(call: LeanCall) -> list[float]:
    """``benchmarks.burst.output_times`` (wire): each tool call's output read − its output_item.done written."""
    done = call.item_done_at
    return [(call.output_at[c] - written) * 1000 for c in call.output_order
            if c in done and (written := done[c][0]) is not None]


def trace_events(call: LeanCall) -> list[dict[str, Any]]:
    return [json.loads(t) for t in call.trace or []]


def burst_phase_report(phase: Any, calls: list[LeanCall], joins: list[dict[str, Any]]) -> dict[str, Any]:
    """``benchmarks.burst.phase_report``'s keys (without the simulator's queue measures)."""
    from dataclasses import asdict

    outputs: list[float] = []
    creates: list[float] = []
    per_call_p99: list[float] = []
    protocol: collections.Counter[str] = collections.Counter()
    for call in calls:
        mine = output_times(call)
        outputs += mine
        if mine:
            per_call_p99.append(percentile(mine, 99))
        a = analyse(call)
        creates += a["create_ms"]
        protocol["errors"] += len(a["error_codes"])
        protocol["violations"] += len(a["violations"])
        protocol["unanswered"] += len(a["unanswered"])
        protocol["missing_create"] += a["missing_create"]
        protocol["duplicate_outputs"] += a["duplicate_outputs"]
        protocol["tool_calls"] += a["tool_calls"]
        protocol["closed"] += int(call.closed)
        protocol["frames_sent"] += call.frames_sent
    statuses = collections.Counter(str(j["status"]) for j in joins)
    report = {
        "phase": asdict(phase), "output_ms": summary(outputs), "create_ms": summary(creates),
        "rounds_done": len(outputs), "per_call_output_p99_ms": per_call_p99,
        "join_ms": summary(j["ms"] for j in joins if j["status"] == 200),
        "join_statuses": dict(statuses), **protocol,
        "violation_examples": [v for c in calls for v in c.violations][:3],
    }
    if calls and calls[0].trace is not None:
        report["sent_events_first_call"] = trace_events(calls[0])
    return report


# --- role: the burst's sim side (``benchmarks.burst --sim lean``) -----------------------------------

async def _burst_run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.burst import Phase, join_phase, call_steps

    phases = [Phase(**{**p, "think_ms": tuple(p["think_ms"])}) for p in json.loads(args.phases)]
    rng = random.Random(args.seed)
    peer = LeanPeer(coalesce=args.coalesce)
    reports: dict[str, Any] = {}
    lags: list[float] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(peer.serve, 0)
        nursery.start_soon(_loop_lag, lags)
        for phase in phases:       # the same draws, in the same order, as the simulator's side
            for n, cid in enumerate(phase.call_ids()):
                peer.calls[cid] = LeanCall(cid, call_steps(phase, rng), trace=args.trace and n == 0)
        print(f"PORT {port}", flush=True)
        by_name = {p.name: p for p in phases}
        with trio.move_on_after(args.timeout):
            while True:
                line = (await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)).strip()
                if not line or line == "STOP":
                    break
                _, name, server_port, host_header = line.split(" ", 3)   # JOIN <phase> <port> <host>
                phase = by_name[name]
                joins = await join_phase(peer, phase, int(server_port), host_header, rng, args.wait)
                reports[name] = burst_phase_report(phase, [peer.calls[c] for c in phase.call_ids()], joins)
                reports[name]["sim_loop_lag_ms"] = summary(lags)
                lags.clear()
                print(f"PHASE_DONE {name}", flush=True)
        nursery.cancel_scope.cancel()
    return {"phases": reports, "coalesce_writes": args.coalesce, "sim": "lean"}


async def _loop_lag(into: list[float], period_s: float = 0.05) -> None:
    """How late a ``period_s`` sleep wakes in this process (ms): the peer's own scheduling delay."""
    while True:
        t0 = trio.current_time()
        await trio.sleep(period_s)
        into.append((trio.current_time() - t0 - period_s) * 1000)


def burst_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="the lean peer as the burst's sim side")
    p.add_argument("--phases", required=True, help="JSON list of Phase fields")
    p.add_argument("--coalesce", action="store_true", help="one write per step (default: one per event)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--wait", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--trace", action="store_true", help="report the first call of each phase's frames")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    _quiet_process()
    result = trio.run(_burst_run, args)
    Path(args.out).write_text(json.dumps(result, default=str))
    print(f"DONE {args.out}", flush=True)
    return 0


# --- role: sim_host (``benchmarks.roundtrip`` / ``capacity`` ``--sim lean``) -------------------------

async def _host_run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.sim_host import aggregate, create_phases, make_scenario, play_calls, timeline

    rng = random.Random(args.seed)
    peer = LeanPeer(coalesce=args.coalesce)
    ids = [f"{args.prefix}-{n}" for n in range(args.calls)]
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(peer.serve, 0)
        for cid in ids:
            peer.calls[cid] = LeanCall(cid, make_scenario(args, rng).steps)
        print(f"PORT {port}", flush=True)
        calls = [peer.calls[c] for c in ids]
        connected_at, timed_out = await play_calls(nursery, calls, args.timeout)
        for call in calls:
            if not call.closed:
                peer.end_call(call)
        with trio.move_on_after(5.0):
            for call in calls:
                await call.wait_until(lambda c: c.connection is None)
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    per_call = {cid: analyse(peer.calls[cid]) for cid in ids}
    result = aggregate(per_call, peer.handshakes)
    result.update(create_by_second=timeline(per_call, connected_at), create_phases=create_phases(per_call, connected_at))
    result.update(workload=args.workload, timed_out=timed_out, wall_s=round(time.perf_counter() - started, 3),
                  sim="lean", frames_sent=sum(c.frames_sent for c in calls))
    return result


def host_main(argv: list[str]) -> int:
    from benchmarks.sim_host import parse_args

    argv = list(argv)
    coalesce = "--coalesce" in argv
    if coalesce:
        argv.remove("--coalesce")
    args = parse_args(argv)
    args.coalesce = coalesce
    if args.workload.startswith("scenario:"):
        raise SystemExit("the lean peer plays the roundtrip and idle workloads only (scenarios: the simulator)")
    _quiet_process()
    result = trio.run(_host_run, args)
    Path(args.out).write_text(json.dumps(result, default=str))
    print(f"DONE {args.out}", flush=True)
    return 0


def _quiet_process() -> None:
    # as the simulator hosts: no full collections walking the growing records mid-run
    gc.freeze()
    gc.disable()
