"""Burst: calls joining as traffic really arrives, every event its own frame.

Workload (``--mode burst``, the default): ``--calls`` (100) calls join over
``--spread`` seconds (1.0; join times drawn uniformly, seeded), each by a
``POST /api/voice/connect`` the simulator process sends to the server under
test at that time. Once its sideband is open a call starts its tool rounds
at once: a user turn, a response carrying one ``briefing.get`` call, the
server's output and ``response.create``, a short answer ("Okay."), then a
think time drawn from ``--think-ms`` (50 250) before the next turn;
``--rounds`` (20) rounds, then the simulator closes the call (1000). The
simulator sends **every server event as its own websocket frame in its own
socket write** on a TCP_NODELAY socket (``Simulator(coalesce_writes=False)``;
``--coalesce`` restores the steady-state benchmarks' one write per burst).

Two servers run the same workload, one after the other, in the same run
(each with a fresh simulator process and the same seed):

* ``ours`` — a real ``voiceactors serve`` process (rate limit off, API token
  unset, the generated 14-day sample journal), from this checkout or from
  ``$BENCH_PEER_REPO`` (another worktree: that commit's server under this
  harness, for before/after pairs);
* ``nothing`` — ``benchmarks.peers.nothing``: the same ``/connect``, a raw
  sideband that answers each ``function_call_arguments.done`` with a fixed
  output and sends ``response.create`` after the ``response.done``: the
  harness's own latency under the same burst.

Measured at the simulator (one process, one clock, ``trio.current_time()``
stamps), on the wire: ``output`` = the server's
``function_call_output`` read off the socket (``SimCall.read_at``) − the
function call's ``response.output_item.done`` frame written to it
(``written_at``: the call is complete from then on; a server that answers
at ``function_call_arguments.done``, as the do-nothing one does, can come
in below zero); ``create`` = its ``response.create`` read − the
``response.done`` written (the response must have ended first); ``join`` =
the ``/connect`` answered − sent. Each p50/p99/max over every round of
every call of the phase. The queued measure (``output_queued_ms``,
``create_queued_ms``: from the event queued in the simulator to the reply
taken by its reader) is reported alongside; it adds the simulator's own
waits, reported too (``sim_write_wait_ms``: an ``output_item.done`` queued →
written, behind the frames queued before it; ``sim_read_wait_ms``: an
output read → taken, behind the simulator's own writes).

CPU (psutil user+system of the server process, over each phase's window:
the first ``/connect`` sent to every call closed, then until the server is
quiet, at most ``--settle-max-s``):

* **per connect** — the ``connect`` phase: the same ``--calls`` calls
  joined over the same spread, held ``--hold-s`` (0.5) with no rounds, then
  closed; CPU / calls (so it includes the call's end and its record);
* **per tool round** — the ``burst`` phase: (CPU − calls × the connect
  phase's CPU per call) / rounds done: the rounds' cost by subtraction.
  ``gross`` (CPU / rounds, connects included) is reported too.

Both take out the idle server's own CPU over the window (its timers:
measured for ``--idle-s`` (2) seconds with no call before the phases,
``idle_core_pct``). psutil counts CPU in 10 ms ticks: a phase needs
seconds of CPU for a tenth-of-a-millisecond resolution per round.

A ``warm`` phase (``--warm-calls`` (5) calls, 2 rounds) runs first and is not reported:
first-use costs (imports, the tool's first read) stay out of the numbers.

Other modes:

* ``--mode one`` — one call, ``--rounds`` (default 50) rounds with the same
  think times: the single call's output p50 (and CPU per round, gross);
* ``--mode long`` — one call doing ``--long-rounds`` (3,000) rounds against
  ``--short-calls`` (20) calls of 5 rounds one after another, think time 0
  (``--think-ms 0 0``): CPU per round of each, net of a connect phase
  (``--short-calls`` calls joined one after another, no rounds) — a
  per-event cost that grows with the call's history shows as the long
  call's rounds costing more;
* ``--mode sweep`` — the burst at each of ``--steps`` call counts (a fresh
  server each; ``ours`` unless ``--peers``): a step passes when at least
  ``--pass-share`` (0.5) of its calls have their own output p99 ≤
  ``--target-ms`` (50); it stops after the first failing step. The burst
  capacity = the largest passing step.

Run::

    .venv/bin/python -m benchmarks.burst --json B-burst.json
    .venv/bin/python -m benchmarks.burst --mode one --json B-one.json
    .venv/bin/python -m benchmarks.burst --mode long --json B-long.json
    .venv/bin/python -m benchmarks.burst --mode sweep --steps 50 100 150 200 --json B-sweep.json
    .venv/bin/python -m benchmarks.burst --peers ours --py-spy 5      # + where the server's CPU goes
    .venv/bin/python -m benchmarks.burst --sim lean --json B-lean.json # the lean peer as the load generator
    git worktree add /tmp/before <commit> && \\
      BENCH_PEER_REPO=/tmp/before .venv/bin/python -m benchmarks.burst --json B-before.json

Processes: this driver (CPU windows), the simulator (the ``_sim`` role of
this module: the measuring side, and the joins; ``--sim lean``: the lean
peer, ``benchmarks/lean_sim.py``, the same steps and frames at about a
third of the simulator's CPU), the server under test. On
2 cores the simulator and the server share the machine; the simulator's
CPU is in the report. Bounded: every phase has a timeout, every process is
a child on loopback.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import (
    BENCH_KEY, CpuWindow, Proc, code_label, fmt, free_loopback_port, machine_facts, percentile,
    sample_journal, spawn, summary, work_dir, write_json,
)

if TYPE_CHECKING:
    from voiceactors.simulator.scenario import Step

PREFIX = "rtc_burst"
TOOL_TEXT = "What does my day look like?"
ANSWER = "Okay."
PEERS = ("ours", "nothing")
#: the load generator (``--sim``): the module and role spawned as the burst's sim side
SIMS = {"simulator": ("benchmarks.burst", "_sim"), "lean": ("benchmarks.lean_sim", "burst")}


@dataclass(frozen=True)
class Phase:
    """One group of calls the simulator joins: ``calls`` calls over
    ``spread_s`` (or one after another: ``sequential``), each doing
    ``rounds`` tool rounds (0: held ``hold_s`` and closed)."""

    name: str
    calls: int
    rounds: int
    spread_s: float = 1.0
    sequential: bool = False
    think_ms: tuple[float, float] = (50.0, 250.0)
    hold_s: float = 0.5

    def call_ids(self) -> list[str]:
        return [f"{PREFIX}_{self.name}-{n}" for n in range(self.calls)]

    def budget_s(self, wait_s: float) -> float:
        """A generous bound on the phase's wall time."""
        per_call = self.hold_s + self.rounds * (self.think_ms[1] / 1000 + 0.5) + 5
        return 60 + self.spread_s + per_call * (self.calls if self.sequential else 1) + wait_s


