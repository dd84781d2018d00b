"""Every benchmark of ``python -m benchmarks`` run end to end at its tiny
size, and the runner writing the results page.

Benchmarks are not part of the test suite; this only proves each one still
runs (simulators, servers and peers as child processes on loopback, the
journal handlers), that its figures come out of its JSON, and that what it
accounts for adds up. No timing is asserted. The benchmarks that start a
redis-server skip where it is not installed (``.ci/run`` installs it); the
plots need matplotlib (the ``bench`` extra) and skip without it.
"""

from __future__ import annotations

import ast
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from redis_support import needs_redis

pytest.importorskip("psutil")        # the test extra has both; the benchmarks account CPU with psutil
pytest.importorskip("websockets")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """The benchmarks package importable, its work folder in ``tmp_path``."""
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("VOICEACTORS_BENCH_DIR", str(tmp_path / "bench"))
    return tmp_path


def run_tiny(tmp_path: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One benchmark at its tiny size through the runner: (its stored result, its first run's JSON)."""
    from benchmarks.__main__ import run_one
    from benchmarks.suite import BY_NAME, Size

    result = run_one(BY_NAME[name], Size.TINY, tmp_path / "out", print)
    assert result["rows"], f"{name} reported no figure"
    assert result["size"] == "tiny" and result["when_utc"] and result["argv"]
    assert len(result["runs"]) == result["repeats"] == BY_NAME[name].runs(Size.TINY)
    return result, json.loads(Path(result["runs"][0]["json"]).read_text())


def _burst_phase(data: dict[str, Any], peer: str, phase: str) -> dict[str, Any]:
    (r,) = [r for r in data["results"] if r["peer"] == peer]
    return r["phases"][phase]


def test_the_listing_names_every_benchmark_and_each_module_says_what_it_measures(bench, capsys):
    from benchmarks.__main__ import main
    from benchmarks.suite import BENCHMARKS

    assert main([]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line and not line.startswith("run")]
    assert listed == [b.name for b in BENCHMARKS]
    for module in {b.module for b in BENCHMARKS}:
        path = REPO / (module.replace(".", "/") + ".py")
        assert ast.get_docstring(ast.parse(path.read_text())), f"{module} has no docstring"


def test_every_size_of_every_benchmark_is_a_valid_command_line(bench, capsys):
    # the quick and full sizes are only run by hand: their arguments are checked here (parsed, then --help)
    import importlib

    from benchmarks.suite import BENCHMARKS, Size

    for b in BENCHMARKS:
        module = importlib.import_module(b.module)
        for size, repeat in itertools.product(Size, range(max(1, len(b.orders)))):   # each order of the servers
            with pytest.raises(SystemExit) as exit_:
                module.main([*b.argv(size, repeat), "--help"])
            assert exit_.value.code == 0, (b.name, size, repeat, capsys.readouterr().err)


def _private_names_of_the_product() -> set[str]:
    """Every ``_name`` the package defines: functions, methods, classes, attributes set on ``self``."""
    names = set()
    for path in (REPO / "voiceactors").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_benchmark_names_a_private_method_of_the_product():
    # what a benchmark needs from inside the product is exposed by the product (a metric, a documented hook):
    # no attribute read, import, patch or string match of a private name
    private = _private_names_of_the_product()
    for path in (REPO / "benchmarks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named = {word.strip("()'\".,:`") for word in node.value.split()} & private
                assert not named, f"{path.name}:{node.lineno} names {named}"
        tree = ast.parse(path.read_text())
        own = {"self", "cls"} | {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                assert isinstance(owner, ast.Name) and owner.id in own, \
                    f"{path.name}:{node.lineno} reads .{node.attr}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("voiceactors"):
                assert not [a.name for a in node.names if a.name.startswith("_")], f"{path.name}:{node.lineno}"


@pytest.fixture(scope="module")
def page_run(tmp_path_factory) -> tuple[Path, Path, Path]:
    """One run of the runner writing a results page, read by the tests below: (results, page, plots)."""
    folder = tmp_path_factory.mktemp("page")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO))
        patch.setenv("VOICEACTORS_BENCH_DIR", str(folder / "bench"))
        return _page_run(folder)


def _page_run(bench: Path) -> tuple[Path, Path, Path]:
    from benchmarks.__main__ import main

    results, page, plots = bench / "docs" / "results.json", bench / "docs" / "page.md", bench / "docs" / "plots"
    page.parent.mkdir(parents=True)
    page.write_text("# Benchmarks\n\nHand-written.\n\n<!-- generated by `python -m benchmarks run`: do not edit "
                    "by hand until the END line -->\nold\n<!-- END of the generated part -->\n\nAfter.\n")
    assert main(["run", "tool_round", "round_cpu", "--tiny", "--results", str(results), "--page", str(page),
                 "--plots", str(plots)]) == 0
    return results, page, plots


def test_tool_round_steps_both_servers_and_plots_latency_and_cpu(page_run):
    # its tiny run is the one the page tests read (``page_run``): the runner's stored result and its JSON
    results, _, _ = page_run
    result = json.loads(results.read_text())["tool_round"]
    assert result["size"] == "tiny" and result["repeats"] == 1 and result["rows"]
    data = json.loads(Path(result["runs"][0]["json"]).read_text())
    assert [(s["peer"], s["calls"]) for s in data["steps"]] == [("ours", 2), ("nothing", 2)]
    for step in data["steps"]:
        burst = step["result"]["phases"]["burst"]
        assert burst["rounds_done"] == 4 and burst["unanswered"] == 0 and burst["errors"] == 0
    assert set(result["plots"]["latency"]) == {"ours, p50", "ours, p99", "do-nothing server, p50",
                                               "do-nothing server, p99"}
    assert set(result["plots"]["cpu"]) <= {"ours", "do-nothing server"}


def test_burst_answers_every_round_of_both_servers_in_each_repeat_and_reports_the_median(bench):
    result, first = run_tiny(bench, "burst")
    second = json.loads(Path(result["runs"][1]["json"]).read_text())
    # the two repeats alternate which server runs first
    assert [r["peer"] for r in first["results"]] == ["ours", "nothing"]
    assert [r["peer"] for r in second["results"]] == ["nothing", "ours"]
    for data in (first, second):
        for peer in ("ours", "nothing"):
            connect, burst = _burst_phase(data, peer, "connect"), _burst_phase(data, peer, "burst")
            assert connect["join_statuses"] == {"200": 3} and connect["closed"] == 3 and connect["rounds_done"] == 0
            assert burst["rounds_done"] == 6 and burst["output_ms"]["n"] == 6 and burst["create_ms"]["n"] == 6
            assert burst["errors"] == 0 and burst["violations"] == 0 and burst["unanswered"] == 0
        nothing_p50 = _burst_phase(data, "nothing", "burst")["output_ms"]["p50"]
        if nothing_p50 <= 0:   # it answers before the output clock starts: no ratio, and said why
            assert data["ours_vs_nothing_output_p50"] is None and data["ratio_skipped"]
    assert result["rows"][0]["figure"].startswith("burst of 3 joining calls")
    # each repeat's rows are kept; a row is the lower middle repeat's, with the count and the range
    p99s = sorted((run["rows"][1] for run in result["runs"]), key=lambda row: row["measure"]["number"])
    assert [row["figure"] for row in p99s] == ["burst of 3 joining calls: output p99 (ours)"] * 2
    low, high = (row["measure"]["number"] for row in p99s)
    assert result["rows"][1]["value"] == f"{p99s[0]['value']}; lower median of 2, range {low:.1f} ms–{high:.1f} ms"


def test_repeats_are_reported_by_the_median_repeat_and_their_range():
    from benchmarks.suite import Measure, Row, Summary, Unit, combine

    def repeat(ratio: float, p50: float, note: str) -> Summary:
        return Summary([Row("ratio", f"×{ratio:.2f} ({p50:.2f} ms)", "≤ ×1.5", ratio <= 1.5,
                            Measure(ratio, Unit.RATIO)),
                        Row("servers", note)])

    rows = combine([repeat(3.0, 2.0, "a"), repeat(1.2, 0.9, "b"), repeat(13.9, 9.0, "c")]).rows
    assert rows[0].value == "×3.00 (2.00 ms); median of 3, range ×1.20–×13.90" and rows[0].met is False
    assert rows[1].value == "a; b; c (3 repeats)"
    assert combine([repeat(1.2, 0.9, "b")]).rows[0].value == "×1.20 (0.90 ms)"


def test_repeats_on_the_command_line_override_a_benchmarks_own(bench):
    from benchmarks.__main__ import main

    results = bench / "results.json"
    assert main(["run", "round_cpu", "--tiny", "--repeats", "3", "--no-page", "--results", str(results)]) == 0
    stored = json.loads(results.read_text())["round_cpu"]
    assert stored["repeats"] == 3 and [run["repeat"] for run in stored["runs"]] == [1, 2, 3]
    assert all(Path(run["json"]).name == f"round_cpu-{run['repeat']}.json" for run in stored["runs"])
    assert "; median of 3, range " in stored["rows"][0]["value"]


def _other_checkout(tmp_path: Path) -> tuple[Path, Path]:
    """Another checkout: a copy of this one's package (its compiled files
    too, so nothing but the changed file compiles again) whose import
    appends the importing process's command line to a file. Returns the
    checkout and that file."""
    other, imports = tmp_path / "other", tmp_path / "imports-of-the-other-checkout.jsonl"
    shutil.copytree(REPO / "voiceactors", other / "voiceactors")
    with (other / "voiceactors" / "__init__.py").open("a") as init:
        init.write(f"\nimport json as _json, sys as _sys\nwith open({str(imports)!r}, 'a') as _f:\n"
                   "    _f.write(_json.dumps(_sys.argv) + '\\n')\n")
    return other, imports


def test_against_another_checkout_runs_its_server_beside_this_ones(bench):
    # one_call measures a server child; round_cpu's own process is the code under test
    from benchmarks.__main__ import main

    other, imports = _other_checkout(bench)
    stored = (REPO / "docs" / "benchmarks" / "results.json").read_bytes()
    assert main(["run", "one_call", "round_cpu", "--tiny", "--against", str(other)]) == 0
    (folder,) = (bench / "bench" / "results").iterdir()
    compared = {b["name"]: b for b in json.loads((folder / "comparison.json").read_text())["benchmarks"]}
    for side in ("old", "new"):
        (run,) = compared["one_call"]["runs"][side]
        data = json.loads(Path(run["json"]).read_text())
        assert _burst_phase(data, "ours", "one")["rounds_done"] == 2 and data["results"][0]["peer"] == "ours"
        assert data["server_repo"] == str(other if side == "old" else REPO)
    (figure,) = compared["one_call"]["figures"]
    assert len(figure["old"]) == len(figure["new"]) == 1 and figure["new_over_old"] > 0
    assert "`round_cpu` | CPU of a tool round's 28 frames" in (folder / "comparison.md").read_text()
    # the other checkout's package ran the old side's server and round_cpu's old run, and nothing else:
    # the simulator, the do-nothing server and the benchmarks' own code are this checkout's
    argvs = [json.loads(line) for line in imports.read_text().splitlines()]
    assert [a[1:2] for a in argvs if a[1:2] == ["serve"]] == [["serve"]]
    (round_cpu,) = [a for a in argvs if a[0].endswith("round_cpu.py")]
    assert Path(round_cpu[0]).resolve() == REPO / "benchmarks" / "round_cpu.py"
    assert not [a for a in argvs if "_sim" in a or a[0].endswith(("nothing.py", "lean_sim.py"))]
    assert (REPO / "docs" / "benchmarks" / "results.json").read_bytes() == stored   # the page's results left alone


def test_the_long_call(bench):
    # one_call runs in test_against_another_checkout_runs_its_server_beside_this_ones
    result, data = run_tiny(bench, "long_call")
    long_, short = _burst_phase(data, "ours", "long"), _burst_phase(data, "ours", "short")
    assert long_["rounds_done"] == 12 and short["rounds_done"] == 10 and long_["unanswered"] == 0
    assert "12-round call" in result["rows"][0]["figure"]


@needs_redis
def test_connect_pairs_without_and_with_the_registry(bench):
    result, data = run_tiny(bench, "connect")
    assert [run["redis"] for run in data["runs"]] == [False, True]
    for run in data["runs"]:
        assert run["connect"]["statuses"] == {"200": 3} and run["end"]["records_with_end"] == 3
        assert run["log_events"].get("call.connected") == 3 and run["server_rc"] == 0
    assert len(result["rows"]) == 3


@needs_redis
def test_capacity_steps_up_one_process_and_two_workers(bench):
    result, data = run_tiny(bench, "capacity")
    assert [(s["workers"], s["calls"]) for s in data["steps"]] == [(1, 4), (2, 4)]
    for step in data["steps"]:
        assert step["calls_connected"] == 4 and step["missing_create"] == 0 and step["passed"], step
        assert step["cpu"]["peer"]["cpu_s"] > 0          # the serve's process tree
    assert set(result["plots"]["capacity"]) == {"one `serve` process", "`serve --workers 2`"}


def test_idle_memory(bench):
    result, data = run_tiny(bench, "idle_memory")
    (m,) = data["idle"]
    assert m["calls_connected"] == 3 and m["handshakes_rejected"] == 0 and m["rss_joined_mib"] > 0
    assert result["rows"][0]["value"].endswith("KiB")


@needs_redis
def test_scale_out_measures_a_plain_and_a_leased_process(bench):
    result, data = run_tiny(bench, "scale_out")
    assert [r["mode"] for r in data["results"]] == ["serve", "redis"]
    for r in data["results"]:
        assert r["calls_connected"] == 3 and r["unanswered"] == 0 and r["violations"] == 0
        assert {p["role"] for p in r["measure"]["processes"]} >= {"serve"}
    assert "redis" in {p["role"] for p in data["results"][1]["measure"]["processes"]}
    assert result["rows"][0]["figure"].startswith("server CPU a call costs under the shared registry")


@needs_redis
def test_takeover_answers_the_pending_write_once_from_the_taker(bench):
    result, data = run_tiny(bench, "takeover")
    (run,) = data["runs"]
    assert run["outputs_call_w"] == 1 and run["connections"] == 2 and run["violations"] == 0
    assert run["takeover_s"] > 0 and run["take_over_logged_s"] is not None
    assert 0 <= run["kill_delay_s"] <= 1 / 3     # a random phase, up to a scan period
    assert "TTL 1 s" in result["rows"][0]["figure"]


def test_floods_account_for_every_request(bench):
    result, data = run_tiny(bench, "floods")
    (r,) = data["repeats"]
    assert r["live_connects"] == {"200": 2} and r["server_rc"] == 0
    phases = {p["phase"]: p for p in r["phases"]}
    assert list(phases) == ["idle", "mint", "sse", "connect"]
    for kind in ("mint", "connect"):                              # each request ends in one bucket
        f = phases[kind]["flood"]
        assert f["sent"] + f["skipped"] == 3                      # 5/s for 0.6 s
        assert sum(f["statuses"].values()) + sum(f["errors"].values()) + f["cancelled"] == f["sent"]
    sse = phases["sse"]["flood"]
    assert sum(sse["statuses"].values()) + sum(sse["errors"].values()) + sse["unanswered_at_ramp_end"] == 8
    assert [row["figure"].split(" under ")[1].split(",")[0] for row in result["rows"]] == [
        "a mint flood", "an event-stream flood", "a bogus-connect flood"]


def test_journal_at_tiny_scale(bench):
    result, data = run_tiny(bench, "journal")
    r = data["results"]
    assert r["counts"]["days"] == 3 and r["index_build"]["files"] > 0
    assert r["index_refresh_unchanged"]["files_indexed"] == 0
    for key in ("journal.search", "journal.get_day", "commitments.list", "entities.recent_with"):
        assert r[key]["n"] == 3 and r[key]["errors"] == 0, (key, r[key])
    assert [row["figure"] for row in result["rows"]][:2] == ["`journal.search` p50 at 3 days",
                                                            "`commitments.list` (the ledger) p50 at 3 days"]


def test_round_cpu(bench):
    result, data = run_tiny(bench, "round_cpu")
    assert data["view"] and data["creates"] == 5 and data["tool_calls"] == 5 and data["frames_per_round"] == 28


def test_tracing_cost(bench):
    result, data = run_tiny(bench, "tracing_cost")
    assert data["rounds"] == data["tool_calls"] == 3 and not data["traced"] and data["spans"] == 0
    assert data["us_per_round"] > 0 and "tracing off" in result["rows"][0]["figure"]


def test_the_runner_rewrites_only_the_generated_part_of_the_page(page_run):
    results, page, _ = page_run
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written.\n") and text.endswith("\n\nAfter.\n")
    assert "\nold\n" not in text and "**Not the reference numbers:**" in text
    assert "| `round_cpu` |" in text and "`python -m benchmarks run round_cpu`" in text
    assert set(json.loads(results.read_text())) == {"tool_round", "round_cpu"}


def test_the_runner_draws_the_plots(page_run):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib (the bench extra)")
    _, page, plots = page_run
    assert (plots / "tool-round-latency.svg").read_text().lstrip().startswith("<?xml")
    assert (plots / "tool-round-cpu.svg").exists()
    assert "![Tool round latency against concurrent calls" in page.read_text()
