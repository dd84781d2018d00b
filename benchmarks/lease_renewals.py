"""The cost of keeping N leases (issue 18): Redis requests/s and CPU.

What it measures, per repeat: a throwaway ``redis-server`` (unix socket, no
persistence) and one child Python process that starts a ``RedisRegistry``
(``--ttl``), acquires ``--leases`` leases and keeps each with
``cluster.leases.keep_lease`` (the supervisor's contract, in both the old and
the new code), then holds them ``--hold`` seconds. Over the hold window
(after every lease is kept): the child's CPU and redis-server's CPU (psutil,
user + system), and Redis's own count of commands (``INFO commandstats``,
reset at the window's start): the requests the holder sent (``EVAL`` and
``PING``; Redis counts the scripts' own ``GET``/``PEXPIRE`` apart, in
``commands_per_s``), per second.
Every lease must still be held at the end (checked: the run fails if not).

``$BENCH_PEER_REPO`` (another checkout, e.g. ``git worktree add --detach
/tmp/before main``): the child imports that checkout's ``voiceactors``, so
before/after run in the same harness. ``--pairs`` interleaves them.

Run::

    .venv/bin/python -m benchmarks.lease_renewals --leases 1000 --hold 30 --repeats 3
    BENCH_PEER_REPO=/tmp/before .venv/bin/python -m benchmarks.lease_renewals --leases 1000 --hold 30 --pairs 3

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
from typing import IO, Any

import psutil

from benchmarks.common import add_pairs_arguments, machine_facts, run_plan
from benchmarks.connect_cost import throwaway_redis

# The child: run with the chosen checkout first on sys.path. It prints "kept"
# once every lease is kept, then holds until stdin closes and prints how many
# leases it still holds.
CHILD = r"""
import sys, trio
from voiceactors.cluster.leases import keep_lease
from voiceactors.cluster.registry import RedisRegistry

async def main(url, leases, ttl):
    registry = RedisRegistry(url, ttl, node="bench")
    lost = []
    async def keep(lease):
        lost.append(await keep_lease(registry, lease, 0.5))
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        for i in range(leases):
            lease = await registry.acquire(f"rtc_bench_{i}")
            assert lease is not None
            nursery.start_soon(keep, lease)
        await trio.sleep(0.1)
        print("kept", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        held = sum(registry.lease_of(f"rtc_bench_{i}") is not None for i in range(leases))
        print(json.dumps({"held": held, "lost": len(lost)}), flush=True)
        nursery.cancel_scope.cancel()

import json
trio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
"""


def _line_starting(stream: IO[str], prefix: str) -> str | None:
    """The child's next line starting with ``prefix`` (its logs go to stdout too)."""
    for line in stream:
        if line.startswith(prefix):
            return line
    return None


def _cpu(ps: psutil.Process) -> float:
    t = ps.cpu_times()
    return t.user + t.system


def _redis_cli(url: str, *command: str) -> str:
    sock = url.removeprefix("unix://")
    return subprocess.run(["redis-cli", "-s", sock, *command], capture_output=True, text=True, timeout=10,
                          check=True).stdout


def _command_calls(url: str) -> dict[str, int]:
    calls = {}
    for line in _redis_cli(url, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line.partition(":")
            calls[name.removeprefix("cmdstat_")] = int(fields.split(",")[0].split("=")[1])
    return calls


def run_once(repo: Path, leases: int, hold_s: float, ttl_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-leases-") as folder, \
            throwaway_redis(Path(folder)) as (url, redis_ps):
        env = dict(os.environ, PYTHONPATH=str(repo))
        child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(leases), str(ttl_s)], cwd=repo, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdin is not None
            if _line_starting(child.stdout, "kept") is None:
                raise RuntimeError("the holder did not start")
            child_ps = psutil.Process(child.pid)
            _redis_cli(url, "CONFIG", "RESETSTAT")
            cpu0, rcpu0, t0 = _cpu(child_ps), _cpu(redis_ps), time.monotonic()
            time.sleep(hold_s)
            cpu1, rcpu1, t1 = _cpu(child_ps), _cpu(redis_ps), time.monotonic()
            calls = _command_calls(url)
            child.stdin.close()
            outcome = json.loads(_line_starting(child.stdout, "{") or "{}")
            child.wait(30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    if outcome.get("held") != leases or outcome.get("lost"):
        raise RuntimeError(f"leases were lost during the hold: {outcome}")
    window = t1 - t0
    calls.pop("config|resetstat", None)     # the harness's own
    # requests: what the holder sent (its scripts' own GET/PEXPIRE are counted apart by Redis)
    requests = sum(n for name, n in calls.items() if name not in ("get", "pexpire"))
    return {"leases": leases, "hold_s": round(window, 2), "ttl_s": ttl_s,
            "requests_per_s": round(requests / window, 2),
            "evals_per_s": round(calls.get("eval", 0) / window, 2),
            "commands_per_s": round(sum(calls.values()) / window, 2),
            "holder_cpu_ms_per_s": round((cpu1 - cpu0) * 1000 / window, 2),
            "redis_cpu_ms_per_s": round((rcpu1 - rcpu0) * 1000 / window, 2),
            "commands": calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--hold", type=float, default=30.0, help="seconds measured, once every lease is kept")
    parser.add_argument("--ttl", type=float, default=10.0, help="the lease TTL (the setting's default)")
    add_pairs_arguments(parser)
    parser.add_argument("--json", default=None, help="also write every run here")
    args = parser.parse_args(argv)
    plan = run_plan(parser, args, "peer")
    print(json.dumps({"machine": machine_facts(), "load": os.getloadavg(), "args": vars(args)}), flush=True)
    runs = []
    for label, repo in plan:
        result = {"run": label, "repo": str(repo), "started_load": os.getloadavg()[0],
                  **run_once(repo, args.leases, args.hold, args.ttl)}
        print(json.dumps(result), flush=True)
        runs.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_facts(), "args": vars(args), "runs": runs},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
