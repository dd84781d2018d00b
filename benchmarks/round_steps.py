"""Scheduler steps a tool round costs our server, counted, not timed.

One call in this process: the Realtime simulator (one frame per event, as in
``benchmarks.burst``), a real ``ToolExecutor`` on the 14-day sample journal
and a ``CallActor`` over loopback sockets, ``--rounds`` rounds of the burst's
turn (a user turn, a response with one ``briefing.get`` call, its output and
``response.create``, a short answer). A trio ``Instrument`` counts the steps
of the server's own tasks per round, by task: the call's reader, its tool
tasks, the executor, trio-websocket's reader task for our connection (the
simulator's tasks are not counted). ``tool_reuse_s`` is large, so every
round after the first has a fresh answer to reuse.

It runs twice: with the executor's in-step answer (``answer_now``, as the
runtime wires it) and without it (every request through the executor's
inbox, as before issue 14's in-step answer), and prints both. A step count
does not depend on the machine's load, unlike the CPU and latency numbers of
the other benchmarks.

With ``--redis`` it runs the in-step call twice instead: as one process runs
it, and as a worker (``serve --redis``) runs it, on a throwaway
``redis-server``: the lease won from a ``RedisRegistry`` and kept by its
renewal batch while the actor runs inside the lease's stop
(``leases.run_leased``, as the supervisor does), the call's ``SendFence``
and the mirror's record lines (``on_record``) wired as the supervisor wires
them. The registry's tasks and coredis's are counted too (not the shared
feed: no client listens in the burst). Run as a file with another
checkout first on ``PYTHONPATH`` to count that one::

    .venv/bin/python -m benchmarks.round_steps --rounds 20
    .venv/bin/python -m benchmarks.round_steps --rounds 40 --redis
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/round_steps.py --rounds 40 --redis
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import logging
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import structlog
import trio

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))   # run as a file: PYTHONPATH first, then here

DAY = dt.date(2026, 3, 27)
KEY = "sk-bench-steps-0123456789"

#: Our tasks, by the end of their name; the rest (the simulator's, the test's) are not counted.
OURS = ("CallActor._reader", "CallActor._writer", "CallActor._run_tool", "CallActor._tell_executor",
        "CallActor._watch", "ToolExecutor.run", "ToolExecutor._serve")


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.by_task: collections.Counter[str] = collections.Counter()
        self.counting = False

    def before_task_step(self, task: Any) -> None:
        if not self.counting:
            return
        name = task.name
        for ours in OURS:
            if name.endswith(ours):
                self.by_task[ours] += 1
                return
        if name.startswith("coredis."):
            self.by_task["coredis"] += 1
            return
        if ".cluster." in name:         # the registry's own tasks (a worker's run)
            self.by_task[".".join(name.split(".")[-2:])] += 1
            return
        if name.endswith("WebSocketConnection._reader_task"):
            # ours is the client end of the sideband (the simulator's is the server end)
            frame = getattr(task.coro, "cr_frame", None)
            connection = frame.f_locals.get("self") if frame is not None else None
            if getattr(connection, "is_client", False):
                self.by_task["trio_websocket reader"] += 1


def _scenario(rounds: int) -> Any:
    from voiceactors.simulator import Scenario

    steps: list[dict[str, Any]] = []
    for _ in range(rounds):
        steps += [{"user_turn": {"text": "brief me"}},
                  {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
                  {"wait_outputs": {"timeout_s": math.inf}}, {"response": {"text": "Okay."}},
                  {"sleep": 0.05}]
    steps.append({"close": 1000})
    return Scenario.from_obj(steps)


async def _one(rounds: int, in_step: bool, root: Path, redis_url: str | None = None) -> dict[str, Any]:
    from voiceactors.actors.call import CallActor
    from voiceactors.actors.executor import ToolExecutor
    from voiceactors.journal.sample import write_sample_journal
    from voiceactors.settings import Settings
    from voiceactors.simulator import Simulator
    from voiceactors.tools import REGISTRY, ToolContext

    journal = root / "journal"
    if not journal.exists():
        write_sample_journal(journal, days=14, today=DAY)
    sim = Simulator(None, api_key=KEY, coalesce_writes=False)
    steps = _Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            settings = Settings(journal=journal, state_dir=root / f"state-{in_step}", openai_base_url=sim.base_url,
                                tool_reuse_s=1e6, tool_timeout_read_s=math.inf, call_idle_timeout_s=math.inf,
                                call_max_duration_s=math.inf)
            executor = ToolExecutor(settings, ToolContext(journal=journal, state_dir=settings.state_dir,
                                                          today=lambda: DAY), REGISTRY)
            await nursery.start(executor.run)
            sim_call = sim.add_call("rtc_steps", _scenario(rounds))
            leased: dict[str, Any] = {}
            if redis_url is not None:
                leased = await _leased(nursery, redis_url)
            actor = CallActor(settings, "rtc_steps", executor.inbox, KEY, hangup=False,
                              answer_now=executor.answer_now if in_step else None,
                              fence=leased.get("fence"), on_record=leased.get("on_record"))
            steps.counting = True
            if redis_url is None:
                await actor.run()
            else:
                await _run_leased(leased, actor)
            steps.counting = False
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    return {"in_step": in_step, "worker": redis_url is not None, "rounds": rounds,
            "tool_calls": len(sim_call.tool_calls),
            "outputs": len(sim_call.outputs), "answered_in_step": actor.answered_in_step,
            "steps_per_round": {k: round(v / rounds, 2) for k, v in sorted(steps.by_task.items())},
            "total_per_round": round(sum(steps.by_task.values()) / rounds, 2)}


async def _leased(nursery: trio.Nursery, redis_url: str) -> dict[str, Any]:
    """A worker's registry, running, and the call's lease won from it."""
    from voiceactors.cluster.registry import RedisRegistry

    registry = RedisRegistry(redis_url, 10.0, node="bench")
    await nursery.start(registry.run)
    lease = await registry.acquire("rtc_steps")
    assert lease is not None, "a fresh redis-server: the lease is ours"
    return {"registry": registry, "lease": lease, "fence": registry.fence_of("rtc_steps"),
            "on_record": registry.note_record}


async def _run_leased(leased: dict[str, Any], actor: Any) -> None:
    """The actor inside its lease's stop, then the lease released (the supervisor's ``_run_leased``)."""
    from voiceactors.cluster import leases

    registry, lease = leased["registry"], leased["lease"]
    why = await leases.run_leased(registry, lease, 5.0, actor.run)
    assert why is None, f"the lease was {why} during the run"
    await registry.release(lease)


def run(rounds: int, redis: bool = False) -> list[dict[str, Any]]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory() as tmp:
        if not redis:
            return [trio.run(_one, rounds, in_step, Path(tmp)) for in_step in (False, True)]
        from benchmarks.connect_cost import throwaway_redis

        with throwaway_redis(Path(tmp) / "redis") as (url, _):
            return [trio.run(_one, rounds, True, Path(tmp), url_or_none) for url_or_none in (None, url)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--json", type=Path)
    p.add_argument("--redis", action="store_true",
                   help="the in-step call as one process and as a worker (a throwaway redis-server)")
    args = p.parse_args(argv)
    results = run(args.rounds, args.redis)
    for r in results:
        label = ("worker (--redis)" if r["worker"] else "one process     ") if args.redis else \
            ("in-step answer" if r["in_step"] else "inbox only    ")
        print(f"{label}: {r['total_per_round']} steps per round "
              f"{r['steps_per_round']} (answered in step {r['answered_in_step']} of {r['tool_calls']})")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
