"""The benchmarks the runner knows: what each runs at each size and which
figures it reports.

Each entry names a module of this package (its docstring says what it
measures and why), the arguments of its ``main`` at each ``Size`` and how
its JSON becomes the results page's rows (``Row``: the figure, the value,
the target and whether it is met) and plot series. The runner
(``python -m benchmarks``) calls ``main`` in this process; the servers,
simulators and peers a benchmark starts are its child processes.

``Size.TINY`` is the smoke test's (every benchmark end to end, no timing
meant); ``QUICK`` fits the whole set in a few minutes on two cores;
``FULL`` is what the results page quotes.

A benchmark whose single run does not give a figure one can trust on a
shared machine runs several times (``Benchmark.repeats``); one that compares
two servers alternates which runs first (``Benchmark.orders``). A row
carries the number its value leads with (``Measure``): over the repeats the
runner reports each figure's median and range (``combine``), and a
side-by-side run divides the medians of two checkouts.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import shutil
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator


class Size(enum.StrEnum):
    TINY = "tiny"
    QUICK = "quick"
    FULL = "full"


class Unit(enum.StrEnum):
    MS = "ms"
    US = "µs"
    SECONDS = "s"
    KIB = "KiB"
    RATIO = "×"


@dataclass(frozen=True)
class Measure:
    """The number a row's value leads with, in its unit: what the median
    and range over repeats are taken of, and what a side-by-side run divides."""

    number: float
    unit: Unit
    digits: int = 2

    def text(self) -> str:
        if self.unit is Unit.RATIO:
            return f"×{self.number:.{self.digits}f}"
        return f"{self.number:.{self.digits}f} {self.unit}"


@dataclass(frozen=True)
class Row:
    """One line of the results table."""

    figure: str
    value: str
    target: str = ""
    met: bool | None = None       # None: no target, or the run cannot tell
    measure: Measure | None = None


def measured(value: float | None, unit: Unit, digits: int = 2) -> Measure | None:
    return None if value is None or math.isnan(value) else Measure(float(value), unit, digits)


#: a plot's series: label -> [(x, y), ...]
Series = dict[str, list[tuple[float, float]]]


@dataclass(frozen=True)
class Summary:
    rows: list[Row]
    plots: dict[str, Series] = field(default_factory=dict)


@dataclass(frozen=True)
class Benchmark:
    name: str
    module: str
    what: str                                   # one line for the listing
    args: dict[Size, list[str]]
    summarise: Callable[[dict[str, Any]], Summary]
    env: dict[str, str] = field(default_factory=dict)
    needs_redis: bool = False                  # skipped where redis-server is not installed
    #: runs of the whole benchmark at each size (1 where absent): those whose one run is not steady
    repeats: dict[Size, int] = field(default_factory=dict)
    #: arguments added to each repeat in turn: two servers compared in alternating order
    orders: tuple[tuple[str, ...], ...] = ()
    #: the code under test runs in the benchmark's own process (no server child): run against another
    #: checkout, the benchmark itself runs as a child process with that checkout's package
    in_process: bool = False

    def runs(self, size: Size) -> int:
        return self.repeats.get(size, 1)

    def argv(self, size: Size, repeat: int = 0) -> list[str]:
        """The command line of the ``repeat``-th run (from 0) at ``size``."""
        order = self.orders[repeat % len(self.orders)] if self.orders else ()
        return [*self.args[size], *order]


def combine(summaries: list[Summary]) -> Summary:
    """One summary of a benchmark's repeats: each figure's row taken from the
    repeat at the median of its measure, its value followed by how many
    repeats and their range; a figure without a measure lists every
    repeat's value. The plots are the first repeat's."""
    if len(summaries) == 1:
        return summaries[0]
    by_figure: dict[str, list[Row]] = {}
    for summary in summaries:
        for row in summary.rows:
            by_figure.setdefault(row.figure, []).append(row)
    return Summary([_median_row(rows) for rows in by_figure.values()], summaries[0].plots if summaries else {})


def _median_row(rows: list[Row]) -> Row:
    numbered = sorted((r for r in rows if r.measure is not None), key=lambda r: r.measure.number if r.measure else 0)
    if not numbered:
        return replace(rows[0], value=f"{'; '.join(r.value for r in rows)} ({len(rows)} repeats)")
    n = len(numbered)
    # an odd count's median is a repeat: its whole value (a ratio with its two latencies) stays consistent;
    # an even count's row is the lower of the two middle repeats, and says so
    middle = numbered[(n - 1) // 2]
    low, high = numbered[0].measure, numbered[-1].measure
    assert low is not None and high is not None
    which = "median" if n % 2 else "lower median"
    return replace(middle, value=f"{middle.value}; {which} of {n}, range {low.text()}–{high.text()}")


def redis_available() -> bool:
    return shutil.which("redis-server") is not None


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in this process's environment (the child processes a
    benchmark starts inherit them), restored afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


# --- formatting -----------------------------------------------------------------------------------


def ms(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f} ms"


def ratio(value: float | None) -> str:
    return "–" if value is None else f"×{value:.2f}"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


# --- the burst family (benchmarks.burst) ------------------------------------------------------------

_BURST_TINY = ["--rounds", "2", "--spread", "0.2", "--think-ms", "10", "20", "--hold-s", "0.1",
               "--settle-max-s", "1", "--warm-calls", "1", "--idle-s", "0.2"]


def _phase(data: dict[str, Any], peer: str, phase: str) -> dict[str, Any] | None:
    for r in data.get("results", []):
        if r["peer"] == peer:
            found: dict[str, Any] | None = r["phases"].get(phase)
            return found
    return None


def _cpu_per_round(p: dict[str, Any] | None) -> float | None:
    if p is None:
        return None
    value = p.get("server_ms_per_round_net", p.get("server_ms_per_round_gross"))
    return None if value is None else float(value)


def _burst_summary(data: dict[str, Any]) -> Summary:
    ours, nothing = _phase(data, "ours", "burst"), _phase(data, "nothing", "burst")
    rows = []
    if ours and nothing:
        o, n = ours["output_ms"], nothing["output_ms"]
        calls = ours["phase"]["calls"]
        r = data.get("ours_vs_nothing_output_p50")
        rows.append(Row(f"burst of {calls} joining calls: output p50, ours / the do-nothing server",
                        f"{ratio(r)} ({ms(o.get('p50'), 2)} / {ms(n.get('p50'), 2)})", "≤ ×1.5", _at_most(r, 1.5),
                        measured(r, Unit.RATIO)))
        rows.append(Row(f"burst of {calls} joining calls: output p99 (ours)", ms(o.get("p99")), "≤ 50 ms",
                        _at_most(o.get("p99"), 50.0), measured(o.get("p99"), Unit.MS, 1)))
        rows.append(Row("burst: join p99 (`/connect` sent → answered), ours / the do-nothing server",
                        f"{ms(ours['join_ms'].get('p99'))} / {ms(nothing['join_ms'].get('p99'))}",
                        measure=measured(ours["join_ms"].get("p99"), Unit.MS, 1)))
        mine, floor = _cpu_per_round(ours), _cpu_per_round(nothing)
        rows.append(Row("burst: server CPU per tool round, ours / the do-nothing server",
                        f"{ms(mine, 2)} / {ms(floor, 2)}", "≤ 2 ms", _at_most(mine, 2.0), measured(mine, Unit.MS)))
    connect = _phase(data, "ours", "connect")
    if connect and "server_ms_per_connect" in connect:
        value = float(connect["server_ms_per_connect"])
        rows.append(Row("server CPU per connect, joining in a burst (call end included)", ms(value, 2),
                        "≤ 5 ms", _at_most(value, 5.0), measured(value, Unit.MS)))
    return Summary(rows)


def _one_summary(data: dict[str, Any]) -> Summary:
    ours, nothing = _phase(data, "ours", "one"), _phase(data, "nothing", "one")
    if not ours:
        return Summary([])
    p50 = ours["output_ms"].get("p50")
    floor = nothing["output_ms"].get("p50") if nothing else None
    return Summary([Row("one call: output p50 (the function call complete → our output read), "
                        "ours (the do-nothing server)", f"{ms(p50, 2)} ({ms(floor, 2)})", "≤ 1.5 ms",
                        _at_most(p50, 1.5), measured(p50, Unit.MS))])


def _long_summary(data: dict[str, Any]) -> Summary:
    long_, short = _phase(data, "ours", "long"), _phase(data, "ours", "short")
    if not long_ or not short:
        return Summary([])
    a, b = _cpu_per_round(long_), _cpu_per_round(short)
    rounds = long_["rounds_done"]
    met = None if a is None or b is None else a <= b * 1.1
    return Summary([Row(f"CPU per round of a {rounds:,}-round call / of 5-round calls (net of connects)",
                        f"{ms(a, 3)} / {ms(b, 3)}", "no more (±10 %)", met, measured(a, Unit.MS, 3))])


def _sweep_summary(data: dict[str, Any]) -> Summary:
    plots: dict[str, Series] = {"latency": {}, "cpu": {}}
    for step in data.get("steps", []):
        p = step["result"]["phases"]["burst"]
        who = "ours" if step["peer"] == "ours" else "do-nothing server"
        out = p["output_ms"]
        if out.get("n"):
            plots["latency"].setdefault(f"{who}, p50", []).append((step["calls"], out["p50"]))
            plots["latency"].setdefault(f"{who}, p99", []).append((step["calls"], out["p99"]))
        cpu = _cpu_per_round(p)
        if cpu is not None:
            plots["cpu"].setdefault(who, []).append((step["calls"], cpu))
    rows = []
    capacity = data.get("capacity", {})
    if capacity:
        rows.append(Row("calls joining in one second with most calls' output p99 ≤ 50 ms, ours / the do-nothing "
                        "server (the largest step tried)",
                        f"{capacity.get('ours', 0):,} / {capacity.get('nothing', 0):,}"))
    ours_cpu = plots["cpu"].get("ours", [])
    if ours_cpu:
        calls, cpu = ours_cpu[-1]
        floor = dict(plots["cpu"].get("do-nothing server", [])).get(calls)
        rows.append(Row(f"server CPU per tool round at {int(calls):,} calls, ours / the do-nothing server",
                        f"{ms(cpu, 2)} / {ms(floor, 2)}", "≤ 2 ms", _at_most(cpu, 2.0), measured(cpu, Unit.MS)))
    return Summary(rows, plots)


# --- capacity, memory (benchmarks.capacity) -----------------------------------------------------------


def _most_passed(steps: list[dict[str, Any]]) -> int:
    return max((s["calls"] for s in steps if s["passed"]), default=0)


def _held(steps: list[dict[str, Any]]) -> str:
    """The most calls a series passed; when its first step failed, that step and its p99."""
    best = _most_passed(steps)
    if best or not steps:
        return f"{best:,}"
    first = steps[0]
    return f"fewer than {first['calls']:,} (p99 {first['create_ms'].get('p99', float('nan')):.0f} ms there)"


def _capacity_summary(data: dict[str, Any]) -> Summary:
    steps = data.get("steps", [])
    one = [s for s in steps if s.get("workers") == 1]
    two = [s for s in steps if s.get("workers", 0) > 1]
    plot: Series = {}
    for label, series in (("one `serve` process", one), ("`serve --workers 2`", two)):
        plot[label] = [(s["calls"], s["create_ms"]["p99"]) for s in series if s["create_ms"].get("n")]
    a, b = _most_passed(one), _most_passed(two)
    # met: a step of 1,000 or more passed; missed: one of at most 1,000 failed; else not tried that far
    failed_below = any(not s["passed"] and s["calls"] <= 1000 for s in one)
    met = True if a >= 1000 else False if failed_below else None
    rows = [Row("calls one `serve` process holds at tool round p99 ≤ 50 ms", _held(one), "≥ 1,000", met),
            Row("calls `serve --workers 2` holds at p99 ≤ 50 ms, and its ratio to one process",
                f"{_held(two)} ({ratio(b / a) if a and b else '–'})",
                "≥ ×1.8 (not showable on 2 shared cores: see Scaling out)", None)]
    return Summary(rows, {"capacity": plot})


def _idle_summary(data: dict[str, Any]) -> Summary:
    rows = []
    for m in data.get("idle", []):
        rows.append(Row(f"resident memory per idle call ({m['calls']:,} calls)", f"{m['kib_per_call']} KiB",
                        "≤ 150 KiB", _at_most(m["kib_per_call"], 150.0), measured(m["kib_per_call"], Unit.KIB, 1)))
    return Summary(rows)


# --- connect, scale-out, takeover ------------------------------------------------------------------


def _connect_summary(data: dict[str, Any]) -> Summary:
    runs = data.get("runs", [])
    plain = [r for r in runs if not r.get("redis")]
    leased = [r for r in runs if r.get("redis")]
    cpu = _median([r["connect"]["per_call_ms"] for r in plain])
    lat = _median([r["connect"]["latency_ms"]["p50"] for r in plain if r["connect"].get("latency_ms", {}).get("n")])
    rows = [Row("server CPU per connect, connects at an even rate (call end apart)", ms(cpu, 2), "≤ 5 ms",
                _at_most(cpu, 5.0), measured(cpu, Unit.MS)),
            Row("connect latency p50 (`/connect` sent → answered)", ms(lat, 2), measure=measured(lat, Unit.MS))]
    if leased:
        cpu_r = _median([r["connect"]["per_call_ms"] for r in leased])
        redis_ms = _median([r["connect"].get("redis_server_ms", 0.0) for r in leased])
        lat_r = _median([r["connect"]["latency_ms"]["p50"] for r in leased
                         if r["connect"].get("latency_ms", {}).get("n")])
        extra = None if cpu is None or cpu_r is None else cpu_r - cpu
        rows.append(Row("the shared registry's cost per connect: server CPU (redis-server's), latency p50 with it",
                        f"{'+' if extra is not None and extra >= 0 else ''}{ms(extra, 2)} ({ms(redis_ms, 2)}), "
                        f"{ms(lat_r, 2)}", measure=measured(extra, Unit.MS)))   # a difference: its sign as measured (a quick run's may be below 0)
    return Summary(rows)


def _by_role(run: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [p for p in run.get("measure", {}).get("processes", []) if p["role"] == role]


def _per_call(run: dict[str, Any]) -> float | None:
    """Server CPU ms per call-second of a run's serving processes."""
    values = [p["ms_per_call_s"] for p in _by_role(run, "serve") + _by_role(run, "worker") if p["ms_per_call_s"]]
    return _median(values)


