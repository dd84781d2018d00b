"""Where one thread of a running process spends its wall time, from /proc (Linux).

Reads ``/proc/<pid>/task/<tid>/stat``, ``wchan`` and ``stack`` (``stack``
needs root) ``--samples`` times, ``--interval`` apart, and prints the share
of samples in each scheduler state (``R`` running or runnable, ``S``
sleeping, ``D`` in uninterruptible I/O), the kernel function each sleep
waits in (``futex_do_wait``: a lock, for a Python thread most often the
GIL; ``do_epoll_wait``: trio's I/O wait, idle) and the thread's CPU over
the window. "Runnable" and "running" are one state here: a thread at
``R`` in most samples with less CPU than that is waiting for a core.

    python -m benchmarks.thread_states <pid>                 # the main thread
    python -m benchmarks.thread_states <pid> --tid <tid> --samples 400

docs/benchmarks.md § 43 used it on a server's trio thread during a join.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from pathlib import Path


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _state_and_cpu(task: Path) -> tuple[str, int] | None:
    stat = _read(task / "stat")
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()     # the name may hold spaces or parentheses
    return fields[0], int(fields[11]) + int(fields[12])      # state, utime + stime in ticks


def sample(pid: int, tid: int, samples: int, interval: float) -> dict[str, object]:
    task = Path(f"/proc/{pid}/task/{tid}")
    states: collections.Counter[str] = collections.Counter()
    waits: collections.Counter[tuple[str, str]] = collections.Counter()
    stacks: collections.Counter[tuple[str, str]] = collections.Counter()
    first = _state_and_cpu(task)
    if first is None:
        raise SystemExit(f"no thread {tid} in process {pid}")
    start, ticks0, ticks1 = time.monotonic(), first[1], first[1]
    for _ in range(samples):
        now = _state_and_cpu(task)
        if now is None:
            break
        state, ticks1 = now
        states[state] += 1
        waits[(state, _read(task / "wchan") or "-")] += 1
        if state != "R":
            frames = _read(task / "stack").splitlines()[:4]
            stacks[(state, " | ".join(f.split(" ", 1)[-1] for f in frames))] += 1
        time.sleep(interval)
    elapsed = time.monotonic() - start
    return {"states": states, "waits": waits, "stacks": stacks,
            "cpu_core_pct": (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / elapsed * 100}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pid", type=int)
    p.add_argument("--tid", type=int, help="the thread (default: the main thread, tid = pid)")
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--interval", type=float, default=0.02, help="seconds between samples")
    args = p.parse_args(argv)
    r = sample(args.pid, args.tid or args.pid, args.samples, args.interval)
    states = r["states"]
    assert isinstance(states, collections.Counter)
    total = sum(states.values()) or 1
    print("states: " + ", ".join(f"{s} {n / total:.1%}" for s, n in states.most_common())
          + f"; CPU {r['cpu_core_pct']:.0f} % of a core")
    for label in ("waits", "stacks"):
        counter = r[label]
        assert isinstance(counter, collections.Counter)
        for (state, where), n in counter.most_common(8):
            print(f"  {label[:-1]} {n / total:6.1%} {state} {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
