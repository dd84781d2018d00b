"""Bad input over HTTP: property-based fuzzing against our OpenAPI document,
and the malformed requests people and browsers really send.

One real server for the module: hypercorn's trio worker on loopback (the app
is Quart-Trio, so it runs under trio, in its own thread), with the Realtime
simulator in the same trio run standing in for OpenAI. Schemathesis reads
``voiceactors/http/openapi.json`` and sends positive and negative cases to
every operation (``max_examples`` 30 per operation, deterministic); every
response must be documented (status, content type, body schema), none may be
a 5xx, and every error body must be exactly ``{"error": "<message>"}``.

Then explicit cases: invalid UTF-8, wrong content types, deeply nested and
huge JSON, oversized bodies (declared and streamed), unicode and control
characters in ``call_id``, methods and paths that do not exist.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import queue
import socket
import threading
from typing import Any, Iterator

import httpx
import pytest
import schemathesis
import structlog
import trio
from hypothesis import HealthCheck, settings as hsettings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from voiceactors import logs
from voiceactors.http import create_app
from voiceactors.http import errors as E
from voiceactors.http.app import routes_served
from voiceactors.http.routes import openapi_document, openapi_path
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator
from voiceactors.server import run_server
from voiceactors.settings import Settings

DAY = dt.date(2026, 3, 27)
KEY = "sk-test-fuzz-0a1b2c3d4e5f"
BODY_LIMIT = 64 * 1024
WEBHOOK_SECRET = "whsec_" + "Zm96ei13ZWJob29rLXNlY3JldA=="
WEBHOOK_REFUSALS = {E.WEBHOOK_UNSIGNED, E.WEBHOOK_FORGED, E.WEBHOOK_STALE, E.WEBHOOK_MALFORMED}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A real server on an ephemeral loopback port, in a thread with its own
    trio run; stopped (gracefully) at the end of the module."""
    tmp = tmp_path_factory.mktemp("fuzz")
    journal = write_sample_journal(tmp / "journal", days=2, today=DAY)
    buffer = io.StringIO()
    logs.configure("json", "info", stream=buffer)
    ready: queue.Queue = queue.Queue()

    async def main() -> None:
        sim = Simulator(None, api_key=KEY)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.serve, 0)
            settings = Settings(journal=journal, state_dir=tmp / "state", port=0, openai_api_key_env=KEY,
                                openai_base_url=sim.base_url, mint_timeout_s=3.0, brain_ready_wait_s=5.0,
                                # the phone webhook configured: fuzzed deliveries meet its signature check
                                openai_webhook_secret_env=WEBHOOK_SECRET,
                                shutdown_deadline_s=3.0, close_deadline_s=1.0, body_limit=BODY_LIMIT,
                                # thousands of POSTs from one client: the rate limit is
                                # tests/test_http_hardening.py's subject, not this module's
                                rate_limit_per_s=0)

            async def serve(task_status=trio.TASK_STATUS_IGNORED) -> None:
                await run_server(settings, shutdown_trigger=stop.wait, task_status=task_status)
                nursery.cancel_scope.cancel()

            [base] = await nursery.start(serve)
            ready.put({"base": base, "stop": stop, "token": trio.lowlevel.current_trio_token(), "sim": sim})

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True, name="fuzz-server")
    thread.start()
    info = ready.get(timeout=30)
    info["log"] = buffer
    try:
        yield info
    finally:
        trio.from_thread.run_sync(info["stop"].set, trio_token=info["token"])
        thread.join(30)
        structlog.reset_defaults()
    assert not thread.is_alive(), "the server did not stop"


def assert_error_shape(response: Any) -> None:
    """An error is JSON, exactly ``{"error": "<non-empty message>"}``."""
    content_type = response.headers.get("content-type", "")
    if isinstance(content_type, list):      # schemathesis' Response: name -> list of values
        content_type = content_type[0] if content_type else ""
    assert content_type.startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"], body


# --- the document matches the server ------------------------------------------------------

def test_openapi_document_lists_exactly_the_served_routes(tmp_path):
    app = create_app(Settings(journal=tmp_path, state_dir=tmp_path / "state"))
    served = {(method, openapi_path(rule)) for rule, method in routes_served(app)}
    documented = {(method.upper(), path) for path, ops in openapi_document()["paths"].items() for method in ops}
    assert served == documented


def test_the_served_document_is_the_static_file(server):
    response = httpx.get(server["base"] + "/api/voice/openapi.json", timeout=10)
    assert response.status_code == 200 and response.json() == openapi_document()


# --- schemathesis ---------------------------------------------------------------------------

schema = schemathesis.openapi.from_dict(openapi_document())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=30,
                                deterministic=True, database="none")


@schema.parametrize()
@hsettings(max_examples=30, deadline=None, derandomize=True, database=None,
           suppress_health_check=list(HealthCheck))
