"""The benchmarks' one runner.

    python -m benchmarks                      # list the benchmarks
    python -m benchmarks run [NAME ...]       # run them (all by default) at full size
    python -m benchmarks run --quick          # the whole set in a few minutes
    python -m benchmarks run burst --repeats 7
    python -m benchmarks run burst one_call --quick --against /tmp/old   # this checkout's server beside another's
    python -m benchmarks page                 # rewrite the page from the stored results

``run`` shows each benchmark's progress, prints a table of its figures, stores
them in ``docs/benchmarks/results.json`` (each benchmark with the date,
commit and size of its run, and every repeat's figures) and rewrites the
generated part of ``docs/benchmarks.md`` and its plots from every stored
result. A benchmark that repeats (``Benchmark.repeats``, or ``--repeats``)
is reported by each figure's median and range (``suite.combine``). A
benchmark's own output goes to
``$VOICEACTORS_BENCH_DIR/results/<time>/<name>.log`` and its JSON beside it
(``<name>-<repeat>.json`` when it repeats).

``--against PATH`` measures another checkout's server beside this one's
(``run_against``): each benchmark's repeats on both, alternated (the other,
this, this, the other, ...), then a table of every repeat, the medians and
this checkout's over the other's, printed and written to the run folder as
``comparison.md`` and ``comparison.json``; the results page and the stored
results are left alone.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from benchmarks import page
from benchmarks.common import REPO, SERVER_CHECKOUT_ENV, Checkout, code_label, machine_facts, work_dir, write_json
from benchmarks.suite import (BENCHMARKS, BY_NAME, Benchmark, Row, Size, Summary, combine, environment,
                              redis_available)


class Ticker:
    """Prints that a benchmark is still running, every ``every`` seconds."""

    def __init__(self, name: str, out: Callable[[str], None], every: float = 30.0) -> None:
        self._name, self._out, self._every = name, out, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._out(f"    … {self._name} still running, {time.monotonic() - self._started:.0f} s")

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(1)


@contextlib.contextmanager
def output_to(stream: TextIO) -> Iterator[None]:
    """This process's standard output, and so its children's (a benchmark's
    servers and peers print too), goes to ``stream`` meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(stream.fileno(), 1)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        sys.stdout.flush()
        stream.flush()
        os.dup2(saved, 1)
        os.close(saved)


@dataclass(frozen=True)
class Repeat:
    """One run of a benchmark: its figures and what it ran on."""

    index: int                      # from 0
    summary: Summary
    record: dict[str, Any]          # what results.json keeps of it


def output_name(bench: Benchmark, index: int, count: int, side: str = "") -> str:
    """The stem of a repeat's log and JSON in the run folder: ``<name>`` when
    it runs once, ``<name>-<side>-<repeat>`` otherwise (the side when two
    checkouts are compared)."""
    parts = [bench.name, *([side] if side else []), *([str(index + 1)] if count > 1 or side else [])]
    return "-".join(parts)


