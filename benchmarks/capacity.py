"""Capacity: how many concurrent calls one server process holds, and what an idle call costs.

What it measures:

* **step-up** — the ``benchmarks.roundtrip`` workload (one ``briefing.get``
  round trip per call every ``--gap`` s, plus ``--rate-hz`` transcript deltas
  per call) at increasing call counts (``--steps``, default 250 500 1000
  1500); a step passes when the tool round trip p99 (simulator's
  ``response.done`` → our ``response.create``) is under ``--target-ms``
  (50). It stops after the first failing step. Reported per step: output and
  create p50/p99/max, our CPU and the simulator's, protocol errors.
* **idle memory** — ``--idle`` call counts joined with no script (the calls
  only hold their sideband open); resident memory per call = (RSS with the
  calls joined and settled − RSS before joining) / calls. ``--idle-peers``
  adds the same measurement for the other peers.

* **workers** (``--workers N``) — the same step-up against a whole
  ``voiceactors serve --workers N`` (the ``served`` peer: HTTP connects, one
  TCP connection each, so the kernel spreads them over the workers) and, at
  each step just before it, against one ``voiceactors serve`` process in the
  same harness; each series stops at its first failing step. Reported: the
  most calls at create p99 ≤ ``--target-ms`` for both and their ratio (the
  issue's target is ≥ 1.8×). CPU is the whole process tree's (parent,
  workers, private redis-server).

* **join rate** (``--join-rate N``) — the peer joins the calls at most N a
  second (``BENCH_JOIN_RATE``, read by the ``ours`` and ``served`` peers)
  instead of as fast as it can (the default: the ``served`` peer's 8 connect
  threads back to back). The verdict is the same (create p99 over every round
  of the step); each step also reports the create p99 of the rounds that
  started while calls were still joining (``join``) and of those after the
  last call joined (``steady``), from the sim's ``create_phases``. At a slow
  rate the first calls may end before the last join: keep ``--rounds`` ×
  ``--gap`` above calls ÷ rate (the step's line says how long the join took).

The simulator runs in its own process, so on this 2-core machine the two
processes share the cores: a step where the simulator itself is near a full
core measures the harness as much as the server (its CPU is printed).

Run::

    .venv/bin/python -m benchmarks.capacity
    .venv/bin/python -m benchmarks.capacity --steps 250 500 --rounds 5 --idle 500 1000
    .venv/bin/python -m benchmarks.capacity --steps 100 --rate-hz 0     # tool traffic only
    .venv/bin/python -m benchmarks.capacity --workers 2 --idle --steps 250 500 750 1000 1250 1500
    .venv/bin/python -m benchmarks.capacity --sim lean --workers 2 --idle --steps 500 750 1000 1250 1500 \\
        --rounds 4 --gap 5 --rate-hz 0     # the lean peer (benchmarks/lean_sim.py) as the load generator
    .venv/bin/python -m benchmarks.capacity --sim lean --workers 2 --idle --steps 1250 1500 1750 \\
        --rounds 8 --gap 5 --rate-hz 0 --join-rate 100     # calls joining at 100/s (the burst's rate)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import machine_facts, write_json
from benchmarks.roundtrip import report_line, run_sideband


def idle_memory(peer: str, calls: int, settle_s: float = 3.0, sim: str = "simulator") -> dict[str, Any]:
    r = run_sideband(peer, calls, workload="idle", idle_settle_s=settle_s, tag="idle", sim=sim)
    delta = (r["rss_joined"] or 0) - r["rss_before"]
    return {"peer": peer, "calls": calls, "calls_connected": r["calls_connected"],
            "rss_before_mib": round(r["rss_before"] / 2**20, 1), "rss_joined_mib": round((r["rss_joined"] or 0) / 2**20, 1),
            "kib_per_call": round(delta / 1024 / max(1, calls), 1), "join_s": r["join_s"],
            "errors": r["error_codes"], "handshakes_rejected": r["handshakes_rejected"]}


def phases_text(r: dict[str, Any]) -> str:
    """The step's create p99 apart: while calls joined, and after the last joined."""
    phases = r.get("create_phases") or {}
    join, steady = (_p99_text(phases.get(name) or {}) for name in ("join", "steady"))
    return f"join {r.get('join_s')} s: create p99 {join}, steady after it {steady}"


def _p99_text(s: dict[str, Any]) -> str:
    return f"{s['p99']:.1f} ms (n={s['n']})" if s.get("n") else "n/a"


def step_up(steps: list[int], *, rounds: int, gap: float, rate_hz: float, target_ms: float,
            log_level: str, peer: str = "ours", sim: str = "simulator") -> list[dict[str, Any]]:
    out = []
    for n in steps:
        r = run_sideband(peer, n, rounds=rounds, gap=gap, rate_hz=rate_hz, log_level=log_level, tag="cap", sim=sim)
        p99 = r["create_ms"]["p99"]
        complete = r["calls_connected"] == n and r["missing_create"] == 0 and not r["timed_out"]
        r["passed"] = bool(complete and p99 == p99 and p99 <= target_ms)
        out.append(r)
        print(report_line(r) + f" | {phases_text(r)} | {'PASS' if r['passed'] else 'FAIL'} "
              f"(create p99 {p99:.1f} ms)", flush=True)
        if not r["passed"]:
            break
    return out


