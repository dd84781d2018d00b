"""Soak: hundreds of concurrent simulated calls for a few minutes, then the books.

One trio process runs the Realtime simulator and our real runtime (brain,
tool executor, call supervisor) on loopback. A driver keeps ``--concurrency``
calls live, starting a new one whenever one ends, until ``--duration``
seconds have passed or ``--calls`` calls were started (both bounds hold).
Each call plays a script drawn from a generator seeded with its index:
several user turns, each either a tool round (1-3 reads in one response,
outputs, one ``response.create``, an answer) or a barge-in round (the user
interrupts a response while its ``journal.search`` runs), then a clean close.

It ends with the books, and fails (exit 1) when one does not balance:

* every tool call answered exactly once — per call, the simulator's outputs
  are exactly its issued tool call ids, one each; no protocol error, no
  violation; every call record ends ``closed_by_service``;
* no task left behind — after the last call ends, the number of trio tasks
  (a walk from ``trio.lowlevel.current_root_task()``) is back to what it was
  before the first call;
* memory flat after the calls end — resident memory (``VmRSS`` from
  ``/proc/self/status``) after all calls, against after a warm-up wave of
  the same concurrency; the growth must stay under ``--rss-slack-mib``.

Checked calls are dropped from the simulator's records as they end, so the
simulator's bookkeeping does not count as our memory.

Run (by hand, not in CI)::

    .venv/bin/python -m benchmarks.soak                      # 300 live calls, 180 s
    .venv/bin/python -m benchmarks.soak --concurrency 100 --duration 60
    .venv/bin/python -m benchmarks.soak --duration 120 --gc-full-interval 300   # peak memory under serve's GC schedule
    .venv/bin/python -m benchmarks.soak --concurrency 20 --duration 5 --calls 60   # what the suite runs

``tests/test_soak_small.py`` runs ``soak()`` with 20 calls for a few seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import io
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from voiceactors import gc_policy, logs
from voiceactors.call.record import read_record, record_path
from voiceactors.messages import Connect, CountCalls, ask
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator
from voiceactors.simulator.scenario import Step
from voiceactors.runtime import open_runtime
from voiceactors.settings import Settings

SOAK_DAY = dt.date(2026, 3, 27)
SOAK_KEY = "sk-soak-voiceactors-local"
READS = [
    ("calendar.today", {}), ("briefing.get", {}), ("commitments.list", {"state": "open"}),
    ("commitments.list", {"limit": 5}), ("journal.get_day", {"day": "2026-03-26"}),
    ("journal.search", {"query": "launch", "limit": 3}), ("entities.get", {"entity_slug": "nobody_at_all"}),
    ("observer.start_listening", {"mode": "voice_memo"}),
]


@dataclass
class SoakConfig:
    concurrency: int = 300
    duration_s: float = 180.0
    max_calls: int = 5000
    rounds: tuple[int, int] = (2, 5)        # user turns per call (inclusive range)
    pause_s: tuple[float, float] = (0.2, 2.0)  # between turns
    barge_in_share: float = 0.3
    rss_slack_mib: float = 24.0
    seed: int = 0
    log_level: str = "warning"
    gc_full_interval_s: float = 0.0         # > 0: serve's scheduled full collections (gc_policy)


@dataclass
class SoakReport:
    calls_started: int = 0
    calls_checked: int = 0
    tool_calls: int = 0
    barge_ins: int = 0
    max_live: int = 0
    problems: list[str] = field(default_factory=list)
    tasks_before: int = 0
    tasks_after: int = 0
    rss_start_mib: float = 0.0
    rss_warm_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_end_mib: float = 0.0
    elapsed_s: float = 0.0
    error_log_lines: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["ok"] = self.ok
        out["problems"] = self.problems[:50]
        return out


# --- measurements -------------------------------------------------------------------

def rss_mib() -> float:
    """Resident memory of this process (``VmRSS``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def count_tasks() -> int:
    """Every live trio task, by a walk of the task tree from the root."""
    count = 0
    root = trio.lowlevel.current_root_task()
    assert root is not None     # only called inside trio.run
    stack = [root]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


# --- scripts ----------------------------------------------------------------------------

def script(index: int, cfg: SoakConfig) -> tuple[list[Step], int]:
    """The scenario steps of call ``index`` and how many barge-ins it has."""
    rng = random.Random(cfg.seed * 1_000_003 + index)
    # gpt-realtime lets a call go on while a tool call waits: a read slow enough
    # under the soak's load is acknowledged (docs/calls.md § Slow tools), which
    # the simulator counts as a violation unless the model may do so
    steps: list[Step] = [{"async_tools": True}]
    barge_ins = 0
    for turn in range(rng.randint(*cfg.rounds)):
        steps.append({"user_turn": {"text": f"turn {turn}", "duration_ms": 20}})
        if rng.random() < cfg.barge_in_share:
            barge_ins += 1
            steps += [
                {"response": {"text": "Let me look.", "tool_calls": [
                    {"name": "journal.search", "arguments": {"query": rng.choice(["offsite", "launch", "alice"])}}],
                    "hold_s": 0.3}},
                {"barge_in": {"after_ms": rng.randint(0, 150), "text": "never mind"}},
                {"response": {"text": "Sure."}},
                {"wait_outputs": {"response_create": False, "timeout_s": 60}},
            ]
        else:
            calls = [{"name": n, "arguments": a} for n, a in rng.sample(READS, rng.randint(1, 3))]
            steps += [
                {"response": {"tool_calls": calls}},
                {"wait_outputs": {"timeout_s": 60}},
                {"response": {"text": "Here is what I found."}},
            ]
        steps.append({"sleep": round(rng.uniform(*cfg.pause_s), 3)})
    steps.append({"close": 1000})
    return steps, barge_ins


# --- the run -------------------------------------------------------------------------------

def check_call(sim: Simulator, state_dir: Path, call_id: str, report: SoakReport) -> None:
    """The books of one ended call; then forget its simulator records."""
    call = sim.calls.pop(call_id)
    report.calls_checked += 1
    report.tool_calls += len(call.tool_calls)
    issued, answered = set(call.tool_calls), set(call.outputs)
    if issued != answered:
        report.problems.append(f"{call_id}: issued {sorted(issued)} answered {sorted(answered)}")
    for tool_call_id, outputs in call.outputs.items():
        if len(outputs) != 1:
            report.problems.append(f"{call_id}: {tool_call_id} answered {len(outputs)} times")
    if call.error_codes:
        report.problems.append(f"{call_id}: service errors {call.error_codes}")
    if call.violations:
        report.problems.append(f"{call_id}: violations {call.violations}")
    record = read_record(record_path(state_dir, call_id))
    reason = record[-1].get("reason") if record and record[-1].get("kind") == "end" else None
    if reason != "closed_by_service":
        report.problems.append(f"{call_id}: ended {reason}")


async def run_wave(sim: Simulator, runtime: Any, state_dir: Path, cfg: SoakConfig, report: SoakReport,
                   *, first_index: int, deadline: float, max_calls: int) -> int:
    """Keep ``cfg.concurrency`` calls live until ``deadline`` or ``max_calls``
    calls were started; return when every started call has ended and been
    checked. Returns the next call index."""
    supervisor = runtime.actors["calls"]
    limit = trio.Semaphore(cfg.concurrency)
    index = first_index

    async def one_call(call_index: int) -> None:
        call_id = f"rtc_soak_{call_index:06d}"
        steps, barge_ins = script(call_index, cfg)
        sim_call = sim.add_call(call_id, steps)
        report.barge_ins += barge_ins
        try:
            answer = await ask(runtime.calls, lambda reply: Connect(call_id, reply), timeout=30)
            if answer != "connected":
                report.problems.append(f"{call_id}: connect answered {answer}")
                sim.calls.pop(call_id, None)
                return
            report.max_live = max(report.max_live, len(supervisor.calls))
            with trio.move_on_after(300) as stuck:
                await sim_call.wait_until(lambda c: c.closed and c.connection is None)
                while call_id in supervisor.calls:
                    await trio.sleep(0.02)
            if stuck.cancelled_caught:
                report.problems.append(f"{call_id}: did not end within 300 s")
                sim.calls.pop(call_id, None)
                return
            check_call(sim, state_dir, call_id, report)
        finally:
            limit.release()

    async with trio.open_nursery() as nursery:
        while time.monotonic() < deadline and index - first_index < max_calls:
            await limit.acquire()
            report.calls_started += 1
            nursery.start_soon(one_call, index)
            index += 1
    return index


async def soak(cfg: SoakConfig, workdir: Path | None = None) -> SoakReport:
    """Run the soak; the report says whether the books balance."""
    report = SoakReport()
    started = time.monotonic()
    log_buffer = io.StringIO()
    logs.configure("json", cfg.log_level, stream=log_buffer)
    with tempfile.TemporaryDirectory(prefix="voiceactors-soak-", dir=workdir) as tmp:
        journal = write_sample_journal(Path(tmp) / "journal", days=3, today=SOAK_DAY)
        sim = Simulator(None, api_key=SOAK_KEY)
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            settings = Settings(journal=journal, state_dir=Path(tmp) / "state", openai_api_key_env=SOAK_KEY,
                                openai_base_url=sim.base_url, max_calls=max(1000, cfg.concurrency * 2),
                                feed_retention_s=1.0, tool_timeout_read_s=30.0, call_idle_timeout_s=120.0,
                                close_deadline_s=5.0, reconnect_attempts=3)
            from voiceactors import clock
            clock.pin(SOAK_DAY.isoformat())
            try:
                async with open_runtime(settings) as runtime:
                    gc.collect()
                    await trio.sleep(0.2)
                    report.tasks_before = count_tasks()
                    report.rss_start_mib = rss_mib()
                    # warm-up: one wave of the full concurrency (caches, the search index, allocator pools)
                    index = await run_wave(sim, runtime, settings.state_dir, cfg, report, first_index=0,
                                           deadline=math.inf, max_calls=cfg.concurrency)
                    gc.collect()
                    report.rss_warm_mib = rss_mib()
                    deadline = time.monotonic() + cfg.duration_s
                    peak = [report.rss_warm_mib]

                    async def sample_rss(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                        task_status.started()
                        while True:
                            peak[0] = max(peak[0], rss_mib())
                            await trio.sleep(1.0)

                    async with trio.open_nursery() as sampler:
                        await sampler.start(sample_rss)
                        sampler.start_soon(gc_policy.collect_on_schedule, cfg.gc_full_interval_s)
                        await run_wave(sim, runtime, settings.state_dir, cfg, report, first_index=index,
                                       deadline=deadline, max_calls=max(0, cfg.max_calls - index))
                        sampler.cancel_scope.cancel()
                    live = await ask(runtime.calls, CountCalls, timeout=10)
                    if live:
                        report.problems.append(f"{live} calls still live at the end")
                    await trio.sleep(0.5)      # let closed sockets' tasks unwind
                    gc.collect()
                    report.tasks_after = count_tasks()
                    report.rss_peak_mib = peak[0]
                    report.rss_end_mib = rss_mib()
            finally:
                clock.pin(None)
            nursery.cancel_scope.cancel()
    report.elapsed_s = round(time.monotonic() - started, 1)
    if report.tasks_after != report.tasks_before:
        report.problems.append(f"tasks: {report.tasks_before} before the calls, {report.tasks_after} after")
    growth = report.rss_end_mib - report.rss_warm_mib
    if growth > cfg.rss_slack_mib:
        report.problems.append(f"memory grew {growth:.1f} MiB after the warm-up (slack {cfg.rss_slack_mib} MiB)")
    errors = [line for line in log_buffer.getvalue().splitlines() if '"level": "error"' in line
              or '"level":"error"' in line]
    report.error_log_lines = len(errors)
    if errors:
        report.problems.append(f"{len(errors)} error log lines, first: {errors[0][:300]}")
    if sim.calls:
        report.problems.append(f"{len(sim.calls)} simulator calls never checked")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=300, help="live calls at once (default 300)")
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of soak after the warm-up wave")
    parser.add_argument("--calls", type=int, default=5000, help="at most this many calls in all")
    parser.add_argument("--barge-in-share", type=float, default=0.3)
    parser.add_argument("--rss-slack-mib", type=float, default=24.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gc-full-interval", type=float, default=0.0,
                        help="run serve's scheduled full collections every this many seconds (0: Python's policy)")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    cfg = SoakConfig(concurrency=args.concurrency, duration_s=args.duration, max_calls=args.calls,
                     barge_in_share=args.barge_in_share, rss_slack_mib=args.rss_slack_mib, seed=args.seed,
                     gc_full_interval_s=args.gc_full_interval)
    report = trio.run(soak, cfg)
    logs.configure("json", "info")
    text = json.dumps(report.as_dict(), indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