def test_fuzz_every_operation(case, server):
    response = case.call(base_url=server["base"], timeout=15)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
    if response.status_code >= 400:
        assert_error_shape(response)
    # Source names are configuration, and the calls a server recorded its state,
    # which no schema can list: a schema-valid ``credentials`` naming a source
    # this server lacks, or ``continues`` naming a call it has no record of (or
    # one that did not end at its time limit), is a documented 400.
    refused_by_state = response.status_code == 400 and response.json() in (
        {"error": E.CREDENTIALS_UNKNOWN_SOURCE}, {"error": E.CONTINUES_UNKNOWN}, {"error": E.CONTINUES_NOT_AT_LIMIT})
    # Nor can a schema sign a phone webhook (an HMAC under the server's secret):
    # a schema-valid delivery without the signature is a documented 400.
    unsigned = response.status_code == 400 and response.json()["error"] in WEBHOOK_REFUSALS
    case.validate_response(response, excluded_checks=[positive_data_acceptance] if refused_by_state or unsigned
                           else None)


def test_fuzzing_left_no_unhandled_error_in_the_log(server):
    # runs after the fuzz cases (file order): a 500 "internal error" would have logged this
    text = server["log"].getvalue()
    assert '"http.unhandled_error"' not in text
    requests = [json.loads(line) for line in text.splitlines() if '"event": "http.request"' in line]
    statuses = {line["status"] for line in requests}
    assert len(requests) >= 100 and 400 in statuses and 200 in statuses, (len(requests), statuses)
    assert all(status < 500 for status in statuses)


# --- explicit bad input -----------------------------------------------------------------------

JSON = {"Content-Type": "application/json"}
POSTS = ["/api/voice/session", "/api/voice/connect", "/api/voice/refresh-brain"]


@pytest.fixture(scope="module")
def client(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server["base"], timeout=15) as c:
        yield c


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize("raw", [
    b"\xff\xfe\xfd", b'{"call_id": "\xff\xfe"}', b'{"call_id": "rtc_\xc3"}',
    b"\x00", b'{"call_id": "rtc_1"}\x00', b"\xc0\xaf",
])
def test_invalid_utf8_and_odd_bytes_are_400(client, path, raw):
    response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, (raw, response.text)
    assert_error_shape(response)


@pytest.mark.parametrize("raw", [
    b"\xef\xbb\xbf{}",                                          # UTF-8 with a byte order mark
    "{}".encode("utf-16"), "{}".encode("utf-32"),                # other JSON encodings (RFC 8259 decoders detect them)
    b'{"call_id": "\\ud800"}',                                 # an escaped lone surrogate
    b'{"call_id": "\xed\xa0\x80"}',                             # a UTF-8-encoded surrogate (json uses surrogatepass)
])
def test_other_encodings_decode_as_json_and_call_ids_stay_strict(client, raw):
    """Recorded behaviour: ``json.loads`` detects UTF-8-BOM/16/32, so these
    are objects — accepted where a body is optional, and a call id must
    still match ``^[A-Za-z0-9_-]{1,128}$``."""
    assert client.post("/api/voice/session", content=raw, headers=JSON).status_code == 200
    response = client.post("/api/voice/connect", content=raw, headers=JSON)
    assert response.status_code == 400
    assert response.json()["error"] in ("call_id is required", "call_id is invalid")


@pytest.mark.parametrize("content_type, raw", [
    ("text/plain", b"call_id=rtc_1"),
    ("application/x-www-form-urlencoded", b"call_id=rtc_1"),
    ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data; name=\"call_id\"\r\n\r\n"
                                          b"rtc_1\r\n--xyz--\r\n"),
    ("application/xml", b"<call_id>rtc_1</call_id>"),
    ("", b"call_id=rtc_1"),
])
def test_bodies_not_declared_json_are_415(client, content_type, raw):
    for path in POSTS:
        response = client.post(path, content=raw, headers={"Content-Type": content_type} if content_type else {})
        assert response.status_code == 415, (path, content_type, response.text)
        assert response.json() == {"error": "content type must be application/json"}


def test_json_sent_as_text_plain_is_refused(client, server):
    """A cross-site page can POST ``text/plain`` to a loopback server without a
    CORS preflight; such a body once passed as JSON (a page could mint sessions)."""
    server["sim"].add_call("rtc_text_plain")
    response = client.post("/api/voice/connect", content=b'{"call_id": "rtc_text_plain"}',
                           headers={"Content-Type": "text/plain"})
    assert response.status_code == 415 and response.json() == {"error": "content type must be application/json"}
    assert server["sim"].calls["rtc_text_plain"].connections == 0


