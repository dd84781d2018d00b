"""CPU per connect and per call end, on the server.

What it measures: a real ``voiceactors serve`` process (the 14-day sample
journal, the Realtime simulator standing in for OpenAI, both on loopback,
the server's logs at ``info`` to a file as an operator would run it) and
``--calls`` call ids the simulator knows with no script (the ``idle``
workload of ``benchmarks.sim_host``: the calls hold their sideband open).
The driver sends ``POST /api/voice/connect`` for each id at ``--rate`` per
second (one connection each), waits until the simulator has a sideband for
every call and the server is quiet again, then tells the simulator to end
every call (close 1000) and waits until the server has written every call
record. For each of the two windows it reports the server's CPU seconds
(user + system, all threads, psutil) minus its idle CPU over the same wall
time (measured before the connects), divided by the calls:

* ``connect_ms`` — one ``/connect`` through the sideband being up: the
  route, the supervisor, the actor's start, the key, the websocket
  handshake, the call record's first write, the log lines;
* ``end_ms`` — one call's end: the close, the record's last write, the
  actor's removal, the log lines.

``--registry`` runs each repeat twice, interleaved (the order alternates):
without Redis and with ``--redis`` on a throwaway ``redis-server`` (unix
socket, no persistence) of the driver's, and reports for both the CPU per
connect, the ``/connect`` latency (the driver's round trip: the route
answers once the call's lease is taken and its actor started) and, with
Redis, ``redis_server_ms`` (redis-server's own CPU per connect): the
registry's cost per connect is the difference.

``--hold-s S``: between the connects and the ends, the server's CPU (and
redis-server's) per second over ``S`` seconds of every call held and
nothing said: what keeping the calls costs (with ``--redis``: the lease
renewals, the registry's and the other cluster polls).

``--py-spy`` samples the server with py-spy over the connects (raw
collapsed stacks into the run folder, ``peer.pyspy.txt``) and over the
first 4 s of the ends (``end.pyspy.txt``); summarise with
``benchmarks.profile_summary``); CPU numbers of a sampled run are not
comparable with an unsampled one.

Run::

    .venv/bin/python -m benchmarks.connect_cost --calls 200 --repeats 3
    .venv/bin/python -m benchmarks.connect_cost --calls 200 --repeats 1 --py-spy
    .venv/bin/python -m benchmarks.connect_cost --server-repo /tmp/before    # another checkout's server
    .venv/bin/python -m benchmarks.connect_cost --calls 200 --repeats 5 --registry  # with --redis vs without

Bounded: every wait has a timeout; every process is a child on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import psutil

from benchmarks.common import (Proc, free_loopback_port, machine_facts, redis_socket_path, sample_journal, spawn, summary,
                               work_dir)
from benchmarks.floods import http_call, serve_against_sim
from benchmarks.roundtrip import start_py_spy

PREFIX = "rtc_conn"


def quiet(server: Proc, *, below_core_pct: float = 8.0, period: float = 0.5, bound_s: float = 30.0) -> float:
    """Wait until the server uses less than ``below_core_pct`` of a core over
    ``period`` (at most ``bound_s``); the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound_s:
        c0 = server.cpu_s()
        time.sleep(period)
        if 100 * (server.cpu_s() - c0) / period < below_core_pct:
            break
    return round(time.monotonic() - t0, 2)


def count_records(state_dir: Path, with_end: bool) -> int:
    n = 0
    for path in (state_dir / "calls").glob(f"{PREFIX}-*.jsonl"):
        text = path.read_text(errors="replace")
        n += 1 if (not with_end or '"kind": "end"' in text or '"kind":"end"' in text) else 0
    return n


def window(server: Proc, idle_core: float, calls: int, t0: float, c0: float) -> dict[str, Any]:
    wall = time.monotonic() - t0
    cpu = server.cpu_s() - c0
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "per_call_ms": round(1000 * (cpu - idle_core * wall) / calls, 2),
            "per_call_raw_ms": round(1000 * cpu / calls, 2)}


@contextlib.contextmanager
def throwaway_redis(folder: Path) -> Iterator[tuple[str, psutil.Process]]:
    """A ``redis-server`` on a unix socket in ``folder``, no persistence: its URL and process."""
    folder.mkdir(parents=True, exist_ok=True)
    sock = redis_socket_path(folder)
    proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                             "--save", "", "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.01)
        yield f"unix://{sock}", psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)


