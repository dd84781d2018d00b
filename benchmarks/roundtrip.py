"""Tool round trip over the sideband, measured at the simulator.

What it measures: for every response carrying one ``briefing.get`` call, the
time from the simulator writing that response's ``response.done`` to it
reading the peer's ``function_call_output`` (``output``) and the peer's
``response.create`` (``create``): p50 / p99 / max over every round of every
call, with N concurrent calls, each also receiving background transcript
deltas (``--rate-hz``, default 20 events/s). For ``ours`` the server's own
measurements come from its call records: each tool call's executor duration
(limiter + worker-thread hop + handler), giving ``overhead`` = output − that
duration as the simulator sees it; ``server_overhead`` (the first write of
the output − the tool's start − its duration: the actors' hops and the
writer's turn, without the harness); ``server_turnaround`` (our
``response.create`` written − the ``response.done`` read). For every peer
``overhead_vs_handler`` = output − the p50 of the handler alone (timed in
the driver on the same journal), which counts the thread hop as overhead.
Also for ``ours``: ``loop_lag_ms`` (how late a 10 ms sleep wakes in our
process).
CPU: user+system seconds of the peer process and of the simulator process
over the measured window (from every call joined to every call closed), as a
share of one core and of the machine. Also: the simulator's protocol
records (error codes, violations, unanswered tool calls).

Simulator and peer are separate processes (``benchmarks.sim_host`` and
``benchmarks.peers.<peer>``) on loopback; the journal is the generated
14-day sample.

Run::

    .venv/bin/python -m benchmarks.roundtrip --peer ours --calls 1 100 500
    .venv/bin/python -m benchmarks.roundtrip --calls 2 --rounds 2 --gap 0.2 --json /tmp/rt.json
    .venv/bin/python -m benchmarks.roundtrip --calls 500 --py-spy 8     # + where our CPU goes
    .venv/bin/python -m benchmarks.roundtrip --calls 500 1000 --sim lean   # the lean peer instead of the simulator
    git worktree add /tmp/before <commit> && \
    BENCH_PEER_REPO=/tmp/before .venv/bin/python -m benchmarks.roundtrip --calls 100   # that commit's server

``--peer`` is ``ours`` (default: the runtime joined by ``Connect``
messages) or ``served`` (a whole ``voiceactors serve``, joined over HTTP).
Bounded: each run ends by itself after its rounds, or at its timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from benchmarks.common import (
    BENCH_KEY, work_dir, CpuWindow, fmt, machine_facts, sample_journal, spawn, summary, write_json,
)
from voiceactors import storage

PEERS = {
    "ours": "benchmarks.peers.ours",
    "served": "benchmarks.peers.served",     # a whole `voiceactors serve` (BENCH_SERVE_WORKERS=N: --workers N)
}


TREE_PEERS = frozenset({"served"})     # measured with every process under them

#: the load generator (``--sim``): the module and its leading arguments
SIMS = {"simulator": ("benchmarks.sim_host", []), "lean": ("benchmarks.lean_sim", ["host"])}


def server_timings(state_dir: Path) -> dict[str, Any]:
    """What our server measured itself, from its call records
    (``<state>/calls/*.jsonl``): each tool call's executor duration by tool
    call id, its ``overhead_ms`` (first write of the output − start − that
    duration: the hops between the actors and the writer's turn) and each
    ``response.create``'s ``turnaround_ms`` (written − the ``response.done``
    it follows was read)."""
    durations: dict[str, float] = {}
    overhead: list[float] = []
    turnaround: list[float] = []
    for path in sorted((state_dir / "calls").glob("*.jsonl")):
        for line in storage.jsonl_lines(path.read_text(encoding="utf-8", errors="replace")):
            try:
                rec = storage.loads_line(line)
            except ValueError:
                continue
            if rec.get("kind") == "tool_call" and rec.get("duration_ms") is not None:
                durations[rec["tool_call_id"]] = float(rec["duration_ms"])
                if rec.get("overhead_ms") is not None:
                    overhead.append(float(rec["overhead_ms"]))
            elif rec.get("kind") == "response_create" and rec.get("turnaround_ms") is not None:
                turnaround.append(float(rec["turnaround_ms"]))
    return {"durations": durations, "overhead_ms": summary(overhead), "turnaround_ms": summary(turnaround)}


_HANDLER_MS: dict[str, dict[str, float]] = {}


def handler_ms(journal: Path, n: int = 40) -> dict[str, float]:
    """``briefing.get``'s own work: the handler alone, in this process, on the
    same journal (schema check + handler, no thread hop), ``n`` calls."""
    key = str(journal)
    if key not in _HANDLER_MS:
        from voiceactors.tools import ToolContext, lookup, prepare

        from benchmarks.common import BENCH_TODAY

        spec = lookup("briefing.get")
        assert spec is not None
        ctx = ToolContext(journal=journal, state_dir=journal.parent / "handler-state", today=lambda: BENCH_TODAY)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            spec.handler(ctx, prepare(spec, "{}"))
            times.append((time.perf_counter() - t0) * 1000)
        _HANDLER_MS[key] = summary(times)
    return _HANDLER_MS[key]


class Watcher(Protocol):
    """What ``run_sideband``'s ``on_joined`` starts: something that watches
    the peer while the calls play, waited for once they have ended."""

    def wait(self, timeout: float) -> Any: ...


def start_py_spy(pid: int, seconds: float, run_dir: Path, name: str = "peer.pyspy.txt") -> subprocess.Popen[bytes]:
    """Sample ``pid`` with py-spy for ``seconds`` into ``run_dir/name``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    extra = os.environ.get("BENCH_PY_SPY_ARGS", "").split()   # e.g. --gil: only the thread holding the GIL
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
                             "--nonblocking", "--format", "raw", *extra, "-o", str(run_dir / name)],
                            stdout=subprocess.DEVNULL, stderr=open(run_dir / "py-spy.stderr", "w"))


def _peer_repo() -> Path | None:
    """``BENCH_PEER_REPO``: the peer's server (its ``voiceactors``) from
    another checkout (e.g. a worktree of an older commit) under this
    harness, for before/after pairs (``common.Checkout``)."""
    repo = os.environ.get("BENCH_PEER_REPO")
    return Path(repo) if repo else None


def run_sideband(peer: str, calls: int, *, workload: str = "roundtrip", rounds: int = 10, gap: float = 1.0,
                 rate_hz: float = 20.0, wait: float = 10.0, journal_days: int = 14, log_level: str = "info",
                 idle_settle_s: float = 3.0, tag: str = "rt", keep: bool = False,
                 py_spy_s: float | None = None, sim: str = "simulator",
                 on_joined: Callable[[int, Path], Watcher] | None = None) -> dict[str, Any]:
    """One run: a simulator process (``sim``: see ``SIMS``) and a peer process, ``calls`` calls of
    ``workload``. Returns the simulator's aggregate plus CPU, RSS and (ours)
    the overhead join. With ``py_spy_s`` the peer is sampled by py-spy for
    that long once every call has joined (``peer.pyspy.txt`` in the run
    folder; summarised into ``profile``). ``on_joined(peer pid, run folder)``,
    when given, starts a watcher of the benchmark's own at the same moment
    (``benchmarks.scale_out``'s CPU and Redis window); it is waited for
    before the run's folder is read. Every wait is bounded."""
    run_dir = work_dir() / "runs" / f"{tag}-{peer}-{workload.replace(':', '_')}-{calls}-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = sample_journal(journal_days)
    if workload == "roundtrip":
        play_s = gap + rounds * (gap + 0.5) + 5
    elif workload == "idle":
        play_s = idle_settle_s + 30
    else:
        play_s = 40
    timeout = play_s + 60 + calls * 0.1
    sim_out = run_dir / "sim.json"
    sim_module, sim_args = SIMS[sim]
    sim_proc = spawn("sim", sim_module, [
        *sim_args, "--calls", str(calls), "--prefix", "rtc_bench", "--workload", workload, "--rounds", str(rounds),
        "--gap", str(gap), "--rate-hz", str(rate_hz), "--wait", str(wait), "--timeout", str(timeout),
        "--out", str(sim_out)], workdir=run_dir)
    peer_proc = None
    try:
        port = sim_proc.expect("PORT", 60)
        log_path = run_dir / "peer.log"
        peer_proc = spawn(peer, PEERS[peer], [
            "--base-url", f"http://127.0.0.1:{port}/v1", "--api-key", BENCH_KEY, "--prefix", "rtc_bench",
            "--calls", str(calls), "--journal", str(journal), "--state-dir", str(run_dir / "state"),
            "--log", str(log_path), "--log-level", log_level, "--max-seconds", str(timeout + 10)],
            workdir=run_dir, repo=_peer_repo())
        peer_proc.tree = peer in TREE_PEERS
        peer_proc.expect("STARTED", 120)
        time.sleep(0.5)
        rss_before = peer_proc.rss()
        window = CpuWindow({"peer": peer_proc, "sim": sim_proc})
        joined_at = time.perf_counter()
        peer_proc.send("GO")
        sim_proc.expect("CONNECTED", timeout)
        join_s = time.perf_counter() - joined_at
        window.start()
        measured_from = time.time()
        spy: Watcher | None = None
        if on_joined is not None:
            spy = on_joined(peer_proc.popen.pid, run_dir)
        elif py_spy_s:
            spy = start_py_spy(peer_proc.popen.pid, py_spy_s, run_dir)
        rss_joined = None
        if workload == "idle":
            time.sleep(idle_settle_s)
            rss_joined = peer_proc.rss()
            sim_proc.send("STOP")
        sim_proc.expect("DONE", timeout + 30)
        cpu = window.stop()
        if spy is not None:
            try:
                spy.wait(timeout=(py_spy_s or 0) + 30)
            except subprocess.TimeoutExpired:
                if isinstance(spy, subprocess.Popen):
                    spy.kill()
        rss_end = peer_proc.rss()
        peer_proc.close_stdin()
        peer_rc = peer_proc.wait(30)
        sim_proc.close_stdin()
        sim_proc.wait(10)
        result: dict[str, Any] = json.loads(sim_out.read_text())   # sim_host's report (a JSON object)
    finally:
        for proc in (peer_proc, sim_proc):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.terminate()
                proc.wait(10)
    result.update(sim=sim, peer=peer, calls=calls, workload=workload, rounds=rounds, gap_s=gap, rate_hz=rate_hz,
                  log_level=log_level, cpu=cpu, join_s=round(join_s, 3), peer_rc=peer_rc,
                  rss_before=rss_before, rss_joined=rss_joined, rss_end=rss_end, run_dir=str(run_dir),
                  peer_stderr_tail=peer_proc.tail(600) if peer_proc else "")
    if result.get("tool_calls"):     # the load generator's own CPU per round (connects are outside the window)
        result["sim_ms_per_round"] = round(1000 * cpu["sim"]["cpu_s"] / result["tool_calls"], 3)
    handler = handler_ms(journal)
    result["handler_ms"] = handler
    result["overhead_vs_handler_ms"] = summary(ms - handler["p50"] for _, ms in result["outputs"])
    if peer == "ours":
        server = server_timings(run_dir / "state")
        durations = server["durations"]
        overhead = [ms - durations[i] for i, ms in result["outputs"] if i in durations]
        result["tool_ms"] = summary(durations.values())
        result["server_overhead_ms"] = server["overhead_ms"]
        result["server_turnaround_ms"] = server["turnaround_ms"]
        lag_file = Path(str(log_path) + ".lag.json")
        if lag_file.exists():
            result["loop_lag_ms"] = summary(json.loads(lag_file.read_text()))
        gc_file = Path(str(log_path) + ".gc.json")
        if gc_file.exists():
            pauses = [p for p in json.loads(gc_file.read_text()) if p[2] >= measured_from]  # calls live
            result["gc_pause_ms"] = {str(g): summary(ms for gen, ms, _ in pauses if gen == g) for g in (0, 1, 2)}
        result["overhead_ms"] = summary(overhead)
    result.pop("outputs", None)
    if py_spy_s:
        from benchmarks.profile_summary import summarise

        spy_file = run_dir / "peer.pyspy.txt"
        result["profile"] = summarise(spy_file.read_text(errors="replace")) if spy_file.exists() else "no profile"
    if not keep:
        shutil.rmtree(run_dir / "state", ignore_errors=True)
    return result


def report_line(r: dict[str, Any]) -> str:
    cpu = r["cpu"]
    parts = [f"{r['peer']:>8} calls={r['calls']:<5}",
             f"output {fmt(r['output_ms'])}", f"create {fmt(r['create_ms'])}"]
    if "overhead_ms" in r:
        parts.append(f"overhead {fmt(r['overhead_ms'])}")
    parts.append(f"handler p50 {r['handler_ms']['p50']:.2f} ms")
    if "loop_lag_ms" in r:
        parts.append(f"loop lag {fmt(r['loop_lag_ms'])}")
    if "gc_pause_ms" in r:
        full = r["gc_pause_ms"]["2"]
        parts.append(f"gc2 n={full['n']} max {full['max']:.1f} ms, gc0+1 max "
                     f"{max(r['gc_pause_ms'][g]['max'] for g in ('0', '1')):.1f} ms")
    if "server_overhead_ms" in r:
        parts.append(f"server: overhead {fmt(r['server_overhead_ms'])} turnaround {fmt(r['server_turnaround_ms'])}"
                     f" tool {fmt(r['tool_ms'])}")
    parts.append(f"cpu peer {cpu['peer']['machine_pct']}% sim {cpu['sim']['machine_pct']}% of machine")
    if "sim_ms_per_round" in r:
        parts.append(f"{r.get('sim', 'simulator')} {r['sim_ms_per_round']} ms CPU per round")
    parts.append(f"errors {r['error_codes'] or 0} violations {r['violations']} unanswered {r['unanswered']}")
    if r.get("timed_out"):
        parts.append("TIMED OUT (calls still open were ended by the harness)")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", choices=sorted(PEERS), default="ours")
    p.add_argument("--calls", type=int, nargs="+", default=[1, 100, 500])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--gap", type=float, default=1.0, help="seconds between a call's rounds")
    p.add_argument("--rate-hz", type=float, default=20.0, help="background transcript deltas per call")
    p.add_argument("--log-level", default="info", help="our server's log level (ours only)")
    p.add_argument("--py-spy", type=float, metavar="SECONDS", help="sample the peer with py-spy this long")
    p.add_argument("--sim", choices=sorted(SIMS), default="simulator",
                   help="the load generator: our simulator (default) or the lean peer (benchmarks/lean_sim.py)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    facts = machine_facts()
    print(f"# machine: {facts}", flush=True)
    results = []
    for n in args.calls:
        r = run_sideband(args.peer, n, rounds=args.rounds, gap=args.gap, rate_hz=args.rate_hz,
                         log_level=args.log_level, py_spy_s=args.py_spy, sim=args.sim)
        results.append(r)
        print(report_line(r), flush=True)
        if r.get("profile"):
            print(r["profile"], flush=True)
    if args.json:
        write_json(Path(args.json), {"machine": facts, "argv": sys.argv, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
