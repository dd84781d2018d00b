"""Peers side by side, same workload, same run: ours, the asyncio baseline, the Agents SDK.

What it measures, for each peer (``benchmarks.peers``), one after the other
in one invocation against a fresh simulator process each time:

* the ``benchmarks.roundtrip`` workload at ``--calls`` (default 1 and 100):
  output and create round trips p50/p99, the peer's CPU, and the ratio
  ours/peer of each percentile (below 1: ours is faster);
* the shipped ``parallel_tools`` scenario at ``--scenario-calls`` calls
  (three tool calls in one response: exactly one ``response.create`` may
  follow): protocol errors the simulator sent
  (``conversation_already_has_active_response`` ...), violations it recorded
  (``response.create`` while outputs were missing, ``wait_outputs`` timeouts);
* the shipped ``barge_in_during_tool`` scenario (the user barges in while the
  tool-carrying response is still active): tool calls left unanswered, and
  ``response.create`` events sent after the barge-in (the scenario expects
  none: the model answers the new turn itself, so each one makes the model
  speak an extra, stale reply — the simulator answers it with a default
  response rather than an error, so it is counted here).

Run::

    .venv/bin/python -m benchmarks.peers_compare
    .venv/bin/python -m benchmarks.peers_compare --peers ours baseline --calls 1 20 --rounds 3
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import fmt, machine_facts, write_json
from benchmarks.roundtrip import PEERS, run_sideband


def protocol_summary(r: dict[str, Any]) -> dict[str, Any]:
    return {"calls": r["calls"], "error_codes": r["error_codes"], "violations": r["violations"],
            "violation_examples": r["violation_examples"][:3], "unanswered": r["unanswered"],
            "duplicate_outputs": r["duplicate_outputs"], "response_creates": r["response_creates"],
            "responses": r["responses"], "timed_out": r["timed_out"]}


def ratio(a: float, b: float) -> float:
    if not (a == a and b == b) or b == 0:
        return math.nan
    return round(a / b, 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", nargs="+", choices=sorted(PEERS), default=["ours", "baseline", "agents"])
    p.add_argument("--calls", type=int, nargs="+", default=[1, 100])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--gap", type=float, default=1.0)
    p.add_argument("--rate-hz", type=float, default=20.0)
    p.add_argument("--scenario-calls", type=int, default=20, help="0 skips the scenarios")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    facts = machine_facts()
    print(f"# machine: {facts}", flush=True)
    results: dict[str, Any] = {}
    for peer in args.peers:
        res: dict[str, Any] = {"roundtrip": {}}
        for n in args.calls:
            r = run_sideband(peer, n, rounds=args.rounds, gap=args.gap, rate_hz=args.rate_hz, tag="peers")
            res["roundtrip"][n] = r
            print(f"{peer:>8} roundtrip calls={n:<4} output {fmt(r['output_ms'])} | create {fmt(r['create_ms'])} "
                  f"| cpu {r['cpu']['peer']['machine_pct']}% | errors {r['error_codes'] or 0} "
                  f"violations {r['violations']} unanswered {r['unanswered']}", flush=True)
        for scenario in ("parallel_tools", "barge_in_during_tool") if args.scenario_calls > 0 else ():
            r = run_sideband(peer, args.scenario_calls, workload=f"scenario:{scenario}", tag="peers")
            res[scenario] = protocol_summary(r)
            extra = f"response.create after barge-in {r['response_creates']}" if scenario.startswith("barge") else ""
            print(f"{peer:>8} {scenario:<21} calls={args.scenario_calls} errors {r['error_codes'] or 0} "
                  f"violations {r['violations']} unanswered {r['unanswered']} {extra}", flush=True)
        results[peer] = res
    if "ours" in results:
        for peer in results:
            if peer == "ours":
                continue
            for n in args.calls:
                a, b = results["ours"]["roundtrip"][n], results[peer]["roundtrip"][n]
                line = {f"{m}_{q}": ratio(a[f"{m}_ms"][q], b[f"{m}_ms"][q])
                        for m in ("output", "create") for q in ("p50", "p99")}
                results[peer].setdefault("ratio_ours_over_peer", {})[n] = line
                print(f"ours/{peer} calls={n}: {line}", flush=True)
    if args.json:
        write_json(Path(args.json), {"machine": facts, "argv": sys.argv, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