def _scale_out_summary(data: dict[str, Any]) -> Summary:
    runs = data.get("results", [])
    plain = _median([v for r in runs if r["mode"] == "serve" and (v := _per_call(r)) is not None])
    leased_runs = [r for r in runs if r["mode"] == "redis"]
    leased = _median([v for r in leased_runs if (v := _per_call(r)) is not None])
    calls = _median([float(r["calls"]) for r in leased_runs])
    redis_cpu = _median([p["core_pct"] * 10 / calls for r in leased_runs for p in _by_role(r, "redis")
                         if calls])
    # every request of ours is a script (EVAL/EVALSHA); Redis also counts the commands each script runs
    requests = _median([sum(v for k, v in r["measure"].get("redis_calls_per_s", {}).items()
                            if k in ("eval", "evalsha")) / calls
                        for r in leased_runs if calls and r.get("measure")])
    x = None if plain is None or leased is None or not plain else leased / plain
    rows = [Row("server CPU a call costs under the shared registry / in a plain process (ms per call-second)",
                f"{ratio(x)} ({ms(leased, 3)} / {ms(plain, 3)})", "≤ ×1.10", _at_most(x, 1.10),
                measured(x, Unit.RATIO))]
    if redis_cpu is not None and requests is not None:
        rows.append(Row("redis-server per live call: CPU (ms per call-second), our requests (scripts) a second",
                        f"{ms(redis_cpu, 3)}, {requests:.3f}", measure=measured(redis_cpu, Unit.MS, 3)))
        if redis_cpu > 0:
            rows.append(Row("model: calls one redis-server core serves (1,000 ms / its CPU per call-second)",
                            f"~{1000 / redis_cpu:,.0f}"))
    return Summary(rows)


