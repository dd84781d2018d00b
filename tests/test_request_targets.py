"""Request targets, token guessing, foreign fetches and stream ids, over raw
sockets against a real server (hypercorn on loopback, ``test_http_hardening``'s
rig):

* every spelling of a rate-limited POST's target (absolute form, doubled
  leading slash, percent-encoded) draws from the origin form's bucket, at
  every layer that refuses (the app, the ASGI layer, the accept) and on a
  connect answered below Quart and hypercorn;
* a refused credential on any route (a bearer token, the console's cookie,
  ``/mcp``, the console's config) draws from the sign-in's failure bucket,
  and a client over it gets 429 before its token is compared, the right
  one too, while another client's right token still gets in;
* a browser's ``Sec-Fetch-Site: same-site`` (another port on localhost) is
  refused on ``/api/voice/*`` with the console's cookie or without any,
  while what the console sends (``same-origin``) is served;
* a ``Last-Event-ID`` whose numbers overflow a stream id is 400.

Each client of a test is its own loopback address (127.0.0.N), so each has
its own buckets on the one server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from redis_support import REDIS_SERVER, redis_server  # noqa: F401 - the fixture
from test_http_hardening import _exchange, journal, real_server_for  # noqa: F401 - the journal fixture

TOKEN = "targets-token-5b9e0c1d7a"
BEARER = f"Bearer {TOKEN}"
COSTLY = ["/api/voice/connect", "/api/voice/session", "/api/voice/refresh-brain", "/api/voice/login"]
NO_REFILL = 0.0001          # a token back every ~3 hours: none comes back while a test runs


def _spellings(path: str, port: int) -> dict[str, str]:
    """The one path as a client may spell its target."""
    head, _, last = path.rpartition("/")
    return {"origin form": path, "absolute form": "http://x" + path,
            "absolute form, our host": f"http://127.0.0.1:{port}" + path, "doubled slash": "/" + path,
            "percent-encoded": f"{head}/%{ord(last[0]):02x}{last[1:]}"}


def _request(method: str, target: str, port: int, *, body: bytes | None = None, **headers: str) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def _send(port: int, source: str, method: str, target: str, *, body: bytes | None = None,
                **headers: str) -> tuple[int, dict[str, str], Any]:
    """One request on its own connection from ``source``: status, headers (lower-case names), JSON body."""
    data, closed = await _exchange(port, _request(method, target, port, body=body, **headers), source=source)
    assert closed, data[:200]
    head, _, payload = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {name.lower(): value for name, _, value in (line.partition(": ") for line in header_lines)}
    try:
        value = json.loads(payload)
    except ValueError:
        value = payload
    return int(status_line.split(" ")[1]), parsed, value


class Sources:
    """A new loopback address per client: a client of its own to every bucket."""

    def __init__(self) -> None:
        self.n = 1

    def next(self) -> str:
        self.n += 1
        return f"127.0.0.{self.n}"


# --- every spelling of a target draws from the same bucket --------------------------------------

BODIES = {"/api/voice/connect": b"[", "/api/voice/session": b"[", "/api/voice/refresh-brain": b"[",
          "/api/voice/login": json.dumps({"token": "a-wrong-guess"}).encode()}


async def test_every_spelling_of_a_costly_post_is_limited_as_its_origin_form(journal, tmp_path):
    """``POST http://x/api/voice/connect`` was 30 × 200 where the origin form
    got 24 × 429: the limit keyed on the raw target, the router on its path."""
    sources = Sources()
    async with real_server_for(journal, tmp_path, api_token=TOKEN, rate_limit_burst=3,
                               rate_limit_per_s=NO_REFILL) as server:
        port = server["port"]
        for path in COSTLY:
            answered = {}
            for name, target in _spellings(path, port).items():
                source = sources.next()
                statuses = [(await _send(port, source, "POST", target, body=BODIES[path], Authorization=BEARER))[0]
                            for _ in range(6)]
                answered[name] = statuses
            expected = 401 if path.endswith("/login") else 400      # a bad body (a wrong token) still costs a try
            assert all(statuses == [expected] * 3 + [429] * 3 for statuses in answered.values()), (path, answered)
            # one client's bucket, whichever spelling drains it
            source = sources.next()
            for target in list(_spellings(path, port).values())[:3]:
                assert (await _send(port, source, "POST", target, body=BODIES[path],
                                    Authorization=BEARER))[0] == expected
            for target in _spellings(path, port).values():
                status, headers, body = await _send(port, source, "POST", target, body=BODIES[path],
                                                    Authorization=BEARER)
                assert (status, body) == (429, {"error": "too many requests"}), (path, target)
                assert int(headers["retry-after"]) > 60


async def test_a_plain_connect_in_absolute_form_takes_its_token(journal, tmp_path):
    """The connect answered below Quart (and from a connection's first read,
    below hypercorn) matched the raw target: in absolute form it went to
    Quart's route, which the limit did not key on either."""
    sources = Sources()
    async with real_server_for(journal, tmp_path, api_token=TOKEN, rate_limit_burst=2,
                               rate_limit_per_s=NO_REFILL) as server:
        port = server["port"]
        for n, target in enumerate(_spellings("/api/voice/connect", port).values()):
            source = sources.next()
            statuses = []
            for attempt in range(3):
                call_id = f"rtc_target_{n}_{attempt}"
                server["sim"].add_call(call_id)
                status, _headers, body = await _send(port, source, "POST", target, Authorization=BEARER,
                                                     body=json.dumps({"call_id": call_id}).encode())
                statuses.append((status, body))
            assert statuses == [(200, {"status": "connected"})] * 2 + [(429, {"error": "too many requests"})], target