def run_repeat(bench: Benchmark, size: Size, folder: Path, say: Callable[[str], None], index: int, count: int,
               *, checkout: Checkout | None = None, side: str = "") -> Repeat:
    """The ``index``-th run of ``bench``. Its server comes from ``checkout``
    (None: this checkout, as always); a benchmark whose own process is the
    code under test (``in_process``) then runs as a child of that checkout."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = output_name(bench, index, count, side)
    out, log = folder / f"{stem}.json", folder / f"{stem}.log"
    argv = [*bench.argv(size, index), "--json", str(out)]
    started, when = time.monotonic(), machine_facts()
    label = f"{bench.name} {side} {index + 1}/{count}" if side else bench.name
    with open(log, "w") as stream, output_to(stream), Ticker(label, say):
        if checkout is not None and bench.in_process:
            rc = run_child(bench, checkout, argv, stream)
        else:
            server = {SERVER_CHECKOUT_ENV: str(checkout.root)} if checkout is not None else {}
            with environment({**bench.env, **server}):
                rc = importlib.import_module(bench.module).main(argv)
    wall = time.monotonic() - started
    if rc != 0 or not out.exists():
        raise RuntimeError(f"{bench.name}: exit status {rc}, no results (see {log})")
    summary = bench.summarise(json.loads(out.read_text()))
    return Repeat(index, summary, {
        "repeat": index + 1, "commit": code_label(checkout.root if checkout else REPO),
        "when_utc": when["when_utc"], "loadavg_1m": when["loadavg_1m"],
        "other_test_processes": when["pytest_processes"], "wall_s": round(wall, 1), "argv": argv[:-2],
        "json": str(out), "rows": [asdict(r) for r in summary.rows]})


def run_child(bench: Benchmark, checkout: Checkout, argv: list[str], stream: TextIO) -> int:
    """``python -m <module> argv`` with ``checkout``'s package (its own
    interpreter where it has a venv), its output to ``stream``."""
    env = {**os.environ, **bench.env, **checkout.env()}
    done = subprocess.run([checkout.python, "-m", bench.module, *argv], cwd=checkout.start_folder(), env=env,
                          stdout=stream, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False)
    return done.returncode


def run_one(bench: Benchmark, size: Size, folder: Path, say: Callable[[str], None],
            repeats: int | None = None) -> dict[str, Any]:
    """Run one benchmark, ``repeats`` times (default its own count at
    ``size``); returns its stored result (rows, plots, when, what, and each
    repeat's figures)."""
    count = repeats or bench.runs(size)
    started = time.monotonic()
    runs = []
    for i in range(count):
        runs.append(run_repeat(bench, size, folder, say, i, count))
        if count > 1:
            say(f"    repeat {i + 1}/{count} done in {runs[-1].record['wall_s']:.0f} s")
    summary = combine([r.summary for r in runs])
    first = runs[0].record
    machine = machine_facts()
    return {"name": bench.name, "size": str(size), "when_utc": first["when_utc"], "commit": code_label(),
            "loadavg_1m": max(r.record["loadavg_1m"] for r in runs),
            "other_test_processes": max(r.record["other_test_processes"] for r in runs),
            "machine": {key: machine[key] for key in ("cores", "python", "platform")},
            "wall_s": round(time.monotonic() - started, 1), "argv": bench.argv(size), "repeats": count,
            "rows": [asdict(r) for r in summary.rows],
            "plots": {name: {label: [list(p) for p in points] for label, points in series.items()}
                      for name, series in summary.plots.items()},
            "runs": [r.record for r in runs]}


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        for row in r["rows"]:
            met = {True: "met", False: "MISSED", None: ""}[row["met"]]
            lines.append(f"{r['name']:<12} {row['figure'][:70]:<70} {row['value']:<28} {row['target']:<16} {met}")
    return "\n".join(lines)


def chosen_benchmarks(names: list[str]) -> list[Benchmark] | None:
    """The benchmarks ``names`` (every one when empty); None, and said why, when one is unknown."""
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)} (python -m benchmarks lists them)", file=sys.stderr)
        return None
    return [BY_NAME[n] for n in names] if names else list(BENCHMARKS)


def run_folder() -> Path:
    return work_dir() / "results" / time.strftime("%Y%m%d-%H%M%S")


def run(names: list[str], size: Size, *, results_path: Path, page_path: Path | None,
        plots_dir: Path | None, repeats: int | None = None) -> int:
    chosen = chosen_benchmarks(names)
    if chosen is None:
        return 2
    folder = run_folder()

    # stays the terminal while a benchmark's output (and its children's) goes to its log
    with os.fdopen(os.dup(1), "w", buffering=1) as terminal:
        def say(text: str) -> None:
            terminal.write(text + "\n")

        done, skipped, failed = run_all(chosen, size, folder, say, repeats)
        stored = page.load_results(results_path)
        stored.update({r["name"]: r for r in done})
        if done:
            write_json(results_path, stored)
        say("\n" + table(done))
        if page_path is not None and plots_dir is not None and done:
            page.write(page_path, plots_dir, stored, say)
        if skipped or failed:
            say(f"# skipped: {skipped or 'none'}; failed: {failed or 'none'}")
    return 1 if failed else 0