def _takeover_summary(data: dict[str, Any]) -> Summary:
    runs = data.get("runs", [])
    times = [r["takeover_s"] for r in runs]
    ttl = runs[0]["ttl_s"] if runs else None
    median = _median(times)
    once = all(r["outputs_call_w"] == 1 and r["violations"] == 0 for r in runs)
    span = (f" ({min(times):.2f}–{max(times):.2f} s, {len(times)} repeats)" if len(times) > 1
            else " (1 repeat)" if times else "")
    return Summary([Row(f"takeover: kill -9 of a call's holder → its pending write answered by another "
                        f"process (lease TTL {ttl:g} s)" if ttl is not None else "takeover",
                        (f"{median:.2f} s" if median is not None else "–") + span,
                        "about the TTL; each pending write answered once",
                        None if not runs else bool(once and ttl is not None and median is not None
                                                   and median <= ttl * 1.5),
                        measured(median, Unit.SECONDS))])


# --- floods, journal, round CPU ----------------------------------------------------------------------


def _floods_summary(data: dict[str, Any]) -> Summary:
    worst: dict[str, tuple[float, float]] = {}
    for repeat in data.get("repeats", []):
        for p in repeat.get("phases", []):
            if "ratio_p50" in p and p["phase"] != "idle":
                a, b = worst.get(p["phase"], (0.0, 0.0))
                worst[p["phase"]] = (max(a, p["ratio_p50"]), max(b, p["ratio_p99"]))
    names = {"mint": "a mint flood", "sse": "an event-stream flood", "connect": "a bogus-connect flood"}
    rows = []
    for phase, (p50, p99) in worst.items():
        rows.append(Row(f"live calls' tool round under {names.get(phase, phase)}, against idle (worst p50 / p99)",
                        f"{ratio(p50)} / {ratio(p99)}", "≤ ×2", p50 <= 2.0 and p99 <= 2.0,
                        measured(p50, Unit.RATIO)))
    return Summary(rows)


