"""Redis requests and CPU per feed event of the shared feed's writer (issue
18; docs/benchmarks.md § 16).

What it measures: ``--calls`` calls in one trio run, each doing ``--rounds``
tool rounds that publish a round's feed events through a ``FeedHub`` whose
sink is a ``SharedFeed`` on a throwaway ``redis-server`` (unix socket, no
persistence): the user's transcript and ``tool.started``, ``--tool-ms``
later ``tool.finished``, the assistant's transcript and ``usage``; then a
think time drawn from ``--think-s`` (seeded; each call starts at a random
point of its first think). When the calls are done the writer is stopped,
which writes what is left (as a stopping server does), and the streams are
checked to hold every event. Reported per 1,000 events: our process's CPU
(``time.process_time`` from the first publish until the writer stopped), the
same for a sink that drops every event (``null``: the harness's own floor,
the calls and the feed without Redis), redis-server's CPU (psutil), and the
Redis requests (``INFO commandstats``: ``EVAL`` calls).

Each run is a child process with its own redis-server, so ``--before``
measures another checkout's ``SharedFeed`` in the same harness, interleaved
(it uses only APIs every version has: ``SharedFeed(...)``, ``run``,
``append`` through ``FeedHub.sink``)::

    git worktree add --detach /tmp/feedbatch-before 9bfff7a   # main before this change
    .venv/bin/python -m benchmarks.feed_write --calls 500 --rounds 6 --repeats 3 --before /tmp/feedbatch-before
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

import psutil

from benchmarks.connect_cost import throwaway_redis

HERE = Path(__file__).resolve().parent.parent


def _cpu_s(ps: psutil.Process) -> float:
    t = ps.cpu_times()
    return float(t.user + t.system)


# --- the child: one run, in the checkout on PYTHONPATH ----------------------------


class NullSink:
    """The floor: a sink that drops every event."""

    def append(self, call_id: str, event: dict[str, Any], queued: Any) -> None:
        pass


async def _one_call(feed: Any, rounds: int, tool_s: float, thinks: list[float], start_s: float) -> None:
    import trio

    await trio.sleep(start_s)
    for n in range(rounds):
        c = f"call_{n}"
        feed.transcript(role="user", text=f"what is on my calendar for day {n}", item_id=f"u{n}")
        feed.tool_started(tool="calendar.today", tool_call_id=c, epoch=1)
        await trio.sleep(tool_s)
        feed.tool_done(tool="calendar.today", tool_call_id=c, epoch=1, outcome="ok", duration_ms=tool_s * 1000)
        feed.transcript(role="assistant", text="You have a standup at nine and lunch with Sam at noon.",
                        item_id=f"a{n}")
        feed.usage(response_id=f"resp_{n}", model="gpt-realtime",
                   tokens={"input": 1200 + n, "output": 80, "cached": 900},
                   cost_usd=0.0021, call={"cost_usd": 0.0021 * (n + 1), "responses": n + 1})
        await trio.sleep(thinks[n])


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    from voiceactors import logs
    from voiceactors.actors.feed import FeedHub
    from voiceactors.cluster import redis_client as rc
    from voiceactors.cluster.shared_feed import SharedFeed

    logs.configure("json", "warning", stream=sys.stderr)
    rng = random.Random(args.seed)
    lo, hi = args.think_s
    plans = [([rng.uniform(lo, hi) for _ in range(args.rounds)], rng.uniform(0, hi)) for _ in range(args.calls)]
    hub = FeedHub()
    shared = None if args.null else SharedFeed(args.url, max_len=1000, retention_s=60.0, max_items=100,
                                               max_duration_s=3600.0, max_per_call=10, max_total=10)
    hub.sink = NullSink() if shared is None else shared
    evals0 = await _evals(rc, args.url) if shared is not None else 0
    stop_error = None
    try:
        async with trio.open_nursery() as outer:
            if shared is not None:
                await outer.start(shared.run)
            t0, c0 = time.monotonic(), time.process_time()
            async with trio.open_nursery() as calls:
                for n, (thinks, start_s) in enumerate(plans):
                    feed = hub.open(f"rtc_{n}", epoch=n + 1)
                    calls.start_soon(_one_call, feed, args.rounds, args.tool_ms / 1000, thinks, start_s)
            published = time.monotonic()
            # events the writer had not taken yet when the calls were done: a
            # writer that keeps up has a handful (``_waiting``: every version's)
            backlog = len(getattr(shared, "_waiting", ()))
            outer.cancel_scope.cancel()      # the writer's stop writes what is left
    except Exception as exc:                 # a stop that raised (the writer before ed009e2 could)
        stop_error = repr(exc)[:200]
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    events = args.calls * args.rounds * 5
    result = {"events": events, "cpu_s": round(cpu, 3), "wall_s": round(wall, 2),
              "drain_s": round(time.monotonic() - published, 3), "backlog_at_end": backlog}
    if stop_error is not None:
        result["stop_error"] = stop_error
    if shared is not None:
        result["evals"] = await _evals(rc, args.url) - evals0
        result["landed"] = await _landed(rc, args.url, args.calls)
        result["dropped"] = shared.dropped
    return result


async def _evals(rc: Any, url: str) -> int:
    async with rc.client(url) as redis:
        stats = await redis.info("commandstats")
        return int(stats.get("cmdstat_eval", {}).get("calls", 0))


async def _landed(rc: Any, url: str, calls: int) -> int:
    async with rc.client(url) as redis:
        return sum([int(await redis.xlen(rc.feed_key(f"rtc_{n}"))) for n in range(calls)])


# --- the parent: interleaved runs ------------------------------------------------------


def _run(args: argparse.Namespace, tree: Path, null: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="feed-write-") as tmp, throwaway_redis(Path(tmp)) as (url, redis_ps):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--url", url,
               "--calls", str(args.calls), "--rounds", str(args.rounds), "--tool-ms", str(args.tool_ms),
               "--think-s", str(args.think_s[0]), str(args.think_s[1]), "--seed", str(args.seed)]
        if null:
            cmd.append("--null")
        env = {**os.environ, "PYTHONPATH": str(tree)}
        r0 = _cpu_s(redis_ps)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:     # reported, and the other runs go on
            errors = [line.strip() for line in done.stderr.splitlines() if "Error" in line or "Exception" in line]
            return {"failed": (errors or ["?"])[-1][-300:]}
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        result["redis_cpu_s"] = round(_cpu_s(redis_ps) - r0, 3)
    return result


def _per_k(result: dict[str, Any]) -> str:
    if "failed" in result:
        return f"FAILED: {result['failed']}"
    k = result["events"] / 1000
    text = f"ours {1000 * result['cpu_s'] / k:.1f} ms CPU/1k events"
    if "evals" in result:
        text += (f", redis-server {1000 * result['redis_cpu_s'] / k:.1f} ms, {result['evals'] / k:.1f} EVAL/1k"
                 f", landed {result['landed']}/{result['events']}, dropped {result['dropped']}")
    text += f", wall {result['wall_s']} s, backlog at the end {result['backlog_at_end']}, drain {result['drain_s']} s"
    return text + (f", THE STOP RAISED {result['stop_error']}" if "stop_error" in result else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tool-ms", type=float, default=5.0)
    p.add_argument("--think-s", type=float, nargs=2, default=(1.0, 3.0))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--before", type=Path, help="another checkout: its SharedFeed, interleaved with this one")
    p.add_argument("--json", type=Path, default=None, help="also write every run here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--null", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        import trio

        print(json.dumps(trio.run(_child, args)))
        return 0
    trees = [("this", HERE)] + ([("before", args.before.resolve())] if args.before else [])
    print(f"{args.calls} calls x {args.rounds} rounds x 5 events, think {args.think_s[0]}-{args.think_s[1]} s; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    runs: list[dict[str, Any]] = []
    for repeat in range(1, args.repeats + 1):
        order = [("null", HERE)] + (trees if repeat % 2 else trees[::-1])
        for name, tree in order:
            stamp = time.strftime("%H:%M:%S", time.gmtime())
            result = _run(args, tree, name == "null")
            runs.append({"repeat": repeat, "tree": name, "at": stamp, "load": os.getloadavg()[0], **result})
            print(f"{stamp} repeat {repeat} {name}: {_per_k(result)}; load {os.getloadavg()[0]:.2f}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