def test_requests_a_browser_marks_cross_site_are_403(client):
    for path in POSTS:
        response = client.post(path, content=b"", headers={"Sec-Fetch-Site": "cross-site"})
        assert response.status_code == 403 and response.json() == {"error": "cross-site request refused"}
    response = client.get("/api/voice/status", headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 403
    response = client.get("/api/voice/status", headers={"Sec-Fetch-Site": "same-origin"})
    assert response.status_code == 200


@pytest.mark.parametrize("path", POSTS)
def test_deeply_nested_json_is_400_or_ignored_never_a_crash(client, path):
    for raw in (b"[" * 30_000 + b"]" * 30_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000):
        assert len(raw) < BODY_LIMIT
        response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, (path, response.text)
        assert_error_shape(response)
    # nested, but within what a parser handles: an object the session ignores
    nested = json.dumps(json.loads('{"a":' * 200 + "1" + "}" * 200)).encode()
    response = client.post(path, content=nested, headers={"Content-Type": "application/json"})
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert_error_shape(response)


def test_huge_json_just_under_the_limit_is_handled(client):
    wide = json.dumps({f"k{i}": i for i in range(4000)}).encode()            # ~57 KiB, 4000 keys
    assert len(wide) < BODY_LIMIT
    assert client.post("/api/voice/session", content=wide, headers=JSON).status_code == 200
    response = client.post("/api/voice/connect", content=wide, headers=JSON)
    assert response.status_code == 400 and response.json() == {"error": "call_id is required"}
    long_id = json.dumps({"call_id": "r" * 60_000}).encode()
    response = client.post("/api/voice/connect", content=long_id, headers=JSON)
    assert response.status_code == 400 and response.json() == {"error": "call_id is invalid"}


@pytest.mark.parametrize("path", POSTS)
def test_oversized_bodies_are_413_json(client, path):
    big = b'{"x": "' + b"a" * (BODY_LIMIT + 10) + b'"}'
    response = client.post(path, content=big, headers={"Content-Type": "application/json"})   # declared length
    assert response.status_code == 413 and response.json() == {"error": "request body too large"}

    def chunks() -> Iterator[bytes]:            # no Content-Length: chunked, bounded while reading
        for start in range(0, len(big), 8192):
            yield big[start:start + 8192]

    response = client.post(path, content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json() == {"error": "request body too large"}


def test_a_declared_huge_length_is_refused_before_the_body_is_read(server):
    """``Content-Length: 10 GB`` and no body: refused at once, 413 JSON, connection closed."""
    host, port = server["base"].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST /api/voice/connect HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
                     + b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body) == {"error": "request body too large"}


BAD_CALL_IDS = [
    "rtc_\u00e9", "rtc_\u0430bc", "rtc_\U0001F600", "rtc\u200b1", "rtc_\u202e1", "rtc\x001", "rtc\n1",
    "rtc\r\nX-Injected: 1", "rtc\t1", "rtc 1", "\x7f", "rtc/../../etc", "../x", "rtc%2e%2e", "rtc.1",
    "rtc;1", "rtc'1", "rtc\"1", "\ufeffrtc", "r" * 129, "\u3000",
]


@pytest.mark.parametrize("call_id", BAD_CALL_IDS)
def test_unicode_and_control_characters_in_call_id_are_400(client, call_id):
    response = client.post("/api/voice/connect", json={"call_id": call_id})
    assert response.status_code == 400, (call_id, response.text)
    assert response.json()["error"] in ("call_id is invalid", "call_id is required")
    for path in ("/api/voice/events", "/api/voice/nav-hints"):
        response = client.get(path, params={"call_id": call_id})
        assert response.status_code == 400, (path, call_id, response.text)
        assert_error_shape(response)


def test_a_padded_call_id_is_trimmed(client, server):
    server["sim"].add_call("rtc_padded")
    response = client.post("/api/voice/connect", json={"call_id": "  rtc_padded\t"})
    assert response.status_code == 200


@pytest.mark.parametrize("method, path, status", [
    ("PUT", "/api/voice/connect", 405), ("DELETE", "/api/voice/session", 405), ("PATCH", "/api/voice/status", 405),
    ("GET", "/api/voice/connect", 405), ("POST", "/api/voice/status", 405), ("GET", "/api/voice/nope", 404),
    ("GET", "/api/voice/", 404), ("GET", "/api/voice/%00", 404), ("GET", "/api/voice/status/extra", 404),
    ("OPTIONS", "/api/voice/connect", 405),
])
def test_unknown_methods_and_paths_answer_json(client, method, path, status):
    response = client.request(method, path)
    assert response.status_code == status, response.text
    assert_error_shape(response)


def test_a_missing_query_parameter_is_400_json(client):
    for path in ("/api/voice/events", "/api/voice/nav-hints"):
        response = client.get(path)
        assert response.status_code == 400 and response.json() == {"error": "call_id is required"}


def test_a_request_with_too_big_headers_is_refused_and_the_server_goes_on(server, client):
    """Headers of 200 KB: hypercorn refuses them with 431 before the app sees
    the request (so the body is hypercorn's, not our JSON); the server goes on.
    (Headers that arrive in one read are accepted up to roughly that size:
    ``h11_max_incomplete_size`` bounds only headers still incomplete.)"""
    try:
        response = httpx.get(server["base"] + "/api/voice/status", headers={"X-Big": "a" * 200_000}, timeout=10)
        assert response.status_code == 431
    except httpx.HTTPError:
        pass      # or it simply closes the connection
    assert client.get("/api/voice/status").status_code == 200
