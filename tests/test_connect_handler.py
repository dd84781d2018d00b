"""Every request to ``/api/voice/connect`` is answered by its one handler
(``http/connect.py``), each exactly as the API's other routes would answer it.

``RECORDED`` holds those answers as they are on the wire (status line,
headers in order but the date, body: Quart's shapes, byte for byte), with
the route label its ``voiceactors_http_requests_total`` count went up by;
its ``http.request`` line is the one every API answer gets. Each case is
sent through both ways a connect arrives — a connection's first read below
hypercorn (``FirstReadConnect``) and hypercorn's ASGI call — and must get
exactly that, without Quart's request handling (``request_started`` is
never sent). Also pinned: the guards Quart's hook applies are the list the
handler applies; the rate limit takes one token per connect; the
connection after a first-read answer is hypercorn's, without a task of
hypercorn's for the connect; with a shared registry a connect wins its
lease in the request's task. Real app, actors and simulator on loopback.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any, AsyncIterator

import h11
import pytest
import trio
from quart import request_started

from test_context_calls import SIM_KEY, app_for, sim  # noqa: F401 - the simulator fixture
from calls_support import DAY
from redis_support import redis_server  # noqa: F401 - the fixture
from clock_support import serving
from voiceactors import metrics
from voiceactors.http.app import create_app, voice_state
from voiceactors.http.connect import CONNECT_PATH
from voiceactors.settings import Settings

JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Case:
    """One request (``_request``'s arguments) in one app (``SETTINGS``) and
    the answer recorded for it: its head's lines (``date: -`` for the date),
    its body and the route label it was counted under."""

    app: str
    name: str
    request: dict[str, Any]
    head: tuple[str, ...]
    body: bytes
    route: str


#: each app's settings, past ``_app``'s
SETTINGS: dict[str, dict[str, Any]] = {
    "open": dict(body_limit=4096),
    "token": dict(api_token="tok-123456", rate_limit_per_s=1.0, rate_limit_burst=50),
    "nokey": dict(openai_api_key_env=None),
    "limited": dict(rate_limit_per_s=0.001, rate_limit_burst=2),
    "cap": dict(max_calls=1),
}

#: in each app's order: a case may depend on those before it (the token
#: failures before a lock-out, the rate limit's tokens, the one call slot).
#: ``<uuid>``: a new request id (the one the answer names); ``<seconds>``: a
#: ``Retry-After`` of the bucket's wait (real time passes between cases).
RECORDED = [
    Case("open", "plain", dict(body=b'{"call_id": "rtc_rec_plain"}'), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "plain_close", dict(body=b'{"call_id": "rtc_rec_close"}', headers={"Connection": "close"}), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11", "Connection: close",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "greeting_first", dict(body=b'{"call_id": "rtc_rec_greet", "greeting": "first"}'), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "greeting_later", dict(body=b'{"call_id": "rtc_x", "greeting": "later"}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 39", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"greeting must be \\"first\\""}\n', "/api/voice/connect"),
    Case("open", "context_bad", dict(body=b'{"call_id": "rtc_x", "context": {"kind": "nope"}}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 71", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"context.kind must be one of day, entity, commitment, facet"}\n', "/api/voice/connect"),
    Case("open", "context_unknown", dict(body=b'{"call_id": "rtc_rec_ctx", "context": {"kind": "entity", "id": "nobody_here"}}'), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 89", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected","context":{"kind":"entity","verified":false,"reason":"not_found"}}\n', "/api/voice/connect"),
    Case("open", "credentials_bad", dict(body=b'{"call_id": "rtc_x", "credentials": 5}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 66", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"credentials must be an object of source name to token"}\n', "/api/voice/connect"),
    Case("open", "credentials_unknown", dict(body=b'{"call_id": "rtc_x", "credentials": {"nope": "tok"}}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 51", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"credentials name an unknown mcp source"}\n', "/api/voice/connect"),
    Case("open", "id_space", dict(body=b'{"call_id": "rtc bad"}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 31", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"call_id is invalid"}\n', "/api/voice/connect"),
    Case("open", "id_int", dict(body=b'{"call_id": 7}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 31", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"call_id is invalid"}\n', "/api/voice/connect"),
    Case("open", "id_empty", dict(body=b'{"call_id": ""}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 32", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"call_id is required"}\n', "/api/voice/connect"),
    Case("open", "id_missing", dict(body=b'{}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 32", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"call_id is required"}\n', "/api/voice/connect"),
    Case("open", "id_padded", dict(body=b'{"call_id": " rtc_rec_pad "}'), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "array", dict(body=b'[1]'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 47", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"request body must be a JSON object"}\n', "/api/voice/connect"),
    Case("open", "truncated", dict(body=b'{"call_id": "rtc_x"'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 44", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"request body must be valid JSON"}\n', "/api/voice/connect"),
    Case("open", "empty", dict(body=b''), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 44", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"request body must be valid JSON"}\n', "/api/voice/connect"),
    Case("open", "surrogate", dict(body=b'{"call_id": "\\ud800"}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 31", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"call_id is invalid"}\n', "/api/voice/connect"),
    Case("open", "text_plain", dict(headers={"Content-Type": "text/plain"}), (
         "HTTP/1.1 415 ", "content-type: application/json", "content-length: 50", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"content type must be application/json"}\n', "/api/voice/connect"),
    Case("open", "no_content_type", dict(headers={"Content-Type": None}), (
         "HTTP/1.1 415 ", "content-type: application/json", "content-length: 50", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"content type must be application/json"}\n', "/api/voice/connect"),
    Case("open", "json_suffix", dict(body=b'{"call_id": "rtc_rec_suffix"}', headers={"Content-Type": "application/vnd.x+json; charset=utf-8"}), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "cross_site", dict(headers={"Sec-Fetch-Site": "cross-site"}), (
         "HTTP/1.1 403 ", "content-type: application/json", "content-length: 39", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"cross-site request refused"}\n', "/api/voice/connect"),
    Case("open", "same_site", dict(headers={"Sec-Fetch-Site": "same-site"}), (
         "HTTP/1.1 403 ", "content-type: application/json", "content-length: 31", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"origin not allowed"}\n', "/api/voice/connect"),
    Case("open", "same_origin", dict(body=b'{"call_id": "rtc_rec_same"}', headers={"Sec-Fetch-Site": "same-origin"}), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "origin_evil", dict(headers={"Origin": "http://evil.example"}), (
         "HTTP/1.1 403 ", "content-type: application/json", "content-length: 31", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"origin not allowed"}\n', "/api/voice/connect"),
    Case("open", "origin_own", dict(body=b'{"call_id": "rtc_rec_orig"}', headers={"Origin": "http://127.0.0.1:{port}"}), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "host_evil", dict(host=b"evil.example"), (
         "HTTP/1.1 421 ", "content-type: application/json", "content-length: 29", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"host not allowed"}\n', "/api/voice/connect"),
    Case("open", "too_large", dict(body=b'{"call_id": "' + b"a" * 5000 + b'"}'), (
         "HTTP/1.1 413 ", "content-type: application/json", "content-length: 35", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"request body too large"}\n', "/api/voice/connect"),
    Case("open", "chunked", dict(body=b'{"call_id": "rtc_rec_chunk"}', chunked=True), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "chunked_large", dict(body=b'{"call_id": "' + b"a" * 5000 + b'"}', chunked=True), (
         "HTTP/1.1 413 ", "content-type: application/json", "content-length: 35", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"request body too large"}\n', "/api/voice/connect"),
    Case("open", "no_request_id", dict(body=b'{"call_id": "rtc_rec_noid"}', headers={"X-Request-Id": None}), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: <uuid>",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "bad_request_id", dict(body=b'{"call_id": "rtc_rec_badid"}', headers={"X-Request-Id": "bad id!"}), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: <uuid>",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("open", "get", dict(method=b"GET", body=None), (
         "HTTP/1.1 405 ", "content-type: application/json", "content-length: 31", "allow: POST",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"method not allowed"}\n', "unmatched"),
    Case("open", "head", dict(method=b"HEAD", body=None), (
         "HTTP/1.1 405 ", "content-type: application/json", "content-length: 31", "allow: POST",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'', "unmatched"),
    Case("open", "put", dict(method=b"PUT"), (
         "HTTP/1.1 405 ", "content-type: application/json", "content-length: 31", "allow: POST",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"method not allowed"}\n', "unmatched"),
    Case("open", "token_given_open", dict(body=b'{"call_id": "rtc_rec_tok"}', headers={"Authorization": "Bearer whatever"}), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("token", "no_token", dict(), (
         "HTTP/1.1 401 ", "content-type: application/json", "content-length: 25", "www-authenticate: Bearer",
         "connection: close", "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"unauthorized"}\n', "/api/voice/connect"),
    Case("token", "wrong_token", dict(headers={"Authorization": "Bearer nope"}), (
         "HTTP/1.1 401 ", "content-type: application/json", "content-length: 25", "www-authenticate: Bearer",
         "connection: close", "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"unauthorized"}\n', "/api/voice/connect"),
    Case("token", "right_token", dict(body=b'{"call_id": "rtc_rec_right"}', headers={"Authorization": "Bearer tok-123456"}), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("token", "right_token_bad_json", dict(body=b'{', headers={"Authorization": "Bearer tok-123456"}), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 44", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"request body must be valid JSON"}\n', "/api/voice/connect"),
    Case("token", "host_evil_token", dict(host=b"evil.example"), (
         "HTTP/1.1 421 ", "content-type: application/json", "content-length: 29", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"host not allowed"}\n', "/api/voice/connect"),
    Case("token", "cross_site_token", dict(headers={"Sec-Fetch-Site": "cross-site"}), (
         "HTTP/1.1 403 ", "content-type: application/json", "content-length: 39", "connection: close",
         "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"cross-site request refused"}\n', "/api/voice/connect"),
    Case("token", "wrong_token_2", dict(headers={"Authorization": "Bearer nope2"}), (
         "HTTP/1.1 401 ", "content-type: application/json", "content-length: 25", "www-authenticate: Bearer",
         "connection: close", "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"unauthorized"}\n', "/api/voice/connect"),
    Case("token", "wrong_token_3", dict(headers={"Authorization": "Bearer nope3"}), (
         "HTTP/1.1 401 ", "content-type: application/json", "content-length: 25", "www-authenticate: Bearer",
         "connection: close", "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"unauthorized"}\n', "/api/voice/connect"),
    Case("token", "wrong_token_4", dict(headers={"Authorization": "Bearer nope4"}), (
         "HTTP/1.1 401 ", "content-type: application/json", "content-length: 25", "www-authenticate: Bearer",
         "connection: close", "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"unauthorized"}\n', "/api/voice/connect"),
    Case("token", "wrong_token_5", dict(headers={"Authorization": "Bearer nope5"}), (
         "HTTP/1.1 401 ", "content-type: application/json", "content-length: 25", "www-authenticate: Bearer",
         "connection: close", "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"unauthorized"}\n', "/api/voice/connect"),
    Case("token", "locked_right_token", dict(body=b'{"call_id": "rtc_rec_locked"}', headers={"Authorization": "Bearer tok-123456"}), (
         "HTTP/1.1 429 ", "content-type: application/json", "content-length: 30", "retry-after: <seconds>",
         "connection: close", "x-request-id: req-rec", "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"too many requests"}\n', "/api/voice/connect"),
    Case("nokey", "no_key", dict(), (
         "HTTP/1.1 503 ", "content-type: application/json", "content-length: 60", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"voice unavailable \xe2\x80\x94 openai key not configured"}\n', "/api/voice/connect"),
    Case("nokey", "no_key_bad_id", dict(body=b'{"call_id": "a b"}'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 31", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"call_id is invalid"}\n', "/api/voice/connect"),
    Case("limited", "limited_1", dict(body=b'{"call_id": "rtc_rec_lim1"}'), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("limited", "limited_bad_json", dict(body=b'{'), (
         "HTTP/1.1 400 ", "content-type: application/json", "content-length: 44", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"request body must be valid JSON"}\n', "/api/voice/connect"),
    Case("limited", "limited_3", dict(body=b'{"call_id": "rtc_rec_lim3"}'), (
         "HTTP/1.1 429 ", "content-type: application/json", "content-length: 30", "connection: close",
         "retry-after: <seconds>", "cache-control: no-store", "x-request-id: <uuid>", "date: -",
         ), b'{"error": "too many requests"}', "rate_limited"),
    Case("cap", "cap_first", dict(body=b'{"call_id": "rtc_rec_cap_a"}'), (
         "HTTP/1.1 200 ", "content-type: application/json", "content-length: 23", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"status":"connected"}\n', "/api/voice/connect"),
    Case("cap", "cap_second", dict(body=b'{"call_id": "rtc_rec_cap_b"}'), (
         "HTTP/1.1 503 ", "content-type: application/json", "content-length: 30", "x-request-id: req-rec",
         "cache-control: no-store", "date: -", "server: hypercorn-h11",
         ), b'{"error":"voice at capacity"}\n', "/api/voice/connect"),
]


def _request(port: int, *, body: bytes | None = b'{"call_id": "rtc_cap"}', headers: dict[str, str | None] | None = None,
             method: bytes = b"POST", host: bytes | None = None, chunked: bool = False) -> bytes:
    """A connect's bytes: JSON declared, ``X-Request-Id: req-rec``, the
    body's length (or chunked), each of ``headers`` added (None: left out)."""
    fields = {**JSON, "X-Request-Id": "req-rec", **(headers or {})}
    lines = [method + b" /api/voice/connect HTTP/1.1", b"Host: " + (host or b"127.0.0.1:%d" % port)]
    lines += [f"{name}: {value.format(port=port)}".encode() for name, value in fields.items() if value is not None]
    payload = body or b""
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
        payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
    elif body is not None:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


def _app(journal: Any, tmp_path: Any, sim: Any, **changes: Any) -> Any:  # noqa: F811
    """``app_for``'s app, any of its settings changeable."""
    base: dict[str, Any] = dict(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                                openai_base_url=sim.base_url, rate_limit_per_s=0, close_deadline_s=1.0)
    return create_app(Settings(**{**base, **changes}))


class QuartRequests:
    """Counts the requests Quart's own handling started."""

    def __init__(self) -> None:
        self.count = 0

    async def started(self, _sender: Any, **_kwargs: Any) -> None:   # blinker awaits a coroutine function
        self.count += 1


@pytest.fixture
def quart_requests():
    counter = QuartRequests()
    request_started.connect(counter.started, weak=False)
    yield counter
    request_started.disconnect(counter.started)


@contextlib.asynccontextmanager
async def _served(app) -> AsyncIterator[int]:
    """``app`` served through ``serving.serve`` on a loopback port (yielded)
    until the block ends."""
    from hypercorn.config import Config

    from voiceactors.http.serving import serve

    config = Config()
    config.bind = ["127.0.0.1:0"]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(app, config, max_connections=0,
                                                              shutdown_trigger=stop.wait, task_status=task_status))
        try:
            yield int(binds[0].rsplit(":", 1)[1])
        finally:
            stop.set()