def run_all(chosen: list[Benchmark], size: Size, folder: Path, say: Callable[[str], None],
            repeats: int | None = None) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Each benchmark in turn: (the results, the names skipped, the names failed)."""
    say(f"# {len(chosen)} benchmark(s), {size} size, commit {code_label() or '?'}; logs in {folder}")
    done: list[dict[str, Any]] = []
    skipped: list[str] = []
    failed: list[str] = []
    for i, bench in enumerate(chosen, 1):
        if bench.needs_redis and not redis_available():
            say(f"[{i}/{len(chosen)}] {bench.name}: skipped (needs redis-server)")
            skipped.append(bench.name)
            continue
        count = repeats or bench.runs(size)
        say(f"[{i}/{len(chosen)}] {bench.name}: {bench.what}" + (f" ({count} repeats)" if count > 1 else ""))
        t0 = time.monotonic()
        try:
            result = run_one(bench, size, folder, say, count)
        except Exception as exc:     # one benchmark's failure is reported; the others still run
            say(f"    failed after {time.monotonic() - t0:.0f} s: {exc}")
            failed.append(bench.name)
            continue
        done.append(result)
        say(f"    done in {result['wall_s']:.0f} s")
        for row in result["rows"]:
            say(f"    {row['figure']}: {row['value']}")
    return done, skipped, failed


# --- side by side: this checkout's server against another's ------------------------------------------------

#: the two sides of a comparison: the other checkout ("old") and this one ("new")
OLD, NEW = "old", "new"


def side_order(pair: int) -> tuple[str, str]:
    """Which side runs first in the ``pair``-th pair of repeats: the other
    checkout, this, this, the other, ... (each side as often first as second)."""
    return (OLD, NEW) if pair % 2 == 0 else (NEW, OLD)


def run_against(names: list[str], size: Size, other: Path, repeats: int | None = None) -> int:
    """Each chosen benchmark's repeats on both checkouts, alternated; the
    comparison table printed and written to the run folder."""
    chosen = chosen_benchmarks(names)
    if chosen is None:
        return 2
    if not (other / "voiceactors" / "__init__.py").is_file():
        print(f"--against {other}: not a checkout of voiceactors (no voiceactors/__init__.py)", file=sys.stderr)
        return 2
    sides = {OLD: Checkout(other.resolve()), NEW: Checkout(REPO)}
    labels = {side: f"{c.label() or '?'} ({c.root})" for side, c in sides.items()}
    folder = run_folder()
    with os.fdopen(os.dup(1), "w", buffering=1) as terminal:
        def say(text: str) -> None:
            terminal.write(text + "\n")

        say(f"# {len(chosen)} benchmark(s), {size} size, side by side: old {labels[OLD]}, new {labels[NEW]}; "
            f"logs in {folder}")
        compared: list[dict[str, Any]] = []
        failed: list[str] = []
        for i, bench in enumerate(chosen, 1):
            if bench.needs_redis and not redis_available():
                say(f"[{i}/{len(chosen)}] {bench.name}: skipped (needs redis-server)")
                continue
            count = repeats or bench.runs(size)
            say(f"[{i}/{len(chosen)}] {bench.name}: {bench.what} ({count} repeat(s) on each side)")
            try:
                compared.append(compare_one(bench, size, folder, sides, count, say))
            except Exception as exc:     # one benchmark's failure is reported; the others still run
                say(f"    failed: {exc}")
                failed.append(bench.name)
        text = comparison_table(compared, labels, size)
        (folder / "comparison.md").write_text(text + "\n")
        write_json(folder / "comparison.json", {"size": str(size), "sides": labels, "benchmarks": compared})
        say("\n" + text)
        say(f"# wrote {folder / 'comparison.md'} and comparison.json" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


def compare_one(bench: Benchmark, size: Size, folder: Path, sides: dict[str, Checkout], count: int,
                say: Callable[[str], None]) -> dict[str, Any]:
    """``count`` repeats of ``bench`` on each side, pair by pair in
    ``side_order``; every repeat's figures by side."""
    runs: dict[str, list[Repeat]] = {OLD: [], NEW: []}
    for pair in range(count):
        for side in side_order(pair):
            r = run_repeat(bench, size, folder, say, pair, count, checkout=sides[side], side=side)
            runs[side].append(r)
            say(f"    {side} {pair + 1}/{count} done in {r.record['wall_s']:.0f} s: "
                + "; ".join(f"{(row.measure.text() if row.measure else row.value)}" for row in r.summary.rows[:3]))
    return {"name": bench.name, "figures": compared_figures(runs), "runs": {s: [r.record for r in rs]
                                                                            for s, rs in runs.items()}}