def phases_for(mode: str, args: argparse.Namespace, calls: int | None = None) -> list[Phase]:
    think = (float(args.think_ms[0]), float(args.think_ms[1]))
    warm = [Phase("warm", args.warm_calls, 2, spread_s=0.2, think_ms=think)] if args.warm_calls else []
    if mode == "burst":
        return [*warm, Phase("connect", args.calls, 0, args.spread, think_ms=think, hold_s=args.hold_s),
                Phase("burst", args.calls, args.rounds, args.spread, think_ms=think)]
    if mode == "one":
        return [*warm, Phase("one", 1, args.rounds if args.rounds_given else 50, 0.0, think_ms=think)]
    if mode == "long":
        think = think if args.think_given else (0.0, 0.0)
        n = args.short_calls
        return [*warm, Phase("connect", n, 0, 0.0, sequential=True, think_ms=think, hold_s=0.0),
                Phase("short", n, 5, 0.0, sequential=True, think_ms=think),
                Phase("long", 1, args.long_rounds, 0.0, think_ms=think)]
    if mode == "sweep":
        return [*warm, Phase("burst", calls or args.calls, args.rounds, args.spread, think_ms=think)]
    raise SystemExit(f"unknown mode {mode!r}")


# --- the simulator side (``python -m benchmarks.burst _sim``) -------------------------------

def call_steps(phase: Phase, rng: random.Random) -> list[Step]:
    """One call of ``phase``: its rounds with think times drawn from ``rng``."""
    if phase.rounds == 0:
        return [{"sleep": phase.hold_s}, {"close": 1000}]
    steps: list[Step] = []
    lo, hi = phase.think_ms
    for k in range(phase.rounds):
        steps += [
            {"user_turn": {"text": TOOL_TEXT, "duration_ms": 0}},
            {"response": {"tool_calls": [{"name": "briefing.get", "arguments": {}}]}},
            {"wait_outputs": {"timeout_s": 10.0}},
            {"response": {"text": ANSWER}},
        ]
        if k < phase.rounds - 1 and hi > 0:
            steps.append({"sleep": round(rng.uniform(lo, hi) / 1000, 4)})
    steps.append({"close": 1000})
    return steps


