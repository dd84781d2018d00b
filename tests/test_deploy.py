"""The deployment recipe in ``deploy/`` checked with the real parts: the
alert rules and the Prometheus configuration by ``promtool`` (``check``, and
``test rules``: each alert fires on the series that call for it, none on a
healthy process; a real Prometheus scraping a serving process and evaluating
them), the Caddy site by ``caddy validate`` and by running it over TLS in
front of a real server (the console, a call's connect and its event stream
through it, a forged ``X-Forwarded-For`` replaced, ``/metrics`` kept in), the
systemd unit by ``systemd-analyze verify`` (each
skipped, saying why, where the tool is absent; ``.ci/run`` installs them);
every metric, label and label value the rules and the dashboard use is one a
real serving process exports; the unit's command is one the CLI accepts and
its stop timeout outlasts the server's own shutdown bound."""

from __future__ import annotations

import configparser
import datetime as dt
import json
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trustme
import yaml

from child_support import CHILD_START_S, Child
from voiceactors import settings as settings_module
from voiceactors.call.state import ToolOutcome
from voiceactors.cli import build_parser
from voiceactors.http import create_app
from voiceactors.http.connect import CONNECT_PATH
from voiceactors.journal.sample import write_sample_journal
from voiceactors.metrics import Metrics
from voiceactors.server import GRACEFUL_S, run_server
from voiceactors.simulator import Simulator
from voiceactors.settings import Settings, shutdown_deadlines
from voiceactors.workers import STOP_SLACK_S

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES, PROMETHEUS, CADDYFILE = DEPLOY / "alerts.yml", DEPLOY / "prometheus.yml", DEPLOY / "Caddyfile"
UNIT, DASHBOARD = DEPLOY / "voiceactors.service", DEPLOY / "grafana-dashboard.json"
DAY = dt.date(2026, 3, 27)
#: Prometheus's own series of a target, and the labels it puts on every scraped one.
PROMETHEUS_OWN = {"up": frozenset({"job", "instance"})}
TARGET_LABELS = frozenset({"job", "instance"})
#: route labels that are no Quart rule (``metrics.http_request`` callers)
SPECIAL_ROUTES = frozenset({"unmatched", "busy", "rate_limited", CONNECT_PATH, "/mcp"})


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"`{name}` is not installed (Debian's package; .ci/run installs it)")
    return found


# --- what a serving process exports ------------------------------------------------

@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    return write_sample_journal(tmp_path_factory.mktemp("deploy") / "journal", days=1, today=DAY)


async def _scrape(journal: Path, state_dir: Path) -> str:
    settings = Settings(journal=journal, state_dir=state_dir).replace(
        port=0, shutdown_deadline_s=3.0, close_deadline_s=1.0)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        try:
            async with httpx.AsyncClient() as client:
                response = await client.get(f"{base}/metrics")
        finally:
            stop.set()
    assert response.status_code == 200
    return response.text


def _series(text: str) -> list[str]:
    """Every series name the exposition text declares (``# TYPE``: a counter's
    name ends ``_total``; a histogram's series are its ``_bucket``, ``_sum``,
    ``_count``)."""
    suffixes = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    return [name + suffix for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)
            for suffix in suffixes[kind]]


def _family(series: str, families: dict[str, frozenset[str]]) -> str:
    stem = re.sub(r"_(total|created|bucket|sum|count)$", "", series)
    return stem if stem in families else series


def _label_names() -> dict[str, frozenset[str]]:
    """Each family's label names, from the server's registry (the exposition
    text names them only on series already counted)."""
    labels: dict[str, frozenset[str]] = {}
    for instrument in vars(Metrics()).values():
        name = getattr(instrument, "_name", None)
        if isinstance(name, str) and hasattr(instrument, "_labelnames"):
            labels[name] = frozenset(instrument._labelnames)
    return labels


@pytest.fixture(scope="module")
def scraped(journal, tmp_path_factory) -> str:
    """A real serving process's ``/metrics``, before any call."""
    return trio.run(_scrape, journal, tmp_path_factory.mktemp("state"))


