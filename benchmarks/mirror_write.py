"""Redis requests and CPU per tool round of the registry's mirror (issue 18;
docs/benchmarks.md § 23).

What it measures: one child process holds ``--calls`` leases in a
``RedisRegistry`` on a throwaway ``redis-server`` (unix socket, no
persistence); each call does ``--rounds`` tool rounds: the record's
``tool_started`` line noted (``note_record``, as the call record's writer
does), a tool time drawn from ``--tool-ms LOW HIGH`` (seeded), its
``tool_call`` line, then ``--think-s`` (each call starts at a random point of
its first think). Reported per round: the child's CPU (``time.process_time``
from the first line until the mirror is settled), the same with a
``LocalRegistry`` (``null``: the harness's own floor), Redis's requests
(``INFO commandstats``: ``EVAL``, less the acquires') and the hash writes
they carried (``HSET``/``HDEL``). Every call's mirror must end empty (checked).

Each run is a child process with its own redis-server, so
``BENCH_PEER_REPO`` (another checkout) measures that checkout's registry in
the same harness; ``--pairs`` interleaves it with this one::

    git worktree add --detach /tmp/rediscost-before d808858
    BENCH_PEER_REPO=/tmp/rediscost-before .venv/bin/python -m benchmarks.mirror_write --calls 500 --pairs 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.redis_cost import commandstats

REPO = Path(__file__).resolve().parent.parent


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    from voiceactors.cluster import redis_client as rc
    from voiceactors.cluster.registry import LocalRegistry, RedisRegistry

    registry: Any = LocalRegistry() if args.null else RedisRegistry(args.url, 10.0, node="bench")
    ids = [f"rtc_mirror_{i}" for i in range(args.calls)]
    rng = random.Random(args.seed)
    plans = [(rng.random() * args.think_s,
              [rng.uniform(args.tool_ms[0], args.tool_ms[1]) / 1000 for _ in range(args.rounds)]) for _ in ids]

    async def call(call_id: str, start: float, tools: list[float]) -> None:
        await trio.sleep(start)
        for n, tool_s in enumerate(tools):
            tool_call_id = f"{call_id}_r{n}"
            registry.note_record(call_id, {"kind": "tool_started", "tool_call_id": tool_call_id,
                                           "tool": "briefing.get", "arguments": "{}", "response_id": "resp_1",
                                           "effect": "read"})
            await trio.sleep(tool_s)
            registry.note_record(call_id, {"kind": "tool_call", "tool_call_id": tool_call_id, "tool": "briefing.get"})
            await trio.sleep(args.think_s)

    assert Path(sys.modules["voiceactors"].__file__ or "").resolve().is_relative_to(Path(args.repo).resolve())
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        for call_id in ids:
            await registry.acquire(call_id)
        t0, c0 = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as calls:
            for call_id, (start, tools) in zip(ids, plans):
                calls.start_soon(call, call_id, start, tools)
        await trio.sleep(0.3)       # the mirror's last pass
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        left = 0
        if not args.null:
            async with rc.client(args.url) as redis:
                for call_id in ids:
                    left += len(await redis.hgetall(rc.pending_key(call_id)))
        nursery.cancel_scope.cancel()
    return {"cpu_s": cpu, "wall_s": wall, "rounds": args.calls * args.rounds, "left_pending": left}


def _run(repo: Path, args: argparse.Namespace, null: bool) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="rediscost-mirror-"))
    sock = str(folder / "redis.sock")
    redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
                              "--save", "", "--appendonly", "no", "--dir", str(folder)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.02)
        before = commandstats(sock)
        # run as a script from the checkout measured: its voiceactors comes first (PYTHONPATH)
        child = [sys.executable, str(Path(__file__).resolve()), "--child", "--url", f"unix://{sock}",
                 "--calls", str(args.calls), "--rounds", str(args.rounds), "--think-s", str(args.think_s),
                 "--tool-ms", str(args.tool_ms[0]), str(args.tool_ms[1]), "--seed", str(args.seed), "--repo", str(repo)]
        if null:
            child.append("--null")
        env = {**os.environ, "PYTHONPATH": str(repo)}
        out = subprocess.run(child, cwd=repo, env=env, capture_output=True, text=True,
                             timeout=60 + args.rounds * (args.think_s + 1) * 2)
        if out.returncode != 0:
            raise SystemExit(f"child failed: {out.stderr[-1500:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        after = commandstats(sock)
    finally:
        redis.terminate()
        redis.wait(10)
    delta = {k: v - before.get(k, 0) for k, v in after.items()}
    if not null:        # each acquire is one EVAL with one HSET (the calls hash): not the mirror's
        delta["eval"] = delta.get("eval", 0) - args.calls
        delta["hset"] = delta.get("hset", 0) - args.calls
    rounds = result["rounds"]
    result.update(repo=str(repo), null=null, cpu_ms_per_round=round(1000 * result["cpu_s"] / rounds, 4),
                  evals_per_round=round(delta.get("eval", 0) / rounds, 3),
                  writes_per_round=round((delta.get("hset", 0) + delta.get("hdel", 0)) / rounds, 3),
                  when_utc=time.strftime("%H:%M:%S", time.gmtime()), load=os.getloadavg()[0])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--think-s", type=float, default=5.0)
    p.add_argument("--tool-ms", type=float, nargs=2, default=[2.0, 40.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pairs", type=int, default=1, help="BENCH_PEER_REPO's run then this checkout's, this many times")
    p.add_argument("--json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--null", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--repo", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        import trio

        print(json.dumps(trio.run(_child, args)))
        return 0
    other = os.environ.get("BENCH_PEER_REPO")
    results = []
    for _ in range(args.pairs):
        runs = [(Path(other), False)] if other else []
        runs += [(REPO, False), (REPO, True)]
        for repo, null in runs:
            r = _run(repo, args, null)
            results.append(r)
            print(f"{r['when_utc']} load {r['load']:.2f} {'null' if null else repo}: {r['cpu_ms_per_round']} ms CPU"
                  f" per round, {r['evals_per_round']} EVAL and {r['writes_per_round']} HSET+HDEL per round, "
                  f"{r['rounds']} rounds in {r['wall_s']:.1f} s, pending left {r['left_pending']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
