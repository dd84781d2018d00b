"""Where in a burst the slow rounds are (issue 14: the burst's p99).

Reads a burst run folder kept with ``--keep`` (``benchmarks.burst --peers
ours --keep``: the server's log ``server.stderr`` and its call records
``state/calls/*.jsonl``) and puts every round of the ``burst`` phase on
one wall clock: a call's record lines carry ``t`` (seconds since its actor
started), and its ``call.connected`` log line the wall time of its
``connect`` line, so each line's time is ``connected − t(connect) + t``.
Then, per ``--bin-s`` of the phase, it prints how many calls connected,
how many ``response.create``\\ s were sent and the server's own latencies
of those rounds: the record's ``turnaround_ms`` (``response.done`` read to
``response.create`` written) and the tool calls' ``overhead_ms`` (their
time in our code besides the tool's run), p50 / p99. The same split in
two: rounds while calls are still joining (up to the last
``call.connected``) against the rest.

These are the *server's* latencies, from the moment it read an event: the
time an event waits in the socket before the server gets to read it is
not in them (the simulator's ``output`` is the whole of it). So a bin
whose server-side p99 is low while the simulator's p99 is high says the
wait is before the read (the trio thread busy with other work: joins,
other calls' rounds), and where that is, the bins' connects say.

Run::

    .venv/bin/python -m benchmarks.burst --peers ours --keep --json B.json
    .venv/bin/python -m benchmarks.burst_tail <run folder from B.json's results[0].run_dir>
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

PHASE_PREFIX = "rtc_burst_burst-"


def _wall(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def connected_at(log: Path, prefix: str) -> dict[str, float]:
    """Each call's first ``call.connected`` wall time, by call id."""
    out: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        if '"call.connected"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        call_id = str(entry.get("call_id", ""))
        if call_id.startswith(prefix) and call_id not in out:
            out[call_id] = _wall(entry["timestamp"])
    return out


def rounds(calls: Path, connected: dict[str, float]) -> list[dict[str, Any]]:
    """Every ``response_create`` and ``tool_call`` line of the connected
    calls, with its wall time ``at``."""
    out: list[dict[str, Any]] = []
    for call_id, at in connected.items():
        path = calls / f"{call_id}.jsonl"
        if not path.exists():
            continue
        lines = [json.loads(raw) for raw in path.read_text(errors="replace").splitlines() if raw.strip()]
        connect_t = next((line["t"] for line in lines if line.get("kind") == "connect"), None)
        if connect_t is None:
            continue
        for line in lines:
            if line.get("kind") in ("response_create", "tool_call"):
                out.append({**line, "at": at - connect_t + line["t"], "call_id": call_id})
    return out


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _row(label: str, lines: list[dict[str, Any]], joins: int) -> str:
    turn = [float(x["turnaround_ms"]) for x in lines if x["kind"] == "response_create" and x.get("turnaround_ms") is not None]
    over = [float(x["overhead_ms"]) for x in lines if x["kind"] == "tool_call" and x.get("overhead_ms") is not None]

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    return (f"| {label} | {joins} | {len(turn)} | {fmt(_p(turn, 50))} / {fmt(_p(turn, 99))} "
            f"| {fmt(_p(over, 50))} / {fmt(_p(over, 99))} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the burst's rounds on one clock: where the slow ones are")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--bin-s", type=float, default=0.5)
    p.add_argument("--prefix", default=PHASE_PREFIX)
    args = p.parse_args(argv)
    connected = connected_at(args.run_dir / "server.stderr", args.prefix)
    if not connected:
        print("no call.connected lines for", args.prefix, file=sys.stderr)
        return 1
    lines = rounds(args.run_dir / "state" / "calls", connected)
    t0 = min(connected.values())
    last_join = max(connected.values())
    print(f"{len(connected)} calls connected over {last_join - t0:.2f} s; {len(lines)} round lines")
    print("| seconds after the first connect | calls connected | response.create | turnaround p50 / p99 ms "
          "| tool overhead p50 / p99 ms |")
    print("|---|---|---|---|---|")
    end = max(x["at"] for x in lines) if lines else last_join
    start = 0.0
    while t0 + start <= end:
        stop = start + args.bin_s
        in_bin = [x for x in lines if start <= x["at"] - t0 < stop]
        joins = sum(1 for at in connected.values() if start <= at - t0 < stop)
        print(_row(f"{start:.1f}–{stop:.1f}", in_bin, joins))
        start = stop
    print()
    print(_row("while joining", [x for x in lines if x["at"] <= last_join], len(connected)))
    print(_row("after the last join", [x for x in lines if x["at"] > last_join], 0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