async def _answer(port: int, request: bytes) -> bytes:
    """``request`` sent on a fresh connection; the whole answer (its
    ``Content-Length``, or until the server closes)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = b""
    with trio.fail_after(10):
        await stream.send_all(request)
        while True:
            chunk = await stream.receive_some()
            if not chunk:
                break
            data += chunk
            head, blank, rest = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length: (\d+)\r?$", head)
            if blank and (request.startswith(b"HEAD ") or (length and len(rest) >= int(length.group(1)))):
                break
    await stream.aclose()
    return data


def _counts() -> dict[str, float]:
    """``voiceactors_http_requests_total`` by ``"<route> <status>"``."""
    text = metrics.render()[0].decode()
    return {f"{m.group(1)} {m.group(2)}": float(m.group(3))
            for m in re.finditer(r'^voiceactors_http_requests_total\{route="([^"]*)",status="(\d+)"\} (\S+)$', text, re.M)}


def _lines(log_stream: Any, start: int) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log_stream.getvalue()[start:].splitlines() if line.strip()]
    for line in lines:
        line.pop("timestamp", None)
        line.pop("duration_ms", None)
    return [line for line in lines if line["event"].startswith("http.")]


UUID = re.compile(r"^[0-9a-f]{32}$")


def _expected_line(case: Case, method: str, request_id: str) -> dict[str, Any]:
    if case.route == "rate_limited":             # the early 429's summary line (asgi.py), no request line
        return {"actor": "http", "refused": 1, "event": "http.rate_limited", "level": "warning"}
    status = int(case.head[0].split()[1])
    return {"actor": "http", "method": method, "path": CONNECT_PATH, "status": status, "request_id": request_id,
            "event": "http.request", "level": "info"}


@pytest.mark.parametrize("first_read", [True, False], ids=["first-read", "hypercorn"])
@pytest.mark.parametrize("app_name", list(SETTINGS))
async def test_every_request_gets_the_recorded_answer(make_sample, tmp_path, sim, pin_today, log_stream,  # noqa: F811
                                                      quart_requests, app_name, first_read):
    pin_today(DAY.isoformat())
    cases = [case for case in RECORDED if case.app == app_name]
    for case in cases:
        known = re.search(rb'"call_id": " ?(rtc_rec_\w+)', case.request.get("body") or b"")
        if known:
            sim.add_call(known.group(1).decode(), [{"sleep": 5}, {"close": 1000}])
    app = _app(make_sample(days=3), tmp_path, sim, **SETTINGS[app_name])
    if not first_read:
        app.first_read_answer = None             # serving.serve: every connection straight to hypercorn
    async with _served(app) as port:
        for case in cases:
            request = _request(port, **case.request)
            before, start = _counts(), len(log_stream.getvalue())
            answer = await _answer(port, request)
            await trio.sleep(0.05)               # the server's log line after its last write
            head, _, body = answer.partition(b"\r\n\r\n")
            lines = re.sub(rb"(?m)^date: [^\r]*", b"date: -", head).decode().split("\r\n")
            request_id = next(line.split(": ")[1] for line in lines if line.lower().startswith("x-request-id: "))
            retry_after = next((line.split(": ")[1] for line in lines if line.startswith("retry-after: ")), "")
            assert retry_after == "" or 1 <= int(retry_after) <= 1000, case.name   # the bucket's refill: real time
            expected_head = [line.replace("<uuid>", request_id).replace("<seconds>", retry_after) for line in case.head]
            assert (lines, body) == (expected_head, case.body), case.name
            assert request_id in ("req-rec",) or UUID.match(request_id), case.name
            method = request.split(b" ", 1)[0].decode()
            assert _lines(log_stream, start) == [_expected_line(case, method, request_id)], case.name
            after = _counts()
            counted = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
            assert counted == {f"{case.route} {case.head[0].split()[1]}": 1}, case.name
    assert quart_requests.count == 0


async def test_the_rate_limit_takes_one_token_per_connect(make_sample, tmp_path, sim, pin_today):  # noqa: F811
    pin_today(DAY.isoformat())
    app = _app(make_sample(days=3), tmp_path, sim, rate_limit_per_s=0.001, rate_limit_burst=2)
    for n in range(2):
        sim.add_call(f"rtc_limit_{n}", [{"sleep": 0.2}, {"close": 1000}])
    async with serving(app) as test_app:
        client = test_app.test_client()
        statuses = []
        for body in (b'{"call_id": "rtc_limit_0"}', b'{"call_id": "rtc_limit_1"}', b'{"call_id": "rtc_limit_0"}'):
            response = await client.post("/api/voice/connect", data=body,
                                          headers={**JSON, "Content-Length": str(len(body))})
            statuses.append(response.status_code)
    assert statuses == [200, 200, 429]


def test_quarts_hook_applies_the_guards_the_connect_handler_applies(tmp_path):
    """One ordered list of guards (``guards.declared``), applied by Quart's
    one guard hook and by the connect's handler; the app's hooks pinned
    (with a token required: every guard declared)."""
    app = create_app(Settings(journal=tmp_path, state_dir=tmp_path / "state", api_token="tok-123456"))
    before = [hook.__name__ for hook in app.before_request_funcs[None]]
    after = [hook.__name__ for hook in app.after_request_funcs[None]]
    assert before == ["_begin", "_guards"]
    assert sorted(after) == ["_finish", "_settle_login"]
    assert set(app.before_request_funcs) == {None} and set(app.after_request_funcs) == {None}
    assert app.connect.guards is app.guards
    assert [guard.__name__ for guard in app.guards] == ["guard", "guard", "browser_guard", "guard", "guard"]
    assert [guard.__qualname__.split(".")[0] for guard in app.guards] == [
        "body_limit", "own_host_and_origin", "browser_guard", "require_token", "rate_limit"]
    rules = {rule.rule for rule in app.url_map.iter_rules()}
    assert CONNECT_PATH not in rules                   # not a Quart route: its handler takes every method


class HypercornTasks(trio.abc.Instrument):
    """Counts the tasks hypercorn spawns (its connection's, its app's)."""

    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: Any) -> None:
        if task.name.startswith("hypercorn."):
            self.count += 1


def _connect_request(port: int, call_id: str, *, close: bool) -> bytes:
    return _request(port, body=json.dumps({"call_id": call_id}).encode(), headers={"X-Request-Id": "req-wire",
                    "Connection": "close" if close else None})


CONNECTED_HEAD = (b"HTTP/1.1 200 \r\ncontent-type: application/json\r\ncontent-length: 23\r\nx-request-id: req-wire\r\n"
                  b"cache-control: no-store\r\ndate: -\r\nserver: hypercorn-h11\r\n")
CONNECTED_BODY = b'{"status":"connected"}\n'


def _without_date(response: bytes) -> bytes:
    return re.sub(rb"\r\ndate: [^\r]*", b"\r\ndate: -", response)


async def test_below_hypercorn_a_connect_takes_no_task_of_hypercorns_and_the_connection_goes_on(
        make_sample, tmp_path, sim, pin_today):  # noqa: F811
    """Through ``serving.serve``: a connect whole in the first read is
    answered without a task of hypercorn's, with ``Connection: close`` when
    asked, and kept alive otherwise (the next request on the connection is
    hypercorn's)."""
    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=3), tmp_path, sim)
    for n in range(2):
        sim.add_call(f"rtc_wire_{n}", [{"sleep": 0.2}, {"close": 1000}])
    hypercorn_tasks = HypercornTasks()
    async with _served(app) as port:
        assert app.first_read_answer(lambda: []).watching("127.0.0.1")
        trio.lowlevel.add_instrument(hypercorn_tasks)
        closed = await _answer(port, _connect_request(port, "rtc_wire_0", close=True))
        trio.lowlevel.remove_instrument(hypercorn_tasks)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_connect_request(port, "rtc_wire_1", close=False))
        first = b""
        with trio.fail_after(10):
            while not first.endswith(b"\n"):
                first += await stream.receive_some()
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % port)
            second = b""
            while chunk := await stream.receive_some():
                second += chunk
        await stream.aclose()
    assert hypercorn_tasks.count == 0
    assert _without_date(closed) == CONNECTED_HEAD + b"Connection: close\r\n\r\n" + CONNECTED_BODY
    assert _without_date(first) == CONNECTED_HEAD + b"\r\n" + CONNECTED_BODY
    assert second.startswith(b"HTTP/1.1 200 ") and b"voiceactors_" in second