def _cpu(ps: psutil.Process | None) -> float:
    if ps is None:
        return 0.0
    t = ps.cpu_times()
    seconds: float = t.user + t.system
    return seconds


def run_once(args: argparse.Namespace, journal: Path, repeat: int, redis: tuple[str, psutil.Process] | None = None
             ) -> dict[str, Any]:
    run_dir = work_dir() / "runs" / f"connect-{repeat}-{int(time.time() * 1000)}"
    sim = spawn("sim", "benchmarks.sim_host", [
        "--calls", str(args.calls), "--prefix", PREFIX, "--workload", "idle", "--timeout", "600",
        "--out", str(run_dir / "sim.json")], workdir=run_dir)
    server = None
    result: dict[str, Any] = {"repeat": repeat, "redis": redis is not None}
    redis_ps = redis[1] if redis is not None else None
    try:
        sim_port = int(sim.expect("PORT", 60))
        port = free_loopback_port()
        host = f"127.0.0.1:{port}"
        env = {"VOICEACTORS_RATE_LIMIT_PER_S": "0", "VOICEACTORS_LOG_LEVEL": args.log_level}
        if redis is not None:
            env["VOICEACTORS_REDIS_URL"] = redis[0]
        server = serve_against_sim(sim_port, port, journal, run_dir, env=env,
                                   repo=Path(args.server_repo) if args.server_repo else None)
        quiet(server)
        t0, c0 = time.monotonic(), server.cpu_s()
        time.sleep(args.idle_s)
        idle_core = (server.cpu_s() - c0) / (time.monotonic() - t0)
        result["idle_core_pct"] = round(100 * idle_core, 1)

        lines_before = len(server.stderr_path.read_text(errors="replace").splitlines())
        spy = start_py_spy(server.popen.pid, args.calls / args.rate + 1, run_dir) if args.py_spy else None
        t0, c0, r0 = time.monotonic(), server.cpu_s(), _cpu(redis_ps)
        statuses: dict[str, int] = {}
        latencies: list[float] = []
        for n in range(args.calls):
            due = t0 + n / args.rate
            time.sleep(max(0.0, due - time.monotonic()))
            sent = time.perf_counter()
            status, _ = http_call(port, "POST", "/api/voice/connect", host, {"call_id": f"{PREFIX}-{n}"})
            latencies.append((time.perf_counter() - sent) * 1000)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        sim.expect("CONNECTED", 60)
        deadline = time.monotonic() + 30
        while count_records(run_dir / "state", with_end=False) < args.calls and time.monotonic() < deadline:
            time.sleep(0.05)
        quiet(server)
        result["connect"] = window(server, idle_core, args.calls, t0, c0)
        result["connect"]["statuses"] = statuses
        result["connect"]["latency_ms"] = summary(latencies)
        if redis_ps is not None:
            result["connect"]["redis_server_ms"] = round(1000 * (_cpu(redis_ps) - r0) / args.calls, 3)

        if args.hold_s > 0:   # every call held, nothing said: what keeping them costs per second
            t0, c0, r0 = time.monotonic(), server.cpu_s(), _cpu(redis_ps)
            time.sleep(args.hold_s)
            wall = time.monotonic() - t0
            result["held"] = {"wall_s": round(wall, 2),
                              "cpu_ms_per_s": round(1000 * (server.cpu_s() - c0) / wall, 2),
                              "redis_cpu_ms_per_s": round(1000 * (_cpu(redis_ps) - r0) / wall, 2)}
        if spy is not None:   # the connects' samples are in; sample the ends into their own file
            spy.wait(30)
            spy = start_py_spy(server.popen.pid, 4, run_dir, "end.pyspy.txt")
        t0, c0 = time.monotonic(), server.cpu_s()
        sim.send("STOP")
        sim.expect("DONE", 60)
        deadline = time.monotonic() + 30
        while count_records(run_dir / "state", with_end=True) < args.calls and time.monotonic() < deadline:
            time.sleep(0.05)
        quiet(server)
        result["end"] = window(server, idle_core, args.calls, t0, c0)
        result["end"]["records_with_end"] = count_records(run_dir / "state", with_end=True)
        log = server.stderr_path.read_text(errors="replace").splitlines()
        result["log_lines_per_call"] = round((len(log) - lines_before) / args.calls, 2)
        result["log_events"] = _events(log[lines_before:])
        if spy is not None:
            spy.wait(30)
            result["py_spy"] = f"{run_dir / 'peer.pyspy.txt'} (the ends: end.pyspy.txt)"
        server.popen.send_signal(signal.SIGTERM)
        result["server_rc"] = server.wait(60)
    finally:
        for proc in (server, sim):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.terminate()
                proc.wait(10)
    if not args.keep:
        shutil.rmtree(run_dir / "state", ignore_errors=True)
    return result