def output_times(call: Any, wire: bool = True) -> list[float]:
    """ms from each function call's ``response.output_item.done`` to the
    first ``function_call_output`` for it: ``wire``, from its frame written
    to the socket to the output's frame read off it (``written_at`` →
    ``read_at``); else from the event queued to the output taken by the
    simulator's reader (``sent_at`` → ``received_at``, the queued measure,
    which counts the simulator's own queues). Calls never answered
    are left out (``unanswered`` counts them)."""
    from benchmarks.sim_host import stamps

    sent_at, received_at = stamps(call, wire)
    done_at: dict[str, float] = {}
    for event, t in zip(call.sent, sent_at):
        if t is not None and event.get("type") == "response.output_item.done" \
                and event["item"].get("type") == "function_call":
            done_at[event["item"]["call_id"]] = t
    out = []
    seen: set[str] = set()
    for event, t in zip(call.received, received_at):
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        if event.get("type") == "conversation.item.create" and item.get("type") == "function_call_output":
            cid = str(item.get("call_id"))
            if cid in done_at and cid not in seen:
                seen.add(cid)
                out.append((t - done_at[cid]) * 1000)
    return out


def harness_waits(call: Any) -> tuple[list[float], list[float]]:
    """The simulator's own waits around each tool round, in ms: each function
    call's ``response.output_item.done`` queued → its frame written (behind
    the frames queued before it), and each ``function_call_output`` read off
    the socket → taken by the simulator's reader (behind its own writes).
    The queued measure of ``output`` is the wire measure plus these two."""
    write_waits = [
        (w - q) * 1000 for e, q, w in zip(call.sent, call.sent_at or [], call.written_at or [])
        if w is not None and e.get("type") == "response.output_item.done" and e["item"].get("type") == "function_call"]
    read_waits = []
    for e, r, t in zip(call.received, call.read_at or [], call.received_at or []):
        item = e.get("item") if isinstance(e.get("item"), dict) else {}
        if e.get("type") == "conversation.item.create" and item.get("type") == "function_call_output":
            read_waits.append((t - r) * 1000)
    return write_waits, read_waits


def phase_report(phase: Phase, calls: list[Any], joins: list[dict[str, Any]], trace: bool = False) -> dict[str, Any]:
    """The simulator's numbers for one phase (see the module docstring);
    ``trace``: with the first call's sent events (``sent_events_first_call``)."""
    from benchmarks.sim_host import analyse

    outputs: list[float] = []
    creates: list[float] = []
    outputs_queued: list[float] = []
    creates_queued: list[float] = []
    per_call_p99: list[float] = []
    write_waits: list[float] = []
    read_waits: list[float] = []
    protocol: collections.Counter[str] = collections.Counter()
    for call in calls:
        w, r = harness_waits(call)
        write_waits += w
        read_waits += r
        mine = output_times(call)
        outputs += mine
        outputs_queued += output_times(call, wire=False)
        if mine:
            per_call_p99.append(percentile(mine, 99))
        a = analyse(call, wire=True)
        creates += a["create_ms"]
        creates_queued += analyse(call)["create_ms"]
        protocol["errors"] += len(a["error_codes"])
        protocol["violations"] += len(a["violations"])
        protocol["unanswered"] += len(a["unanswered"])
        protocol["missing_create"] += a["missing_create"]
        protocol["duplicate_outputs"] += a["duplicate_outputs"]
        protocol["tool_calls"] += a["tool_calls"]
        protocol["closed"] += int(call.closed)
    statuses = collections.Counter(str(j["status"]) for j in joins)
    report = {
        "phase": asdict(phase), "output_ms": summary(outputs), "create_ms": summary(creates),
        "output_queued_ms": summary(outputs_queued), "create_queued_ms": summary(creates_queued),
        "sim_write_wait_ms": summary(write_waits), "sim_read_wait_ms": summary(read_waits),
        "rounds_done": len(outputs), "per_call_output_p99_ms": per_call_p99,
        "join_ms": summary(j["ms"] for j in joins if j["status"] == 200),
        "join_statuses": dict(statuses), **protocol,
        "violation_examples": [v for c in calls for v in c.violations][:3],
    }
    if trace and calls:
        report["sent_events_first_call"] = calls[0].sent
    return report


