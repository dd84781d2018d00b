"""What a connect does, counted (issue 14, the connect; docs/benchmarks.md § 19).

CPU per connect moves by ±1 ms between runs of one build on a shared
machine (§ 13, § 15); counts do not. This runs ``connect_cost``'s workload
(a real ``voiceactors serve`` against the simulator, ``--calls`` connects
at ``--rate``, one connection each) with the server under ``cProfile``
for the connect window only (switched on and off by SIGUSR1 / SIGUSR2
through a ``sitecustomize`` this writes into the run folder: nothing in
the product knows), and prints per connect:

* trio task steps (``Context.run``), tasks spawned, cancel scopes entered,
  memory channels opened, epoll waits;
* socket sends, ``stat`` calls, worker-thread jobs, structlog lines;

and, with ``--top``, the functions of our code and its libraries by
cumulative time (the profiler's ``thread_time``: the trio thread's CPU,
inflated several times by the profiling itself, so read shares, not ms).

Run::

    .venv/bin/python -m benchmarks.connect_counts
    .venv/bin/python -m benchmarks.connect_counts --server-repo /tmp/before     # another checkout's server
    .venv/bin/python -m benchmarks.connect_counts --phase end                   # the calls' ends instead
    .venv/bin/python -m benchmarks.connect_counts --redis   # the server with --redis (a worker's connect)

Bounded: every wait has a timeout; every process is a child on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import signal
import textwrap
import time
from pathlib import Path

from benchmarks.common import free_loopback_port, sample_journal, spawn, work_dir
from benchmarks.connect_cost import PREFIX, count_records, quiet, throwaway_redis
from benchmarks.floods import http_call, serve_against_sim

SITECUSTOMIZE = textwrap.dedent("""\
    import os, sys
    if os.environ.get("BENCH_CPROFILE_OUT") and "serve" in sys.argv:
        import cProfile, signal, time
        _profile = cProfile.Profile(time.thread_time)
        def _on(*_):
            _profile.enable()
        def _off(*_):
            _profile.disable()
            _profile.dump_stats(os.environ["BENCH_CPROFILE_OUT"])
        signal.signal(signal.SIGUSR1, _on)
        signal.signal(signal.SIGUSR2, _off)
    if os.environ.get("BENCH_STEPS_OUT") and "serve" in sys.argv:
        # trio task steps and spawns by task name, through an instrument added to trio.run
        import collections, json, re, signal, trio
        _steps, _spawned, _on_flag = collections.Counter(), collections.Counter(), [False]
        def _name(task):
            return re.sub(r"[0-9]+", "N", task.name)
        class _Steps(trio.abc.Instrument):
            def before_task_step(self, task):
                if _on_flag[0]:
                    _steps[_name(task)] += 1
            def task_spawned(self, task):
                if _on_flag[0]:
                    _spawned[_name(task)] += 1
        def _son(*_):
            _on_flag[0] = True
        def _soff(*_):
            _on_flag[0] = False
            with open(os.environ["BENCH_STEPS_OUT"], "w") as out:
                json.dump({"steps": _steps, "spawned": _spawned}, out)
        _run = trio.run
        def _instrumented_run(*args, **kwargs):
            kwargs["instruments"] = [*kwargs.get("instruments", ()), _Steps()]
            return _run(*args, **kwargs)
        trio.run = _instrumented_run
        signal.signal(signal.SIGUSR1, _son)
        signal.signal(signal.SIGUSR2, _soff)
    """)

#: label -> (a piece of the file name, the function name) as pstats keys them
COUNTS: dict[str, tuple[str, str]] = {
    "task steps": ("~", "<method 'run' of '_contextvars.Context' objects>"),
    "tasks spawned": ("trio/_core/_run.py", "spawn_impl"),
    "cancel scopes entered": ("trio/_core/_run.py", "__enter__"),
    "memory channels": ("trio/_channel.py", "__new__"),
    "epoll waits": ("~", "<method 'poll' of 'select.epoll' objects>"),
    "socket sends": ("~", "<method 'send' of '_socket.socket' objects>"),
    "stat calls": ("~", "<built-in method posix.stat>"),
    "worker-thread jobs": ("trio/_core/_thread_cache.py", "start_thread_soon"),
    "log lines": ("structlog/_base.py", "_process_event"),
}
#: trio's thread cache has two functions of that name, both called once per job
PER_JOB_CALLS = {"worker-thread jobs": 2}


def profile_connects(calls: int, rate: float, phase: str, repo: Path | None, *, steps: bool = False,
                     redis: bool = False) -> Path:
    """The window's cProfile stats (or, with ``steps``, its task steps and
    spawns by task name as JSON: a trio instrument instead of the profiler);
    ``redis``: the server with ``--redis`` on a throwaway redis-server."""
    run_dir = work_dir() / "runs" / f"counts-{int(time.time() * 1000)}"
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(throwaway_redis(run_dir / "redis"))[0] if redis else None
        return _profile_connects(run_dir, calls, rate, phase, repo, steps=steps, redis_url=url)


def _profile_connects(run_dir: Path, calls: int, rate: float, phase: str, repo: Path | None, *, steps: bool,
                      redis_url: str | None) -> Path:
    (run_dir / "site").mkdir(parents=True)
    (run_dir / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = run_dir / ("steps.json" if steps else "server.prof")
    sim = spawn("sim", "benchmarks.sim_host", ["--calls", str(calls), "--prefix", PREFIX, "--workload", "idle",
                                               "--timeout", "600", "--out", str(run_dir / "sim.json")], workdir=run_dir)
    server = None
    try:
        port = free_loopback_port()
        env = {"VOICEACTORS_RATE_LIMIT_PER_S": "0", "VOICEACTORS_LOG_LEVEL": "info",
               "BENCH_STEPS_OUT" if steps else "BENCH_CPROFILE_OUT": str(out),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(run_dir / "site"), os.environ.get("PYTHONPATH")]))}
        if redis_url is not None:
            env["VOICEACTORS_REDIS_URL"] = redis_url
        server = serve_against_sim(int(sim.expect("PORT", 60)), port, sample_journal(14), run_dir, env=env, repo=repo)
        quiet(server)
        pid = server.popen.pid
        os.kill(pid, signal.SIGUSR1 if phase == "connect" else 0)
        t0 = time.monotonic()
        for n in range(calls):
            time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
            http_call(port, "POST", "/api/voice/connect", f"127.0.0.1:{port}", {"call_id": f"{PREFIX}-{n}"})
        sim.expect("CONNECTED", 60)
        deadline = time.monotonic() + 30
        while count_records(run_dir / "state", with_end=False) < calls and time.monotonic() < deadline:
            time.sleep(0.05)
        quiet(server)
        os.kill(pid, signal.SIGUSR2 if phase == "connect" else signal.SIGUSR1)
        sim.send("STOP")
        sim.expect("DONE", 60)
        deadline = time.monotonic() + 30
        while count_records(run_dir / "state", with_end=True) < calls and time.monotonic() < deadline:
            time.sleep(0.05)
        # an end line is in the file before the record's close has fsynced it:
        # the actor's end (and its call.ended line) comes after that
        while _ended(server.stderr_path) < calls and time.monotonic() < deadline:
            time.sleep(0.05)
        quiet(server)
        if phase == "end":
            os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        server.popen.send_signal(signal.SIGTERM)
        server.wait(60)
    finally:
        for proc in (server, sim):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.terminate()
                proc.wait(10)
    return out


def _ended(log: Path) -> int:
    return log.read_text(errors="replace").count('"call.ended"')


def counts(path: Path, calls: int) -> dict[str, float]:
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    out = {}
    for label, (where, name) in COUNTS.items():
        n = sum(value[1] for (file, _line, func), value in stats.items() if func == name and where in file)
        out[label] = round(n / calls / PER_JOB_CALLS.get(label, 1), 1)
    out["Python function calls"] = round(sum(value[1] for value in stats.values()) / calls)
    return out


def print_steps(path: Path, calls: int, phase: str) -> None:
    data = json.loads(path.read_text())
    for kind in ("steps", "spawned"):
        table: dict[str, int] = data[kind]
        print(f"# {kind} per {phase}: {sum(table.values()) / calls:.1f}")
        for name, n in sorted(table.items(), key=lambda item: -item[1]):
            if n / calls >= 0.05:
                print(f"{n / calls:7.2f}  {name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a connect's task steps, sends and hops, counted")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--phase", choices=["connect", "end"], default="connect")
    p.add_argument("--server-repo", type=Path, default=None)
    p.add_argument("--top", type=int, default=0, help="also list this many functions by cumulative time")
    p.add_argument("--steps", action="store_true",
                   help="instead of the profile: trio task steps and spawns per connect by task name (an instrument)")
    p.add_argument("--redis", action="store_true", help="the server with --redis (a throwaway redis-server)")
    args = p.parse_args(argv)
    out = profile_connects(args.calls, args.rate, args.phase, args.server_repo, steps=args.steps, redis=args.redis)
    if args.steps:
        print_steps(out, args.calls, args.phase)
        return 0
    print(f"# {args.phase}, {args.calls} at {args.rate}/s, server {args.server_repo or 'this checkout'}: {out}")
    for label, value in counts(out, args.calls).items():
        print(f"{label:24s} {value:7.1f} per {args.phase}")
    if args.top:
        pstats.Stats(str(out)).sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