def _events(lines: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in lines:
        try:
            event = str(json.loads(line).get("event"))
        except (ValueError, AttributeError):
            event = "<not json>"
        counts[event] = counts.get(event, 0) + 1
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="CPU per connect and per call end")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rate", type=float, default=50.0, help="connects per second")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--idle-s", type=float, default=2.0)
    p.add_argument("--log-level", default="info")
    p.add_argument("--py-spy", action="store_true", help="sample the server over the connects")
    p.add_argument("--server-repo", default=os.environ.get("BENCH_PEER_REPO"),
                   help="run the server from another checkout (default $BENCH_PEER_REPO)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--registry", action="store_true", help="each repeat without and with --redis, interleaved")
    p.add_argument("--hold-s", type=float, default=0.0,
                   help="after the connects, measure the server holding every call this long (CPU per second)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _line(r: dict[str, Any]) -> str:
    c = r["connect"]
    lat = c.get("latency_ms") or {}
    return (f"connect {c['per_call_ms']} ms CPU/call (raw {c['per_call_raw_ms']}, {c['statuses']})"
            + (f", redis-server {c['redis_server_ms']} ms CPU/call" if "redis_server_ms" in c else "")
            + (f", latency p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} ms" if lat.get("n") else "")
            + f", end {r['end']['per_call_ms']} ms CPU/call (raw {r['end']['per_call_raw_ms']}), "
            f"idle {r['idle_core_pct']} % of a core, log lines/call {r['log_lines_per_call']}, "
            f"records with end {r['end']['records_with_end']}"
            + (f", held: {r['held']['cpu_ms_per_s']} ms CPU/s (redis-server {r['held']['redis_cpu_ms_per_s']})"
               if "held" in r else ""))


def registry_pairs(args: argparse.Namespace, journal: Path) -> list[dict[str, Any]]:
    """Each repeat: one run without Redis and one with, the order alternating."""
    runs = []
    for repeat in range(1, args.repeats + 1):
        for with_redis in ((False, True) if repeat % 2 else (True, False)):
            if with_redis:
                with throwaway_redis(work_dir() / "runs" / f"redis-{repeat}-{int(time.time() * 1000)}") as redis:
                    r = run_once(args, journal, repeat, redis)
            else:
                r = run_once(args, journal, repeat)
            runs.append(r)
            print(f"repeat {repeat} {'redis   ' if with_redis else 'no redis'}: {_line(r)}", flush=True)
    for with_redis in (False, True):
        mine = [r for r in runs if r["redis"] is with_redis]
        cpu = sorted(r["connect"]["per_call_ms"] for r in mine)
        p50 = sorted(r["connect"]["latency_ms"]["p50"] for r in mine)
        print(f"{'redis   ' if with_redis else 'no redis'}: connect CPU/call median {cpu[len(cpu) // 2]} ms, "
              f"latency p50 median {p50[len(p50) // 2]:.2f} ms over {len(mine)} runs", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    journal = sample_journal(14)
    runs = []
    if args.registry:
        runs = registry_pairs(args, journal)
    for repeat in range(1, 0 if args.registry else args.repeats + 1):
        r = run_once(args, journal, repeat)
        runs.append(r)
        print(f"repeat {repeat}: connect {r['connect']['per_call_ms']} ms CPU/call "
              f"(raw {r['connect']['per_call_raw_ms']}, {r['connect']['statuses']}), "
              f"end {r['end']['per_call_ms']} ms CPU/call (raw {r['end']['per_call_raw_ms']}), "
              f"idle {r['idle_core_pct']} % of a core, log lines/call {r['log_lines_per_call']}, "
              f"records with end {r['end']['records_with_end']}/{args.calls}"
              + (f", py-spy {r['py_spy']}" if r.get("py_spy") else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_facts(), "args": vars(args), "runs": runs},
                                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
