"""The journal's Realtime session settings (``reasoning_effort``,
``parallel_tool_calls``, ``idle_timeout_ms``): read and checked from the
``voice`` block, sent in the mint's session and in the sideband's
``session.update`` only when set, refused at start and logged at request
time when bad. Over real sockets: the HTTP API and a CallActor against the
simulator with its strict conformance check on."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from calls_support import assert_clean_protocol, received_types, rig, steady
from clock_support import serving
from voiceactors import voice_config
from voiceactors.call.call_context import LinkedContext, carried_view, taken_over_context
from voiceactors.cli import main
from voiceactors.http import create_app
from voiceactors.realtime.session_settings import REASONING_EFFORTS, SessionSettings, parse
from voiceactors.settings import InvalidSettings, Settings
from voiceactors.simulator import Simulator
from voiceactors.simulator.conformance import client_error
from journal_support import set_voice
from simulator_support import serving_simulator

SIM_KEY = "sk-test-session-settings-4d5e6f"
BASE = "You are sol, the journal's voice."
CHOSEN = {"reasoning_effort": "low", "parallel_tool_calls": False, "idle_timeout_ms": 12000}
CHOSEN_FIELDS = {"reasoning": {"effort": "low"}, "parallel_tool_calls": False,
                 "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 12000}}}}
#: The mint's session as it was before these settings existed, key for key.
MINTED_KEYS = ["type", "model", "instructions", "tools", "tool_choice", "output_modalities"]


@pytest.fixture
async def sim():
    async with serving_simulator(Simulator("silence", api_key=SIM_KEY, conformance=True)) as simulator:
        yield simulator


def settings_for(journal: Path, tmp_path: Path, sim: Simulator) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                    openai_base_url=sim.base_url, rate_limit_per_s=0, close_deadline_s=1.0)


async def minted_session(client: Any, sim: Simulator) -> dict[str, Any]:
    response = await client.post("/api/voice/session", json={})
    assert response.status_code == 200, await response.get_json()
    session: dict[str, Any] = sim.client_secret_requests[-1]["body"]["session"]
    return session


async def connected_call(client: Any, sim: Simulator, call_id: str) -> Any:
    call = sim.add_call(call_id, [{"sleep": 1.0}, {"close": 1000}])
    response = await client.post("/api/voice/connect", json={"call_id": call_id})
    assert response.status_code == 200
    with trio.fail_after(10):
        await call.wait_until(lambda c: c.closed and c.connection is None)
    return call


def conforms(session: dict[str, Any]) -> None:
    """The minted session holds to the SDK's session type exactly (strict
    types, no undeclared field): the check the simulator makes of every
    ``session.update``, whose session is the same type."""
    assert client_error({"type": "session.update", "session": session}) == (None, None)


# ------------------------------------------------------------ the voice block

def test_the_efforts_are_the_sdks():
    from openai.types.realtime.realtime_reasoning_effort import RealtimeReasoningEffort
    assert REASONING_EFFORTS == typing.get_args(RealtimeReasoningEffort)
    assert {"low", "medium", "high"} <= set(REASONING_EFFORTS)


def test_the_docs_name_the_sdks_realtime_models():
    from openai.types.realtime.realtime_session_create_request_param import RealtimeSessionCreateRequestParam
    hint = typing.get_type_hints(RealtimeSessionCreateRequestParam)["model"]
    models = [name for member in typing.get_args(hint) for name in typing.get_args(member)]
    assert "gpt-realtime-2" in models and voice_config.DEFAULT_VOICE_MODEL in models
    row = next(line for line in (Path(__file__).parents[1] / "docs" / "configuration.md").read_text().splitlines()
               if line.startswith("| `model` |"))
    assert [m for m in models if f"`{m}`" not in row] == []


def test_parse_reads_set_values_and_leaves_null_unset():
    assert parse(CHOSEN) == (SessionSettings("low", False, 12000), [])
    assert parse({"reasoning_effort": " High ", "parallel_tool_calls": None}) == (SessionSettings("high"), [])
    assert parse({}) == (SessionSettings(), [])
    assert SessionSettings().session_fields() == {} and SessionSettings().view() == {}
    assert SessionSettings("low", False, 12000).session_fields() == CHOSEN_FIELDS


@pytest.mark.parametrize(("key", "value", "message"), [
    ("reasoning_effort", "max", "voice.reasoning_effort must be one of "
                                + ", ".join(REASONING_EFFORTS) + ", not 'max'"),
    ("reasoning_effort", 3, "voice.reasoning_effort must be one of " + ", ".join(REASONING_EFFORTS) + ", not 3"),
    ("parallel_tool_calls", "yes", "voice.parallel_tool_calls must be true or false, not 'yes'"),
    ("parallel_tool_calls", 1, "voice.parallel_tool_calls must be true or false, not 1"),
    ("idle_timeout_ms", 0, "voice.idle_timeout_ms must be a whole number of milliseconds above 0, not 0"),
    ("idle_timeout_ms", 1.5, "voice.idle_timeout_ms must be a whole number of milliseconds above 0, not 1.5"),
    ("idle_timeout_ms", True, "voice.idle_timeout_ms must be a whole number of milliseconds above 0, not True"),
])
def test_a_bad_value_is_named_and_only_it_is_left_unset(key, value, message):
    chosen, problems = parse({**CHOSEN, key: value})
    assert problems == [message]
    assert getattr(chosen, key) is None
    assert chosen.view() == {k: v for k, v in CHOSEN.items() if k != key}


def test_serve_refuses_to_start_with_a_bad_value(tmp_path, make_sample):
    journal = make_sample(days=1)
    set_voice(journal, {"reasoning_effort": "extreme", "idle_timeout_ms": -1})
    with pytest.raises(InvalidSettings) as refused:
        create_app(Settings(journal=journal, state_dir=tmp_path / "state"))
    assert str(refused.value) == (
        "invalid settings: voice.reasoning_effort must be one of " + ", ".join(REASONING_EFFORTS)
        + ", not 'extreme'; voice.idle_timeout_ms must be a whole number of milliseconds above 0, not -1")


def test_serve_with_a_bad_value_exits_2_before_serving(tmp_path, make_sample, capsys):
    journal = make_sample(days=1)
    set_voice(journal, {"parallel_tool_calls": "sometimes"})
    code = main(["serve", "--port", "0", "--journal", str(journal), "--state-dir", str(tmp_path / "state")])
    assert code == 2
    err = capsys.readouterr().err
    assert "voiceactors: invalid settings: voice.parallel_tool_calls must be true or false, not 'sometimes'" in err
    assert '"server.serving"' not in err
    assert not (tmp_path / "state").exists()         # refused before anything was created


def test_a_taken_over_call_carries_the_settings(tmp_path):
    linked = LinkedContext(BASE, None, session=SessionSettings("high", True))
    view = carried_view(linked)
    assert view["session"] == {"reasoning_effort": "high", "parallel_tool_calls": True}
    taken = taken_over_context(json.loads(json.dumps(view)))
    assert taken is not None and taken.session == SessionSettings("high", True)
    # none set: the carried view is what it always was
    assert "session" not in carried_view(LinkedContext(BASE, None))


# ------------------------------------------------------------ over the HTTP API

async def test_the_settings_reach_the_mint_and_the_sideband(make_sample, tmp_path, sim):
    journal = make_sample(days=2)
    set_voice(journal, {"model": "gpt-realtime-2", **CHOSEN})
    async with serving(create_app(settings_for(journal, tmp_path, sim))) as test_app:
        client = test_app.test_client()
        session = await minted_session(client, sim)
        assert session["model"] == "gpt-realtime-2"
        assert list(session) == MINTED_KEYS + ["reasoning", "parallel_tool_calls", "audio"]
        assert {key: session[key] for key in CHOSEN_FIELDS} == CHOSEN_FIELDS
        conforms(session)
        call = await connected_call(client, sim, "rtc_settings_sent")
    # a call without a link: one session.update, the settings alone (the
    # minted instructions stay), applied by the service
    assert received_types(call)[:1] == ["session.update"]
    [update] = [e for e in call.received if e["type"] == "session.update"]
    assert update["session"] == {"type": "realtime", **CHOSEN_FIELDS}
    assert call.session["reasoning"] == {"effort": "low"} and call.session["parallel_tool_calls"] is False
    assert call.session["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 12000
    assert call.nonconforming == [] and call.error_codes == [] and call.violations == []


async def test_without_settings_the_requests_are_unchanged(make_sample, tmp_path, sim):
    journal = make_sample(days=2)
    set_voice(journal, {"model": "gpt-realtime", "parallel_tool_calls": None})
    async with serving(create_app(settings_for(journal, tmp_path, sim))) as test_app:
        client = test_app.test_client()
        session = await minted_session(client, sim)
        assert list(session) == MINTED_KEYS and session["model"] == voice_config.DEFAULT_VOICE_MODEL
        conforms(session)
        call = await connected_call(client, sim, "rtc_settings_none")
    assert "session.update" not in received_types(call)
    assert call.nonconforming == [] and call.violations == []


async def test_a_bad_value_edited_in_later_is_logged_and_left_to_the_service(make_sample, tmp_path, sim):
    journal = make_sample(days=2)
    set_voice(journal, {"reasoning_effort": "medium"})
    async with serving(create_app(settings_for(journal, tmp_path, sim))) as test_app:
        client = test_app.test_client()
        assert (await minted_session(client, sim))["reasoning"] == {"effort": "medium"}
        set_voice(journal, {"reasoning_effort": "max", "parallel_tool_calls": True})
        with capture_logs() as captured:
            session = await minted_session(client, sim)
        assert "reasoning" not in session and session["parallel_tool_calls"] is True
        conforms(session)
    [line] = [e for e in captured if e["event"] == "config.voice_setting_invalid"]
    assert line["log_level"] == "error"
    assert line["error"] == ("voice.reasoning_effort must be one of " + ", ".join(REASONING_EFFORTS)
                             + ", not 'max'")


# ------------------------------------------------------------ CallActor + simulator

async def test_a_calls_updates_all_carry_the_settings(tmp_path, autojump_clock):
    """The first connection's update carries the settings (no link: no
    instructions); the update a ``journal.select`` makes due carries the
    new instructions and the settings again."""
    scenario = steady([
        {"user_turn": {"text": "Let's talk about Daniel."}},
        {"response": {"tool_calls": [{"name": "journal.select", "arguments": {"kind": "entity", "id": "daniel"},
                                      "call_id": "call_select"}]}},
        {"wait_outputs": {}},
        {"response": {"text": "Daniel Park it is."}},
        {"sleep": 0.5},
        {"close": 1000},
    ])
    async with rig(tmp_path) as r:
        r.sim.conformance = True
        actor, sc = await r.run_call("rtc_settings_linked", scenario,
                                     context=LinkedContext(BASE, None, session=SessionSettings("minimal", True)))
    assert actor.end_reason == "closed_by_service"
    assert_clean_protocol(sc, creates=1)
    assert received_types(sc)[:1] == ["session.update"]
    first, selected = [e["session"] for e in sc.received if e["type"] == "session.update"]
    assert first == {"type": "realtime", "reasoning": {"effort": "minimal"}, "parallel_tool_calls": True}
    assert list(selected) == ["type", "instructions", "reasoning", "parallel_tool_calls"]
    assert selected["instructions"].startswith(BASE) and '"Daniel Park"' in selected["instructions"]
    assert selected["reasoning"] == {"effort": "minimal"} and selected["parallel_tool_calls"] is True
    assert sc.session["reasoning"] == {"effort": "minimal"}     # the service applied it
    assert sc.nonconforming == []


async def test_the_idle_timeout_sent_is_the_one_the_service_keeps_time_by(tmp_path, autojump_clock):
    """The simulator fires its idle timeout only from the session's
    server-VAD ``idle_timeout_ms``: the journal's, sent at connect."""
    scenario = steady([{"idle_timeout": {"wait_s": 60}}, {"sleep": 0.5}, {"close": 1000}])
    async with rig(tmp_path) as r:
        r.sim.conformance = True
        started = trio.current_time()
        actor, sc = await r.run_call("rtc_settings_idle", scenario,
                                     context=LinkedContext(BASE, None, session=SessionSettings(idle_timeout_ms=7000)))
    assert actor.end_reason == "closed_by_service" and sc.idle_timeouts == 1
    assert 7.0 <= trio.current_time() - started < 60
    assert sc.session["audio"]["input"]["turn_detection"] == {"type": "server_vad", "idle_timeout_ms": 7000}
    assert sc.nonconforming == []


def test_serve_with_bad_mcp_sources_exits_2_before_serving(tmp_path, make_sample, capsys):
    """Bad MCP sources were checked only inside the serving loop: a traceback and exit 1."""
    journal = make_sample(days=1)
    set_voice(journal, {"mcp_sources": [{"name": "crm"}]})
    code = main(["serve", "--port", "0", "--journal", str(journal), "--state-dir", str(tmp_path / "state")])
    assert code == 2
    err = capsys.readouterr().err
    assert "voiceactors: invalid settings: mcp_sources[0]" in err
    assert "Traceback" not in err and '"server.serving"' not in err
    assert not (tmp_path / "state").exists()         # refused before anything was created
