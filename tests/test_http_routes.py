"""Route tests for /api/voice/*: every status code and error string of the design.

The app runs its real runtime (brain, executor, supervisor) in the serving
lifespan; the brain is the ``local`` backend, or the ``claude`` backend over
the stand-in CLI in ``tests/bin/fake-claude`` when a test needs it slow or
failing. Mint tests that need an OpenAI peer live in ``test_e2e.py`` (the
simulator).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import trio

from clock_support import clock_held_still, serving
from voiceactors.http import create_app, voice_state
from voiceactors.http import errors as E
from voiceactors.http.app import routes_served
from voiceactors.http.routes import openapi_document, openapi_path
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)
FAKE_CLAUDE = Path(__file__).parent / "bin" / "fake-claude"
KEY = "sk-test-routes-0123456789"
# Nothing listens on the discard port: a mint that gets that far fails fast.
DEAD_BASE_URL = "http://127.0.0.1:9/v1"



@pytest.fixture
def journal(make_sample) -> Path:
    """A fresh copy per test: tests edit the voice config and the brain writes its session file."""
    return make_sample(days=2)


def make_settings(journal: Path, tmp_path: Path, **changes) -> Settings:
    base = Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=KEY,
                    openai_base_url=DEAD_BASE_URL)
    return base.replace(**changes)


def set_voice_config(journal: Path, **voice) -> None:
    path = journal / "config" / "journal.json"
    data = json.loads(path.read_text())
    data["voice"] = voice
    path.write_text(json.dumps(data))


def use_fake_claude(journal: Path, monkeypatch, mode: str) -> dict:
    set_voice_config(journal, brain="claude")
    monkeypatch.setenv("FAKE_CLAUDE_MODE", mode)
    return {"claude_command": str(FAKE_CLAUDE)}


async def post(client, path: str, body: object = None, raw: bytes | None = None, **kw):
    if raw is not None:
        return await client.post(path, data=raw, **kw)
    if body is None:
        return await client.post(path, **kw)
    return await client.post(path, json=body, **kw)


async def error_of(response) -> str:
    data = await response.get_json()
    assert set(data) == {"error"}, data
    return data["error"]


# --- POST /api/voice/session ---------------------------------------------------

async def test_session_rejects_non_object_bodies(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for raw in (b"[1, 2]", b"\"text\"", b"42", b"null", b"{not json", b"\xff\xfe"):
            response = await post(client, "/api/voice/session", raw=raw)
            assert response.status_code == 400, raw
            assert await error_of(response) == E.NOT_AN_OBJECT == "request body must be a JSON object"


async def test_session_without_key_is_503_even_with_empty_body(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path, openai_api_key_env=None))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for response in (await post(client, "/api/voice/session"),
                         await post(client, "/api/voice/session", {})):
            assert response.status_code == 503
            assert await error_of(response) == "voice unavailable — openai key not configured"


async def test_session_key_from_journal_config_wins_over_env(journal, tmp_path):
    # A key in the journal's voice block counts even with no env key; the
    # mint then fails against the dead base URL: 500, not 503.
    set_voice_config(journal, openai_api_key="sk-journal-key-abcdef")
    app = create_app(make_settings(journal, tmp_path, openai_api_key_env=None))
    async with serving(app) as test_app:
        response = await post(test_app.test_client(), "/api/voice/session")
        assert response.status_code == 500
        assert await error_of(response) == "voice session unavailable"
        body = await response.get_data()
        assert b"sk-journal" not in body


async def test_session_brain_not_ready_after_ten_seconds(journal, tmp_path, monkeypatch, settled_clock):
    extra = use_fake_claude(journal, monkeypatch, "hang")
    app = create_app(make_settings(journal, tmp_path, **extra))
    async with serving(app) as test_app:
        started = trio.current_time()
        response = await post(test_app.test_client(), "/api/voice/session")
        waited = trio.current_time() - started
        assert response.status_code == 503
        assert await error_of(response) == "voice unavailable — brain not ready"
        assert 10.0 <= waited < 11.0


async def test_session_mint_failure_is_500_with_generic_message(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        response = await post(test_app.test_client(), "/api/voice/session", {"ignored": True})
        assert response.status_code == 500
        assert await error_of(response) == "voice session unavailable"


# --- POST /api/voice/connect ----------------------------------------------------

@pytest.mark.parametrize("raw, message", [
    (b"", E.INVALID_JSON),
    (b"   ", E.INVALID_JSON),
    (b"{", E.INVALID_JSON),
    (b"{'call_id': 'x'}", E.INVALID_JSON),
    (b"[\"rtc_1\"]", E.NOT_AN_OBJECT),
    (b"\"rtc_1\"", E.NOT_AN_OBJECT),
    (b"{}", E.CALL_ID_REQUIRED),
    (b"{\"call_id\": null}", E.CALL_ID_REQUIRED),
    (b"{\"call_id\": \"\"}", E.CALL_ID_REQUIRED),
    (b"{\"call_id\": \"   \"}", E.CALL_ID_REQUIRED),
    (b"{\"call_id\": 42}", E.CALL_ID_INVALID),
    (b"{\"call_id\": [\"rtc_1\"]}", E.CALL_ID_INVALID),
    (b"{\"call_id\": \"../etc/passwd\"}", E.CALL_ID_INVALID),
    (b"{\"call_id\": \"rtc 1\"}", E.CALL_ID_INVALID),
    (b"{\"call_id\": \"rtc_\\u00e9\"}", E.CALL_ID_INVALID),
    (json.dumps({"call_id": "a" * 129}).encode(), E.CALL_ID_INVALID),
])
async def test_connect_validation(journal, tmp_path, raw, message):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        response = await post(test_app.test_client(), "/api/voice/connect", raw=raw,
                              headers={"Content-Type": "application/json"})
        assert response.status_code == 400
        assert await error_of(response) == message


def test_error_strings_are_the_designs():
    assert E.INVALID_JSON == "request body must be valid JSON"
    assert E.CALL_ID_REQUIRED == "call_id is required"
    assert E.CALL_ID_INVALID == "call_id is invalid"
    assert E.KEY_NOT_CONFIGURED == "voice unavailable \u2014 openai key not configured"
    assert E.BRAIN_NOT_READY == "voice unavailable \u2014 brain not ready"
    assert E.RUNTIME_UNAVAILABLE == "voice runtime unavailable"
    assert E.REFRESH_FAILED == "brain refresh failed"
    assert E.SESSION_UNAVAILABLE == "voice session unavailable"


async def test_connect_without_key_is_503(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path, openai_api_key_env=None))
    async with serving(app) as test_app:
        response = await post(test_app.test_client(), "/api/voice/connect", {"call_id": "rtc_abc"})
        assert response.status_code == 503
        assert await error_of(response) == E.KEY_NOT_CONFIGURED


async def test_connect_at_capacity_is_503(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path, max_calls=0))
    async with serving(app) as test_app:
        response = await post(test_app.test_client(), "/api/voice/connect", {"call_id": "rtc_full"})
        assert response.status_code == 503
        assert await error_of(response) == "voice at capacity"


async def test_runtime_missing_is_500_and_status_falls_back(journal, tmp_path):
    # Not serving: no lifespan ran, so there is no runtime.
    app = create_app(make_settings(journal, tmp_path))
    client = app.test_client()
    for path, body in (("/api/voice/connect", {"call_id": "rtc_x"}), ("/api/voice/session", None),
                       ("/api/voice/refresh-brain", None)):
        response = await post(client, path, body)
        assert response.status_code == 500, path
        assert await error_of(response) == "voice runtime unavailable"
    for path in ("/api/voice/nav-hints?call_id=rtc_x", "/api/voice/observer-actions",
                 "/api/voice/events?call_id=rtc_x"):
        response = await client.get(path)
        assert response.status_code == 500, path
        assert await error_of(response) == "voice runtime unavailable"
    response = await client.get("/api/voice/status")
    assert response.status_code == 200
    assert await response.get_json() == {"brain_ready": False, "brain_age_seconds": None,
                                         "openai_configured": True, "active_sessions": 0,
                                         "daily_cost_usd": None, "daily_budget_usd": None, "budget_spent": False, "phone_configured": False}


# --- POST /api/voice/refresh-brain ----------------------------------------------

async def test_refresh_brain_returns_preview_and_age(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await post(client, "/api/voice/refresh-brain")
        assert response.status_code == 200
        data = await response.get_json()
        assert list(data) == ["status", "instruction_preview", "brain_ready", "brain_age_seconds"]
        assert data["status"] == "refreshed" and data["brain_ready"] is True
        assert data["brain_age_seconds"] == 0
        assert 0 < len(data["instruction_preview"]) <= 200
        assert "sol" in data["instruction_preview"]
        response = await post(client, "/api/voice/refresh-brain", {"any": "object"})
        assert response.status_code == 200


async def test_refresh_brain_rejects_non_objects(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        for raw in (b"[]", b"1", b"{oops"):
            response = await post(test_app.test_client(), "/api/voice/refresh-brain", raw=raw)
            assert response.status_code == 400
            assert await error_of(response) == E.NOT_AN_OBJECT


async def test_refresh_brain_202_after_thirty_seconds(journal, tmp_path, monkeypatch, settled_clock):
    extra = use_fake_claude(journal, monkeypatch, "hang")
    app = create_app(make_settings(journal, tmp_path, **extra))
    async with serving(app) as test_app:
        started = trio.current_time()
        response = await post(test_app.test_client(), "/api/voice/refresh-brain")
        assert response.status_code == 202
        assert await response.get_json() == {"status": "refreshing"}
        assert 30.0 <= trio.current_time() - started < 31.0


async def test_refresh_brain_failure_is_500(journal, tmp_path, monkeypatch):
    extra = use_fake_claude(journal, monkeypatch, "crash")
    app = create_app(make_settings(journal, tmp_path, **extra))
    async with serving(app) as test_app:
        response = await post(test_app.test_client(), "/api/voice/refresh-brain")
        assert response.status_code == 500
        assert await error_of(response) == "brain refresh failed"


# --- GET /api/voice/status ---------------------------------------------------------

async def test_status_fields_before_and_after_the_brain(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path, openai_api_key_env=None))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.get("/api/voice/status")
        assert response.status_code == 200
        assert await response.get_json() == {"brain_ready": False, "brain_age_seconds": None,
                                             "openai_configured": False, "active_sessions": 0,
                                             "daily_cost_usd": 0.0, "daily_budget_usd": None,
                                             "budget_spent": False, "phone_configured": False}
        await post(client, "/api/voice/refresh-brain")
        set_voice_config(journal, openai_api_key="sk-now-configured-123")
        data = await (await client.get("/api/voice/status")).get_json()
        assert data == {"brain_ready": True, "brain_age_seconds": 0, "openai_configured": True,
                        "active_sessions": 0, "daily_cost_usd": 0.0, "daily_budget_usd": None,
                        "budget_spent": False, "phone_configured": False}


async def test_status_brain_age_counts_up(journal, tmp_path, settled_clock):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        async with clock_held_still():     # the refresh runs in a worker thread: no jump to its 30 s wait
            assert (await post(client, "/api/voice/refresh-brain")).status_code == 200
        await trio.sleep(125)
        async with clock_held_still():     # and so does the key lookup of /status
            data = await (await client.get("/api/voice/status")).get_json()
        assert data["brain_ready"] is True
        assert 125 <= data["brain_age_seconds"] < 130


# --- client feed ---------------------------------------------------------------------

async def test_feed_routes_validate_and_answer(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for path in ("/api/voice/events", "/api/voice/nav-hints"):
            response = await client.get(path)
            assert response.status_code == 400
            assert await error_of(response) == E.CALL_ID_REQUIRED
            response = await client.get(path + "?call_id=bad%2Fid")
            assert response.status_code == 400
            assert await error_of(response) == E.CALL_ID_INVALID
        response = await client.get("/api/voice/events?call_id=rtc_not_live")
        assert response.status_code == 404
        assert await error_of(response) == "call not found"
        response = await client.get("/api/voice/nav-hints?call_id=rtc_not_live")
        assert response.status_code == 200
        assert await response.get_json() == {"hints": [], "consumed": True}
        response = await client.get("/api/voice/observer-actions")
        assert response.status_code == 200
        assert await response.get_json() == {"actions": [], "consumed": True}


# --- every response JSON -------------------------------------------------------------

async def test_unknown_routes_wrong_methods_and_big_bodies_answer_json(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.get("/api/voice/nope")
        assert response.status_code == 404 and await error_of(response) == "not found"
        response = await client.get("/no-such-page")    # "/" is the console (test_console.py)
        assert response.status_code == 404 and await error_of(response) == "not found"
        response = await client.get("/api/voice/session")
        assert response.status_code == 405 and await error_of(response) == "method not allowed"
        assert "POST" in response.headers["Allow"]
        response = await client.options("/api/voice/session")
        assert response.status_code == 405 and response.mimetype == "application/json"
        response = await client.post("/api/voice/status")
        assert response.status_code == 405
        big = json.dumps({"call_id": "rtc_1", "pad": "x" * (64 * 1024)}).encode()
        for path in ("/api/voice/connect", "/api/voice/session", "/api/voice/refresh-brain"):
            response = await post(client, path, raw=big)
            assert response.status_code == 413, path
            assert await error_of(response) == "request body too large"
        # exactly at the limit is still read (and judged on its content)
        at_limit = b"[" + b" " * (64 * 1024 - 2) + b"]"
        response = await post(client, "/api/voice/connect", raw=at_limit)
        assert response.status_code == 400 and await error_of(response) == E.NOT_AN_OBJECT


async def test_deeply_nested_json_is_a_400_not_a_crash(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        raw = b"[" * 30000 + b"]" * 30000
        response = await post(test_app.test_client(), "/api/voice/connect", raw=raw)
        assert response.status_code == 400
        assert await error_of(response) == E.INVALID_JSON


async def test_request_id_is_echoed_when_sane_and_generated_otherwise(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.get("/api/voice/status", headers={"X-Request-Id": "req-123.abc"})
        assert response.headers["X-Request-Id"] == "req-123.abc"
        response = await client.get("/api/voice/status", headers={"X-Request-Id": "bad id\u2028<script>"})
        generated = response.headers["X-Request-Id"]
        assert generated != "bad id\u2028<script>" and len(generated) == 32
        response = await client.get("/api/voice/nope")
        assert len(response.headers["X-Request-Id"]) == 32
        assert response.headers["Cache-Control"] == "no-store"


async def test_metrics_are_prometheus_text(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        await client.get("/api/voice/status")
        response = await client.get("/metrics")
        assert response.status_code == 200
        assert response.mimetype == "text/plain"
        text = (await response.get_data()).decode()
        assert "voiceactors_live_calls" in text
        assert 'voiceactors_http_requests_total{route="/api/voice/status",status="200"}' in text


async def test_openapi_document_matches_the_routes(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    async with serving(app) as test_app:
        response = await test_app.test_client().get("/api/voice/openapi.json")
        assert response.status_code == 200
        served = await response.get_json()
    assert served == openapi_document()
    documented = {(path, method.upper()) for path, item in served["paths"].items() for method in item}
    routed = {(openapi_path(rule), method) for rule, method in routes_served(app)}
    assert documented == routed
    for path, item in served["paths"].items():
        for method, op in item.items():
            for code in op["responses"]:
                assert code.isdigit(), (path, method, code)


def test_runtime_is_absent_until_served(journal, tmp_path):
    app = create_app(make_settings(journal, tmp_path))
    assert voice_state(app).runtime is None
