"""``voiceactors fuzz CAPTURE``: the report on stdout, one line per run and
each failure in full (what broke, the fewest changes that still break it,
the command that replays it). Exit 0 when every run kept every invariant,
1 when one did not, 2 for a capture it cannot read."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from voiceactors import clock, logs
from voiceactors.fuzz.runs import RunResult, load_script, minimal, run_seeds
from voiceactors.fuzz.schedule import Schedule
from voiceactors.replay import journal_for_runs, load_conditions, load_expectation, expectation_path, sweep_stale_folders

__all__ = ["cli_fuzz", "fuzz"]


def fuzz(capture: Path, *, runs: int, seed: int, jobs: int, journal: str | None, today: str | None,
         keep: tuple[int, ...] | None = None, out: TextIO = sys.stdout) -> int:
    """The runs of seeds ``seed`` … ``seed + runs - 1``; 0 when each kept the invariants."""
    try:
        script = load_script(capture)
        conditions = load_conditions(capture)      # the slow tool source of a capture that had one
    except (OSError, ValueError) as error:
        print(f"voiceactors fuzz: {error}", file=sys.stderr)
        return 2
    expected = expectation_path(capture)
    today = today or (load_expectation(expected).get("today") if expected.exists() else None) \
        or clock.today().isoformat()
    print(f"fuzzing {capture.name}: {runs} runs from seed {seed}, {jobs} at a time", file=out)

    def each(result: RunResult) -> None:
        verdict = "ok" if not result.problems else "FAILED"
        print(f"  seed {result.seed}: {verdict} ({len(result.schedule.changes)} changes)", file=out, flush=True)

    with journal_for_runs(journal, today) as journal_dir:
        results = run_seeds(script, range(seed, seed + runs), journal_dir, today, jobs=jobs, keep=keep,
                            conditions=conditions, each=each)
        failed = next((result for result in results if result.problems), None)
        if failed is None:
            print(f"OK: {runs} runs kept every invariant", file=out)
            return 0
        smallest = minimal(script, failed, journal_dir, today, conditions)
    _report(capture, script, failed, smallest, out)
    return 1


def _report(capture: Path, script: Any, failed: RunResult, smallest: Any, out: TextIO) -> None:
    print(f"FAILED: the run of seed {failed.seed} broke an invariant:", file=out)
    for problem in failed.problems:
        print(f"  - {problem}", file=out)
    print(f"  the fewest of its changes that still break it ({len(smallest.changes)} of "
          f"{len(failed.schedule.changes)}):", file=out)
    for line in smallest.describe(script):
        print(f"  - {line}", file=out)
    if not smallest.changes:
        print(f"  it breaks with no change at all: voiceactors fuzz {capture} --seed {failed.seed} --runs 1 "
              "--keep none", file=out)
        return
    # indices into the seed's whole schedule (what --keep selects from), not
    # into a schedule already cut down by --keep
    drawn = Schedule.draw(script, failed.seed).changes
    kept = ",".join(str(drawn.index(change)) for change in smallest.changes)
    print(f"  replay it: voiceactors fuzz {capture} --seed {failed.seed} --runs 1 --keep {kept}", file=out)


def _kept(text: str | None) -> tuple[int, ...] | None:
    """``--keep``'s indices (None: every change; ``none``: no change)."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return ()
    return tuple(int(part) for part in text.split(",") if part.strip())


def cli_fuzz(args: argparse.Namespace) -> int:
    logs.configure("console", "error")     # the calls' own warnings (a drop's reconnect) would drown the report
    sweep_stale_folders()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    try:
        keep = _kept(args.keep)
    except ValueError:
        print(f"voiceactors fuzz: --keep takes change indices (0,2) or none, not {args.keep!r}", file=sys.stderr)
        return 2
    if args.runs < 1 or args.jobs < 1:
        print("voiceactors fuzz: --runs and --jobs must be at least 1", file=sys.stderr)
        return 2
    return fuzz(Path(args.file), runs=args.runs, seed=seed, jobs=min(args.jobs, args.runs),
                journal=args.journal, today=args.today, keep=keep)
