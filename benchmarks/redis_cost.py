"""Scaling out: what a process pays for the shared registry. CPU per call of one serving
process in three set-ups, at equal calls per process.

* ``serve`` — one ``voiceactors serve`` process, no Redis;
* ``redis`` — one ``serve --redis URL`` process against a private
  ``redis-server`` this driver starts (unix socket, no persistence): the
  Redis cost alone, at the same load per process;
* ``workers`` — ``serve --workers 2`` (its own private redis-server) with
  twice the calls, so each worker holds about as many as the other two.

Each run is the capacity workload (``benchmarks.roundtrip``'s sideband run
through the ``served`` peer: a ``briefing.get`` round per call every
``--gap`` s). Once every call has joined it waits ``--settle`` s, then reads
psutil over ``--window`` s for every process of the tree (the serving
processes, a parent, redis-server) and the calls each serving process holds
(its established TCP connections: one sideband each), then py-spy samples
one serving process (the first worker) for ``--spy`` s (after the CPU
window, so py-spy's own cost is not in it). Printed per run: CPU % of a core
per process, calls, CPU ms per call-second, and the profile's summary.

Run (interleave set-ups; ``BENCH_PEER_REPO`` runs another checkout's server)::

    .venv/bin/python -m benchmarks.redis_cost --calls 375 750 --modes serve redis workers
    BENCH_PEER_REPO=/tmp/rediscost-before .venv/bin/python -m benchmarks.redis_cost --calls 375 --modes workers
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks import roundtrip
from benchmarks.common import machine_facts, write_json

MODES = ("serve", "redis", "workers")


def _role(ps: psutil.Process) -> str:
    try:
        cmd = ps.cmdline()
    except psutil.Error:
        return "gone"
    text = " ".join(cmd)
    if "redis-server" in text:
        return "redis"
    if "voiceactors.cli" not in text:
        return "other"
    if "--workers 1" in text:
        return "worker"
    if "--workers" in text:
        return "parent"
    return "serve"


def _sidebands(ps: psutil.Process) -> int:
    try:
        conns = ps.net_connections(kind="tcp")
    except psutil.Error:
        return 0
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED and c.raddr)


class _Measure:
    """Stands in for run_sideband's py-spy process: started once every call
    joined, it measures the tree, then profiles one serving process."""

    def __init__(self, peer_pid: int, run_dir: Path, settle: float, window: float, spy_s: float,
                 extra: list[int], redis_socket: str | None) -> None:
        self.result: dict[str, Any] = {}
        self._args = (peer_pid, run_dir, settle, window, spy_s)
        self._extra = extra             # processes outside the peer's tree (this driver's redis-server)
        self._socket = redis_socket     # its socket, for the commands it ran (``INFO commandstats``)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        peer_pid, run_dir, settle, window, spy_s = self._args
        time.sleep(settle)
        procs = [*psutil.Process(peer_pid).children(recursive=True), *map(psutil.Process, self._extra)]
        roles = {p.pid: _role(p) for p in procs}
        before = {}
        for p in procs:
            try:
                t = p.cpu_times()
                before[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        if self._socket is None:        # --workers: its private redis-server's socket
            for p in procs:
                if roles[p.pid] == "redis":
                    text = " ".join(p.cmdline())     # redis-server retitles itself "redis-server unixsocket:PATH"
                    found = text.split("unixsocket:", 1)[1].split()[0] if "unixsocket:" in text else None
                    self._socket = found
        stats0 = commandstats(self._socket)
        t0 = time.perf_counter()
        time.sleep(window)
        wall = time.perf_counter() - t0
        stats1 = commandstats(self._socket)
        rows = []
        for p in procs:
            if p.pid not in before or roles[p.pid] in ("other", "gone"):
                continue
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            cpu = t.user + t.system - before[p.pid]
            calls = _sidebands(p) if roles[p.pid] in ("serve", "worker") else 0
            rows.append({"pid": p.pid, "role": roles[p.pid], "core_pct": round(100 * cpu / wall, 1),
                         "calls": calls,
                         "ms_per_call_s": round(1000 * cpu / wall / calls, 3) if calls else None})
        self.result = {"window_s": round(wall, 2), "load": os.getloadavg()[0], "processes": rows,
                       "redis_calls_per_s": {k: round((v - stats0.get(k, 0)) / wall, 1) for k, v in stats1.items()
                                             if v > stats0.get(k, 0)}}
        serving = [r for r in rows if r["role"] in ("serve", "worker")]
        if serving and spy_s:
            target = serving[0]["pid"]
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            subprocess.run([spy, "record", "--pid", str(target), "--duration", str(int(spy_s)), "--rate", "100",
                            "--nonblocking", "--format", "raw", "-o", str(run_dir / "peer.pyspy.txt")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=spy_s + 30)
            self.result["profiled_pid"] = target

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout)

    def kill(self) -> None:
        pass


def commandstats(socket_path: str | None) -> dict[str, int]:
    """Calls per Redis command so far (EVAL, and the commands scripts ran)."""
    if socket_path is None:
        return {}
    try:
        text = subprocess.run(["redis-cli", "-s", socket_path, "info", "commandstats"], capture_output=True,
                              text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in text.splitlines():
        if line.startswith("cmdstat_") and "calls=" in line:
            name, _, rest = line.partition(":")
            found[name[len("cmdstat_"):]] = int(rest.split("calls=")[1].split(",")[0])
    return found


def _private_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    sock = folder / "redis.sock"
    proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
                             "--save", "", "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc, f"unix://{sock}"


def run_one(mode: str, calls_per_process: int, *, rounds: int, gap: float, settle: float, window: float,
            spy_s: float) -> dict[str, Any]:
    measures: list[_Measure] = []

    def start_measure(pid: int, run_dir: Path) -> _Measure:
        # the served peer's pid: the serving processes are under it
        m = _Measure(pid, run_dir, settle, window, spy_s, [redis.pid] if redis is not None else [],
                     str(folder / "redis.sock") if redis is not None else None)
        measures.append(m)
        return m

    total = calls_per_process * (2 if mode == "workers" else 1)
    os.environ["BENCH_SERVE_WORKERS"] = "2" if mode == "workers" else "1"
    redis: subprocess.Popen[bytes] | None = None
    started = time.strftime("%H:%M:%S", time.gmtime())
    folder = Path(tempfile.mkdtemp(prefix="rediscost-redis-"))
    try:
        if mode == "redis":
            redis, url = _private_redis(folder)
            os.environ["BENCH_SERVE_REDIS"] = url
        r = roundtrip.run_sideband("served", total, rounds=rounds, gap=gap, rate_hz=0, tag=f"rcost-{mode}",
                                   py_spy_s=settle + window + spy_s, on_joined=start_measure)
    finally:
        os.environ.pop("BENCH_SERVE_WORKERS", None)
        os.environ.pop("BENCH_SERVE_REDIS", None)
        if redis is not None:
            redis.terminate()
            redis.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    m = measures[0].result if measures else {}
    return {"mode": mode, "calls_per_process": calls_per_process, "calls": total, "started_utc": started, "measure": m, "profile": r.get("profile"),
            "create_ms": r["create_ms"], "output_ms": r["output_ms"], "calls_connected": r["calls_connected"],
            "errors": r["error_codes"], "violations": r["violations"], "unanswered": r["unanswered"],
            "peer_repo": os.environ.get("BENCH_PEER_REPO", "")}


def report(r: dict[str, Any]) -> str:
    m = r["measure"]
    rows = ", ".join(f"{p['role']} {p['core_pct']}% ({p['calls']} calls, {p['ms_per_call_s']} ms/call-s)"
                     if p["calls"] else f"{p['role']} {p['core_pct']}%" for p in m.get("processes", []))
    return (f"{r['started_utc']} load {m.get('load', 0):.2f} {r['mode']:>7} {r['calls_per_process']}/process "
            f"(connected {r['calls_connected']}/{r['calls']}): {rows} | create p50/p99 "
            f"{r['create_ms']['p50']:.1f}/{r['create_ms']['p99']:.1f} ms | errors {r['errors'] or 0} "
            f"violations {r['violations']} unanswered {r['unanswered']}"
            + (f" | redis calls/s {m['redis_calls_per_s']}" if m.get("redis_calls_per_s") else "")
            + (f" | peer repo {r['peer_repo']}" if r["peer_repo"] else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, nargs="+", default=[375, 750], help="calls per serving process")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--gap", type=float, default=5.0)
    p.add_argument("--settle", type=float, default=4.0)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--spy", type=float, default=10.0, help="py-spy seconds (0: none)")
    p.add_argument("--profile", action="store_true", help="print each run's profile summary")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    facts = machine_facts()
    print(f"# machine: {facts}", flush=True)
    results = []
    for _ in range(args.repeats):
        for n in args.calls:
            for mode in args.modes:
                r = run_one(mode, n, rounds=args.rounds, gap=args.gap, settle=args.settle, window=args.window,
                            spy_s=args.spy)
                results.append(r)
                print(report(r), flush=True)
                if args.profile and r.get("profile"):
                    print(r["profile"], flush=True)
    if args.json:
        write_json(Path(args.json), {"machine": facts, "argv": sys.argv, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
