"""The benchmarks' one runner.

    python -m benchmarks                      # list the benchmarks
    python -m benchmarks run [NAME ...]       # run them (all by default) at full size
    python -m benchmarks run --quick          # the whole set in a few minutes
    python -m benchmarks page                 # rewrite the page from the stored results

``run`` shows each benchmark's progress, prints a table of its figures, stores
them in ``docs/benchmarks/results.json`` (each benchmark with the date,
commit and size of its run) and rewrites the generated part of
``docs/benchmarks.md`` and its plots from every stored result. A
benchmark's own output goes to ``$VOICEACTORS_BENCH_DIR/logs/<name>.log``
and its JSON beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from benchmarks import page
from benchmarks.common import code_label, machine_facts, work_dir, write_json
from benchmarks.suite import BENCHMARKS, BY_NAME, Benchmark, Size, environment, redis_available


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


def run_one(bench: Benchmark, size: Size, folder: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Run one benchmark; returns its stored result (rows, plots, when, what)."""
    folder.mkdir(parents=True, exist_ok=True)
    out, log = folder / f"{bench.name}.json", folder / f"{bench.name}.log"
    module = importlib.import_module(bench.module)
    started, when = time.monotonic(), machine_facts()
    with open(log, "w") as stream, output_to(stream), environment(bench.env), Ticker(bench.name, say):
        rc = module.main([*bench.argv(size), "--json", str(out)])
    wall = time.monotonic() - started
    if rc != 0 or not out.exists():
        raise RuntimeError(f"{bench.name}: exit status {rc}, no results (see {log})")
    summary = bench.summarise(json.loads(out.read_text()))
    return {"name": bench.name, "size": str(size), "when_utc": when["when_utc"], "commit": code_label(),
            "loadavg_1m": when["loadavg_1m"], "other_test_processes": when["pytest_processes"],
            "machine": {key: when[key] for key in ("cores", "python", "platform")}, "wall_s": round(wall, 1), "argv": bench.argv(size),
            "rows": [asdict(r) for r in summary.rows],
            "plots": {name: {label: [list(p) for p in points] for label, points in series.items()}
                      for name, series in summary.plots.items()}}


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        for row in r["rows"]:
            met = {True: "met", False: "MISSED", None: ""}[row["met"]]
            lines.append(f"{r['name']:<12} {row['figure'][:70]:<70} {row['value']:<28} {row['target']:<16} {met}")
    return "\n".join(lines)


def run(names: list[str], size: Size, *, results_path: Path, page_path: Path | None,
        plots_dir: Path | None) -> int:
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)} (python -m benchmarks lists them)", file=sys.stderr)
        return 2
    chosen = [BY_NAME[n] for n in names] if names else list(BENCHMARKS)
    folder = work_dir() / "results" / time.strftime("%Y%m%d-%H%M%S")

    # stays the terminal while a benchmark's output (and its children's) goes to its log
    with os.fdopen(os.dup(1), "w", buffering=1) as terminal:
        def say(text: str) -> None:
            terminal.write(text + "\n")

        done, skipped, failed = run_all(chosen, size, folder, say)
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


def run_all(chosen: list[Benchmark], size: Size, folder: Path,
            say: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
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
        say(f"[{i}/{len(chosen)}] {bench.name}: {bench.what}")
        t0 = time.monotonic()
        try:
            result = run_one(bench, size, folder, say)
        except Exception as exc:     # one benchmark's failure is reported; the others still run
            say(f"    failed after {time.monotonic() - t0:.0f} s: {exc}")
            failed.append(bench.name)
            continue
        done.append(result)
        say(f"    done in {result['wall_s']:.0f} s")
        for row in result["rows"]:
            say(f"    {row['figure']}: {row['value']}")
    return done, skipped, failed


def listing() -> str:
    width = max(len(b.name) for b in BENCHMARKS)
    lines = [f"{b.name:<{width}}  {b.what}" + ("  [redis-server]" if b.needs_redis else "") for b in BENCHMARKS]
    return "\n".join(lines + ["", "run them: python -m benchmarks run [NAME ...] [--quick]"])


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="voiceactors benchmarks")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("list", help="list the benchmarks (the default)")
    r = sub.add_parser("run", help="run benchmarks and rewrite the results page")
    r.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    sizes = r.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="small sizes: the whole set in a few minutes")
    sizes.add_argument("--tiny", action="store_true", help="the smoke test's sizes (no meaningful numbers)")
    for q in (r, sub.add_parser("page", help="rewrite the page and plots from the stored results")):
        q.add_argument("--results", type=Path, default=page.RESULTS, help="the stored results (JSON)")
        q.add_argument("--page", type=Path, default=page.PAGE, help="the results page")
        q.add_argument("--plots", type=Path, default=page.PLOTS, help="where the plots go")
    r.add_argument("--no-page", action="store_true", help="store the results but leave the page alone")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "run":
        size = Size.QUICK if args.quick else Size.TINY if args.tiny else Size.FULL
        return run(args.names, size, results_path=args.results, page_path=None if args.no_page else args.page,
                   plots_dir=None if args.no_page else args.plots)
    if args.command == "page":
        page.write(args.page, args.plots, page.load_results(args.results), print)
        return 0
    print(listing())
    return 0


if __name__ == "__main__":
    sys.exit(main())
