"""The journal surfaces at scale, timed in-process through the tool handlers.

What it measures, on a generated sample journal of ``--days`` days (1,000 by
default: ~50,000 segments, 2,000 people, ~10,000 commitments — the same data
``voiceactors journal sample DIR --days 1000 --today 2026-03-02`` writes):

* index build from scratch (``journal.search.build_index``), a refresh with
  nothing changed, and an incremental refresh after one day changed (one
  segment summary rewritten, one segment added);
* ``journal.search`` p50 / p99 over a fixed set of queries (topics, people,
  with and without ``days`` / ``facet``);
* ``journal.get_day`` over random days;
* ``commitments.list``: the first call (ledger derived from every activity
  file) and warm calls (the ledger cached by file modification state), open
  and closed;
* ``commitments.complete`` (each a ``ledger_close`` write), and the
  ``commitments.list`` right after one (the cache is invalidated by the write);
* ``entities.recent_with`` over random people (``days`` 7 and 90);
* what the periodic background refresh (nothing changed) costs this
  process's trio loop (``refresh_lag``): a probe sleeps 10 ms and records how
  late it wakes, while a load task runs a fixed ~2 ms CPU step every 10 ms
  and records the step's wall time (a stand-in for live calls). Measured with
  nothing in the background (``idle``), with the refresh in a thread of this
  process (``thread``: what ``ensure_index`` did before) and in the child
  process ``ensure_index`` starts now (``child``), ``--lag-rounds`` times each,
  alternating.

Each handler is called as the ToolExecutor calls it: ``handler(ToolContext,
args)`` after ``registry.prepare`` (JSON Schema), in this thread, timed with
``time.perf_counter``. The journal is generated once under
``$VOICEACTORS_BENCH_DIR`` (default /tmp/voiceactors-bench) and reused;
``commitments.complete`` runs on a copy so the cached journal stays pristine.

Run::

    .venv/bin/python -m benchmarks.journal_scale                 # 1,000 days
    .venv/bin/python -m benchmarks.journal_scale --days 30 --n 20   # quick
    .venv/bin/python -m benchmarks.journal_scale --reuse --profile list   # pyinstrument of commitments.list
    .venv/bin/python -m benchmarks.journal_scale --reuse --refresh-lag    # only the refresh's loop lag
    .venv/bin/python -m benchmarks.journal_scale --reuse --refresh-lag --lag-rounds 1 --first-build   # + first build
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from benchmarks.common import BENCH_TODAY, work_dir, fmt, machine_facts, sample_journal, summary, write_json

if TYPE_CHECKING:
    from voiceactors.tools import ToolContext

QUERIES = ["budget", "roadmap", "pricing page", "kiln firing", "summer camp", "incident review",
           "board deck", "glaze", "hiring plan", "dentist", "launch checklist", "SOC 2 audit",
           "onboarding", "migration", "weekend hike", "gallery submission"]


_T = TypeVar("_T")


def _timed(fn: Callable[[], _T]) -> tuple[float, _T]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def _call(name: str, ctx: ToolContext, args: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """One tool call the way the executor runs it (schema check + handler)."""
    import json

    from voiceactors.tools import lookup, prepare

    spec = lookup(name)
    assert spec is not None, name
    return _timed(lambda: spec.handler(ctx, prepare(spec, json.dumps(args))))


def _series(name: str, ctx: ToolContext,
            arg_list: list[dict[str, Any]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    times: list[float] = []
    outs: list[dict[str, Any]] = []
    for args in arg_list:
        ms, out = _call(name, ctx, args)
        times.append(ms)
        outs.append(out)
    errors = [o for o in outs if set(o) == {"error"}]
    s = summary(times)
    s["errors"] = len(errors)
    return s, outs


def journal_counts(root: Path) -> dict[str, int]:
    """How big the journal is (segments, people, commitments)."""
    from voiceactors.journal import days, entities, ledger

    day_list = days.list_days(root)
    segments = sum(len(days.day_segments(root, d) or []) for d in day_list)
    people = sum(1 for e in entities.load_entities(root).values() if e.type.lower() == "person")
    return {"days": len(day_list), "segments": segments, "people": people,
            "commitments": len(ledger.derive(root))}


def change_one_day(root: Path, day: str) -> str:
    """Rewrite one segment summary of ``day`` and add one segment: what a day
    of new observation looks like to the index."""
    day_dir = root / "chronicle" / day / "default"
    segs = sorted(p for p in day_dir.iterdir() if p.is_dir())
    summary_md = segs[0] / "talents" / "summary.md"
    summary_md.write_text(summary_md.read_text() + "\nLate addition: the offsite budget moved.\n")
    new = day_dir / "235500_300"
    if not new.exists():
        shutil.copytree(segs[-1], new)
    return str(new)


def _cpu_step(target_ms: float = 2.0) -> Callable[[], None]:
    """A fixed amount of pure-Python work taking ~``target_ms`` on an idle loop."""
    def work(k: int) -> int:
        return sum(i * i for i in range(k))

    k, t0 = 20_000, time.perf_counter()
    work(k)
    k = max(1000, int(k * target_ms / max(1e-6, (time.perf_counter() - t0) * 1000)))

    def step() -> None:
        work(k)

    return step


def _loop_probe(running: Callable[[], bool], min_s: float, step: Callable[[], None]) -> dict[str, Any]:
    """Run a trio loop until ``running()`` is False (and at least ``min_s``):
    the lateness of 10 ms sleeps and the wall time of CPU steps, in ms."""
    import trio

    lags: list[float] = []
    steps: list[float] = []

    async def main() -> float:
        t_start = trio.current_time()

        async def probe() -> None:
            while running() or trio.current_time() - t_start < min_s:
                t0 = trio.current_time()
                await trio.sleep(0.010)
                lags.append((trio.current_time() - t0 - 0.010) * 1000)
            nursery.cancel_scope.cancel()

        async def load() -> None:
            while True:
                t0 = time.perf_counter()
                step()
                steps.append((time.perf_counter() - t0) * 1000)
                await trio.sleep(0.010)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            nursery.start_soon(load)
        return trio.current_time() - t_start

    seconds = trio.run(main)
    return {"lag": lags, "step": steps, "seconds": round(seconds, 2)}


def refresh_lag(root: Path, state: Path, rounds: int = 2) -> dict[str, Any]:
    """The trio loop's lag and CPU-step time while an incremental refresh with
    nothing changed runs in the background: in a thread, in a child, and none
    (for as long as the others took on average). Samples of a mode's rounds
    are pooled (rounds alternate thread / child, so a drift in machine load
    hits both)."""
    import threading

    from voiceactors.journal import index
    from voiceactors.journal.search import build_index

    build_index(root, state)          # current: the refreshes below find nothing changed
    step = _cpu_step()

    def in_thread() -> Callable[[], bool]:
        thread = threading.Thread(target=build_index, args=(root, state), daemon=True)
        thread.start()
        return thread.is_alive

    def in_child() -> Callable[[], bool]:
        index.ensure_index(root, state, 0.0)           # stale at once: starts the child
        assert index.running_refresh(root, state) is not None, "no refresh child started"
        return lambda: index.running_refresh(root, state) is not None

    runs: list[tuple[str, Callable[[], Callable[[], bool]]]] = []
    for _ in range(max(1, rounds)):
        runs += [("thread", in_thread), ("child", in_child)]
    runs.append(("idle", lambda: (lambda: False)))
    pooled: dict[str, dict[str, list[float]]] = {}
    for mode, start in runs:
        took = [t for e in pooled.values() for t in e["seconds"]]
        idle_s = max(0.2, sum(took) / len(took)) if mode == "idle" else 0.0
        r = _loop_probe(start(), idle_s, step)
        entry = pooled.setdefault(mode, {"lag": [], "step": [], "seconds": []})
        entry["lag"] += r["lag"]
        entry["step"] += r["step"]
        entry["seconds"].append(r["seconds"])
    return {f"refresh_lag.{mode}": {"lag_ms": summary(e["lag"]), "step_ms": summary(e["step"]),
                                    "seconds": e["seconds"]}
            for mode, e in pooled.items()}


def first_build_lag(root: Path, scratch: Path) -> dict[str, Any]:
    """The same probe while a search's *first* build runs (an empty state
    dir): ``build_index`` in a thread of this process (``first_thread``: what
    ``ensure_index`` did before) and ``ensure_index`` called from a thread,
    which waits for the child that builds (``first_child``)."""
    import threading

    from voiceactors.journal import index
    from voiceactors.journal.search import build_index

    step = _cpu_step()
    out: dict[str, Any] = {}
    for mode, target in (("first_thread", build_index), ("first_child", lambda r, s: index.ensure_index(r, s, 3600))):
        state = scratch / mode
        shutil.rmtree(state, ignore_errors=True)
        thread = threading.Thread(target=target, args=(root, state), daemon=True)
        thread.start()
        r = _loop_probe(thread.is_alive, 0.0, step)
        out[f"refresh_lag.{mode}"] = {"lag_ms": summary(r["lag"]), "step_ms": summary(r["step"]),
                                      "seconds": [r["seconds"]]}
        shutil.rmtree(state, ignore_errors=True)
    return out


def run(days: int, n: int, seed: int = 7, profile: str | None = None, reuse: bool = False,
        lag_rounds: int = 2, lag_only: bool = False, first_build: bool = False) -> dict[str, Any]:
    from voiceactors.journal import entities, index
    from voiceactors.journal.search import build_index
    from voiceactors.tools import ToolContext

    rng = random.Random(seed)
    out: dict[str, Any] = {"days": days}
    t_gen = time.perf_counter()
    pristine = sample_journal(days)
    out["generate_or_reuse_s"] = round(time.perf_counter() - t_gen, 2)

    # a working copy: the index build and writes below must not touch the cached journal
    root = work_dir() / f"journal-{days}d-work"
    state = work_dir() / f"journal-{days}d-state"
    if not (lag_only and reuse):
        shutil.rmtree(state, ignore_errors=True)      # (--refresh-lag --reuse keeps the index)
    t_copy = time.perf_counter()
    if reuse and root.is_dir():
        out["copy_s"] = "reused"      # a previous run's copy (a few commitments closed, one day edited)
    else:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine, root)
        out["copy_s"] = round(time.perf_counter() - t_copy, 2)
    ctx = ToolContext(journal=root, state_dir=state, today=lambda: BENCH_TODAY)
    if lag_only:
        out.update(refresh_lag(root, state, rounds=lag_rounds))
        if first_build:
            out.update(first_build_lag(root, work_dir() / f"journal-{days}d-first"))
        return out

    ms, stats = _timed(lambda: build_index(root, state))
    out["index_build"] = {"ms": round(ms, 1), "files": stats.files_indexed, "chunks": stats.chunks}
    ms, stats = _timed(lambda: build_index(root, state))
    out["index_refresh_unchanged"] = {"ms": round(ms, 1), "files_indexed": stats.files_indexed}
    day_list = sorted(p.name for p in (root / "chronicle").iterdir() if p.name.isdigit())
    changed_day = day_list[len(day_list) // 2]
    change_one_day(root, changed_day)
    ms, stats = _timed(lambda: build_index(root, state))
    out["index_refresh_one_day"] = {"ms": round(ms, 1), "files_indexed": stats.files_indexed,
                                    "files_removed": stats.files_removed, "day": changed_day}
    out["index_bytes"] = os.path.getsize(index.index_path(root, state))
    if lag_rounds:
        out.update(refresh_lag(root, state, rounds=lag_rounds))

    people = [e for e in entities.load_entities(root).values() if e.type.lower() == "person"]
    searches = []
    for i in range(n):
        q = QUERIES[i % len(QUERIES)] if i % 3 else rng.choice(people).name
        args: dict[str, Any] = {"query": q}
        if i % 4 == 1:
            args["days"] = 30
        if i % 5 == 2:
            args["facet"] = "work"
        searches.append(args)
    _call("journal.search", ctx, {"query": "warm up"})   # connection open, index checked

    def do_searches() -> tuple[dict[str, float], list[dict[str, Any]]]:
        return _series("journal.search", ctx, searches)

    if profile == "search":
        out["profile"] = _profile(do_searches)
    out["journal.search"], results = do_searches()
    out["journal.search"]["hits_mean"] = round(sum(r.get("count", 0) for r in results) / max(1, len(results)), 1)

    get_days = [{"day": f"{d[:4]}-{d[4:6]}-{d[6:]}"} for d in rng.choices(day_list, k=n)]
    out["journal.get_day"], _ = _series("journal.get_day", ctx, get_days)

    ms, first = _call("commitments.list", ctx, {"state": "open"})
    out["commitments.list_first"] = {"ms": round(ms, 1), "items": len(first.get("commitments", []))}

    def do_lists() -> tuple[dict[str, float], list[dict[str, Any]]]:
        return _series("commitments.list", ctx, [{"state": s} for s in ("open", "closed", None) * (n // 3 + 1)][:n])

    if profile == "list":
        out["profile"] = _profile(do_lists)
    out["commitments.list"], _ = do_lists()

    open_ids = [c["id"] for c in first.get("commitments", [])]
    k = min(len(open_ids), max(3, n // 10))
    completes, lists_after = [], []

    def do_completes() -> None:
        for cid in open_ids[:k]:
            ms, _res = _call("commitments.complete", ctx, {"commitment_id": cid, "resolution": "done"})
            completes.append(ms)
            ms, _ = _call("commitments.list", ctx, {"state": "open"})
            lists_after.append(ms)

    if profile == "complete":
        out["profile"] = _profile(do_completes)
    else:
        do_completes()
    out["commitments.complete"] = summary(completes)
    out["commitments.list_after_complete"] = summary(lists_after)

    recent = [{"entity_slug": rng.choice(people).id, "days": rng.choice([7, 90])} for _ in range(n)]
    if profile == "recent":
        out["profile"] = _profile(lambda: _series("entities.recent_with", ctx, recent))
    out["entities.recent_with"], _ = _series("entities.recent_with", ctx, recent)
    out["counts"] = journal_counts(root)   # last: it derives the ledger, which must be cold above
    return out


def _profile(fn: Callable[[], object]) -> str:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    fn()
    profiler.stop()
    # (Any where pyinstrument is not installed: CI installs no bench extra)
    text: str = profiler.output_text(unicode=False, color=False, show_all=False)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=1000)
    p.add_argument("--n", type=int, default=200, help="calls per measured tool")
    p.add_argument("--profile", choices=["search", "list", "complete", "recent"], help="pyinstrument one series")
    p.add_argument("--reuse", action="store_true", help="reuse the previous run's working copy (no 1.3 GB copy)")
    p.add_argument("--refresh-lag", action="store_true",
                   help="only measure the trio loop's lag during a background index refresh")
    p.add_argument("--lag-rounds", type=int, default=2, help="refreshes per mode (thread, child)")
    p.add_argument("--first-build", action="store_true",
                   help="with --refresh-lag: also the lag during a first build (thread vs child), ~25 s more")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    from voiceactors import logs

    logs.configure("json", "info", stream=open(os.devnull, "w"))   # rendered like the server's, not shown
    facts = machine_facts()
    print(f"# machine: {facts}", flush=True)
    r = run(args.days, args.n, profile=args.profile, reuse=args.reuse,
            lag_rounds=args.lag_rounds, lag_only=args.refresh_lag, first_build=args.first_build)
    for key, value in r.items():
        if key == "profile":
            continue
        if isinstance(value, dict) and "lag_ms" in value:
            print(f"{key:34} lag {fmt(value['lag_ms'])} ms; 2 ms step {fmt(value['step_ms'])} ms; "
                  f"runs {value['seconds']} s", flush=True)
        elif isinstance(value, dict) and "p50" in value:
            extra = {k: v for k, v in value.items() if k not in ("n", "p50", "p99", "max", "mean")}
            print(f"{key:34} {fmt(value)} ms {extra or ''}", flush=True)
        else:
            print(f"{key:34} {value}", flush=True)
    if r.get("profile"):
        print(r["profile"])
    if args.json:
        write_json(Path(args.json), {"machine": facts, "argv": sys.argv, "results": r})
    return 0


if __name__ == "__main__":
    sys.exit(main())