def _served(workers: int, n: int, **kw: Any) -> dict[str, Any]:
    os.environ["BENCH_SERVE_WORKERS"] = str(workers)     # read by the served peer (spawn passes the env on)
    try:
        r = run_sideband("served", n, tag=f"cap-w{workers}", **kw)
    finally:
        os.environ.pop("BENCH_SERVE_WORKERS", None)
    r["workers"] = workers
    return r


def step_up_workers(steps: list[int], workers: int, *, rounds: int, gap: float, rate_hz: float,
                    target_ms: float, log_level: str, sim: str = "simulator") -> list[dict[str, Any]]:
    """At each step one ``serve`` process, then ``serve --workers N``; a series
    that failed a step runs no further steps."""
    out: list[dict[str, Any]] = []
    going = {1: True, workers: True}
    for n in steps:
        for w in (1, workers):
            if not going[w]:
                continue
            r = _served(w, n, rounds=rounds, gap=gap, rate_hz=rate_hz, log_level=log_level, sim=sim)
            p99 = r["create_ms"]["p99"]
            complete = r["calls_connected"] == n and r["missing_create"] == 0 and not r["timed_out"]
            r["passed"] = bool(complete and p99 == p99 and p99 <= target_ms)
            going[w] = r["passed"]
            out.append(r)
            print(f"workers={w} " + report_line(r) + f" | {phases_text(r)} | {'PASS' if r['passed'] else 'FAIL'} "
                  f"(create p99 {p99:.1f} ms)", flush=True)
        if not any(going.values()):
            break
    return out


def _capacity(steps: list[dict[str, Any]]) -> int:
    passed = [s["calls"] for s in steps if s["passed"]]
    return max(passed) if passed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="*", default=[250, 500, 1000, 1500])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--gap", type=float, default=1.0)
    p.add_argument("--rate-hz", type=float, default=20.0)
    p.add_argument("--target-ms", type=float, default=50.0)
    p.add_argument("--peer", default="ours", help="the peer stepped up (ours, served)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--idle", type=int, nargs="*", default=[1000])
    p.add_argument("--idle-peers", nargs="*", default=["ours"])
    p.add_argument("--settle", type=float, default=3.0, help="seconds idle calls settle before RSS is read")
    p.add_argument("--workers", type=int, default=0,
                   help="step up `serve --workers N` and one `serve` process, interleaved (0: the runtime peer)")
    p.add_argument("--sim", choices=["simulator", "lean"], default="simulator",
                   help="the load generator: our simulator (default) or the lean peer (benchmarks/lean_sim.py)")
    p.add_argument("--join-rate", type=float, default=0.0,
                   help="the peer joins the calls at most N a second (0: as fast as it can, the default)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.join_rate > 0:
        os.environ["BENCH_JOIN_RATE"] = str(args.join_rate)     # read by the peers (spawn passes the env on)
    joining = f"joining at {args.join_rate:g}/s" if args.join_rate > 0 else "joining as fast as the peer can"
    facts = machine_facts()
    print(f"# machine: {facts}", flush=True)
    idle = []
    for peer in args.idle_peers:
        for n in args.idle:
            m = idle_memory(peer, n, args.settle, args.sim)
            idle.append(m)
            print(f"idle {peer:>8} calls={n:<5} {m['kib_per_call']} KiB/call "
                  f"(RSS {m['rss_before_mib']} -> {m['rss_joined_mib']} MiB, joined in {m['join_s']} s)", flush=True)
    if args.workers > 1:
        steps = step_up_workers(args.steps, args.workers, rounds=args.rounds, gap=args.gap, rate_hz=args.rate_hz,
                                target_ms=args.target_ms, log_level=args.log_level, sim=args.sim)
        one = _capacity([s for s in steps if s["workers"] == 1])
        many = _capacity([s for s in steps if s["workers"] == args.workers])
        print(f"capacity ({joining}): one serve process {one} calls, --workers {args.workers} {many} calls at create p99 <= "
              f"{args.target_ms} ms (ratio {many / one if one else float('nan'):.2f}; "
              f"steps tried: {[(s['workers'], s['calls']) for s in steps]})", flush=True)
        if args.json:
            write_json(Path(args.json), {"machine": facts, "argv": sys.argv, "idle": idle, "steps": steps})
        return 0
    steps = step_up(args.steps, rounds=args.rounds, gap=args.gap, rate_hz=args.rate_hz,
                    target_ms=args.target_ms, log_level=args.log_level, peer=args.peer,
                    sim=args.sim) if args.steps else []
    passed = [s["calls"] for s in steps if s["passed"]]
    print(f"capacity ({joining}): {max(passed) if passed else 0} calls with create p99 <= {args.target_ms} ms "
          f"(steps tried: {[s['calls'] for s in steps]}); output p99 per step: "
          f"{[round(s['output_ms']['p99'], 1) for s in steps]}", flush=True)
    if args.json:
        write_json(Path(args.json), {"machine": facts, "argv": sys.argv, "idle": idle, "steps": steps})
    return 0


if __name__ == "__main__":
    sys.exit(main())
