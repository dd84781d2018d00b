"""Settings come from one declaration each: the environment, the serve flags,
the startup check and docs/configuration.md's tables all follow from it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import structlog

from clock_support import serving
from voiceactors import settings as S
from voiceactors.cli import build_parser, main
from voiceactors.http import console_sessions, create_app
from voiceactors.server import hypercorn_config, settings_from_args
from voiceactors.settings import InvalidSettings, Settings, shutdown_deadlines

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
TOKEN = "tok-settings-test-81c0a2f7"

# Names operators already use: they never change.
EXISTING_ENV = {
    "journal": ("VOICEACTORS_JOURNAL", "SOLSTONE_JOURNAL"), "state_dir": ("VOICEACTORS_STATE_DIR",),
    "host": ("VOICEACTORS_HOST",), "port": ("VOICEACTORS_PORT",), "api_token": ("VOICEACTORS_API_TOKEN",),
    "openai_api_key_env": ("OPENAI_API_KEY",), "openai_base_url": ("OPENAI_BASE_URL",),
    "log_format": ("VOICEACTORS_LOG_FORMAT",), "log_level": ("VOICEACTORS_LOG_LEVEL",),
    "tool_name_style": ("VOICEACTORS_TOOL_NAMES",), "tool_concurrency": ("VOICEACTORS_TOOL_CONCURRENCY",),
    "tool_timeout_read_s": ("VOICEACTORS_TOOL_TIMEOUT_READ",),
    "tool_timeout_write_s": ("VOICEACTORS_TOOL_TIMEOUT_WRITE",), "tool_reuse_s": ("VOICEACTORS_TOOL_REUSE",),
    "gc_full_interval_s": ("VOICEACTORS_GC_FULL_INTERVAL",), "max_calls": ("VOICEACTORS_MAX_CALLS",),
    "call_idle_timeout_s": ("VOICEACTORS_CALL_IDLE_TIMEOUT",),
    "call_max_duration_s": ("VOICEACTORS_CALL_MAX_DURATION",),
    "claude_command": ("VOICEACTORS_CLAUDE_COMMAND",), "allowed_hosts": ("VOICEACTORS_ALLOWED_HOSTS",),
    "rate_limit_burst": ("VOICEACTORS_RATE_LIMIT_BURST",), "rate_limit_per_s": ("VOICEACTORS_RATE_LIMIT_PER_S",),
    "keep_alive_timeout_s": ("VOICEACTORS_KEEP_ALIVE_TIMEOUT",),
    "max_requests_in_flight": ("VOICEACTORS_MAX_REQUESTS_IN_FLIGHT",),
    "record_events": ("VOICEACTORS_RECORD_EVENTS",),
}
EXISTING_FLAGS = {"journal": "--journal", "state_dir": "--state-dir", "host": "--host", "port": "--port",
                  "log_format": "--log-format", "allowed_hosts": "--allowed-host", "demo": "--demo",
                  "call_budget_usd": "--call-budget-usd", "daily_budget_usd": "--daily-budget-usd",
                  "record_events": "--record-events", "redis_url": "--redis", "workers": "--workers"}


@pytest.fixture(autouse=True)
def _reset_logs():
    yield
    structlog.reset_defaults()


@pytest.fixture
def journal(make_sample) -> Path:
    return make_sample(days=1)


# --- one declaration each --------------------------------------------------------------------

def test_the_doc_tables_are_the_declarations():
    text = DOC.read_text(encoding="utf-8")
    assert S.doc_with_tables(text) == text, (
        "docs/configuration.md drifted from voiceactors/settings.py: "
        "run `python -m voiceactors.settings --write docs/configuration.md`")


def test_a_changed_declaration_shows_as_drift(monkeypatch):
    text = DOC.read_text(encoding="utf-8")
    changed = tuple(dataclasses.replace(item, default=9999) if item.name == "port" else item
                    for item in S.declarations())
    monkeypatch.setattr(S, "declarations", lambda: changed)
    assert "`9999`" in S.markdown() and S.doc_with_tables(text) != text


def test_existing_names_stay_and_every_setting_but_demo_has_one_environment_variable():
    declared = {item.name: item.spec for item in S.declarations()}
    assert set(declared) == {f.name for f in dataclasses.fields(Settings)}
    for name, env in EXISTING_ENV.items():
        assert declared[name].env == env, name
    for name, flag in EXISTING_FLAGS.items():
        assert declared[name].flag == flag, name
    assert {name for name, spec in declared.items() if spec.flag} == set(EXISTING_FLAGS)
    assert [name for name, spec in declared.items() if not spec.env] == ["demo"]
    names = [env for spec in declared.values() for env in spec.env]
    assert len(names) == len(set(names))
    assert all(env.startswith("VOICEACTORS_") for env in names if env not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_WEBHOOK_SECRET",
                                                                                   "SOLSTONE_JOURNAL"))


def test_the_class_defaults_are_the_environment_defaults():
    assert Settings.from_env({}) == Settings(journal=Path("journal"), state_dir=Path(".state"))
    for item in S.declarations():
        field = Settings.__dataclass_fields__[item.name]
        if field.default is not dataclasses.MISSING:
            assert field.default == item.default, item.name


def test_every_environment_variable_is_read():
    env, expected = {}, {}
    for item in S.declarations():
        if not item.spec.env:
            continue
        if item.type is int:
            value, text = item.default + 3, str(item.default + 3)
        elif item.type == int | None:
            value, text = 3, " 3 "
        elif item.type is float:
            value = item.default + 1.5
            text = str(value)
        elif item.type is Path:
            value, text = Path(f"/srv/{item.name}"), f"/srv/{item.name}"
        elif item.type is bool:
            value, text = (not item.default), ("0" if item.default else "1")
        elif item.type == tuple[str, ...]:
            value, text = ("a.example", "b.example:8443"), " a.example, b.example:8443 ,"
        elif item.spec.choices:
            value = text = item.spec.choices[-1]
        else:
            value = text = f"value-of-{item.name}"
        env[item.spec.env[-1]] = text
        expected[item.name] = value
    settings = Settings.from_env(env)
    assert {name: getattr(settings, name) for name in expected} == expected


def test_blank_values_mean_the_default_and_the_first_named_variable_wins():
    settings = Settings.from_env({"VOICEACTORS_PORT": "  ", "VOICEACTORS_HOST": "", "VOICEACTORS_JOURNAL": "/a",
                                  "SOLSTONE_JOURNAL": "/b", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1/",
                                  "VOICEACTORS_LOG_LEVEL": "DEBUG"})
    assert (settings.port, settings.host, settings.journal) == (8765, "127.0.0.1", Path("/a"))
    assert settings.openai_base_url == "http://127.0.0.1:9/v1" and settings.log_level == "debug"
    assert Settings.from_env({"SOLSTONE_JOURNAL": "/b"}).journal == Path("/b")


def test_flags_beat_the_environment_which_beats_the_defaults():
    parser = build_parser()
    env = {"VOICEACTORS_PORT": "8000", "VOICEACTORS_HOST": "127.0.0.2", "VOICEACTORS_ALLOWED_HOSTS": "env.example"}
    flagged = parser.parse_args(["serve", "--port", "0", "--allowed-host", "a.example", "--allowed-host", "b.example",
                                 "--journal", "/j", "--state-dir", "/s", "--log-format", "console", "--demo"])
    settings = Settings.from_env(env, **S.flag_values(flagged))
    assert (settings.port, settings.host, settings.allowed_hosts) == (0, "127.0.0.2", ("a.example", "b.example"))
    assert (settings.journal, settings.state_dir, settings.log_format, settings.demo) == (
        Path("/j"), Path("/s"), "console", True)
    bare = Settings.from_env(env, **S.flag_values(parser.parse_args(["serve"])))
    assert (bare.port, bare.allowed_hosts, bare.demo, bare.log_format) == (8000, ("env.example",), False, "json")
    assert settings_from_args(parser.parse_args(["demo", "--port", "0"])).port == 0


def test_the_flag_help_comes_from_the_declaration(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("listen port (0: any free port) (default 8765; $VOICEACTORS_PORT)",
                 "(default journal; $VOICEACTORS_JOURNAL, then $SOLSTONE_JOURNAL)",
                 "--log-format {json,console}", "(repeatable; default none; $VOICEACTORS_ALLOWED_HOSTS)",
                 "$VOICEACTORS_TODAY"):
        assert text in out, text


# --- checked at start-up -----------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"tool_name_style": "snake"}, "tool_name_style (VOICEACTORS_TOOL_NAMES) must be one of dotted, underscore, "
                                   "not 'snake'"),
    ({"log_format": "xml"}, "log_format (VOICEACTORS_LOG_FORMAT) must be one of json, console"),
    ({"log_level": "loud"}, "log_level (VOICEACTORS_LOG_LEVEL) must be one of debug, info"),
    ({"tool_concurrency": 0}, "tool_concurrency (VOICEACTORS_TOOL_CONCURRENCY) must be more than 0, not 0"),
    ({"body_limit": -1}, "body_limit (VOICEACTORS_BODY_LIMIT) must be more than 0"),
    ({"tool_timeout_read_s": math.nan}, "tool_timeout_read_s (VOICEACTORS_TOOL_TIMEOUT_READ) must be a number"),
    ({"tool_reuse_s": -0.5}, "tool_reuse_s (VOICEACTORS_TOOL_REUSE) must be at least 0, not -0.5"),
    ({"port": 70000}, "port (VOICEACTORS_PORT) must be at most 65535"),
    ({"close_deadline_s": 12.0}, "close_deadline_s (12 s) must be less than shutdown_deadline_s (12 s)"),
    ({"close_deadline_s": 30.0, "shutdown_deadline_s": 20.0}, "close_deadline_s (30 s) must be less than"),
])
def test_create_app_refuses_invalid_settings(journal, tmp_path, changes, message):
    settings = Settings(journal=journal, state_dir=tmp_path / "state").replace(**changes)
    with pytest.raises(InvalidSettings, match="^invalid settings: ") as raised:
        create_app(settings)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_every_problem_is_named_at_once(journal, tmp_path):
    settings = Settings(journal=journal, state_dir=tmp_path).replace(tool_name_style="x", max_calls=-1,
                                                                     close_deadline_s=99.0)
    problems = settings.problems()
    assert len(problems) == 3 and [p.split(" ")[0] for p in problems] == [
        "tool_name_style", "max_calls", "close_deadline_s"]


def test_zero_where_zero_has_a_meaning_and_infinity_for_lifted_limits_are_valid(journal, tmp_path):
    settings = Settings(journal=journal, state_dir=tmp_path).replace(
        port=0, max_calls=0, tool_reuse_s=0, rate_limit_per_s=0, gc_full_interval_s=0, max_requests_in_flight=0,
        rejoin_max_calls=0, reconnect_attempts=0, tool_timeout_read_s=math.inf, call_max_duration_s=math.inf)
    assert settings.problems() == []


@pytest.mark.parametrize("env, message", [
    ({"VOICEACTORS_TOOL_NAMES": "snake"}, "voiceactors: invalid settings: tool_name_style (VOICEACTORS_TOOL_NAMES) "
                                          "must be one of dotted, underscore, not 'snake'"),
    ({"VOICEACTORS_CLOSE_DEADLINE": "20"}, "close_deadline_s (20 s) must be less than shutdown_deadline_s (12 s)"),
    ({"VOICEACTORS_PORT": "eighty"}, "voiceactors: VOICEACTORS_PORT must be a whole number, not 'eighty'"),
    ({"VOICEACTORS_SHUTDOWN_DEADLINE": "soon"}, "VOICEACTORS_SHUTDOWN_DEADLINE must be a number, not 'soon'"),
    ({"VOICEACTORS_FEED_MAX_ITEMS": "0"}, "feed_max_items (VOICEACTORS_FEED_MAX_ITEMS) must be more than 0"),
])
def test_serve_with_invalid_settings_exits_2_before_serving(journal, tmp_path, monkeypatch, capsys, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["serve", "--port", "0", "--journal", str(journal), "--state-dir", str(tmp_path / "state")])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and '"server.serving"' not in err
    assert not (tmp_path / "state").exists()         # refused before anything was created


# --- the shutdown deadline chain -----------------------------------------------------------------

def test_the_shutdown_chain_is_strictly_increasing_and_drives_the_app_and_hypercorn(journal, tmp_path):
    settings = Settings(journal=journal, state_dir=tmp_path / "state")
    deadlines = shutdown_deadlines(settings)
    bounds = [seconds for _, seconds in deadlines.chain()]
    assert bounds == sorted(set(bounds)) and bounds[:2] == [settings.close_deadline_s, settings.shutdown_deadline_s]
    assert deadlines.problems() == []
    assert hypercorn_config(settings).shutdown_timeout == deadlines.hypercorn_s == bounds[-1]
    app = create_app(settings)
    assert app.config["BACKGROUND_TASK_SHUTDOWN_TIMEOUT"] == deadlines.background_tasks_s
    broken = dataclasses.replace(deadlines, background_tasks_s=deadlines.hypercorn_s)
    assert broken.problems() == [f"quart-trio's background-task bound ({S._number(deadlines.hypercorn_s)} s) must "
                                 f"be less than hypercorn's shutdown_timeout ({S._number(deadlines.hypercorn_s)} s)"]


# --- an operator timing that became a setting ---------------------------------------------------

async def test_the_console_sign_in_lasts_console_session_ttl_s(journal, tmp_path):
    # The cookie's Max-Age is read from the session store's lifetime, which
    # also expires the session server-side (test_console.py's store test).
    for ttl, max_age in ((600.0, "Max-Age=600"), (None, "Max-Age=43200")):
        changes = {"console_session_ttl_s": ttl} if ttl else {}
        app = create_app(Settings(journal=journal, state_dir=tmp_path / "state", api_token=TOKEN, **changes))
        async with serving(app) as test_app:
            response = await test_app.test_client().post("/api/voice/login", json={"token": TOKEN})
            assert response.status_code == 200 and max_age in response.headers["Set-Cookie"]
    assert console_sessions.SESSION_TTL_S == Settings.console_session_ttl_s == 12 * 3600.0


def test_a_tool_search_refreshes_the_index_after_search_refresh_interval_s(journal, tmp_path):
    from voiceactors.journal import index as index_mod
    from voiceactors.tools import journal_tools
    from voiceactors.tools.handler_context import ToolContext

    state = tmp_path / "state"

    def ctx(interval: float) -> ToolContext:
        return ToolContext.from_settings(Settings(journal=journal, state_dir=state,
                                                  search_refresh_interval_s=interval))

    assert ctx(300.0).search_refresh_interval_s == 300.0
    assert "results" in journal_tools.search(ctx(300.0), {"query": "the"})       # builds the index
    assert index_mod.is_ready(index_mod.index_path(journal, state))
    journal_tools.search(ctx(300.0), {"query": "the"})
    assert index_mod.running_refresh(journal, state) is None                     # within the interval
    journal_tools.search(ctx(0.0), {"query": "the"})
    child = index_mod.running_refresh(journal, state)
    index_mod.join_refresh(journal, state, timeout=30)
    assert child is not None and child.returncode == 0


def test_demo_with_invalid_settings_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("VOICEACTORS_LOG_LEVEL", "chatty")
    assert main(["demo", "--port", "0"]) == 2
    assert "log_level (VOICEACTORS_LOG_LEVEL) must be one of" in capsys.readouterr().err


def test_a_flag_setting_reads_one_or_zero_from_the_environment():
    assert Settings.from_env({"VOICEACTORS_RECORD_EVENTS": "1"}, journal=Path("j"), state_dir=Path("s")).record_events
    for off in ("0", "false", "no", "off"):
        assert not Settings.from_env({"VOICEACTORS_RECORD_EVENTS": off}, journal=Path("j"),
                                     state_dir=Path("s")).record_events
    assert not Settings.from_env({}, journal=Path("j"), state_dir=Path("s")).record_events
    with pytest.raises(ValueError, match="VOICEACTORS_RECORD_EVENTS must be 1 or 0"):
        Settings.from_env({"VOICEACTORS_RECORD_EVENTS": "maybe"})
