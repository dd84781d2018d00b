"""The console without a browser: pages and their headers, assets, the
console config, sign-in and its cookie, and the call history API and picture.

Records are real files of the documented line kinds (``call/record.py``),
including the shapes a live or crashed call leaves (no ``end``, a tool only
started, an unknown kind, a garbled file); the app runs its real runtime.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import httpx
import pytest
import trio

from clock_support import serving
from voiceactors.call.record import record_path
from voiceactors.http import console_sessions, create_app, history
from voiceactors.http import errors as E
from voiceactors.http.console import content_security_policy
from voiceactors.settings import Settings

REALTIME = "http://127.0.0.1:18766/v1"
TOKEN = "tok-console-test-5f2a9c1e7d3b"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self' http://127.0.0.1:18766; "
       "media-src 'self' blob:; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


@pytest.fixture
def journal(make_sample) -> Path:
    return make_sample(days=2)


def settings(journal: Path, tmp_path: Path, **changes) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env="sk-test",
                    openai_base_url=REALTIME).replace(**changes)


async def error_of(response) -> str:
    data = await response.get_json()
    assert set(data) == {"error"}, data
    return data["error"]


# --- pages, headers, assets ---------------------------------------------------------------

async def test_pages_are_html_with_a_strict_policy(journal, tmp_path):
    app = create_app(settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for path, marker in (("/", 'id="start"'), ("/calls", 'id="calls"'), ("/calls/rtc_abc", 'id="timeline"')):
            response = await client.get(path)
            assert response.status_code == 200, path
            assert response.mimetype == "text/html"
            assert response.headers["Content-Security-Policy"] == CSP
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["Referrer-Policy"] == "no-referrer"
            assert marker in (await response.get_data()).decode()
        response = await client.get("/calls/not%20an%20id")
        assert response.status_code == 404 and await error_of(response) == "not found"


def test_the_policy_names_only_our_origin_and_the_realtime_origin():
    assert "connect-src 'self' https://api.openai.com;" in content_security_policy("https://api.openai.com/v1")
    assert "connect-src 'self';" in content_security_policy("not a url")
    assert "'unsafe-inline'" not in CSP and "*" not in CSP


async def test_assets_are_served_and_nothing_else(journal, tmp_path):
    app = create_app(settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.get("/static/console.js")
        assert response.status_code == 200
        assert response.mimetype in ("text/javascript", "application/javascript")
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert "RTCPeerConnection" in (await response.get_data()).decode()
        response = await client.get("/static/console.css")
        assert response.status_code == 200 and response.mimetype == "text/css"
        for name in ("index.html", "__init__.py", "..%2Fhttp%2Fapp.py", "nope.js", ".hidden.js"):
            response = await client.get(f"/static/{name}")
            assert response.status_code == 404, name
            assert await error_of(response) == "not found"


class _PageAudit(HTMLParser):
    """Every inline script, inline style and off-site reference in a page."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self._in_script = True
            if not (attrs.get("src") or "").startswith("/static/"):
                self.problems.append(f"script without a /static/ src: {attrs}")
        if tag == "style":
            self.problems.append("a <style> element")
        for name, value in attrs.items():
            if name == "style" or name.startswith("on"):
                self.problems.append(f"inline {name} on <{tag}>")
            if name in ("src", "href") and value and re.match(r"^(https?:)?//", value):
                self.problems.append(f"off-site {name}: {value}")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.problems.append("inline script text")


def test_pages_have_no_inline_script_or_style_and_no_third_party_asset():
    folder = resources.files("voiceactors.console")
    pages = [p for p in folder.iterdir() if p.name.endswith(".html")]
    assert {p.name for p in pages} >= {"index.html", "calls.html", "call.html"}
    for page in pages:
        audit = _PageAudit()
        audit.feed(page.read_text(encoding="utf-8"))
        assert audit.problems == [], page.name
    for script in (p for p in folder.iterdir() if p.name.endswith((".js", ".css"))):
        text = script.read_text(encoding="utf-8")
        assert not re.search(r"https?://", text), script.name     # nothing fetched from elsewhere
        assert "localStorage" not in text and "sessionStorage" not in text, script.name
        assert "innerHTML" not in text, script.name


# --- console config and sign-in ------------------------------------------------------------------

