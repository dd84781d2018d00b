"""What a join costs the registry (issue 18): Redis requests and our CPU per
lease won, and per lease released, with connects arriving together.

What it measures, per run: a throwaway ``redis-server`` (unix socket, no
persistence) and one child Python process that starts a ``RedisRegistry``
(``--ttl``) and joins ``--calls`` call ids with ``--parallel`` joiners (the
``served`` peer's 8 connect threads: a joiner takes the next call id,
``acquire``s its lease, then spends ``--work-ms`` of CPU on the trio thread,
standing for the rest of a connect's work, ~5–6 ms in § 25). Then every
lease is released, ``--parallel`` at a time (many calls ending together).
Per phase: the child's CPU (``process_time``) per lease, the requests Redis
counted (``EVAL`` per lease, ``INFO commandstats`` before and after the
phase; the scripts' own commands are counted apart by Redis), and the
``acquire`` latency p50/p99. ``--work-ms 0`` is the best case for batching
(nothing else to do, every joiner's lease in flight at once).

``$BENCH_PEER_REPO`` (another checkout, e.g. ``git worktree add --detach
/tmp/before main``): the child imports that checkout's ``voiceactors``, so
before/after run in the same harness; ``--pairs`` interleaves them.

Run::

    .venv/bin/python -m benchmarks.lease_joins --calls 1000 --parallel 8 --work-ms 5
    BENCH_PEER_REPO=/tmp/before .venv/bin/python -m benchmarks.lease_joins --calls 1000 --pairs 3

Bounded: every wait has a timeout; every process is a child on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_pairs_arguments, machine_facts, run_plan
from benchmarks.connect_cost import throwaway_redis
from benchmarks.lease_renewals import _command_calls, _line_starting

# The child: run with the chosen checkout first on sys.path. For each phase it
# prints "<phase>-ready", waits for a line on stdin (the parent reads Redis's
# counts), runs it and prints its JSON.
CHILD = r"""
import json, sys, time, trio
from voiceactors.cluster.registry import RedisRegistry

def burn(ms):
    end = time.process_time() + ms / 1000
    while time.process_time() < end:
        pass

async def phase(name, items, parallel, step):
    print(f"{name}-ready", flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline)
    queue = iter(items)
    times = []
    async def joiner():
        for item in queue:
            t0 = trio.current_time()
            await step(item)
            times.append((trio.current_time() - t0) * 1000)
    cpu0, t0 = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(parallel):
            nursery.start_soon(joiner)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    times.sort()
    print(json.dumps({"phase": name, "cpu_s": cpu, "wall_s": wall, "p50_ms": times[len(times) // 2],
                      "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))]}), flush=True)

async def main(url, calls, parallel, work_ms, ttl):
    registry = RedisRegistry(url, ttl, node="bench")
    won = []
    async def join(call_id):
        lease = await registry.acquire(call_id)
        assert lease is not None
        won.append(lease)
        burn(work_ms)
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        await phase("join", [f"rtc_bench_{i}" for i in range(calls)], parallel, join)
        await phase("release", list(won), parallel, registry.release)
        print("done", flush=True)
        nursery.cancel_scope.cancel()

trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
"""


def run_once(repo: Path, calls: int, parallel: int, work_ms: float, ttl_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": calls, "parallel": parallel, "work_ms": work_ms}
    with tempfile.TemporaryDirectory(prefix="bench-joins-") as folder, \
            throwaway_redis(Path(folder)) as (url, _redis_ps):
        env = dict(os.environ, PYTHONPATH=str(repo))
        child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(calls), str(parallel), str(work_ms),
                                  str(ttl_s)], cwd=repo, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout is not None and child.stdin is not None
            for name in ("join", "release"):
                if _line_starting(child.stdout, f"{name}-ready") is None:
                    raise RuntimeError(f"the child did not reach {name}")
                before = _command_calls(url)
                child.stdin.write("go\n")
                child.stdin.flush()
                result = json.loads(_line_starting(child.stdout, "{") or "{}")
                after = _command_calls(url)
                evals = after.get("eval", 0) - before.get("eval", 0)
                out[name] = {"cpu_ms_per_lease": round(1000 * result["cpu_s"] / calls, 3),
                             "evals_per_lease": round(evals / calls, 3), "wall_s": round(result["wall_s"], 2),
                             "p50_ms": round(result["p50_ms"], 2), "p99_ms": round(result["p99_ms"], 2)}
            if _line_starting(child.stdout, "done") is None:
                raise RuntimeError("the child did not finish")
            child.wait(30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=8, help="joiners at once (the served peer's threads)")
    parser.add_argument("--work-ms", type=float, default=5.0, help="CPU per join besides the lease (ms)")
    parser.add_argument("--ttl", type=float, default=10.0, help="the lease TTL (the setting's default)")
    add_pairs_arguments(parser)
    parser.add_argument("--json", default=None, help="also write every run here")
    args = parser.parse_args(argv)
    plan = run_plan(parser, args, "before")
    print(json.dumps({"machine": machine_facts(), "args": vars(args)}), flush=True)
    runs = []
    for label, repo in plan:
        result = {"run": label, "utc": time.strftime("%H:%M:%S", time.gmtime()),
                  "load": round(os.getloadavg()[0], 2), **run_once(repo, args.calls, args.parallel, args.work_ms,
                                                                    args.ttl)}
        print(json.dumps(result), flush=True)
        runs.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_facts(), "args": vars(args), "runs": runs},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
