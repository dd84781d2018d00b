"""Each process's CPU in one series of ``benchmarks.capacity --workers N``.

``capacity`` reports one CPU number for the served peer's whole process tree
(the driver, the ``serve`` parent, the workers, the private redis-server).
Run this beside it to see the parts: it waits for the series asked for to
start (``--series 1``: a ``serve`` without ``--workers``; ``--series 2``: a
``serve --workers``), waits ``--after`` seconds (past the join, into the
steady rounds), then prints each process's share of a core, user and system
apart, over ``--window`` seconds: every process of the served peer's tree
and the lean peer (``benchmarks.lean_sim``), and ``--pid``, any other
process to include (e.g. a redis-server of your own behind
``BENCH_SERVE_REDIS``).

    python -m benchmarks.tree_cpu --series 2 > tree-w2.txt &
    python -m benchmarks.capacity --sim lean --workers 2 --idle --steps 2750 --rounds 4 --gap 5 --rate-hz 0

docs/benchmarks.md § 45 used it.
"""

from __future__ import annotations

import argparse
import time

import psutil

SERVED = "benchmarks.peers.served"
LEAN = "benchmarks.lean_sim"


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return ""


def _find(marker: str) -> psutil.Process | None:
    for process in psutil.process_iter():
        if marker in _cmdline(process):
            return process
    return None


def _series_started(peer: psutil.Process, series: int) -> bool:
    """Whether the served peer's server of this series runs."""
    try:
        kids = peer.children(recursive=True)
    except psutil.NoSuchProcess:
        return False
    for kid in kids:
        command = _cmdline(kid)
        if "voiceactors.cli serve" in command and (("--workers" in command) == (series > 1)):
            return True
    return False


def _wait_for_series(series: int, timeout_s: float) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        peer = _find(SERVED)
        if peer is not None and _series_started(peer, series):
            return peer
        time.sleep(0.2)
    raise SystemExit(f"tree_cpu: series {series} did not start within {timeout_s:g} s")


def _times(processes: list[psutil.Process]) -> dict[int, tuple[float, float, str]]:
    out = {}
    for process in processes:
        try:
            t = process.cpu_times()
            out[process.pid] = (t.user, t.system, _cmdline(process).strip() or process.name())
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--series", type=int, choices=[1, 2], default=2)
    p.add_argument("--after", type=float, default=10.0, help="seconds from the series' start to the window")
    p.add_argument("--window", type=float, default=12.0)
    p.add_argument("--pid", type=int, action="append", default=[], help="another process to include")
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    peer = _wait_for_series(args.series, args.timeout)
    time.sleep(args.after)
    processes = [peer, *peer.children(recursive=True), *(psutil.Process(pid) for pid in args.pid)]
    lean = _find(LEAN)
    if lean is not None:
        processes.append(lean)
    before = _times(processes)
    start = time.monotonic()
    time.sleep(args.window)
    after = _times(processes)
    wall = time.monotonic() - start
    for pid, (user, system, command) in after.items():
        if pid not in before:
            continue
        u, s = (100 * (user - before[pid][0]) / wall, 100 * (system - before[pid][1]) / wall)
        print(f"{pid:7d} {u + s:6.1f} % of a core (user {u:5.1f}, system {s:5.1f})  {command[-70:]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