async def test_console_config_on_loopback_needs_no_sign_in(journal, tmp_path):
    app = create_app(settings(journal, tmp_path, demo=True))
    async with serving(app) as test_app:
        response = await test_app.test_client().get("/api/voice/console-config")
        assert response.status_code == 200
        assert await response.get_json() == {"realtime_base_url": REALTIME, "token_required": False,
                                             "signed_in": True, "demo": True, "notices": [],
                                             "services": ["realtime", "live"], "service": "realtime"}


async def test_console_config_names_the_journals_voice_service(journal, tmp_path):
    config = journal / "config" / "journal.json"
    data = json.loads(config.read_text())
    app = create_app(settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for chosen, said in (("live", "live"), ("LIVE", "live"), ("telepathy", "realtime")):
            config.write_text(json.dumps({**data, "voice": {**data.get("voice", {}), "service": chosen}}))
            answer = await (await client.get("/api/voice/console-config")).get_json()
            assert answer["service"] == said, chosen


async def test_the_first_screen_hears_of_no_key_and_an_empty_journal_before_start(tmp_path, log_stream):
    """Both used to be found out only at Start (or never): the console config
    names them, and ``serve`` logs each at start with what to do."""
    from voiceactors.server import run_server
    empty = tmp_path / "empty-journal"
    empty.mkdir()
    bare = settings(empty, tmp_path, openai_api_key_env=None, port=0, shutdown_deadline_s=3.0, close_deadline_s=1.0)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(bare, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            config = (await client.get("/api/voice/console-config")).json()
        stop.set()
    assert config["notices"] == ["no_openai_key", "journal_empty"]
    said = [json.loads(line) for line in log_stream.getvalue().splitlines() if "server.startup_notice" in line]
    assert [(line["notice"], line["level"]) for line in said] == [("no_openai_key", "warning"),
                                                                  ("journal_empty", "warning")]
    assert "restart with OPENAI_API_KEY set" in said[0]["what_to_do"]
    assert "voice.openai_api_key" in said[0]["what_to_do"] and "no restart" in said[0]["what_to_do"]
    # a key in the journal's config is read again without a restart: the notice goes
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "config").mkdir()
    (journal / "config" / "journal.json").write_text(json.dumps({"voice": {"openai_api_key": "sk-from-journal"}}))
    from voiceactors.notices import Notice, startup_notices
    assert startup_notices(settings(journal, tmp_path, openai_api_key_env=None)) == [Notice.JOURNAL_EMPTY]


async def test_notices_are_only_for_a_signed_in_page(tmp_path):
    empty = tmp_path / "empty-journal"
    empty.mkdir()
    app = create_app(settings(empty, tmp_path, openai_api_key_env=None, api_token=TOKEN))
    async with serving(app) as test_app:
        config = await (await test_app.test_client().get("/api/voice/console-config")).get_json()
    assert config["signed_in"] is False and config["notices"] == []


async def test_sign_in_sets_a_strict_cookie_that_stands_in_for_the_token(journal, tmp_path, log_stream):
    app = create_app(settings(journal, tmp_path, api_token=TOKEN))
    async with serving(app) as test_app:
        client = test_app.test_client()
        config = await (await client.get("/api/voice/console-config")).get_json()
        assert config["token_required"] is True and config["signed_in"] is False
        assert (await client.get("/api/voice/status")).status_code == 401
        assert (await client.get("/api/voice/calls")).status_code == 401

        response = await client.post("/api/voice/login", json={"token": "wrong"})
        assert response.status_code == 401 and await error_of(response) == E.UNAUTHORIZED
        assert "Set-Cookie" not in response.headers
        for body in ({}, {"token": ""}, {"token": 7}):
            response = await client.post("/api/voice/login", json=body)
            assert response.status_code == 400 and await error_of(response) == "token is required"

        response = await client.post("/api/voice/login", json={"token": TOKEN})
        assert response.status_code == 200
        assert await response.get_json() == {"signed_in": True, "token_required": True}
        cookie = response.headers["Set-Cookie"]
        assert cookie.startswith(f"{console_sessions.COOKIE_NAME}=")
        assert TOKEN not in cookie
        for attribute in ("HttpOnly", "SameSite=Strict", "Path=/"):
            assert attribute in cookie, cookie
        assert "Secure" not in cookie         # plain http on this test client

        assert (await client.get("/api/voice/status")).status_code == 200
        assert (await client.get("/api/voice/calls")).status_code == 200
        config = await (await client.get("/api/voice/console-config")).get_json()
        assert config["signed_in"] is True

        response = await client.post("/api/voice/logout")
        assert response.status_code == 200
        assert f"{console_sessions.COOKIE_NAME}=;" in response.headers["Set-Cookie"]
        assert (await client.get("/api/voice/status")).status_code == 401
    assert TOKEN not in log_stream.getvalue()


async def test_a_forged_or_revoked_cookie_is_refused(journal, tmp_path):
    app = create_app(settings(journal, tmp_path, api_token=TOKEN))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.post("/api/voice/login", json={"token": TOKEN})
        value = response.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
        other = test_app.test_client()
        other.set_cookie("localhost", console_sessions.COOKIE_NAME, value[:-2] + "xx")
        assert (await other.get("/api/voice/status")).status_code == 401
        await client.post("/api/voice/logout")
        replay = test_app.test_client()
        replay.set_cookie("localhost", console_sessions.COOKIE_NAME, value)
        assert (await replay.get("/api/voice/status")).status_code == 401


async def test_sign_in_over_https_marks_the_cookie_secure(journal, tmp_path):
    app = create_app(settings(journal, tmp_path, api_token=TOKEN))
    async with serving(app) as test_app:
        response = await test_app.test_client().post("/api/voice/login", json={"token": TOKEN}, scheme="https")
        assert "Secure" in response.headers["Set-Cookie"]


async def test_a_cross_site_page_cannot_sign_in_or_mint(journal, tmp_path):
    app = create_app(settings(journal, tmp_path, api_token=TOKEN))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.post("/api/voice/login", json={"token": TOKEN},
                                     headers={"Sec-Fetch-Site": "cross-site"})
        assert response.status_code == 403 and await error_of(response) == E.CROSS_SITE
        response = await client.post("/api/voice/login", data=json.dumps({"token": TOKEN}),
                                     headers={"Content-Type": "text/plain"})
        assert response.status_code == 415
        # signed in, a request the browser marks cross-site still cannot mint
        await client.post("/api/voice/login", json={"token": TOKEN})
        response = await client.post("/api/voice/session", json={}, headers={"Sec-Fetch-Site": "cross-site"})
        assert response.status_code == 403


def test_the_session_store_is_bounded_and_expires(autojump_clock):
    async def main():
        store = console_sessions.SessionStore(ttl_s=10.0, max_sessions=3)
        ids = [store.create() for _ in range(4)]
        assert not store.valid(ids[0]) and all(store.valid(i) for i in ids[1:])
        await trio.sleep(11)
        assert not any(store.valid(i) for i in ids) and len(store) == 0
    trio.run(main, clock=autojump_clock)


# --- call history ----------------------------------------------------------------------------

async def write_demo_like_record(state_dir: Path, call_id: str) -> Path:
    """A finished call: a parallel batch, a barge-in, a reconnect, a failure
    (the documented line kinds, written as the file ``read_record`` reads)."""
    lines = [
        {"kind": "start", "t": 0.0, "call_id": call_id, "at": "2026-03-27T09:15:00+00:00"},
        {"kind": "connect", "t": 0.01, "reconnects": 0},
        {"kind": "tool_started", "t": 0.5, "tool_call_id": "call_a", "tool": "briefing.get", "response_id": "resp_1",
         "epoch": 1, "turn": 1, "effect": "read"},
        {"kind": "response", "t": 0.6, "response_id": "resp_1", "status": "completed", "epoch": 1, "origin": "model",
         "tool_calls": ["call_a"]},
        {"kind": "reconnect", "t": 1.0, "attempt": 1, "delay_s": 0.5, "close_code": 1006},
        {"kind": "response", "t": 2.0, "response_id": "resp_2", "status": "cancelled", "epoch": 2, "origin": "model",
         "tool_calls": ["call_b", "call_c"]},
        {"kind": "transcript", "t": 2.1, "role": "user", "item_id": "item_1", "text": "What's on today?"},
        {"kind": "transcript", "t": 2.2, "role": "assistant", "item_id": "item_2", "text": "Three meetings <and> a launch."},
        {"kind": "tool_call", "t": 0.5, "tool_call_id": "call_a", "tool": "briefing.get", "response_id": "resp_1",
         "epoch": 1, "turn": 1, "duration_ms": 4.2, "outcome": "ok", "output_bytes": 10, "sends": 1,
         "delivered": True, "synthetic": False},
        {"kind": "tool_call", "t": 1.9, "tool_call_id": "call_b", "tool": "journal.search", "response_id": "resp_2",
         "epoch": 2, "turn": 2, "duration_ms": 120.0, "outcome": "timeout", "output_bytes": 10, "sends": 1,
         "delivered": True, "synthetic": False},
        {"kind": "tool_call", "t": 1.9, "tool_call_id": "call_c", "tool": "calendar<today>", "response_id": "resp_2",
         "epoch": 2, "turn": 2, "duration_ms": None, "outcome": "unanswered", "output_bytes": 0, "sends": 0,
         "delivered": False, "synthetic": False},
        {"kind": "end", "t": 6.5, "reason": "closed_by_service", "duration_s": 6.5, "epoch": 2, "reconnects": 1,
         "tool_calls": 3, "responses": 2, "feed_dropped": 0},
    ]
    return write_raw(state_dir, call_id, lines, mtime=None)


def write_raw(state_dir: Path, call_id: str, lines: list, mtime: float | None) -> Path:
    path = record_path(state_dir, call_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


async def test_history_lists_newest_first_and_tolerates_live_crashed_and_unknown(journal, tmp_path):
    state = tmp_path / "state"
    done = await write_demo_like_record(state, "rtc_done")
    os.utime(done, (1_000_000, 1_000_000))
    write_raw(state, "rtc_live", [{"kind": "start", "t": 0.0, "call_id": "rtc_live", "at": "2026-03-27T09:00:00+00:00"},
                                  {"kind": "future_kind", "t": 1.0, "what": "new"},
                                  {"kind": "tool_call", "t": 2.5, "tool_call_id": "c1", "tool": "x", "outcome": "ok",
                                   "duration_ms": 1},
                                  {"kind": "tool_started", "t": 2.4, "tool_call_id": "c2", "tool": "today"}],
              mtime=3_000_000)
    write_raw(state, "rtc_garbled", ["{not json"], mtime=2_000_000)
    app = create_app(settings(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        response = await client.get("/api/voice/calls")
        assert response.status_code == 200
        calls = (await response.get_json())["calls"]
        assert [c["call_id"] for c in calls] == ["rtc_live", "rtc_garbled", "rtc_done"]
        live, garbled, finished = calls
        assert live["ended"] is None and live["duration_s"] == 2.5
        assert live["tool_calls"] == 2 and live["tool_failures"] == 0       # one settled, one still pending
        assert garbled.get("unreadable") is True
        assert finished == {"call_id": "rtc_done", "started_at": finished["started_at"], "duration_s": 6.5,
                            "ended": "closed_by_service", "tool_calls": 3, "tool_failures": 2, "responses": 2,
                            "barge_ins": 1, "reconnects": 1, "runs": 1, "first_words": "What's on today?", "model": None,
                            "tokens": {"text_in": 0, "text_out": 0, "audio_in": 0, "audio_out": 0, "cached_in": 0},
                            "total_tokens": 0, "cost_usd": 0.0}
        assert [c["call_id"] for c in (await (await client.get("/api/voice/calls?limit=1")).get_json())["calls"]] \
            == ["rtc_live"]
        for bad in ("0", "201", "x", "-1"):
            response = await client.get(f"/api/voice/calls?limit={bad}")
            assert response.status_code == 400 and await error_of(response) == "limit must be an integer from 1 to 200"

        detail = await (await client.get("/api/voice/calls/rtc_done")).get_json()
        assert detail["call"] == finished
        assert [line["kind"] for line in detail["lines"]][0] == "start"
        assert detail["transcript"] == [
            {"role": "user", "text": "What's on today?", "item_id": "item_1", "t": detail["transcript"][0]["t"],
             "cut_short": False},
            {"role": "assistant", "text": "Three meetings <and> a launch.", "item_id": "item_2",
             "t": detail["transcript"][1]["t"], "cut_short": False}]
        live_detail = await (await client.get("/api/voice/calls/rtc_live")).get_json()
        assert [line["kind"] for line in live_detail["lines"]] == ["start", "future_kind", "tool_call", "tool_started"]

        response = await client.get("/api/voice/calls/rtc_nope")
        assert response.status_code == 404 and await error_of(response) == E.CALL_NOT_FOUND
        response = await client.get("/api/voice/calls/rtc_garbled")
        assert response.status_code == 500 and await error_of(response) == "call record unreadable"
        response = await client.get("/api/voice/calls/bad%20id")
        assert response.status_code == 400 and await error_of(response) == E.CALL_ID_INVALID


def test_a_crashed_run_then_a_rejoined_run_that_ended_reads_as_ended(tmp_path):
    """A run cut by a crash (a ``start`` with no ``end``) before the run that
    ended: the call ended, with both runs' time (it read as live before)."""
    call_id = "rtc_rejoined"
    write_raw(tmp_path, call_id, [
        {"kind": "start", "t": 0.0, "call_id": call_id, "at": "2026-03-27T09:00:00+00:00"},
        {"kind": "tool_started", "t": 3.0, "tool_call_id": "c1", "tool": "today", "effect": "read"},
        {"kind": "start", "t": 0.0, "call_id": call_id, "at": "2026-03-27T09:00:05+00:00"},
        {"kind": "tool_call", "t": 0.2, "tool_call_id": "c1", "tool": "today", "outcome": "error", "duration_ms": 1},
        {"kind": "end", "t": 2.0, "reason": "closed_by_service", "duration_s": 2.0}], mtime=None)
    (summary,) = history.list_calls(tmp_path)
    assert summary["ended"] == "closed_by_service"
    assert summary["runs"] == 2 and summary["duration_s"] == 5.0

    # and a run that ended, then a rejoined run still going: live
    write_raw(tmp_path, call_id, [
        {"kind": "start", "t": 0.0, "call_id": call_id},
        {"kind": "end", "t": 2.0, "reason": "sideband_lost", "duration_s": 2.0},
        {"kind": "start", "t": 0.0, "call_id": call_id},
        {"kind": "transcript", "t": 1.5, "role": "user", "item_id": "i1", "text": "hi"}], mtime=None)
    (summary,) = history.list_calls(tmp_path)
    assert summary["ended"] is None and summary["runs"] == 2 and summary["duration_s"] == 3.5


def test_listing_is_bounded_and_empty_without_records(tmp_path):
    assert history.list_calls(tmp_path / "nothing") == []
    for i in range(5):
        write_raw(tmp_path, f"rtc_{i}", [{"kind": "start", "t": 0, "call_id": f"rtc_{i}"}], mtime=1000 + i)
    assert [c["call_id"] for c in history.list_calls(tmp_path, limit=3)] == ["rtc_4", "rtc_3", "rtc_2"]


async def test_the_timeline_picture_draws_tools_barge_ins_and_reconnects(journal, tmp_path):
    await write_demo_like_record(tmp_path / "state", "rtc_done")
    app = create_app(settings(journal, tmp_path))
    async with serving(app) as test_app:
        response = await test_app.test_client().get("/api/voice/calls/rtc_done/timeline.svg")
        assert response.status_code == 200 and response.mimetype == "image/svg+xml"
        assert response.headers["Content-Security-Policy"] == "default-src 'none'"
        svg = (await response.get_data()).decode()
    root = ET.fromstring(svg)        # well-formed, and the tool name with <> was escaped
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "briefing.get" in texts and "calendar<today>" in texts      # the protocol's epoch only in a tooltip
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("calendar<today> · tool call ") and t.endswith("· epoch 2") for t in titles), titles
    assert "ok · 4.2 ms" in texts and "timeout · 120.0 ms" in texts and "unanswered · no duration" in texts
    assert "barge-in" in texts and "reconnect 1" in texts and "end: closed_by_service" in texts
    assert "cancelled response (barge-in)" in texts          # the legend
    assert "<script" not in svg and "href" not in svg


def test_a_second_run_continues_the_timeline_and_an_open_one_is_marked():
    from voiceactors.http import timeline_svg
    lines = [{"kind": "start", "t": 0}, {"kind": "end", "t": 3.0, "duration_s": 3.0, "reason": "reconnect_exhausted"},
             {"kind": "start", "t": 0}, {"kind": "tool_call", "t": 1.0, "tool": "today", "duration_ms": 5,
                                         "outcome": "ok", "epoch": 1},
             {"kind": "tool_started", "t": 1.5, "tool_call_id": "z", "tool": "entity.get", "epoch": 1}]
    assert [p.at for p in timeline_svg.place(lines)] == [0, 3.0, 3.0, 4.0, 4.5]
    svg = timeline_svg.render(lines)
    assert "new run" in svg and "no end recorded" in svg
    assert ">entity.get</text>" in svg and "pending · no duration" in svg
    ET.fromstring(svg)


def test_a_barge_in_label_is_never_under_the_next_responses_mark():
    """Two responses 0.2 s apart, the first cancelled: the label used to be
    drawn beside the first mark, where the second mark's dot covered it."""
    from voiceactors.http import timeline_svg
    lines = [{"kind": "start", "t": 0},
             {"kind": "response", "t": 5.0, "response_id": "r1", "status": "cancelled", "origin": "model"},
             {"kind": "response", "t": 5.2, "response_id": "r2", "status": "completed", "origin": "model"},
             {"kind": "response", "t": 5.3, "response_id": "r3", "status": "cancelled", "origin": "model"},
             {"kind": "end", "t": 30.0, "duration_s": 30.0, "reason": "hangup"}]
    root = ET.fromstring(timeline_svg.render(lines))
    ns = "{http://www.w3.org/2000/svg}"
    dots = [(float(c.get("cx")), float(c.get("cy")), float(c.get("r"))) for c in root.iter(f"{ns}circle")]
    labels = [t for t in root.iter(f"{ns}text") if t.text == "barge-in"]
    assert len(dots) == 3 and len(labels) == 2
    width = 52          # "barge-in" in 12 px bold, about
    boxes = [(float(t.get("x")), float(t.get("y")) - 11, float(t.get("x")) + width, float(t.get("y")) + 2)
             for t in labels]
    for left, top, right, bottom in boxes:
        for cx, cy, r in dots:        # no mark's dot overlaps a label
            assert not (cx + r > left and cx - r < right and cy + r > top and cy - r < bottom), (boxes, dots)
    (a, b) = boxes                    # nor do the two labels overlap each other
    assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], boxes


def test_the_call_list_says_what_was_said_first(tmp_path):
    long = "Could you tell me what is on my calendar today and whether the launch review moved to the afternoon?"
    write_raw(tmp_path, "rtc_words", [
        {"kind": "start", "t": 0, "call_id": "rtc_words"},
        {"kind": "transcript", "t": 1.0, "role": "assistant", "item_id": "a1", "text": "Hello.", "order": 2.0},
        {"kind": "transcript", "t": 1.2, "role": "user", "item_id": "u1", "text": long, "order": 1.0}], mtime=1000)
    write_raw(tmp_path, "rtc_quiet", [{"kind": "start", "t": 0, "call_id": "rtc_quiet"}], mtime=999)
    words, quiet = history.list_calls(tmp_path)
    assert words["first_words"] == "Could you tell me what is on my calendar today and whether the launch review…"
    assert len(words["first_words"]) <= history.FIRST_WORDS_CHARS + 1
    assert quiet["first_words"] is None


def test_the_history_of_serve_workers_shows_every_workers_calls_and_joins_a_taken_over_call(tmp_path):
    """``serve --workers``: each worker writes ``<root>/workers/<i>/calls``; a
    call taken over by another worker has a record in both folders."""
    root = tmp_path / "state"
    w0, w1 = root / "workers" / "0", root / "workers" / "1"
    write_raw(w0, "rtc_only0", [{"kind": "start", "t": 0}, {"kind": "end", "t": 1, "reason": "hangup",
                                                                "duration_s": 1.0}], mtime=1000)
    write_raw(w0, "rtc_moved", [{"kind": "start", "t": 0, "at": "2026-03-10T10:00:00+00:00"},
                                {"kind": "tool_started", "t": 0.5, "tool_call_id": "call_w"}], mtime=1001)
    write_raw(w1, "rtc_moved", [{"kind": "start", "t": 0, "at": "2026-03-10T10:00:05+00:00", "rejoined": True},
                                {"kind": "tool_call", "t": 0.1, "tool_call_id": "call_w", "outcome": "restarted"},
                                {"kind": "end", "t": 2, "reason": "hangup", "duration_s": 2.0}], mtime=1002)
    listed = history.list_calls(root)
    assert [c["call_id"] for c in listed] == ["rtc_moved", "rtc_only0"]
    moved = listed[0]
    assert moved["runs"] == 2 and moved["started_at"] == "2026-03-10T10:00:00+00:00"
    assert moved["tool_calls"] == 1 and moved["tool_failures"] == 1    # the taker settled the dead run's call
    detail = history.call_detail(root, "rtc_moved")
    assert [line["kind"] for line in detail["lines"]] == ["start", "tool_started", "start", "tool_call", "end"]
    # a worker's console reads its parent's folder; a plain server its own
    worker = Settings(journal=tmp_path, state_dir=w1, worker_index=1)
    assert history.history_root(worker) == root
    assert history.history_root(Settings(journal=tmp_path, state_dir=w1)) == w1
    with pytest.raises(FileNotFoundError):
        history.call_detail(root, "rtc_nowhere")
