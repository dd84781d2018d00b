"""CPU the server spends per refused request (issue 11 item 9's remaining gap).

What it measures: a real ``voiceactors serve`` process (the 14-day sample
journal, the simulator as OpenAI, both on loopback, the shipped rate limits)
and one client, 127.0.0.1, that first empties its bucket for
``POST /api/voice/session`` (the burst) and then sends ``--requests`` more,
each on its own connection with ``Connection: close`` (as the floods of
``benchmarks.floods`` do), ``--parallel`` at a time. Every one of those is
refused 429. Reported: the server's CPU seconds (user + system, all
threads, psutil) over the refusals, minus its idle CPU over the same wall
time, per refusal, and the answers by status. CPU does not depend on how
busy the machine is the way latency does, so this is the number to compare
on a shared machine; ``benchmarks.floods`` shows what it does to live calls.

Run::

    .venv/bin/python -m benchmarks.refusal_cost --requests 2000 --repeats 3
    .venv/bin/python -m benchmarks.refusal_cost --server-repo /tmp/before   # another checkout's server

Bounded: every request and wait has a timeout; every process is a child on loopback.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import free_loopback_port, machine_facts, sample_journal, spawn, work_dir
from benchmarks.connect_cost import quiet
from benchmarks.floods import http_call, request_bytes, serve_against_sim


def refused_once(port: int, raw: bytes) -> str:
    """One request on a new connection; the answer's status (or the error's name)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(raw)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "garbled"
    except OSError as error:
        return type(error).__name__


def run_once(args: argparse.Namespace, journal: Path, repeat: int) -> dict[str, Any]:
    run_dir = work_dir() / "runs" / f"refusal-{repeat}-{int(time.time() * 1000)}"
    sim = spawn("sim", "benchmarks.sim_host", ["--calls", "1", "--workload", "idle", "--timeout", "600",
                                               "--out", str(run_dir / "sim.json")], workdir=run_dir)
    server = None
    result: dict[str, Any] = {"repeat": repeat}
    try:
        sim_port = int(sim.expect("PORT", 60))
        port = free_loopback_port()
        host = f"127.0.0.1:{port}"
        server = serve_against_sim(sim_port, port, journal, run_dir,
                                   repo=Path(args.server_repo) if args.server_repo else None)
        raw = request_bytes("POST", "/api/voice/session", host)
        burst = [http_call(port, "POST", "/api/voice/session", host)[0] for _ in range(args.burst)]
        result["burst"] = {str(s): burst.count(s) for s in set(burst)}
        quiet(server)
        t0, c0 = time.monotonic(), server.cpu_s()
        time.sleep(args.idle_s)
        idle_core = (server.cpu_s() - c0) / (time.monotonic() - t0)
        t0, c0 = time.monotonic(), server.cpu_s()
        with ThreadPoolExecutor(args.parallel) as pool:
            statuses = list(pool.map(lambda _: refused_once(port, raw), range(args.requests)))
        quiet(server, bound_s=10)
        wall, cpu = time.monotonic() - t0, server.cpu_s() - c0
        result.update(idle_core_pct=round(100 * idle_core, 1), wall_s=round(wall, 2), cpu_s=round(cpu, 3),
                      per_refusal_us=round(1e6 * (cpu - idle_core * wall) / args.requests, 1),
                      statuses={s: statuses.count(s) for s in set(statuses)})
        server.popen.send_signal(signal.SIGTERM)
        result["server_rc"] = server.wait(60)
    finally:
        for proc in (server, sim):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.terminate()
                proc.wait(10)
    shutil.rmtree(run_dir / "state", ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="server CPU per refused request")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--burst", type=int, default=24, help="requests that empty the bucket first (burst 20)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--idle-s", type=float, default=2.0)
    p.add_argument("--server-repo", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    journal = sample_journal(14)
    runs = []
    for repeat in range(1, args.repeats + 1):
        r = run_once(args, journal, repeat)
        runs.append(r)
        print(f"repeat {repeat}: {r['per_refusal_us']} µs CPU per refusal ({r['cpu_s']} s over {r['wall_s']} s, "
              f"idle {r['idle_core_pct']} % of a core), answers {r['statuses']}, burst {r['burst']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_facts(), "args": vars(args), "runs": runs},
                                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