def compared_figures(runs: dict[str, list[Repeat]]) -> list[dict[str, Any]]:
    """Each figure either side reported: every repeat's value on each side
    (its measure's text where it has one), the medians and new / old."""
    order: dict[str, None] = {}
    by_side: dict[str, dict[str, list[Row]]] = {OLD: {}, NEW: {}}
    for side, repeats in runs.items():
        for r in repeats:
            for row in r.summary.rows:
                order.setdefault(row.figure)
                by_side[side].setdefault(row.figure, []).append(row)
    figures = []
    for figure in order:
        entry: dict[str, Any] = {"figure": figure}
        medians: dict[str, float | None] = {}
        for side in (OLD, NEW):
            rows = by_side[side].get(figure, [])
            entry[side] = [row.measure.text() if row.measure else row.value for row in rows]
            numbers = [row.measure.number for row in rows if row.measure]
            first = next((row.measure for row in rows if row.measure), None)
            median = statistics.median(numbers) if numbers else None
            medians[side] = median
            entry[f"{side}_median"] = replace(first, number=median).text() if first and median is not None else ""
        old, new = medians[OLD], medians[NEW]
        entry["new_over_old"] = round(new / old, 3) if old and new is not None else None
        figures.append(entry)
    return figures


def comparison_table(compared: list[dict[str, Any]], labels: dict[str, str], size: Size) -> str:
    lines = [f"Side by side, {size} size: old = {labels[OLD]}, new = {labels[NEW]}; the repeats alternated "
             "(old, new, new, old, ...).", "",
             "| benchmark | figure | old, every repeat | new, every repeat | old median | new median | new / old |",
             "|---|---|---|---|---|---|---|"]
    for bench in compared:
        for f in bench["figures"]:
            ratio = f"×{f['new_over_old']:.3f}" if f["new_over_old"] is not None else ""
            lines.append(f"| `{bench['name']}` | {f['figure']} | {', '.join(f[OLD])} | {', '.join(f[NEW])} | "
                         f"{f['old_median']} | {f['new_median']} | {ratio} |")
    return "\n".join(lines)


def listing() -> str:
    width = max(len(b.name) for b in BENCHMARKS)
    lines = [f"{b.name:<{width}}  {b.what}" + ("  [redis-server]" if b.needs_redis else "") for b in BENCHMARKS]
    return "\n".join(lines + ["", "run them: python -m benchmarks run [NAME ...] [--quick]"])


AGAINST_EXAMPLE = """two commits side by side (every repeat, the medians, new / old; the page left alone):
  git worktree add /tmp/old <commit>
  python -m benchmarks run burst one_call connect round_cpu --quick --against /tmp/old"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="voiceactors benchmarks")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("list", help="list the benchmarks (the default)")
    r = sub.add_parser("run", help="run benchmarks and rewrite the results page",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=AGAINST_EXAMPLE)
    r.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    sizes = r.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="small sizes: the whole set in a few minutes")
    sizes.add_argument("--tiny", action="store_true", help="the smoke test's sizes (no meaningful numbers)")
    for q in (r, sub.add_parser("page", help="rewrite the page and plots from the stored results")):
        q.add_argument("--results", type=Path, default=page.RESULTS, help="the stored results (JSON)")
        q.add_argument("--page", type=Path, default=page.PAGE, help="the results page")
        q.add_argument("--plots", type=Path, default=page.PLOTS, help="where the plots go")
    r.add_argument("--no-page", action="store_true", help="store the results but leave the page alone")
    r.add_argument("--repeats", type=int, metavar="N",
                   help="run each benchmark N times (default: its own count at the size, e.g. burst: 5, "
                        "--quick 3); the figures are the medians, with their range")
    r.add_argument("--against", type=Path, metavar="CHECKOUT",
                   help="run each benchmark's repeats on this checkout and on CHECKOUT (another worktree, "
                        "e.g. `git worktree add /tmp/old <commit>`), alternated: the server under test from "
                        "each, the benchmarks' own code from this one; prints a table of every repeat, the "
                        "medians and new / old, writes it to the run folder, and leaves the results page alone")
    args = p.parse_args(argv)
    if args.command == "run" and args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "run":
        size = Size.QUICK if args.quick else Size.TINY if args.tiny else Size.FULL
        if args.against is not None:
            return run_against(args.names, size, args.against, args.repeats)
        return run(args.names, size, results_path=args.results, page_path=None if args.no_page else args.page,
                   plots_dir=None if args.no_page else args.plots, repeats=args.repeats)
    if args.command == "page":
        page.write(args.page, args.plots, page.load_results(args.results), print)
        return 0
    print(listing())
    return 0


if __name__ == "__main__":
    sys.exit(main())
