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
import json
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
    """One benchmark at its tiny size through the runner: (its stored result, its JSON)."""
    from benchmarks.__main__ import run_one
    from benchmarks.suite import BY_NAME, Size

    result = run_one(BY_NAME[name], Size.TINY, tmp_path / "out", print)
    assert result["rows"], f"{name} reported no figure"
    assert result["size"] == "tiny" and result["when_utc"] and result["argv"]
    return result, json.loads((tmp_path / "out" / f"{name}.json").read_text())


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
        for size in Size:
            with pytest.raises(SystemExit) as exit_:
                module.main([*b.argv(size), "--help"])
            assert exit_.value.code == 0, (b.name, size, capsys.readouterr().err)


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


def test_tool_round_steps_both_servers_and_plots_latency_and_cpu(bench):
    result, data = run_tiny(bench, "tool_round")
    assert [(s["peer"], s["calls"]) for s in data["steps"]] == [("ours", 2), ("nothing", 2)]
    for step in data["steps"]:
        burst = step["result"]["phases"]["burst"]
        assert burst["rounds_done"] == 4 and burst["unanswered"] == 0 and burst["errors"] == 0
    assert set(result["plots"]["latency"]) == {"ours, p50", "ours, p99", "do-nothing server, p50",
                                               "do-nothing server, p99"}
    assert set(result["plots"]["cpu"]) <= {"ours", "do-nothing server"}


def test_burst_answers_every_round_of_both_servers(bench):
    result, data = run_tiny(bench, "burst")
    assert [r["peer"] for r in data["results"]] == ["ours", "nothing"]
    for peer in ("ours", "nothing"):
        connect, burst = _burst_phase(data, peer, "connect"), _burst_phase(data, peer, "burst")
        assert connect["join_statuses"] == {"200": 3} and connect["closed"] == 3 and connect["rounds_done"] == 0
        assert burst["rounds_done"] == 6 and burst["output_ms"]["n"] == 6 and burst["create_ms"]["n"] == 6
        assert burst["errors"] == 0 and burst["violations"] == 0 and burst["unanswered"] == 0
    nothing_p50 = _burst_phase(data, "nothing", "burst")["output_ms"]["p50"]
    if nothing_p50 <= 0:   # it answers before the output clock starts: no ratio, and said why
        assert data["ours_vs_nothing_output_p50"] is None and data["ratio_skipped"]
    assert result["rows"][0]["figure"].startswith("burst of 3 joining calls")


def test_one_call_and_the_long_call(bench):
    result, data = run_tiny(bench, "one_call")
    assert _burst_phase(data, "ours", "one")["rounds_done"] == 2
    assert result["rows"][0]["value"] != "–"
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


def _page_run(bench: Path) -> tuple[Path, Path, Path]:
    from benchmarks.__main__ import main

    results, page, plots = bench / "docs" / "results.json", bench / "docs" / "page.md", bench / "docs" / "plots"
    page.parent.mkdir(parents=True)
    page.write_text("# Benchmarks\n\nHand-written.\n\n<!-- generated by `python -m benchmarks run`: do not edit "
                    "by hand until the END line -->\nold\n<!-- END of the generated part -->\n\nAfter.\n")
    assert main(["run", "tool_round", "round_cpu", "--tiny", "--results", str(results), "--page", str(page),
                 "--plots", str(plots)]) == 0
    return results, page, plots


def test_the_runner_rewrites_only_the_generated_part_of_the_page(bench):
    results, page, _ = _page_run(bench)
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written.\n") and text.endswith("\n\nAfter.\n")
    assert "\nold\n" not in text and "**Not the reference numbers:**" in text
    assert "| `round_cpu` |" in text and "`python -m benchmarks run round_cpu`" in text
    assert set(json.loads(results.read_text())) == {"tool_round", "round_cpu"}


def test_the_runner_draws_the_plots(bench):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib (the bench extra)")
    _, page, plots = _page_run(bench)
    assert (plots / "tool-round-latency.svg").read_text().lstrip().startswith("<?xml")
    assert (plots / "tool-round-cpu.svg").exists()
    assert "![Tool round latency against concurrent calls" in page.read_text()
