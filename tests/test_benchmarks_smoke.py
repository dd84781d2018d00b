"""Smoke runs of every benchmark script with tiny sizes.

Benchmarks are not part of the test suite; this only proves each script
still runs end to end (simulator and peer processes on loopback, the
journal handlers) and writes sane results. No timing is asserted.
Skipped when the ``bench`` extra (psutil, websockets, openai-agents) is
not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("psutil")
pytest.importorskip("websockets")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """The benchmarks package importable, its work folder in ``tmp_path``.
    The drivers run in this process; the simulator and peers they start are
    child processes."""
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("VOICEACTORS_BENCH_DIR", str(tmp_path / "bench"))
    return tmp_path


def _main(tmp_path: Path, module: str, *args: str) -> dict:
    import importlib

    out = tmp_path / f"{module.rsplit('.', 1)[-1]}.json"
    assert importlib.import_module(module).main([*args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_roundtrip_ours_answers_every_tool_call(bench):
    data = _main(bench, "benchmarks.roundtrip", "--peer", "ours", "--calls", "1", "--rounds", "2",
                 "--gap", "0.2", "--rate-hz", "20")
    (r,) = data["results"]
    assert r["tool_calls"] == 2 and r["output_ms"]["n"] == 2 and r["create_ms"]["n"] == 2
    assert r["overhead_ms"]["n"] == 2          # every output joined with its tool_run log line
    assert r["error_codes"] == {} and r["violations"] == 0 and r["unanswered"] == 0
    assert r["cpu"]["peer"]["cpu_s"] > 0 and data["machine"]["cores"] >= 1


def test_peers_compare_runs_the_agents_peer(bench):
    pytest.importorskip("agents")
    data = _main(bench, "benchmarks.peers_compare", "--peers", "agents", "--calls", "1",
                 "--rounds", "1", "--gap", "0.2", "--scenario-calls", "0")
    r = data["results"]["agents"]["roundtrip"]["1"]
    assert r["output_ms"]["n"] == 1 and r["calls_connected"] == 1, r


def test_capacity_idle_memory_with_the_baseline_peer(bench):
    data = _main(bench, "benchmarks.capacity", "--steps", "--idle", "3", "--idle-peers", "baseline",
                 "--settle", "0.3")
    (m,) = data["idle"]
    assert m["peer"] == "baseline" and m["calls_connected"] == 3 and m["handshakes_rejected"] == 0
    assert m["rss_joined_mib"] > 0


def test_journal_scale_tiny(bench):
    from benchmarks import journal_scale

    r = journal_scale.run(days=3, n=3)
    assert r["counts"]["days"] == 3 and r["index_build"]["files"] > 0
    assert r["index_refresh_unchanged"]["files_indexed"] == 0
    assert r["index_refresh_one_day"]["files_indexed"] >= 1
    for key in ("journal.search", "journal.get_day", "commitments.list", "entities.recent_with"):
        assert r[key]["n"] == 3 and r[key]["errors"] == 0, (key, r[key])


def test_floods_every_phase_accounts_for_every_request(bench):
    pytest.importorskip("trio")
    data = _main(bench, "benchmarks.floods", "--repeats", "1", "--calls", "2", "--phase-s", "0.6",
                 "--settle-s", "0.1", "--settle-max-s", "2", "--warmup", "0.3", "--mint-rate", "5", "--connect-rate", "5",
                 "--sse-subscribers", "8", "--sse-rate", "100")
    assert data["rlimit_nofile"]["after"]["soft"] >= data["rlimit_nofile"]["before"]["soft"]
    (r,) = data["repeats"]
    assert r["live_connects"] == {"200": 2} and r["server_rc"] == 0
    phases = {p["phase"]: p for p in r["phases"]}
    assert list(phases) == ["idle", "mint", "sse", "connect"]
    assert sum(p["rounds"] for p in phases.values()) > 0        # the live calls ran through the phases
    for p in phases.values():
        assert {"output_ms", "create_ms", "server_overhead_ms", "cpu", "window"} <= set(p)
        assert "refused" not in p, p["refused"]                     # the benchmark's Host is accepted
    for kind in ("mint", "connect"):                              # each request ends in one bucket
        f = phases[kind]["flood"]
        assert f["sent"] + f["skipped"] == 3                      # 5/s for 0.6 s
        assert sum(f["statuses"].values()) + sum(f["errors"].values()) + f["cancelled"] == f["sent"]
    sse = phases["sse"]["flood"]
    assert sum(sse["statuses"].values()) + sum(sse["errors"].values()) + sse["unanswered_at_ramp_end"] == 8
    assert sse["held"] == sse["statuses"].get("200", 0)
    files = phases["connect"]["call_files_after"]
    assert 0 <= files["bogus"] <= phases["connect"]["flood"]["sent"]


def test_round_cpu_tiny(bench):
    data = _main(bench, "benchmarks.round_cpu", "--rounds", "5", "--window", "2")
    assert data["view"] and data["creates"] == 5 and data["tool_calls"] == 5 and data["frames_per_round"] == 28


def test_round_calls_tiny(bench):
    data = _main(bench, "benchmarks.round_calls", "--rounds", "5")
    assert data["creates"] == 5 and data["tool_calls"] == 5 and data["frames_per_round"] == 28
    assert data["calls_per_round"] > 0 and "voiceactors/actors/call_protocol.py" in data["by_module"]
    assert not [name for name in data["by_module"] if "round_calls" in name or "round_cpu" in name]


def test_record_cpu_tiny(bench):
    args = ("--calls", "3", "--rounds", "2", "--think-ms", "1", "2", "--repeats", "1", "--state-dir", str(bench))
    sizes = {}
    for extra in ((), ("--latency",), ("--null",), ("--full-round",)):
        data = _main(bench, "benchmarks.record_cpu", *args, *extra)
        (run,) = data["runs"]
        assert run["failed"] == [] and run["bytes"] > 0 and run["cpu_ms_per_round"] > 0
        assert ("written_ms_p50_p99_max" in run) == (extra == ("--latency",))
        sizes[extra] = run["bytes"]
    assert sizes[("--full-round",)] > 2 * sizes[()]       # nine lines a round, not two


def test_round_parts_tiny(bench):
    data = _main(bench, "benchmarks.round_parts", "--rounds", "3", "--repeats", "1")
    assert set(data["us_per_round"]) == {"skip_check", "json_loads", "checks", "protocol", "usage",
                                         "record_lines", "frames_out"}
    assert all(v >= 0 for v in data["us_per_round"].values()) and data["rounds"] == 3


def test_burst_ours_and_the_do_nothing_server_answer_every_round(bench):
    data = _main(bench, "benchmarks.burst", "--calls", "3", "--rounds", "2", "--spread", "0.2",
                 "--think-ms", "10", "20", "--hold-s", "0.1", "--settle-max-s", "1", "--warm-calls", "1",
                 "--idle-s", "0.2")
    assert [r["peer"] for r in data["results"]] == ["ours", "nothing"]
    for r in data["results"]:
        assert r["idle_core_pct"] >= 0 and r["coalesce_writes"] is False
        assert set(r["phases"]) == {"warm", "connect", "burst"}
        connect, burst = r["phases"]["connect"], r["phases"]["burst"]
        assert connect["join_statuses"] == {"200": 3} and connect["closed"] == 3 and connect["rounds_done"] == 0
        assert connect["server_ms_per_connect"] >= 0   # psutil counts in 10 ms ticks: 3 connects may read 0
        assert burst["rounds_done"] == 6 and burst["output_ms"]["n"] == 6 and burst["create_ms"]["n"] == 6
        assert burst["errors"] == 0 and burst["violations"] == 0 and burst["unanswered"] == 0
        assert len(burst["per_call_output_p99_ms"]) == 3 and "server_ms_per_round_net" in burst
    ratio, nothing_p50 = data["ours_vs_nothing_output_p50"], data["results"][1]["phases"]["burst"]["output_ms"]["p50"]
    if nothing_p50 > 0:
        assert ratio > 0 and "ratio_skipped" not in data
    else:   # it answers before the output clock starts: the ratio is left out, and said why
        assert ratio is None and data["ratio_skipped"].startswith("do-nothing output p50 is ")


def test_burst_long_mode_and_sweep(bench):
    data = _main(bench, "benchmarks.burst", "--mode", "long", "--long-rounds", "12", "--short-calls", "2",
                 "--settle-max-s", "1", "--warm-calls", "0", "--idle-s", "0")
    (r,) = data["results"]
    short, long_ = r["phases"]["short"], r["phases"]["long"]
    assert r["phases"]["connect"]["phase"]["sequential"] and r["phases"]["connect"]["join_statuses"] == {"200": 2}
    assert short["rounds_done"] == 10 and long_["rounds_done"] == 12 and long_["unanswered"] == 0
    assert long_["phase"]["think_ms"] == [0.0, 0.0] and "server_ms_per_round_net" in long_
    data = _main(bench, "benchmarks.burst", "--mode", "sweep", "--peers", "nothing", "--steps", "2",
                 "--rounds", "2", "--spread", "0.1", "--settle-max-s", "1", "--warm-calls", "0",
                 "--idle-s", "0")
    (step,) = data["steps"]
    assert step["calls"] == 2 and step["result"]["phases"]["burst"]["rounds_done"] == 4
    assert len(data["markdown"]) == 1 and "| burst | 2 | 4 |" in data["markdown"][0]
    assert data["capacity"]["nothing"] in (0, 2) and step["passed"] == (data["capacity"]["nothing"] == 2)


def test_the_do_nothing_server_with_our_frame_fast_path_answers_every_round(bench, monkeypatch):
    # the stricter floor of docs/benchmarks.md § 46: the peer process reads the variable
    monkeypatch.setenv("BENCH_NOTHING_FAST_FRAMES", "1")
    data = _main(bench, "benchmarks.burst", "--mode", "sweep", "--peers", "nothing", "--steps", "3",
                 "--rounds", "2", "--spread", "0.1", "--settle-max-s", "1", "--warm-calls", "0",
                 "--idle-s", "0")
    burst = data["steps"][0]["result"]["phases"]["burst"]
    assert burst["rounds_done"] == 6 and burst["unanswered"] == 0 and burst["errors"] == 0
    assert burst["violations"] == 0 and burst["duplicate_outputs"] == 0


def test_connect_cost_counts_every_call_and_its_lines(bench):
    r = _main(bench, "benchmarks.connect_cost", "--calls", "5", "--rate", "50", "--repeats", "1", "--idle-s", "0.5")
    run = r["runs"][0]
    assert run["connect"]["statuses"] == {"200": 5} and run["end"]["records_with_end"] == 5
    assert run["log_events"].get("call.connected") == 5 and run["log_events"].get("call.ended") == 5
    assert run["server_rc"] == 0


def test_refusal_cost_refuses_what_it_sends(bench):
    r = _main(bench, "benchmarks.refusal_cost", "--requests", "30", "--repeats", "1", "--idle-s", "0.5")
    run = r["runs"][0]
    assert sum(run["statuses"].values()) == 30 and run["statuses"].get("429", 0) >= 28   # a token may refill
    assert run["server_rc"] == 0


def test_log_cost_times_every_kind(bench, capsys):
    from benchmarks import log_cost

    assert log_cost.main(["--lines", "50", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == ["info", "info_bound_call", "debug_filtered", "metrics",
                                                              "scrub"]


def test_round_checks_times_this_checkout_against_another(capsys):
    from pathlib import Path

    from benchmarks import round_checks

    here = Path(__file__).resolve().parent.parent     # "another" checkout: this one, its file loaded apart
    assert round_checks.main(["--before", str(here), "--rounds", "2", "--repeats", "1", "--pairs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("pair 1: µs per round (17 checks): before") and "this" in lines[0]
    assert len(lines) == 1 + 17


@pytest.mark.skipif(__import__("shutil").which("redis-server") is None, reason="redis-server is not installed")
def test_capacity_workers_steps_up_serve_workers_and_one_serve(bench):
    data = _main(bench, "benchmarks.capacity", "--workers", "2", "--idle", "--steps", "4", "--rounds", "1",
                 "--gap", "0.3", "--rate-hz", "0", "--target-ms", "10000")
    assert [(s["workers"], s["calls"]) for s in data["steps"]] == [(1, 4), (2, 4)]
    for step in data["steps"]:
        assert step["calls_connected"] == 4 and step["missing_create"] == 0 and step["passed"], step
        assert step["cpu"]["peer"]["cpu_s"] > 0          # the serve's process tree, not the peer alone


@pytest.mark.skipif(__import__("shutil").which("redis-server") is None, reason="redis-server is not installed")
def test_connect_cost_registry_pairs_with_and_without_redis(bench):
    r = _main(bench, "benchmarks.connect_cost", "--calls", "3", "--rate", "50", "--repeats", "1", "--idle-s", "0.3",
              "--registry", "--hold-s", "0.3")
    assert [run["redis"] for run in r["runs"]] == [False, True]
    for run in r["runs"]:
        assert run["connect"]["statuses"] == {"200": 3} and run["connect"]["latency_ms"]["n"] == 3
        assert run["held"]["wall_s"] >= 0.3 and run["held"]["cpu_ms_per_s"] >= 0
    assert "redis_server_ms" in r["runs"][1]["connect"]


@pytest.mark.skipif(__import__("shutil").which("redis-server") is None, reason="redis-server is not installed")
def test_lease_renewals_keeps_every_lease_and_counts_its_requests(bench):
    r = _main(bench, "benchmarks.lease_renewals", "--leases", "20", "--hold", "1", "--ttl", "1.5")
    (run,) = r["runs"]
    assert run["leases"] == 20 and run["commands"].get("eval", 0) >= 1     # renewed (it checks all held)
    assert run["holder_cpu_ms_per_s"] >= 0 and run["requests_per_s"] > 0


@pytest.mark.skipif(__import__("shutil").which("redis-server") is None, reason="redis-server is not installed")
def test_takeover_answers_the_pending_write_once_from_the_taker(bench):
    r = _main(bench, "benchmarks.takeover", "--repeats", "1", "--ttl", "1")
    (run,) = r["runs"]
    assert run["outputs_call_w"] == 1 and run["connections"] == 2 and run["violations"] == 0
    assert run["takeover_s"] > 0 and run["take_over_logged_s"] is not None
    assert 0 <= run["kill_delay_s"] <= 1 / 3     # a random phase, up to a scan period


def test_round_steps_counts_both_paths(bench):
    data = _main(bench, "benchmarks.round_steps", "--rounds", "3")
    inbox, in_step = data
    assert not inbox["in_step"] and in_step["in_step"]
    assert inbox["outputs"] == in_step["outputs"] == 3
    assert inbox["answered_in_step"] == 0 and in_step["answered_in_step"] == 2   # the first round runs the read
    assert in_step["steps_per_round"]["CallActor._reader"] > 0


@pytest.mark.skipif(__import__("shutil").which("redis-server") is None, reason="redis-server is not installed")
def test_round_steps_counts_a_workers_call(bench):
    one, worker = _main(bench, "benchmarks.round_steps", "--rounds", "3", "--redis")
    assert not one["worker"] and worker["worker"] and one["in_step"] and worker["in_step"]
    assert one["outputs"] == worker["outputs"] == 3
    assert worker["steps_per_round"]["coredis"] > 0 and "coredis" not in one["steps_per_round"]