async def test_sign_in_in_absolute_form_locks_out_as_the_origin_form(journal, tmp_path):
    """Thirty wrong tokens in absolute form were never throttled, and the
    right one still got in that way while the origin form was locked out."""
    sources = Sources()
    async with real_server_for(journal, tmp_path, api_token=TOKEN, rate_limit_per_s=NO_REFILL) as server:
        port = server["port"]
        wrong, right = BODIES["/api/voice/login"], json.dumps({"token": TOKEN}).encode()
        for target in _spellings("/api/voice/login", port).values():
            source = sources.next()
            statuses = [(await _send(port, source, "POST", target, body=wrong))[0] for _ in range(6)]
            assert statuses == [401] * 5 + [429], (target, statuses)
            for locked_out in _spellings("/api/voice/login", port).values():      # the right token too
                assert (await _send(port, source, "POST", locked_out, body=right))[0] == 429, (target, locked_out)
        status, headers, body = await _send(port, sources.next(), "POST", "http://x/api/voice/login", body=right)
        assert (status, body) == (200, {"signed_in": True, "token_required": True})
        assert "voiceactors_session=" in headers["set-cookie"]


MCP_LIST = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode()


async def test_what_each_spelling_reaches(journal, tmp_path):
    """Through hypercorn: the spellings Quart routes reach their route behind
    every guard (the token); the ones it does not route reach nothing."""
    sources = Sources()
    async with real_server_for(journal, tmp_path, api_token=TOKEN) as server:
        port = server["port"]
        source = sources.next()
        for target in _spellings("/api/voice/status", port).values():
            assert (await _send(port, source, "GET", target, Authorization=BEARER))[0] == 200, target
        source = sources.next()
        for target in _spellings("/api/voice/status", port).values():
            assert (await _send(port, source, "GET", target))[0] == 401, target          # no token: refused
        # not routed: a dot segment is no route (404 behind the token), doubled inner slashes redirect
        assert (await _send(port, source, "POST", "/api/voice/./connect", body=b"{}", Authorization=BEARER))[0] == 404
        status, headers, _ = await _send(port, source, "GET", "/api/voice//status", Authorization=BEARER)
        assert status == 308 and headers["location"].endswith("/api/voice/status")
        # /mcp in any spelling is the MCP endpoint (which answers a GET 405), not Quart's 404
        for target in _spellings("/mcp", port).values():
            assert (await _send(port, source, "GET", target, Authorization=BEARER))[0] == 405, target
            status, _headers, body = await _send(port, source, "POST", target, body=MCP_LIST, Authorization=BEARER,
                                                 Accept="application/json, text/event-stream")
            assert status == 200 and len(body["result"]["tools"]) == 9, (target, body)


# --- refused credentials, any route ------------------------------------------------------------