def _journal_summary(data: dict[str, Any]) -> Summary:
    r = data.get("results", {})
    days = r.get("counts", {}).get("days")
    at = f" at {days:,} days" if days else ""
    rows = []
    search, listing = r.get("journal.search", {}), r.get("commitments.list", {})
    if search.get("n"):
        rows.append(Row(f"`journal.search` p50{at}", ms(search["p50"]), "≤ 10 ms (1,000 days)",
                        _at_most(search["p50"], 10.0), measured(search["p50"], Unit.MS, 1)))
    if listing.get("n"):
        rows.append(Row(f"`commitments.list` (the ledger) p50{at}", ms(listing["p50"]), "≤ 20 ms (1,000 days)",
                        _at_most(listing["p50"], 20.0), measured(listing["p50"], Unit.MS, 1)))
    build = r.get("index_build", {})
    if build:
        rows.append(Row(f"search index built from scratch{at}", f"{build['ms'] / 1000:.1f} s",
                        measure=measured(build["ms"] / 1000, Unit.SECONDS, 1)))
    complete = r.get("commitments.complete", {})
    if complete.get("n"):
        rows.append(Row(f"`commitments.complete` p50{at}", ms(complete["p50"]),
                        measure=measured(complete["p50"], Unit.MS, 1)))
    return Summary(rows)


