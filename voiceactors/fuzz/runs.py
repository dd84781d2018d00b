"""Fuzz runs: a captured call played with a schedule drawn from a seed, then
checked (``invariants.broken``); many runs, in parallel processes where the
machine has the cores; a failure shrunk to the fewest changes that still
break the call."""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

import trio
import trio.testing

from voiceactors import clock as clock_module
from voiceactors import logs
from voiceactors.call.event_capture import read_capture
from voiceactors.fuzz.clock import jump_when_idle, seed_scheduler
from voiceactors.fuzz.invariants import broken
from voiceactors.fuzz.schedule import Schedule
from voiceactors.replay import Played, play_script
from voiceactors.replay.conditions import Conditions
from voiceactors.simulator.capture_player import ReplayScript

__all__ = ["GATE_S", "Failure", "RunResult", "load_script", "minimal", "run_schedule", "run_seeds"]

#: How long a replay's gate waits for our output or ``response.create`` (on
#: the run's mock clock: a gate that is never met costs no real time).
GATE_S = 30.0


@dataclass(frozen=True)
class RunResult:
    seed: int
    schedule: Schedule
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Failure:
    run: RunResult
    minimal: Schedule


def load_script(capture: Path, block: int = -1) -> ReplayScript:
    """The steps of one capture block (the last: the latest actor run)."""
    return ReplayScript.from_block(read_capture(capture)[block])


def run_schedule(script: ReplayScript, schedule: Schedule, journal: Path, today: str,
                 conditions: Conditions = Conditions()) -> tuple[str, ...]:
    """Play ``script`` changed by ``schedule`` against the runtime on a copy
    of ``journal`` (today pinned to ``today``), in the capture's
    ``conditions`` (a slow tool source paced by the run's clock), on a mock clock that jumps when
    every task waits and no worker thread works, with trio's scheduler seeded
    by the schedule's seed (``clock.py``); what it broke. Blocking: a
    ``trio.run`` of its own."""
    changed = schedule.apply(script)
    clock = trio.testing.MockClock()
    seed_scheduler(schedule.seed)

    async def play() -> Played:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jump_when_idle, clock)
            # no tool timeout: a tool's time is real time, the run's waits are the clock's
            played = await play_script(changed, journal, timeout_s=GATE_S, conditions=conditions,
                                       tool_timeout_read_s=math.inf, tool_timeout_write_s=math.inf)
            nursery.cancel_scope.cancel()
        return played

    clock_module.pin(today)
    try:
        played = trio.run(play, clock=clock)
    finally:
        clock_module.pin(None)
    return tuple(broken(played))


def _run_seed(script: ReplayScript, seed: int, journal: Path, today: str,
              keep: tuple[int, ...] | None, conditions: Conditions) -> RunResult:
    schedule = Schedule.draw(script, seed)
    if keep is not None:
        schedule = Schedule(seed, tuple(c for i, c in enumerate(schedule.changes) if i in keep))
    return RunResult(seed, schedule, run_schedule(script, schedule, journal, today, conditions))


def run_seeds(script: ReplayScript, seeds: Iterable[int], journal: Path, today: str, *, jobs: int = 1,
              keep: tuple[int, ...] | None = None, conditions: Conditions = Conditions(),
              each: Callable[[RunResult], None] = lambda result: None) -> list[RunResult]:
    """One run per seed, ``jobs`` at a time (processes of their own when
    more than one), in the capture's ``conditions``, until a run breaks an invariant (the runs under way then
    finish, no new one starts); ``each`` hears every result as it comes."""
    seeds = list(seeds)
    results: list[RunResult] = []
    if jobs <= 1:
        for seed in seeds:
            results.append(_run_seed(script, seed, journal, today, keep, conditions))
            each(results[-1])
            if results[-1].problems:
                break
        return results
    context = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                          else "spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_quiet) as pool:
        futures = [pool.submit(_run_seed, script, seed, journal, today, keep, conditions) for seed in seeds]
        for future in concurrent.futures.as_completed(futures):
            results.append(future.result())
            each(results[-1])
            if results[-1].problems:
                for other in futures:
                    other.cancel()
                break
    return sorted(results, key=lambda r: r.seed)


def _quiet() -> None:
    """A worker process logs errors only, as the command does."""
    logs.configure("console", "error")


def minimal(script: ReplayScript, failed: RunResult, journal: Path, today: str,
            conditions: Conditions = Conditions()) -> Schedule:
    """The fewest of the failed run's changes that still break the call:
    each change is left out in turn, and stays out when the call still
    breaks without it."""
    schedule = failed.schedule
    index = 0
    while index < len(schedule.changes):
        smaller = schedule.without(index)
        if run_schedule(script, smaller, journal, today, conditions):
            schedule = smaller
        else:
            index += 1
    return schedule