async def _guess(port: int, source: str, route: str, credential: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    if route == "/mcp":
        return await _send(port, source, "POST", route, body=MCP_LIST, Accept="application/json, text/event-stream",
                           **credential)
    return await _send(port, source, "GET", route, **credential)


GUESSES = {
    "bearer on /status": ("/api/voice/status", {"Authorization": "Bearer wrong-guess"}),
    "bearer on /observer-actions": ("/api/voice/observer-actions", {"Authorization": "Bearer wrong-guess"}),
    "bearer on /mcp": ("/mcp", {"Authorization": "Bearer wrong-guess"}),
    "cookie on /calls": ("/api/voice/calls", {"Cookie": "voiceactors_session=a-guessed-session-id"}),
}


async def test_wrong_tokens_on_any_route_draw_from_the_sign_ins_bucket(journal, tmp_path):
    """~214 guesses a second on ``GET /api/voice/status`` were never
    throttled, and a 401 on ``/mcp`` drew from no bucket."""
    sources = Sources()
    async with real_server_for(journal, tmp_path, api_token=TOKEN, trusted_proxies=("127.0.0.1",)) as server:
        port = server["port"]
        right = {"Authorization": BEARER}
        for name, (route, credential) in GUESSES.items():
            source = sources.next()
            statuses = [(await _guess(port, source, route, credential))[0] for _ in range(5)]
            assert statuses == [401] * 5, (name, statuses)
            status, headers, body = await _guess(port, source, route, credential)
            assert (status, body) == (429, {"error": "too many requests"}), name
            assert 55 <= int(headers["retry-after"]) <= 60, name
            # locked out before the comparison: the right token waits too, on every route
            for other in ("/api/voice/status", "/mcp", "/api/voice/connect"):
                assert (await _guess(port, source, other, right))[0] == 429, (name, other)
            server["sim"].add_call(f"rtc_locked_{source}")       # a connect too (answered below Quart)
            status, _headers, body = await _send(port, source, "POST", "/api/voice/connect", **right,
                                                 body=json.dumps({"call_id": f"rtc_locked_{source}"}).encode())
            assert (status, body) == (429, {"error": "too many requests"}), name
            # another client's right token still gets in
            assert (await _guess(port, sources.next(), route, right))[0] == 200, name
        # one bucket for all routes and the sign-in: three guesses here, two there, then none anywhere
        source = sources.next()
        for route, credential in [GUESSES["bearer on /status"]] * 3 + [GUESSES["bearer on /mcp"]] * 2:
            assert (await _guess(port, source, route, credential))[0] == 401
        assert (await _send(port, source, "POST", "/api/voice/login", body=BODIES["/api/voice/login"]))[0] == 429
        # the console's config tells a right token from a wrong one: the same bucket
        source = sources.next()
        for _ in range(5):
            status, _headers, body = await _send(port, source, "GET", "/api/voice/console-config",
                                                 Authorization="Bearer wrong-guess")
            assert status == 200 and body["signed_in"] is False
        assert (await _send(port, source, "GET", "/api/voice/console-config", Authorization=BEARER))[0] == 429
        # a stale session cookie (a restart signs everyone out) draws once: the console's config drops it
        source = sources.next()
        status, headers, body = await _send(port, source, "GET", "/api/voice/console-config",
                                            Cookie="voiceactors_session=from-before-a-restart")
        assert status == 200 and body["signed_in"] is False
        assert headers["set-cookie"].startswith("voiceactors_session=;") and "Max-Age=0" in headers["set-cookie"]
        # a request presenting nothing guessed nothing: never locked out by its 401s
        source = sources.next()
        assert [(await _send(port, source, "GET", "/api/voice/status"))[0] for _ in range(8)] == [401] * 8
        assert (await _send(port, source, "GET", "/api/voice/status", Authorization=BEARER))[0] == 200
        # behind a trusted proxy the bucket is the forwarded client's
        proxy, wrong = "127.0.0.1", GUESSES["bearer on /status"][1]
        for _ in range(5):
            await _guess(port, proxy, "/api/voice/status", {**wrong, "X-Forwarded-For": "10.9.8.7"})
        assert (await _guess(port, proxy, "/api/voice/status", {**right, "X-Forwarded-For": "10.9.8.7"}))[0] == 429
        assert (await _guess(port, proxy, "/api/voice/status", {**right, "X-Forwarded-For": "10.9.8.6"}))[0] == 200


# --- Last-Event-ID ------------------------------------------------------------------------------

@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
async def test_a_last_event_id_past_a_stream_ids_numbers_is_400(journal, tmp_path, redis_server):  # noqa: F811
    """``18446744073709551616-0`` passed the pattern, and Redis refusing it
    read as ``503 shared feed unreachable``."""
    async with real_server_for(journal, tmp_path, redis_url=redis_server.url) as server:
        port = server["port"]
        for event_id in ("18446744073709551616-0", "0-18446744073709551616", "99999999999999999999-1",
                         "18446744073709551615-18446744073709551615"):      # the last id: nothing follows it
            status, _headers, body = await _send(port, "127.0.0.2", "GET", "/api/voice/events?call_id=rtc_none",
                                                 Last_Event_ID=event_id)
            assert (status, body) == (400, {"error": "Last-Event-ID is invalid"}), event_id
        # the largest id with one after it: a valid one (no such call here)
        status, _headers, body = await _send(port, "127.0.0.2", "GET", "/api/voice/events?call_id=rtc_none",
                                             Last_Event_ID="18446744073709551615-18446744073709551614")
        assert (status, body) == (404, {"error": "call not found"})


# --- another origin of the same site -----------------------------------------------------------

SAME_SITE = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"}
DATA_GETS = ["/api/voice/observer-actions", "/api/voice/nav-hints?call_id=rtc_x", "/api/voice/events?call_id=rtc_x",
             "/api/voice/calls", "/api/voice/status"]


async def test_a_page_on_another_port_cannot_use_the_consoles_cookie(journal, tmp_path):
    """A same-site page (another port on localhost) drained
    ``/api/voice/observer-actions`` and opened event streams with the
    console's cookie: its GETs carry no ``Origin``, and ``SameSite=Strict``
    sends the cookie on the same site."""
    async with real_server_for(journal, tmp_path, api_token=TOKEN) as server:
        port = server["port"]
        status, headers, _ = await _send(port, "127.0.0.2", "POST", "/api/voice/login",
                                         body=json.dumps({"token": TOKEN}).encode(), Sec_Fetch_Site="same-origin")
        assert status == 200
        cookie = {"Cookie": headers["set-cookie"].split(";", 1)[0]}
        for path in DATA_GETS:
            status, _headers, body = await _send(port, "127.0.0.2", "GET", path, **cookie, **SAME_SITE)
            assert (status, body) == (403, {"error": "origin not allowed"}), path
        # what the console sends (fetch and EventSource: same-origin), a person's own navigation and no header
        for fetch_site in ("same-origin", "none", None):
            site = {"Sec-Fetch-Site": fetch_site} if fetch_site else {}
            status, _headers, body = await _send(port, "127.0.0.2", "GET", "/api/voice/observer-actions",
                                                 **cookie, **site)
            assert (status, body) == (200, {"actions": [], "consumed": True}), fetch_site
        # a top-level navigation to a page from that other port is fine
        status, _headers, _body = await _send(port, "127.0.0.2", "GET", "/", Sec_Fetch_Site="same-site",
                                              Sec_Fetch_Mode="navigate")
        assert status == 200


async def test_on_open_loopback_another_port_is_refused_too(journal, tmp_path):
    """Without a token there is no cookie to hold back: the same-site page
    needed none to drain the queue."""
    async with real_server_for(journal, tmp_path) as server:
        port = server["port"]
        for path in DATA_GETS:
            status, _headers, body = await _send(port, "127.0.0.2", "GET", path, **SAME_SITE)
            assert (status, body) == (403, {"error": "origin not allowed"}), path
        status, _headers, body = await _send(port, "127.0.0.2", "GET", "/api/voice/observer-actions",
                                             Sec_Fetch_Site="same-origin")
        assert (status, body) == (200, {"actions": [], "consumed": True})


# --- the one rule is Quart's --------------------------------------------------------------------

TARGETS = ["/api/voice/connect", "http://x/api/voice/connect", "http://x:1/api/voice/connect?a=b", "//api/voice/status",
           "///api/voice/status", "http://x//api/voice/status", "/api/voice/%63onnect", "/api/voice/status;x",
           "http://x/api/voice/status;x", "/api//voice/status", "/api/voice/./connect", "/%6Dcp", "http://x/mcp",
           "http://x", "http://x?y", "*", "/%2F%2Fapi/voice/status", "https://x/%2Fmcp",
           "/api/voice/status?x=http://y/z"]


def test_the_routed_path_is_the_path_quart_routes(tmp_path):
    """``targets.target_path`` (what every guard keys on) is the path Quart
    builds its request from, for the scope hypercorn gives it; pinned
    against Quart's own code (its ``_create_request_from_scope``), so an
    upgrade that changes either is seen here."""
    from urllib.parse import unquote

    from voiceactors.http import create_app
    from voiceactors.http.asgi import ClosingHTTPConnection
    from voiceactors.http.targets import scope_path, target_path
    from voiceactors.settings import Settings

    app = create_app(Settings(journal=tmp_path, state_dir=tmp_path / "state"))

    async def send(_message: Any) -> None:
        pass

    for target in TARGETS:
        raw = target.encode()
        path, _, query = raw.partition(b"?")
        scope = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http",
                 "path": unquote(path.decode("ascii")), "raw_path": path, "query_string": query, "root_path": "",
                 "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        request = ClosingHTTPConnection(app, scope)._create_request_from_scope(send)
        assert target_path(raw) == scope_path(scope) == request.path, target