def _request_lines(log_stream: Any) -> list[dict]:
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line["event"] == "http.request"]


async def test_with_a_shared_registry_a_connect_wins_its_lease_in_the_requests_task(
        make_sample, tmp_path, sim, pin_today, redis_server, log_stream, quart_requests):  # noqa: F811
    """``--redis`` (every worker): the lease is won in the request's task
    (``Runtime.connect_leased``), below hypercorn and at the ASGI layer
    (the test client); its call's actor runs in the supervisor's context
    (its lines carry no request id); Redis down gives the route's 503."""
    pin_today(DAY.isoformat())
    app = _app(make_sample(days=3), tmp_path, sim, redis_url=redis_server.url)
    for call_id in ("rtc_shared_first", "rtc_shared_asgi"):
        sim.add_call(call_id, [{"sleep": 0.3}, {"close": 1000}])
    hypercorn_tasks = HypercornTasks()
    async with _served(app) as port:
        runtime = voice_state(app).runtime
        assert runtime.connect_now is None and runtime.connect_leased is not None
        trio.lowlevel.add_instrument(hypercorn_tasks)
        first = await _answer(port, _connect_request(port, "rtc_shared_first", close=True))
        trio.lowlevel.remove_instrument(hypercorn_tasks)
        client = app.test_client()
        headers = {**JSON, "X-Request-Id": "req-wire", "Content-Length": "30"}
        response = await client.post(CONNECT_PATH, data=b'{"call_id": "rtc_shared_asgi"}', headers=headers)
        via_asgi = response.status_code, [(k.lower(), v) for k, v in response.headers.items()], await response.get_data()
        supervisor = runtime.actors["calls"]
        assert {supervisor.registry.lease_of(c).call_id for c in ("rtc_shared_first", "rtc_shared_asgi")} == {
            "rtc_shared_first", "rtc_shared_asgi"}                 # both leased here
        with trio.fail_after(10):
            while supervisor.calls:
                await trio.sleep(0.01)
        redis_server.stop()
        down = await _answer(port, _connect_request(port, "rtc_shared_down", close=True))
    assert hypercorn_tasks.count == 0 and quart_requests.count == 0
    assert _without_date(first) == CONNECTED_HEAD + b"Connection: close\r\n\r\n" + CONNECTED_BODY
    assert via_asgi == (200, [("content-type", "application/json"), ("content-length", "23"),
                              ("x-request-id", "req-wire"), ("cache-control", "no-store")], CONNECTED_BODY)
    assert _without_date(down) == (
        b"HTTP/1.1 503 \r\ncontent-type: application/json\r\ncontent-length: 60\r\nx-request-id: req-wire\r\n"
        b"cache-control: no-store\r\ndate: -\r\nserver: hypercorn-h11\r\nConnection: close\r\n\r\n"
        + '{"error":"voice unavailable — call registry unreachable"}\n'.encode())
    assert {call_id for call_id, _reason in supervisor.ended} == {"rtc_shared_first", "rtc_shared_asgi"}
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.strip()]
    call_lines = [line for line in lines if line.get("call_id") == "rtc_shared_first" and line["event"].startswith("call.")]
    assert call_lines and not any("request_id" in line for line in call_lines)
    assert [line["status"] for line in _request_lines(log_stream)] == [200, 200, 503]