async def _post_connect(port: int, host_header: str, call_id: str) -> dict[str, Any]:
    import trio

    from benchmarks.floods import http_exchange, request_bytes

    body = json.dumps({"call_id": call_id}).encode()
    t0 = trio.current_time()
    status: int | str
    try:
        status, _ = await http_exchange("127.0.0.1", port, request_bytes("POST", "/api/voice/connect",
                                                                         host_header, body))
    except Exception as error:   # refused, reset, EOF: counted, never raised
        status = type(error).__name__
    return {"call_id": call_id, "status": status, "ms": (trio.current_time() - t0) * 1000}


async def join_phase(sim: Any, phase: Phase, port: int, host_header: str, rng: random.Random,
                      wait_s: float) -> list[dict[str, Any]]:
    """Join every call of ``phase`` on its schedule; return once each has
    closed (or its join failed), bounded by the phase's budget."""
    import trio

    joins: list[dict[str, Any]] = []
    ids = phase.call_ids()

    async def join_and_wait(cid: str, at: float) -> None:
        await trio.sleep_until(at)
        j = await _post_connect(port, host_header, cid)
        joins.append(j)
        if j["status"] == 200:
            await sim.calls[cid].wait_until(lambda c: c.closed)

    with trio.move_on_after(phase.budget_s(wait_s)):
        start = trio.current_time()
        if phase.sequential:
            for cid in ids:
                await join_and_wait(cid, trio.current_time())
        else:
            offsets = sorted(rng.uniform(0, phase.spread_s) for _ in ids)
            async with trio.open_nursery() as nursery:
                for cid, offset in zip(ids, offsets):
                    nursery.start_soon(join_and_wait, cid, start + offset)
    return joins


async def sim_run(args: argparse.Namespace) -> dict[str, Any]:
    import trio

    from voiceactors.simulator import Simulator

    phases = [Phase(**{**p, "think_ms": tuple(p["think_ms"])}) for p in json.loads(args.phases)]
    rng = random.Random(args.seed)
    sim = Simulator(None, api_key=BENCH_KEY, validate_sent=False, timestamps=True,
                    coalesce_writes=args.coalesce)
    reports: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sim.serve, 0)
        for phase in phases:
            for cid in phase.call_ids():
                sim.add_call(cid, call_steps(phase, rng))
        print(f"PORT {port}", flush=True)
        by_name = {p.name: p for p in phases}
        with trio.move_on_after(args.timeout):
            while True:
                line = (await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)).strip()
                if not line or line == "STOP":
                    break
                _, name, server_port, host_header = line.split(" ", 3)   # JOIN <phase> <port> <host>
                phase = by_name[name]
                joins = await join_phase(sim, phase, int(server_port), host_header, rng, args.wait)
                reports[name] = phase_report(phase, [sim.calls[c] for c in phase.call_ids()], joins, args.trace)
                print(f"PHASE_DONE {name}", flush=True)
        nursery.cancel_scope.cancel()
    return {"phases": reports, "coalesce_writes": args.coalesce}


