"""The whole machine's busy share, every half second (``psutil.cpu_percent``).

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

import psutil


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("seconds", type=float)
    p.add_argument("--interval", type=float, default=0.5)
    args = p.parse_args(argv)
    start = time.monotonic()
    while time.monotonic() - start < args.seconds:
        busy = psutil.cpu_percent(interval=args.interval)     # idle and I/O wait count as not busy
        print(f"{time.monotonic() - start:6.1f} s  busy {busy:5.1f} %", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