def _round_cpu_summary(data: dict[str, Any]) -> Summary:
    us = data.get("us_per_round_all")
    return Summary([Row(f"CPU of a tool round's {data.get('frames_per_round', 28)} frames through the call's "
                        "protocol, no sockets", "–" if us is None else f"{us:.0f} µs",
                        measure=measured(us, Unit.US, 0))])


def _tracing_summary(data: dict[str, Any]) -> Summary:
    us = data.get("us_per_round")
    how = "on (every span made, in memory)" if data.get("traced") else "off (no OTEL_* variable)"
    return Summary([Row(f"CPU of a tool round through the call actor and the executor, in memory, tracing {how}",
                        "–" if us is None else f"{us:.0f} µs", measure=measured(us, Unit.US, 0))])


# --- the set ----------------------------------------------------------------------------------------

_LEAN = ["--sim", "lean"]
#: ours first in one repeat, the do-nothing server first in the next
_BOTH_ORDERS = (("--peers", "ours", "nothing"), ("--peers", "nothing", "ours"))

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "tool_round", "benchmarks.burst",
        "the tool round at N calls: latency and server CPU per round, ours and the do-nothing server",
        {Size.TINY: ["--mode", "sweep", "--steps", "2", *_BURST_TINY],
         Size.QUICK: ["--mode", "sweep", *_LEAN, "--steps", "10", "30",
                      "--rounds", "5", "--warm-calls", "2", "--idle-s", "0.5", "--settle-max-s", "2"],
         Size.FULL: ["--mode", "sweep", *_LEAN, "--steps", "25", "50", "100", "200", "400"]},
        _sweep_summary, orders=_BOTH_ORDERS),
    Benchmark(
        "burst", "benchmarks.burst",
        "a burst of calls joining at once: output latency against the do-nothing server's, CPU per connect",
        {Size.TINY: ["--calls", "3", *_BURST_TINY],
         Size.QUICK: [*_LEAN, "--calls", "40", "--rounds", "5", "--warm-calls", "2", "--idle-s", "0.5",
                      "--settle-max-s", "2"],
         Size.FULL: [*_LEAN]},
        _burst_summary, env={"BENCH_NOTHING_FAST_FRAMES": "1"},
        # single runs of the same code spread ×1.4–×13.9 in its ratio on two shared cores
        repeats={Size.TINY: 2, Size.QUICK: 3, Size.FULL: 5}, orders=_BOTH_ORDERS),
    Benchmark(
        "one_call", "benchmarks.burst",
        "one call's output latency, ours and the do-nothing server",
        {Size.TINY: ["--mode", "one", *_BURST_TINY],
         Size.QUICK: ["--mode", "one", *_LEAN, "--rounds", "20", "--warm-calls", "1", "--idle-s", "0",
                      "--settle-max-s", "2"],
         Size.FULL: ["--mode", "one", *_LEAN]},
        _one_summary, repeats={Size.QUICK: 3, Size.FULL: 5}, orders=_BOTH_ORDERS),
    Benchmark(
        "long_call", "benchmarks.burst",
        "a long call's CPU per round against short calls' (a cost growing with a call's history)",
        {Size.TINY: ["--mode", "long", "--long-rounds", "12", "--short-calls", "2", "--settle-max-s", "1",
                     "--warm-calls", "0", "--idle-s", "0"],
         Size.QUICK: ["--mode", "long", *_LEAN, "--long-rounds", "400", "--short-calls", "10", "--idle-s", "0.5",
                      "--settle-max-s", "2"],
         Size.FULL: ["--mode", "long", *_LEAN]},
        _long_summary),
    Benchmark(
        "connect", "benchmarks.connect_cost",
        "server CPU and latency of a connect, without and with the shared registry",
        {Size.TINY: ["--calls", "3", "--rate", "50", "--repeats", "1", "--idle-s", "0.3", "--registry"],
         Size.QUICK: ["--calls", "40", "--rate", "50", "--repeats", "1", "--idle-s", "0.5", "--registry"],
         Size.FULL: ["--calls", "200", "--rate", "50", "--repeats", "5", "--registry"]},
        _connect_summary, needs_redis=True),
    Benchmark(
        "capacity", "benchmarks.capacity",
        "capacity step-up: the most calls at tool round p99 ≤ 50 ms, one process and `serve --workers 2`",
        {Size.TINY: ["--workers", "2", "--idle", "--steps", "4", "--rounds", "1", "--gap", "0.3", "--rate-hz",
                     "0", "--target-ms", "10000"],
         Size.QUICK: [*_LEAN, "--workers", "2", "--idle", "--steps", "150", "300", "--rounds", "3", "--gap",
                      "1.5", "--rate-hz", "0"],
         Size.FULL: [*_LEAN, "--workers", "2", "--idle", "--steps", "1000", "2000", "3000", "3500", "4000", "4500",
                     "5000", "5500", "6000", "--rounds", "4", "--gap", "5", "--rate-hz", "0"]},
        _capacity_summary, needs_redis=True),
    Benchmark(
        "idle_memory", "benchmarks.capacity",
        "resident memory per idle call",
        {Size.TINY: ["--steps", "--idle", "3", "--settle", "0.3"],
         Size.QUICK: [*_LEAN, "--steps", "--idle", "200", "--settle", "1"],
         Size.FULL: [*_LEAN, "--steps", "--idle", "1000"]},
        _idle_summary),
    Benchmark(
        "scale_out", "benchmarks.redis_cost",
        "CPU per call under the shared registry against a plain process; Redis's CPU and requests per call",
        {Size.TINY: ["--calls", "3", "--modes", "serve", "redis", "--rounds", "2", "--gap", "0.5", "--settle",
                     "0.3", "--window", "0.5", "--spy", "0"],
         Size.QUICK: ["--calls", "150", "--modes", "serve", "redis", "--rounds", "3", "--gap", "2", "--settle",
                      "1.5", "--window", "3", "--spy", "0"],
         Size.FULL: ["--calls", "1500", "--modes", "serve", "redis", "--repeats", "2", "--rounds", "6", "--gap",
                     "5", "--spy", "0"]},
        _scale_out_summary, needs_redis=True),
    Benchmark(
        "takeover", "benchmarks.takeover",
        "takeover time: kill -9 of a call's holder → its pending write answered by the other process",
        {Size.TINY: ["--repeats", "1", "--ttl", "1"],
         Size.QUICK: ["--repeats", "1", "--ttl", "2"],
         Size.FULL: ["--repeats", "5", "--ttl", "2"]},
        _takeover_summary, needs_redis=True),
    Benchmark(
        "floods", "benchmarks.floods",
        "live calls' tool round while the HTTP API is flooded (mints, event streams, bogus connects)",
        {Size.TINY: ["--repeats", "1", "--calls", "2", "--phase-s", "0.6", "--settle-s", "0.1", "--settle-max-s",
                     "2", "--warmup", "0.3", "--mint-rate", "5", "--connect-rate", "5", "--sse-subscribers", "8",
                     "--sse-rate", "100"],
         Size.QUICK: ["--repeats", "1", "--phase-s", "3", "--settle-s", "0.5", "--sse-subscribers", "500"],
         Size.FULL: ["--repeats", "3"]},
        _floods_summary),
    Benchmark(
        "journal", "benchmarks.journal_scale",
        "journal search, the ledger and the index at scale (a generated journal)",
        {Size.TINY: ["--days", "3", "--n", "3"],
         Size.QUICK: ["--days", "60", "--n", "50"],
         Size.FULL: ["--days", "1000"]},
        _journal_summary, in_process=True),
    Benchmark(
        "round_cpu", "benchmarks.round_cpu",
        "CPU of one tool round through the call's protocol, without sockets",
        {Size.TINY: ["--rounds", "5", "--window", "2"],
         Size.QUICK: ["--rounds", "1000"],
         Size.FULL: ["--rounds", "3000"]},
        _round_cpu_summary, repeats={Size.QUICK: 3, Size.FULL: 3}, in_process=True),
    Benchmark(
        "tracing_cost", "benchmarks.tracing_cost",
        "CPU of a tool round through the call actor and the executor, tracing off: side by side with the "
        "checkout before the hooks, what they cost",
        {Size.TINY: ["--rounds", "3"],
         Size.QUICK: ["--rounds", "200"],
         Size.FULL: ["--rounds", "600"]},
        _tracing_summary, repeats={Size.QUICK: 3, Size.FULL: 5}, in_process=True),
)

BY_NAME = {b.name: b for b in BENCHMARKS}