def sim_main(argv: list[str]) -> int:
    import gc

    import trio

    from voiceactors import logs

    p = argparse.ArgumentParser(description="burst simulator host")
    p.add_argument("--phases", required=True, help="JSON list of Phase fields")
    p.add_argument("--coalesce", action="store_true", help="one write per burst (default: one per event)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--wait", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--trace", action="store_true", help="report the first call of each phase's sent events")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    logs.configure("json", "warning")
    gc.freeze()   # the records only grow: full collections would stall every call (see sim_host)
    gc.disable()
    result = trio.run(sim_run, args)
    Path(args.out).write_text(json.dumps(result, default=str))
    print(f"DONE {args.out}", flush=True)
    return 0


# --- the driver -----------------------------------------------------------------------------

def _peer_repo() -> Path | None:
    repo = os.environ.get("BENCH_PEER_REPO")
    return Path(repo) if repo else None


def quiet(server: Proc, *, below_core_pct: float = 5.0, max_s: float = 5.0) -> float:
    """Wait until the server's CPU over 0.2 s is below ``below_core_pct`` of
    a core (at most ``max_s``): a phase's tail work (call ends, record
    writes) belongs to its window. Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_s:
        c0 = server.cpu_s()
        time.sleep(0.2)
        if (server.cpu_s() - c0) / 0.2 * 100 < below_core_pct:
            break
    return round(time.monotonic() - t0, 2)


def profile_start(server: Proc, phase: Phase, args: argparse.Namespace, run_dir: Path) -> Any:
    """With ``--py-spy SECONDS``: sample the server under test for that long
    from the start of the mode's main phase (``server.pyspy.txt``)."""
    if not args.py_spy or phase.name not in ("burst", "one", "long"):
        return None
    from benchmarks.roundtrip import start_py_spy

    spy = start_py_spy(server.popen.pid, args.py_spy, run_dir)
    return spy


def profile_finish(spy: Any, seconds: float, run_dir: Path) -> str:
    import subprocess

    from benchmarks.profile_summary import summarise

    try:
        spy.wait(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        spy.kill()
    raw = run_dir / "peer.pyspy.txt"     # the name roundtrip's sampler writes
    return summarise(raw.read_text(errors="replace")) if raw.exists() else "no profile"


def idle_core_pct(server: Proc, seconds: float) -> float:
    """The server's CPU with no call, as % of a core, over ``seconds``: its
    timers' cost, taken out of the per-round numbers (psutil counts 10 ms ticks)."""
    if seconds <= 0:
        return 0.0
    c0 = server.cpu_s()
    time.sleep(seconds)
    return round(100 * (server.cpu_s() - c0) / seconds, 2)


def start_server(peer: str, sim_port: int, port: int, run_dir: Path) -> Proc:
    if peer == "nothing":
        server = spawn("nothing", "benchmarks.peers.nothing", [
            "--port", str(port), "--base-url", f"http://127.0.0.1:{sim_port}/v1", "--api-key", BENCH_KEY],
            workdir=run_dir)
        server.expect("STARTED", 30)
        return server
    from benchmarks.floods import serve_against_sim

    return serve_against_sim(sim_port, port, sample_journal(14), run_dir,
                             env={"VOICEACTORS_RATE_LIMIT_PER_S": "0"}, repo=_peer_repo())


def run_server(peer: str, phases: list[Phase], args: argparse.Namespace, tag: str) -> dict[str, Any]:
    """A fresh simulator and server of ``peer``; every phase in order, each in its own CPU window."""
    run_dir = work_dir() / "runs" / f"burst-{tag}-{peer}-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    sim_out = run_dir / "sim.json"
    budget = sum(p.budget_s(args.wait) for p in phases) + 60
    module, role = SIMS[args.sim]
    sim = spawn("sim", module, [
        role, "--phases", json.dumps([asdict(p) for p in phases]), "--seed", str(args.seed),
        "--wait", str(args.wait), "--timeout", str(budget), "--out", str(sim_out),
        *(["--coalesce"] if args.coalesce else []), *(["--trace"] if args.trace_sent else [])], workdir=run_dir)
    server = None
    windows: dict[str, Any] = {}
    result: dict[str, Any] = {"peer": peer, "run_dir": str(run_dir), "sim": args.sim,
                              "server_repo": str(_peer_repo() or "") if peer == "ours" else ""}
    try:
        sim_port = int(sim.expect("PORT", 60))
        port = free_loopback_port()
        server = start_server(peer, sim_port, port, run_dir)
        if args.pin_cpus:   # the simulator and the server each on its own core: no wake-up preemption between them
            sim.ps.cpu_affinity([args.pin_cpus[0]])
            server.ps.cpu_affinity([args.pin_cpus[1]])
        quiet(server)
        result["idle_core_pct"] = idle_core_pct(server, args.idle_s)
        for phase in phases:
            window = CpuWindow({"server": server, "sim": sim})
            window.start()
            sim.send(f"JOIN {phase.name} {port} 127.0.0.1:{port}")
            spy = profile_start(server, phase, args, run_dir)
            sim.expect(f"PHASE_DONE {phase.name}", phase.budget_s(args.wait) + 30)
            settled = quiet(server, max_s=args.settle_max_s)
            windows[phase.name] = {**window.stop(), "settle_s": settled}
            if spy is not None:
                result["profile"] = profile_finish(spy, args.py_spy, run_dir)
        sim.send("STOP")
        sim.expect("DONE", 60)
        sim_result = json.loads(sim_out.read_text())
        if peer == "ours":
            server.popen.send_signal(signal.SIGTERM)
        server.close_stdin()
        result["server_rc"] = server.wait(30)
    finally:
        for proc in (server, sim):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.terminate()
                proc.wait(10)
    result["server_stderr_tail"] = server.tail(400) if server else ""
    result["phases"] = {name: {**report, "cpu": windows.get(name)} for name, report in sim_result["phases"].items()}
    result["coalesce_writes"] = sim_result["coalesce_writes"]
    add_cpu_per_unit(result["phases"], result["idle_core_pct"])
    if not args.keep:
        shutil.rmtree(run_dir / "state", ignore_errors=True)
    return result


def add_cpu_per_unit(phases: dict[str, Any], idle_core_pct: float = 0.0) -> None:
    """Server CPU ms per call for phases without rounds (``connect``); per
    round for the others: ``gross`` (all of the window) and ``net`` (minus
    the calls' connects, at the connect phase's cost per call). Both take
    out what the idle server spends over the window (``idle_core_pct``)."""
    def busy_ms(p: dict[str, Any]) -> float:
        cpu = p["cpu"]
        cpu_s: float = cpu["server"]["cpu_s"]
        wall_s: float = cpu["wall_s"]
        return 1000 * max(0.0, cpu_s - idle_core_pct / 100 * wall_s)

    connect = phases.get("connect")
    per_connect = None
    if connect and connect.get("cpu") and connect["phase"]["calls"]:
        per_connect = busy_ms(connect) / connect["phase"]["calls"]
        connect["server_ms_per_connect"] = round(per_connect, 2)
    for name, p in phases.items():
        if name == "connect" or not p.get("cpu") or not p["rounds_done"]:
            continue
        cpu_ms = busy_ms(p)
        p["server_ms_per_round_gross"] = round(cpu_ms / p["rounds_done"], 3)
        if per_connect is not None:
            p["server_ms_per_round_net"] = round((cpu_ms - per_connect * p["phase"]["calls"]) / p["rounds_done"], 3)
    add_sim_cpu_per_unit(phases)


def add_sim_cpu_per_unit(phases: dict[str, Any]) -> None:
    """The load generator's own CPU ms per connect and per round (gross; net
    of the connects at the connect phase's cost per call), as for the server:
    what ``--sim`` costs per unit of load."""
    def sim_ms(p: dict[str, Any]) -> float:
        cpu_s: float = p["cpu"]["sim"]["cpu_s"]
        return 1000 * cpu_s

    connect = phases.get("connect")
    per_connect = None
    if connect and connect.get("cpu") and connect["phase"]["calls"]:
        per_connect = sim_ms(connect) / connect["phase"]["calls"]
        connect["sim_ms_per_connect"] = round(per_connect, 2)
    for name, p in phases.items():
        if name == "connect" or not p.get("cpu") or not p["rounds_done"]:
            continue
        p["sim_ms_per_round_gross"] = round(sim_ms(p) / p["rounds_done"], 3)
        if per_connect is not None:
            p["sim_ms_per_round_net"] = round((sim_ms(p) - per_connect * p["phase"]["calls"]) / p["rounds_done"], 3)


def phase_line(peer: str, name: str, p: dict[str, Any]) -> str:
    cpu = p.get("cpu") or {}
    parts = [f"{peer:>7} {name:<7} calls={p['phase']['calls']:<4} rounds={p['rounds_done']:<5}",
             f"output {fmt(p['output_ms'])}", f"create {fmt(p['create_ms'])}", f"join {fmt(p['join_ms'])}"]
    if "output_queued_ms" in p:   # the queued measure (the simulator's queues counted)
        parts.append(f"queued-measure output {fmt(p['output_queued_ms'])} create {fmt(p['create_queued_ms'])} "
                     f"(sim waits: write {fmt(p['sim_write_wait_ms'])}, read {fmt(p['sim_read_wait_ms'])})")
    if cpu:
        parts.append(f"server CPU {cpu['server']['cpu_s']:.2f} s ({cpu['server']['core_pct']}% core), "
                     f"sim {cpu['sim']['core_pct']}% core over {cpu['wall_s']} s")
    if "server_ms_per_connect" in p:
        parts.append(f"{p['server_ms_per_connect']} ms CPU per connect")
    if "server_ms_per_round_gross" in p:
        net = p.get("server_ms_per_round_net")
        parts.append(f"{p['server_ms_per_round_gross']} ms CPU per round gross"
                     + (f", {net} net of connects" if net is not None else ""))
    if "sim_loop_lag_ms" in p:   # the lean peer's own scheduling delay (a 50 ms sleep's lateness)
        parts.append(f"sim loop lag {fmt(p['sim_loop_lag_ms'])}")
    if "sim_ms_per_connect" in p:
        parts.append(f"sim {p['sim_ms_per_connect']} ms CPU per connect")
    if "sim_ms_per_round_gross" in p:
        net = p.get("sim_ms_per_round_net")
        parts.append(f"sim {p['sim_ms_per_round_gross']} ms CPU per round gross"
                     + (f", {net} net" if net is not None else ""))
    parts.append(f"joins {p['join_statuses']} errors {p['errors']} violations {p['violations']} "
                 f"unanswered {p['unanswered']}")
    return " | ".join(parts)


def step_passes(p: dict[str, Any], target_ms: float, share: float) -> tuple[bool, float]:
    """(passed, the share of calls whose own output p99 ≤ ``target_ms``)."""
    calls = p["phase"]["calls"]
    good = sum(1 for v in p["per_call_output_p99_ms"] if v <= target_ms)
    got = good / calls if calls else 0.0
    complete = p["join_statuses"].get("200", 0) == calls and p["unanswered"] == 0
    return bool(complete and got >= share), round(got, 3)


def run_mode(args: argparse.Namespace) -> dict[str, Any]:
    peers = args.peers or (["ours", "nothing"] if args.mode in ("burst", "one") else ["ours"])
    out: dict[str, Any] = {"mode": args.mode, "peers": peers, "results": []}
    if args.mode != "sweep":
        for peer in peers:
            r = run_server(peer, phases_for(args.mode, args), args, args.mode)
            out["results"].append(r)
            for name, p in r["phases"].items():
                if name != "warm":
                    print(phase_line(peer, name, p), flush=True)
            if r.get("profile"):
                print(f"{peer} profile:\n{r['profile']}", flush=True)
        by_peer = {r["peer"]: r["phases"] for r in out["results"]}
        main_phase = {"burst": "burst", "one": "one", "long": "long"}[args.mode]
        if "ours" in by_peer and "nothing" in by_peer:
            o, n = by_peer["ours"][main_phase]["output_ms"], by_peer["nothing"][main_phase]["output_ms"]
            if o["n"] and n["n"] and n["p50"] > 0:
                out["ours_vs_nothing_output_p50"] = round(o["p50"] / n["p50"], 2)
                print(f"ours / nothing output p50: {out['ours_vs_nothing_output_p50']}x "
                      f"(ours p99 {o['p99']:.1f} ms)", flush=True)
            elif o["n"] and n["n"]:
                # The output clock starts at output_item.done; the do-nothing server answers at
                # arguments.done, one event earlier, so on a quiet run its p50 can be <= 0 and a
                # ratio would mean nothing.
                out["ours_vs_nothing_output_p50"] = None
                out["ratio_skipped"] = f"do-nothing output p50 is {n['p50']:.2f} ms (not > 0)"
                print(f"ours / nothing output p50: not computed ({out['ratio_skipped']})", flush=True)
            key = "server_ms_per_round_net" if "connect" in by_peer["ours"] else "server_ms_per_round_gross"
            mine, floor = by_peer["ours"][main_phase].get(key), by_peer["nothing"][main_phase].get(key)
            if mine is not None and floor is not None:   # what our code costs beyond reading the frames
                out["ours_minus_nothing_ms_per_round"] = round(mine - floor, 3)
                print(f"ours - nothing CPU per round ({key}): {out['ours_minus_nothing_ms_per_round']} ms", flush=True)
        return out
    steps = []
    for n in args.steps:
        for peer in peers:
            r = run_server(peer, phases_for("sweep", args, n), args, f"sweep{n}")
            p = r["phases"]["burst"]
            passed, share = step_passes(p, args.target_ms, args.pass_share)
            steps.append({"peer": peer, "calls": n, "passed": passed, "share_within_target": share, "result": r})
            print(phase_line(peer, "burst", p) + f" | {share:.0%} of calls p99 <= {args.target_ms} ms: "
                  f"{'PASS' if passed else 'FAIL'}", flush=True)
        if not all(s["passed"] for s in steps if s["calls"] == n):
            break
    out["steps"] = steps
    for peer in peers:
        passing = [s["calls"] for s in steps if s["peer"] == peer and s["passed"]]
        out.setdefault("capacity", {})[peer] = max(passing) if passing else 0
        print(f"burst capacity {peer}: {out['capacity'][peer]} calls (steps tried "
              f"{[s['calls'] for s in steps if s['peer'] == peer]})", flush=True)
    return out


def markdown_rows(out: dict[str, Any]) -> list[str]:
    """One table row per reported phase."""
    def ms(s: dict[str, Any]) -> str:
        return f"{s['p50']:.1f} / {s['p99']:.1f}" if s.get("n") else ""

    rows = []
    results = [s["result"] for s in out["steps"]] if "steps" in out else out["results"]
    for r in results:
        code = out["code"] if r["peer"] == "ours" else "do-nothing"
        for name, p in r["phases"].items():
            if name == "warm":
                continue
            cpu = p.get("cpu") or {}
            per = (f"{p['server_ms_per_connect']}" if "server_ms_per_connect" in p else
                   f"{p.get('server_ms_per_round_net', '')} ({p.get('server_ms_per_round_gross', '')})")
            rows.append(f"| {out['machine']['when_utc']} (load {out['machine']['loadavg_1m']}) | {code} | {name} | "
                        f"{p['phase']['calls']} | {p['rounds_done']} | {ms(p['output_ms'])} | {ms(p['create_ms'])} | "
                        f"{ms(p['join_ms'])} | {per} | {cpu.get('server', {}).get('core_pct', '')} % | "
                        f"{cpu.get('sim', {}).get('core_pct', '')} % |")
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["burst", "one", "long", "sweep"], default="burst")
    p.add_argument("--peers", nargs="*", choices=PEERS, help="default: ours nothing (burst, one); ours (long, sweep)")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--spread", type=float, default=1.0, help="seconds over which the calls join")
    p.add_argument("--rounds", type=int, help="tool rounds per call (burst, sweep: 20; one: 50)")
    p.add_argument("--think-ms", type=float, nargs=2, metavar=("MIN", "MAX"),
                   help="think time between a call's rounds (default 50 250; long: 0 0)")
    p.add_argument("--warm-calls", type=int, default=5, help="calls of the unreported warm-up phase (0: none)")
    p.add_argument("--hold-s", type=float, default=0.5, help="how long the connect phase's calls stay open")
    p.add_argument("--long-rounds", type=int, default=3000)
    p.add_argument("--short-calls", type=int, default=20, help="long mode: 5-round calls, one after another")
    p.add_argument("--steps", type=int, nargs="*", default=[50, 100, 150, 200, 300])
    p.add_argument("--target-ms", type=float, default=50.0)
    p.add_argument("--pass-share", type=float, default=0.5)
    p.add_argument("--coalesce", action="store_true", help="the simulator coalesces queued events (steady-state style)")
    p.add_argument("--sim", choices=sorted(SIMS), default="simulator",
                   help="the load generator: our simulator (default) or the lean peer (benchmarks/lean_sim.py)")
    p.add_argument("--trace-sent", action="store_true",
                   help="report each phase's first call's sent events (sent_events_first_call)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--wait", type=float, default=10.0, help="wait_outputs bound per round (s)")
    p.add_argument("--settle-max-s", type=float, default=5.0)
    p.add_argument("--idle-s", type=float, default=2.0, help="seconds the idle server's CPU is measured (0: not)")
    p.add_argument("--py-spy", type=float, metavar="SECONDS",
                   help="sample the server with py-spy this long from the main phase's start (summary in the JSON)")
    p.add_argument("--keep", action="store_true", help="keep the server's state directory")
    p.add_argument("--pin-cpus", type=int, nargs=2, metavar=("SIM", "SERVER"),
                   help="pin the simulator and the server under test to these CPUs (one each; default: not pinned)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    args.rounds_given = args.rounds is not None
    args.rounds = args.rounds if args.rounds is not None else 20
    args.think_given = args.think_ms is not None
    args.think_ms = args.think_ms if args.think_ms is not None else [50.0, 250.0]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_sim"]:
        return sim_main(argv[1:])
    args = parse_args(argv)
    facts = machine_facts()
    print(f"# machine: {facts}", flush=True)
    out = run_mode(args)
    out.update(machine=facts, machine_after=machine_facts(), argv=sys.argv,
               server_repo=str(_peer_repo() or ""), code=code_label(_peer_repo()))
    out["markdown"] = markdown_rows(out)
    print("\n".join(out["markdown"]), flush=True)
    if args.json:
        write_json(Path(args.json), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
