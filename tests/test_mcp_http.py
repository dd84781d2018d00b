"""MCP sources at the HTTP layer: a call's credentials at
``POST /api/voice/connect`` (shape checks, unknown sources, the hub gets
them, never logged) and the source tools in a session's ``tools``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from mcp_support import McpTestServer, ToolDef, text_result
from test_http_routes import error_of, make_settings, post
from clock_support import serving
from voiceactors.http import create_app, voice_state
from voiceactors.http import errors as E
from voiceactors.http.routes import session_config

TOKEN = "user-secret-token-123"


async def hello(args: dict) -> object:
    return text_result("hello")


@pytest.fixture
def journal(make_sample) -> Path:
    return make_sample(days=2)


def sources(url: str) -> str:
    return json.dumps([{"name": "crm", "url": url, "token_env": "CRM_TOKEN"}])


@pytest.mark.parametrize("credentials, message", [
    ([], E.CREDENTIALS_INVALID),
    ("crm", E.CREDENTIALS_INVALID),
    ({}, E.CREDENTIALS_INVALID),
    ({"crm": 42}, E.CREDENTIALS_INVALID),
    ({"crm": ""}, E.CREDENTIALS_INVALID),
    ({"crm": "two words"}, E.CREDENTIALS_INVALID),
    ({"crm": "x" * 5000}, E.CREDENTIALS_INVALID),
    ({"other": "token"}, E.CREDENTIALS_UNKNOWN_SOURCE),
])
async def test_connect_refuses_bad_credentials(journal, tmp_path, monkeypatch, credentials, message):
    monkeypatch.setenv("CRM_TOKEN", "server-token")
    app = create_app(make_settings(journal, tmp_path, mcp_sources=sources("http://127.0.0.1:9/mcp")))
    async with serving(app) as test_app:
        response = await post(test_app.test_client(), "/api/voice/connect",
                              {"call_id": "rtc_creds", "credentials": credentials})
        assert response.status_code == 400
        assert await error_of(response) == message


async def test_connect_hands_the_calls_token_to_the_hub_and_never_logs_it(journal, tmp_path, monkeypatch, capsys):
    server = McpTestServer([ToolDef("hello", hello)], tokens={"server-token", TOKEN})
    monkeypatch.setenv("CRM_TOKEN", "server-token")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        app = create_app(make_settings(journal, tmp_path, mcp_sources=sources(url)))
        async with serving(app) as test_app:
            hub = voice_state(app).runtime.actors["mcp"]
            await hub.wait_discovered()
            response = await post(test_app.test_client(), "/api/voice/connect",
                                  {"call_id": "rtc_creds", "credentials": {"crm": TOKEN}})
            assert response.status_code == 200
            with trio.fail_after(10):
                while "crm" not in hub._calls["rtc_creds"].specs:    # the call's own discovery answered
                    await trio.sleep(0.01)
            assert {t["name"] for t in hub.manifest("dotted")} == {"crm.hello"}
        nursery.cancel_scope.cancel()
    out = capsys.readouterr()
    assert "mcp.discovered" in out.out + out.err     # the log lines were captured
    assert TOKEN not in out.out + out.err
    assert "server-token" not in out.out + out.err


def test_session_tools_are_ours_then_the_sources(tmp_path):
    from voiceactors.settings import Settings
    settings = Settings(journal=tmp_path, state_dir=tmp_path / "s")
    tool = {"type": "function", "name": "crm.hello", "description": "[crm] hi", "parameters": {"type": "object"}}
    from voiceactors.tools.registry import REGISTRY
    tools = session_config(settings, "gpt-realtime", "hi", [tool])["tools"]
    assert [t["name"] for t in tools[:-1]] == list(REGISTRY) and tools[-1] == tool
