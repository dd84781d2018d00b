"""The whole machine's busy share, every half second, from /proc/stat (Linux).

Run beside a benchmark to see whether its cores are full at a moment the
benchmark's own averages smooth over (a join burst): each line is the
seconds since the start and the share of all cores' time not idle and not
waiting on I/O over the last interval.

    python -m benchmarks.machine_busy 170 > busy.txt &     # seconds to run

docs/benchmarks.md § 43 used it beside `benchmarks.capacity --workers 2`.
"""

from __future__ import annotations

import argparse
import time


def _totals() -> tuple[int, int]:
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]          # all, idle + iowait


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("seconds", type=float)
    p.add_argument("--interval", type=float, default=0.5)
    args = p.parse_args(argv)
    start = time.monotonic()
    before = _totals()
    while time.monotonic() - start < args.seconds:
        time.sleep(args.interval)
        now = _totals()
        total, idle = now[0] - before[0], now[1] - before[1]
        before = now
        busy = 100 * (1 - idle / total) if total else 0.0
        print(f"{time.monotonic() - start:6.1f} s  busy {busy:5.1f} %", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