@pytest.fixture(scope="module")
def exported(scraped) -> dict[str, frozenset[str]]:
    """Series name -> the label names it may carry, for every series of a real
    serving process's ``/metrics``."""
    text = scraped
    labels = _label_names()
    found: dict[str, frozenset[str]] = {}
    for series in _series(text):
        family = _family(series, labels)
        assert family in labels, f"{series} is exported but not in metrics.Metrics"
        found[series] = labels[family] | TARGET_LABELS | ({"le"} if series.endswith("_bucket") else set())
    found.update(PROMETHEUS_OWN)
    return found


@pytest.fixture(scope="module")
def routes(journal, tmp_path_factory) -> frozenset[str]:
    app = create_app(Settings(journal=journal, state_dir=tmp_path_factory.mktemp("routes")))
    return frozenset(rule.rule for rule in app.url_map.iter_rules()) | SPECIAL_ROUTES


# --- what an expression uses -----------------------------------------------------------

@dataclass
class Uses:
    """The series, their label matchers and the grouping labels of one PromQL expression."""

    series: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)   # name -> (label, op, value)
    grouping: set[str] = field(default_factory=set)


_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r'\b([A-Za-z_:][A-Za-z0-9_:]*)\s*\{((?:[^}"]|"(?:[^"\\]|\\.)*")*)\}')
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_BARE_NAME = re.compile(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()")
_KEYWORDS = frozenset({"bool", "and", "or", "unless", "offset", "inf", "nan"})


def uses(expr: str) -> Uses:
    found = Uses()
    for group in _GROUPING.findall(expr):
        found.grouping.update(label.strip() for label in group.split(",") if label.strip())
    rest = _GROUPING.sub(" ", expr)
    for name, body in _SELECTOR.findall(rest):
        found.series.setdefault(name, []).extend(_MATCHER.findall(body))
    rest = _SELECTOR.sub(" ", rest)
    rest = re.sub(r'"(?:[^"\\]|\\.)*"|\[[^\]]*\]', " ", rest)      # strings, ranges
    for name in _BARE_NAME.findall(rest):
        if name.lower() not in _KEYWORDS:
            found.series.setdefault(name, [])
    return found


def test_the_expression_reader_finds_names_matchers_and_grouping():
    found = uses('histogram_quantile(0.99, sum by (tool, le) (rate(a_bucket{tool=~"x|y", outcome!="ok"}[5m])))'
                 " / ignoring(tool) b_total offset 1h > bool 0.5 and on() c")
    assert found.series == {"a_bucket": [("tool", "=~", "x|y"), ("outcome", "!=", "ok")], "b_total": [], "c": []}
    assert found.grouping == {"tool", "le"}


def _rule_expressions() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def _dashboard_expressions() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {f"{panel['title']} {target['refId']}": target["expr"]
            for panel in panels for target in panel.get("targets", [])}


def _label_values_problem(label: str, op: str, value: str, routes: frozenset[str]) -> str | None:
    """A route or tool outcome that no series will ever carry."""
    known = {"route": routes, "outcome": frozenset(ToolOutcome) | {"ok"}}.get(label)
    if known is None or op not in ("=", "=~"):
        return None
    pattern = re.compile(value if op == "=~" else re.escape(value))
    alternatives = value.split("|") if op == "=~" and "(" not in value else [value]
    if op == "=~" and "(" in value:      # a pattern with a group: one known value it matches will do
        return None if any(pattern.fullmatch(v) for v in known) else f"{label}=~{value!r} matches nothing"
    missing = [v for v in alternatives if v not in known]
    return f"{label} {missing} unknown" if missing else None


def _problems(expressions: dict[str, str], exported: dict[str, frozenset[str]], routes: frozenset[str]) -> list[str]:
    problems = []
    for where, expr in expressions.items():
        found = uses(expr)
        assert found.series, f"{where}: no series in {expr!r}"
        labels_here: set[str] = set()
        for series, matchers in found.series.items():
            if series not in exported:
                problems.append(f"{where}: {series} is not exported")
                continue
            labels_here |= exported[series]
            for label, op, value in matchers:
                if label not in exported[series]:
                    problems.append(f"{where}: {series} has no label {label}")
                elif (problem := _label_values_problem(label, op, value, routes)) is not None:
                    problems.append(f"{where}: {problem}")
        problems += [f"{where}: groups by {label}, which none of its series has"
                     for label in found.grouping - labels_here]
    return problems


def test_every_name_the_alert_rules_use_is_exported(exported, routes):
    expressions = _rule_expressions()
    assert len(expressions) >= 10
    assert _problems(expressions, exported, routes) == []


def test_every_name_the_dashboard_uses_is_exported(exported, routes):
    expressions = _dashboard_expressions()
    assert len(expressions) >= 15
    assert _problems(expressions, exported, routes) == []


def test_a_misspelt_name_or_label_is_caught(exported, routes):
    assert _problems({"typo": 'rate(voiceactors_tool_call_total[5m])'}, exported, routes) == [
        "typo: voiceactors_tool_call_total is not exported"]
    assert _problems({"label": 'voiceactors_tool_calls_total{outcomes="failed"}'}, exported, routes) == [
        "label: voiceactors_tool_calls_total has no label outcomes"]
    assert _problems({"value": 'voiceactors_http_requests_total{route="/api/voice/sessions"}'}, exported, routes) == [
        "value: route ['/api/voice/sessions'] unknown"]
    assert _problems({"by": 'sum by (tool) (voiceactors_live_calls)'}, exported, routes) == [
        "by: groups by tool, which none of its series has"]


def test_a_fresh_process_has_no_rate_limit_left_until_the_service_says_one(scraped):
    """Before: both limits were exported as 0 from the start, which
    ``VoiceactorsServiceRateLimitSpent`` read as spent on every idle process."""
    assert "# TYPE voiceactors_rate_limit_remaining gauge" in scraped
    assert "voiceactors_rate_limit_remaining{" not in scraped


def test_the_alerts_cover_what_an_operator_must_act_on():
    expressions = " ".join(_rule_expressions().values())
    for series in ("voiceactors_http_requests_total", "voiceactors_tool_calls_total", "voiceactors_cost_usd_total",
                   "voiceactors_sideband_reconnects_total", "voiceactors_rate_limit_remaining", "up"):
        assert re.search(rf"\b{series}\b", expressions), series


# --- promtool ---------------------------------------------------------------------

def test_promtool_checks_the_rules():
    done = subprocess.run([_tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=CHILD_START_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rule_expressions())} rules found" in done.stdout


def test_promtool_checks_the_configuration():
    done = subprocess.run([_tool("promtool"), "check", "config", str(PROMETHEUS)], capture_output=True, text=True,
                          timeout=CHILD_START_S)
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load(PROMETHEUS.read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert config["rule_files"] == [RULES.name]


#: Per alert: input series (each with the target's labels added), when to look, the
#: labels it fires with. Every rule of alerts.yml has its case.
_S = 'job="voiceactors",instance="a"'
FIRING: dict[str, tuple[dict[str, str], str, dict[str, str]]] = {
    "VoiceactorsDown": ({f"up{{{_S}}}": "1 1 0 0 0 0"}, "5m", {"job": "voiceactors", "instance": "a"}),
    "VoiceactorsCallsFailing": (
        {f'voiceactors_http_requests_total{{{_S},route="/api/voice/session",status="500"}}': "0 0 1 1",
         f'voiceactors_http_requests_total{{{_S},route="/api/voice/session",status="200"}}': "0+5x3"},
        "3m", {"route": "/api/voice/session"}),
    "VoiceactorsServerErrors": (
        {f'voiceactors_http_requests_total{{{_S},route="/api/voice/calls",status="500"}}': "0 0 2 2"},
        "3m", {"route": "/api/voice/calls", "status": "500"}),
    "VoiceactorsSessionsRefused": (
        {f'voiceactors_http_requests_total{{{_S},route="/api/voice/session",status="503"}}': "0 1 1"}, "2m", {}),
    "VoiceactorsSpendNearDailyBudget": (
        {f'voiceactors_cost_usd_total{{{_S},source="call",model="gpt-realtime"}}': "0+1x20"}, "20m", {}),
    "VoiceactorsConnectsRefused": (
        {f'voiceactors_http_requests_total{{{_S},route="/api/voice/connect",status="503"}}': "0 3 3"},
        "2m", {"route": "/api/voice/connect"}),
    "VoiceactorsSidebandReconnecting": ({f"voiceactors_sideband_reconnects_total{{{_S}}}": "0+1x10"}, "10m", {}),
    "VoiceactorsServiceRateLimitSpent": (
        {f'voiceactors_rate_limit_remaining{{{_S},limit="requests"}}': "5 0 0 0 0"}, "4m", {}),
    "VoiceactorsToolFailed": (
        {f'voiceactors_tool_calls_total{{{_S},tool="journal.search",outcome="failed"}}': "0 0 1 1 1",
         f'voiceactors_tool_calls_total{{{_S},tool="journal.search",outcome="ok"}}': "0+9x4"},
        "4m", {"tool": "journal.search"}),
    "VoiceactorsToolsTimingOut": (
        {f'voiceactors_tool_calls_total{{{_S},tool="journal.search",outcome="ok"}}': "0+10x20",
         f'voiceactors_tool_calls_total{{{_S},tool="journal.search",outcome="timeout"}}': "0+5x20"},
        "16m", {}),
    "VoiceactorsMcpSourceErrors": (
        {f'voiceactors_mcp_errors_total{{{_S},source="weather",kind="timeout"}}': "0+1x10"},
        "10m", {"source": "weather", "kind": "timeout"}),
    "VoiceactorsBrainNotReady": ({f"voiceactors_brain_ready{{{_S}}}": "0x15",
                                  f'voiceactors_brain_refreshes_total{{{_S},outcome="error"}}': "0+1x15"},
                                 "12m", dict(job="voiceactors", instance="a")),
    "VoiceactorsNearCapacity": (
        {f'voiceactors_tool_turnaround_seconds_bucket{{{_S},le="0.05"}}': "0x20",
         f'voiceactors_tool_turnaround_seconds_bucket{{{_S},le="0.1"}}': "0+10x20",
         f'voiceactors_tool_turnaround_seconds_bucket{{{_S},le="+Inf"}}': "0+10x20"},
        "16m", {}),
}
#: A healthy process: calls starting, tools answering, the brain ready. No rule fires.
HEALTHY = {
    f"up{{{_S}}}": "1x20",
    f'voiceactors_http_requests_total{{{_S},route="/api/voice/session",status="200"}}': "0+3x20",
    f'voiceactors_http_requests_total{{{_S},route="/api/voice/connect",status="200"}}': "0+3x20",
    f'voiceactors_tool_calls_total{{{_S},tool="journal.search",outcome="ok"}}': "0+10x20",
    f'voiceactors_tool_calls_total{{{_S},tool="journal.search",outcome="error"}}': "0+1x20",
    f'voiceactors_cost_usd_total{{{_S},source="call",model="gpt-realtime"}}': "0+0.1x20",
    f"voiceactors_brain_ready{{{_S}}}": "1x20",
    f'voiceactors_rate_limit_remaining{{{_S},limit="requests"}}': "4000x20",
    f'voiceactors_tool_turnaround_seconds_bucket{{{_S},le="0.01"}}': "0+10x20",
    f'voiceactors_tool_turnaround_seconds_bucket{{{_S},le="+Inf"}}': "0+10x20",
}


def test_every_rule_has_a_case_that_fires_it():
    assert set(FIRING) == set(_rule_expressions())


def test_promtool_fires_each_alert_on_its_series_and_none_on_a_healthy_process(tmp_path):
    promtool = _tool("promtool")
    # the rules as they are but for their annotations, which promtool would compare verbatim
    # (their templates are checked by `promtool check rules`)
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))

    def case(series: dict[str, str], eval_time: str, alerts: dict[str, list[dict[str, str]]]) -> dict[str, Any]:
        return {"interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "alert_rule_test": [{"eval_time": eval_time, "alertname": name,
                                     "exp_alerts": [{"exp_labels": labels} for labels in expected]}
                                    for name, expected in alerts.items()]}

    severity = {rule["alert"]: rule["labels"]["severity"] for group in rules["groups"] for rule in group["rules"]}
    tests = [case(series, at, {name: [{**labels, "severity": severity[name]}]})
             for name, (series, at, labels) in FIRING.items()]
    tests.append(case(HEALTHY, "20m", {name: [] for name in FIRING}))
    (tmp_path / "test.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                                                       "tests": tests}))
    done = subprocess.run([promtool, "test", "rules", "test.yml"], capture_output=True, text=True,
                          timeout=CHILD_START_S, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


async def _prometheus_answer(client: httpx.AsyncClient, url: str, ready: Any) -> Any:
    """Ask Prometheus's API until ``ready(data)`` holds: its first scrape and its
    first rule evaluation come on its own schedule (a child process: real time,
    bounded)."""
    with trio.fail_after(CHILD_START_S):
        while True:
            data = (await client.get(url)).json()["data"]
            if ready(data):
                return data
            await trio.sleep(0.2)


async def test_a_real_prometheus_scrapes_a_serving_process_and_evaluates_the_rules(journal, tmp_path):
    prometheus = _tool("prometheus")
    settings = Settings(journal=journal, state_dir=tmp_path / "state").replace(
        port=0, shutdown_deadline_s=3.0, close_deadline_s=1.0)
    config = yaml.safe_load(PROMETHEUS.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}     # the test's pace
    config["rule_files"] = [str(RULES)]
    del config["alerting"]                                                          # no Alertmanager here
    listen = f"127.0.0.1:{_free_port()}"
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        [job] = config["scrape_configs"]
        job["static_configs"] = [{"targets": [base.removeprefix("http://")]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        child = Child([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--web.listen-address={listen}",
                       f"--storage.tsdb.path={tmp_path / 'tsdb'}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert child.stderr is not None
            await _wait_for_line(child.stderr, b"Server is ready to receive web requests")
            nursery.start_soon(_drain, child.stderr)
            async with httpx.AsyncClient(timeout=CHILD_START_S) as client:
                api = f"http://{listen}/api/v1"
                up = await _prometheus_answer(client, f'{api}/query?query=up{{job="voiceactors"}}',
                                              lambda data: data["result"])
                assert up["result"][0]["value"][1] == "1"
                names = (await client.get(f"{api}/label/__name__/values")).json()["data"]
                # the series without labels (a labelled one appears once it is counted)
                assert {"voiceactors_live_calls", "voiceactors_brain_ready", "voiceactors_tool_turnaround_seconds_bucket",
                        "voiceactors_sideband_reconnects_total"} <= set(names)
                rules = await _prometheus_answer(
                    client, f"{api}/rules",
                    lambda data: data["groups"] and all(not rule["lastEvaluation"].startswith("0001")   # never
                                                        for group in data["groups"] for rule in group["rules"]))
                evaluated = [rule for group in rules["groups"] for rule in group["rules"]]
                assert len(evaluated) == len(_rule_expressions())
                assert [rule["name"] for rule in evaluated if rule["health"] != "ok"] == []
                # a process that just started and serves nothing is healthy: nothing fires (its
                # brain has no instruction yet: it refreshes when a session first asks)
                assert [rule["name"] for rule in evaluated if rule["state"] != "inactive"] == []
        finally:
            child.terminate()
            with trio.fail_after(CHILD_START_S):
                await child.wait()
            stop.set()


# --- caddy ------------------------------------------------------------------------

def test_caddy_validates_the_site(tmp_path):
    home = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = subprocess.run([_tool("caddy"), "validate", "--config", str(CADDYFILE)], capture_output=True, text=True,
                          timeout=CHILD_START_S, env=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Valid configuration" in done.stdout + done.stderr


def test_the_site_proxies_to_the_units_address_and_keeps_metrics_in():
    site = CADDYFILE.read_text()
    listen = _serve_args()
    assert f"reverse_proxy {listen.host}:{listen.port}" in site
    assert re.search(r"^\s*respond /metrics 404$", site, re.MULTILINE)
    assert re.search(r"^\s*flush_interval -1$", site, re.MULTILINE)       # event streams unbuffered


# --- the systemd unit -----------------------------------------------------------------

def _unit() -> configparser.RawConfigParser:
    unit = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",))
    unit.optionxform = str      # systemd's keys are case-sensitive
    unit.read_string(UNIT.read_text())
    return unit


def _exec_start() -> list[str]:
    return shlex.split(_unit()["Service"]["ExecStart"])


def _serve_args() -> Any:
    args, unknown = build_parser().parse_known_args(_exec_start()[1:])
    assert unknown == []
    return args


def test_the_unit_runs_a_serve_the_cli_accepts():
    binary, *argv = _exec_start()
    assert Path(binary).name == "voiceactors"
    args = _serve_args()
    assert args.command == "serve" and not args.demo
    assert args.host == "127.0.0.1"          # the proxy is the way in
    assert args.state_dir == "/var/lib/voiceactors" == "/var/lib/" + _unit()["Service"]["StateDirectory"]


def test_the_unit_is_unprivileged_restarts_on_failure_and_outlasts_the_shutdown():
    service = _unit()["Service"]
    assert service["User"] not in ("", "root")
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM" and service["KillMode"] == "mixed"
    deadlines = shutdown_deadlines(Settings(journal=Path("j"), state_dir=Path("s")))
    server_bound = max(deadlines.hypercorn_s + GRACEFUL_S, deadlines.hypercorn_s + STOP_SLACK_S)
    assert float(service["TimeoutStopSec"]) > server_bound


def test_the_units_environment_names_settings_that_exist():
    declared = {env for item in settings_module.declarations() for env in item.spec.env}
    names = [line.split("=", 1)[0] for line in _unit()["Service"]["Environment"].split()]
    assert names and set(names) <= declared


def test_systemd_verifies_the_unit(tmp_path):
    analyze = _tool("systemd-analyze")
    # the unit as installed names /opt/voiceactors; verify checks that the binary exists: this one's
    here = Path(sys.executable).parent / "voiceactors"
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(_exec_start()[0], str(here)))
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=CHILD_START_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert str(copy) not in output and f"{UNIT.name}:" not in output, output   # no warning about our unit


def test_systemd_would_warn_about_a_misspelt_key(tmp_path):
    analyze = _tool("systemd-analyze")
    copy = tmp_path / UNIT.name
    here = Path(sys.executable).parent / "voiceactors"
    copy.write_text(UNIT.read_text().replace(_exec_start()[0], str(here)).replace("Restart=", "Restrat="))
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=CHILD_START_S)
    assert "Unknown key 'Restrat'" in done.stdout + done.stderr


# --- the site in front of a real server --------------------------------------------

TOKEN = "deploy-test-token-7d1e44"
SIM_KEY = "sk-test-deploy-5b3c2a1d"
ALICE, BOB, CAROL, DAVE = "203.0.113.7", "203.0.113.8", "203.0.113.9", "203.0.113.10"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _test_site(tmp_path: Path, site_port: int, server_port: int) -> Path:
    """The deploy Caddyfile on loopback: the site's address a test port with a
    test CA's certificate, the server's port this server's, no log file, no
    admin endpoint, no redirect listener on port 80; every directive of the
    site as it is."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "site.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "site.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    site = CADDYFILE.read_text()
    assert "voice.example.org {" in site and "127.0.0.1:8765" in site
    site = re.sub(r"\n\tlog \{.*?\n\t\}\n", "\n", site, flags=re.DOTALL)
    site = site.replace("voice.example.org {",
                        f"https://127.0.0.1:{site_port} {{\n\ttls {tmp_path / 'site.crt'} {tmp_path / 'site.key'}")
    site = site.replace("127.0.0.1:8765", f"127.0.0.1:{server_port}")
    options = f"{{\n\tadmin off\n\thttp_port {_free_port()}\n\tauto_https disable_redirects\n}}\n"
    path = tmp_path / "Caddyfile"
    path.write_text(options + site)
    return path


async def _wait_for_line(stream: trio.abc.ReceiveStream, text: bytes) -> None:
    seen = b""
    with trio.fail_after(CHILD_START_S):       # a child process: real time, bounded
        while text not in seen:
            chunk = await stream.receive_some()
            assert chunk, seen.decode(errors="replace")
            seen += chunk


async def test_through_the_site_over_tls_the_console_a_call_and_its_events_work(journal, tmp_path, pin_today):
    """The console's page, a call's connect and its event stream through the
    site, over TLS; the sign-in cookie ``Secure``; ``/metrics`` kept in; a
    forged ``X-Forwarded-For`` replaced by the client's own address."""
    caddy = _tool("caddy")
    pin_today(DAY.isoformat())          # the journal's day: the call's tool answers from it
    site_port = _free_port()
    simulator = Simulator("single_tool", api_key=SIM_KEY)
    settings = Settings(journal=journal, state_dir=tmp_path / "state", api_token=TOKEN,
                        openai_api_key_env=SIM_KEY).replace(
        port=0, trusted_proxies=("127.0.0.1",), allowed_hosts=(f"127.0.0.1:{site_port}",),
        rate_limit_burst=1, rate_limit_per_s=0.01, shutdown_deadline_s=3.0, close_deadline_s=1.0)
    stop = trio.Event()
    home = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    async with trio.open_nursery() as nursery:
        await nursery.start(simulator.serve, 0)
        settings = settings.replace(openai_base_url=simulator.base_url)
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        site = _test_site(tmp_path, site_port, int(base.rsplit(":", 1)[1]))
        proxy = Child([caddy, "run", "--config", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                      env=home)
        try:
            assert proxy.stderr is not None
            await _wait_for_line(proxy.stderr, b"serving initial configuration")
            nursery.start_soon(_drain, proxy.stderr)
            public = f"https://127.0.0.1:{site_port}"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=tmp_path / "ca.pem"),
                                         timeout=CHILD_START_S) as client:
                console = await client.get(f"{public}/")
                assert console.status_code == 200 and "text/html" in console.headers["content-type"]
                assert (await client.get(f"{public}/api/voice/status", headers=auth)).status_code == 200
                assert (await client.get(f"{public}/metrics")).status_code == 404          # kept in
                assert (await client.get(f"{base}/metrics")).status_code == 200            # Prometheus's way
                login = await client.post(f"{public}/api/voice/login", json={"token": TOKEN})
                assert login.status_code == 200
                assert "Secure" in login.headers["Set-Cookie"]       # the forwarded scheme believed
                await _a_call_through(client, public, auth, simulator)
                refresh = "/api/voice/refresh-brain"
                # straight to the server from loopback (a trusted proxy's address) the header counts
                direct = [await client.post(base + refresh, json={}, headers={**auth, "X-Forwarded-For": who})
                          for who in (ALICE, BOB)]
                assert [r.status_code != 429 for r in direct] == [True, True]
                # through the site each forged address is replaced by the client's own: one bucket
                # (were they passed on, two new addresses would be two fresh buckets)
                proxied = [await client.post(public + refresh, json={}, headers={**auth, "X-Forwarded-For": who})
                           for who in (CAROL, DAVE)]
                assert [r.status_code == 429 for r in proxied] == [False, True]
        finally:
            proxy.terminate()
            with trio.fail_after(CHILD_START_S):
                await proxy.wait()
            stop.set()
            nursery.cancel_scope.cancel()       # the simulator


async def _a_call_through(client: httpx.AsyncClient, public: str, auth: dict[str, str], simulator: Simulator) -> None:
    """A simulated call joined through the site, its events streamed through it as they come."""
    call = simulator.add_call("rtc_proxy_1", "single_tool")
    connected = await client.post(f"{public}/api/voice/connect", json={"call_id": "rtc_proxy_1"}, headers=auth)
    assert connected.status_code == 200, connected.text
    kinds: list[str] = []
    with trio.fail_after(CHILD_START_S):
        async with client.stream("GET", f"{public}/api/voice/events", params={"call_id": "rtc_proxy_1"},
                                 headers=auth) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    kinds.append(json.loads(line[6:])["type"])
                    if kinds[-1] == "call.ended":
                        break
    assert "tool.finished" in kinds and kinds[-1] == "call.ended"
    assert call.outputs        # the tool's output reached the service


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    """Read the proxy's log to its end (a full pipe would stall it)."""
    while await stream.receive_some():
        pass
