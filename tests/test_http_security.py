"""Security defaults: loopback by default, a bearer token off loopback, the
server refusing to start without one, body limits on the wire."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import httpx
import pytest
import structlog
import trio

from clock_support import serving
from voiceactors.cli import main
from voiceactors.http import create_app
from voiceactors.http.auth import InsecureSettings, authorized
from voiceactors.journal.sample import write_sample_journal
from voiceactors.server import run_server
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)
TOKEN = "tok-3f6c0a9e5d7b41e2"


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    return write_sample_journal(tmp_path_factory.mktemp("security") / "journal", days=1, today=DAY)


@pytest.fixture(autouse=True)
def _reset_logs():
    # main() configures logging onto the captured stderr; undo it afterwards
    yield
    structlog.reset_defaults()


def make_settings(journal: Path, tmp_path: Path, **changes) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state").replace(**changes)


def test_loopback_is_the_default_and_open():
    settings = Settings.from_env({})
    assert settings.host == "127.0.0.1" and settings.loopback and settings.api_token is None
    assert authorized(settings, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org"])
def test_app_refuses_off_loopback_without_a_token(journal, tmp_path, host):
    with pytest.raises(InsecureSettings, match="VOICEACTORS_API_TOKEN"):
        create_app(make_settings(journal, tmp_path, host=host))


def test_serve_refuses_off_loopback_without_a_token(journal, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VOICEACTORS_API_TOKEN", raising=False)
    code = main(["serve", "--host", "0.0.0.0", "--port", "0", "--journal", str(journal),
                 "--state-dir", str(tmp_path / "state")])
    assert code == 2
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0" in err and "VOICEACTORS_API_TOKEN" in err


def test_serve_rejects_a_bad_today(journal, tmp_path, capsys):
    code = main(["serve", "--journal", str(journal), "--today", "2026-13-45"])
    assert code == 2
    assert "not a day" in capsys.readouterr().err


def test_token_comparison():
    settings = Settings(journal=Path("j"), state_dir=Path("s"), host="0.0.0.0", api_token=TOKEN)
    assert authorized(settings, f"Bearer {TOKEN}")
    assert authorized(settings, f"bearer  {TOKEN} ")
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer",
                   "Bearer \u00e9\u00e9"):
        assert not authorized(settings, header), header


async def test_off_loopback_requires_the_bearer_token(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path, host="0.0.0.0", api_token=TOKEN))
    async with serving(app) as test_app:
        client = test_app.test_client()
        # every route x every bad header is tests/test_security.py's job
        response = await client.get("/api/voice/status")
        assert response.status_code == 401 and await response.get_json() == {"error": "unauthorized"}
        good = {"Authorization": f"Bearer {TOKEN}"}
        response = await client.get("/api/voice/status", headers=good)
        assert response.status_code == 200
        assert set(await response.get_json()) == {"brain_ready", "brain_age_seconds", "openai_configured",
                                                  "active_sessions", "daily_cost_usd", "daily_budget_usd",
                                                  "budget_spent", "phone_configured"}
        response = await client.post("/api/voice/connect", json={}, headers=good)
        assert response.status_code == 400
        # metrics stay scrapeable without the token; nothing else is outside /api/voice
        assert (await client.get("/metrics")).status_code == 200


async def test_a_configured_token_is_enforced_on_loopback_too(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path, api_token=TOKEN))
    async with serving(app) as test_app:
        client = test_app.test_client()
        assert (await client.get("/api/voice/status")).status_code == 401
        response = await client.get("/api/voice/status", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200


async def test_loopback_without_token_is_open(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        assert (await test_app.test_client().get("/api/voice/status")).status_code == 200


async def test_body_limit_on_the_wire_declared_and_streamed(journal, tmp_path):
    """Through hypercorn: a declared oversize body and a chunked one without
    Content-Length both answer 413 JSON; the response never echoes a key."""
    settings = make_settings(journal, tmp_path, port=0, openai_api_key_env="sk-wire-test-123456")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            response = await client.post("/api/voice/connect", content=b"{" + b" " * 70_000 + b"}",
                                         headers={"Content-Type": "application/json"})
            assert response.status_code == 413
            assert response.json() == {"error": "request body too large"}

            async def chunks():
                yield b'{"call_id": "rtc_1", "pad": "'
                for _ in range(20):
                    yield b"x" * 8192
                yield b'"}'

            response = await client.post("/api/voice/connect", content=chunks(),
                                         headers={"Content-Type": "application/json"})
            assert "content-length" not in response.request.headers
            assert response.status_code == 413
            assert response.json() == {"error": "request body too large"}

            response = await client.get("/api/voice/status")
            assert response.status_code == 200 and response.json()["openai_configured"] is True
            assert b"sk-wire" not in response.content
            assert response.headers["x-request-id"]
        stop.set()