@pytest.mark.parametrize("request_head", [b"", b"Connection: close\r\n", b"Connection: keep-alive, close\r\n",
                                          b"Connection: keep-alive\r\n"])
@pytest.mark.parametrize("app_connection", [None, b"close", b"keep-alive", b"close, upgrade"])
def test_the_first_read_answer_is_written_as_h11_writes_it(request_head, app_connection):
    """``connect.answer_bytes`` (written without ``h11.Connection.send``,
    for its CPU) is byte for byte h11's, and closes when h11 would."""
    from voiceactors.http.connect import answer_bytes

    data = b"POST /api/voice/connect HTTP/1.1\r\nHost: x\r\n%sContent-Length: 2\r\n\r\n{}" % request_head
    body = b'{"error":"x"}\n'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if app_connection is not None:
        headers.append((b"connection", app_connection))
    headers += [(b"x-request-id", b"r"), (b"date", b"Sun, 06 Dec 2026 06:00:00 GMT"), (b"server", b"hypercorn-h11")]
    ours, theirs = h11.Connection(h11.SERVER), h11.Connection(h11.SERVER)
    for connection in (ours, theirs):
        connection.receive_data(data)
        while not isinstance(connection.next_event(), h11.EndOfMessage):
            pass
    written = theirs.send(h11.Response(status_code=415, headers=headers)) + theirs.send(h11.Data(data=body))
    written += theirs.send(h11.EndOfMessage())
    assert answer_bytes(ours, 415, headers, body) == (written, theirs.our_state is h11.MUST_CLOSE)
