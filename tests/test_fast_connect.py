"""A plain ``POST /api/voice/connect`` answered without Quart (``http/fast_connect.py``).

Pinned here: a plain connect (the body only ``{"call_id": ...}``, every
guard passing) never enters Quart's request handling (``request_started``
is not sent) and gets what Quart gives (status, headers, body bytes, the
``http.request`` line); every other request — a context, a greeting, bad
JSON, a bad id, a refusal of each guard, a key missing — is answered
exactly as with the path off; the rate limit takes one token per connect;
at capacity the answer is Quart's 503; a real server's answer on the wire
has the same head either way. Real app, actors and simulator on loopback.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, AsyncIterator

import pytest
import trio
from quart import request_started

from test_context_calls import SIM_KEY, app_for, sim  # noqa: F401 - the simulator fixture
from calls_support import DAY
from redis_support import redis_server  # noqa: F401 - the fixture
from clock_support import serving
from voiceactors.http.app import create_app, voice_state
from voiceactors.http.errors import AT_CAPACITY
from voiceactors.settings import Settings

JSON = {"Content-Type": "application/json"}


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


async def _post(client: Any, body: bytes | None, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    # a real client declares its body's length (the test client does not unless told)
    length = {"Content-Length": str(len(body))} if body else {}
    response = await client.post("/api/voice/connect", data=body, headers={**length, **headers})
    return response.status_code, {k.lower(): v for k, v in response.headers.items()}, await response.get_data()


async def _both_ways(app: Any, client: Any, body: bytes | None, headers: dict[str, str]) -> tuple[Any, Any]:
    """The answer with the fast path on, then with it off (Quart's)."""
    fast = await _post(client, body, headers)
    kept, app.fast_connect = app.fast_connect, None
    try:
        slow = await _post(client, body, headers)
    finally:
        app.fast_connect = kept
    return fast, slow


def _app(journal: Any, tmp_path: Any, sim: Any, **changes: Any) -> Any:  # noqa: F811
    """``app_for``'s app, any of its settings changeable."""
    base: dict[str, Any] = dict(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=SIM_KEY,
                                openai_base_url=sim.base_url, rate_limit_per_s=0, close_deadline_s=1.0)
    return create_app(Settings(**{**base, **changes}))


def _request_lines(log_stream: Any) -> list[dict]:
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line["event"] == "http.request"]


async def test_a_plain_connect_is_answered_without_quart_and_as_quart_answers(
        make_sample, tmp_path, sim, pin_today, log_stream, quart_requests):  # noqa: F811
    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=3), tmp_path, sim)
    for call_id in ("rtc_fast", "rtc_slow"):
        sim.add_call(call_id, [{"sleep": 0.3}, {"close": 1000}])
    async with serving(app) as test_app:
        client = test_app.test_client()
        headers = {**JSON, "X-Request-Id": "req-fast"}
        fast = await _post(client, b'{"call_id": "rtc_fast"}', headers)
        assert quart_requests.count == 0                      # Quart never saw it
        kept, app.fast_connect = app.fast_connect, None
        slow = await _post(client, b'{"call_id": "rtc_slow"}', headers)
        app.fast_connect = kept
        assert quart_requests.count == 1
        assert fast == slow
        assert fast[0] == 200 and json.loads(fast[2]) == {"status": "connected"}
        supervisor = voice_state(app).runtime.actors["calls"]
        with trio.fail_after(10):
            while supervisor.calls:                          # both calls ran and ended
                await trio.sleep(0.01)
    assert {call_id for call_id, _reason in supervisor.ended} == {"rtc_fast", "rtc_slow"}
    first, second = _request_lines(log_stream)
    for line in (first, second):
        line.pop("timestamp", None)
        line.pop("duration_ms")
    assert first == second and first["request_id"] == "req-fast" and first["status"] == 200


@pytest.mark.parametrize("body, headers", [
    (b'{"call_id": "rtc_x", "greeting": "first"}', JSON),           # a greeting: Quart's route
    (b'{"call_id": "rtc_x", "greeting": "later"}', JSON),
    (b'{"call_id": "rtc_x", "context": {"kind": "nope"}}', JSON),
    (b'{"call_id": "rtc bad"}', JSON),
    (b'{"call_id": 7}', JSON),
    (b'{"call_id": ""}', JSON),
    (b'{}', JSON),
    (b'[1]', JSON),
    (b'{"call_id": "rtc_x"', JSON),
    (b'', JSON),
    (b'{"call_id": "rtc_x"}', {"Content-Type": "text/plain"}),
    (b'{"call_id": "rtc_x"}', {**JSON, "Sec-Fetch-Site": "cross-site"}),
    (b'{"call_id": "rtc_x"}', {**JSON, "Origin": "http://evil.example"}),
    (b'{"call_id": "rtc_x"}', {**JSON, "Host": "evil.example"}),
    (b'{"call_id": "' + b"a" * 5000 + b'"}', JSON),                 # past the body limit
])
async def test_every_other_request_gets_quarts_answer(make_sample, tmp_path, sim, pin_today,  # noqa: F811
                                                       body, headers):
    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=3), tmp_path, sim, body_limit=4096)
    async with serving(app) as test_app:
        client = test_app.test_client()
        fast, slow = await _both_ways(app, client, body, {**headers, "X-Request-Id": "req-same"})
    assert fast == slow
    assert fast[0] != 200 or json.loads(fast[2])["status"] == "connected"


async def test_a_missing_key_and_a_required_token_are_quarts_to_answer(make_sample, tmp_path, sim,  # noqa: F811
                                                                         pin_today, quart_requests):
    pin_today(DAY.isoformat())
    app = _app(make_sample(days=3), tmp_path, sim, openai_api_key_env=None)
    body, headers = b'{"call_id": "rtc_nokey"}', {**JSON, "X-Request-Id": "req-same"}
    async with serving(app) as test_app:
        fast, slow = await _both_ways(app, test_app.test_client(), body, headers)
    assert fast == slow and fast[0] == 503 and quart_requests.count == 2

    app = app_for(make_sample(days=3), tmp_path / "token", sim, api_token="tok-123456")
    sim.add_call("rtc_token", [{"sleep": 0.2}, {"close": 1000}])
    async with serving(app) as test_app:
        client = test_app.test_client()
        fast, slow = await _both_ways(app, client, body, headers)
        assert fast == slow and fast[0] == 401 and quart_requests.count == 4
        status, _headers, answer = await _post(client, b'{"call_id": "rtc_token"}',
                                               {**JSON, "Authorization": "Bearer tok-123456"})
        assert status == 200 and json.loads(answer) == {"status": "connected"}
        assert quart_requests.count == 4                     # with the token: the fast path


async def test_the_rate_limit_takes_one_token_per_connect(make_sample, tmp_path, sim, pin_today):  # noqa: F811
    pin_today(DAY.isoformat())
    app = _app(make_sample(days=3), tmp_path, sim, rate_limit_per_s=0.001, rate_limit_burst=2)
    for n in range(2):
        sim.add_call(f"rtc_limit_{n}", [{"sleep": 0.2}, {"close": 1000}])
    async with serving(app) as test_app:
        client = test_app.test_client()
        statuses = [(await _post(client, json.dumps({"call_id": f"rtc_limit_{n}"}).encode(), JSON))[0]
                    for n in range(3)]
        refused = await _post(client, b'{"call_id": "rtc_limit_0"}', JSON)
    assert statuses == [200, 200, 429]
    assert refused[0] == 429 and refused[1]["retry-after"] and json.loads(refused[2])["error"]


async def test_at_capacity_is_quarts_503(make_sample, tmp_path, sim, pin_today, quart_requests):  # noqa: F811
    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=3), tmp_path, sim, max_calls=1)
    sim.add_call("rtc_cap_a", [{"sleep": 1.0}, {"close": 1000}])
    async with serving(app) as test_app:
        client = test_app.test_client()
        headers = {**JSON, "X-Request-Id": "req-cap"}
        assert (await _post(client, b'{"call_id": "rtc_cap_a"}', headers))[0] == 200
        fast, slow = await _both_ways(app, client, b'{"call_id": "rtc_cap_b"}', headers)
    assert fast == slow and fast[0] == 503 and json.loads(fast[2]) == {"error": AT_CAPACITY}
    assert quart_requests.count == 1


class HypercornTasks(trio.abc.Instrument):
    """Counts the tasks hypercorn spawns (its connection's, its app's)."""

    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: Any) -> None:
        if task.name.startswith("hypercorn."):
            self.count += 1


async def _exchange(port: int, request: bytes, answers: int = 1) -> bytes:
    """Send ``request`` on a fresh connection; what came back once
    ``answers`` responses are in (or the server closed)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = b""
    with trio.fail_after(10):
        await stream.send_all(request)
        while data.count(b"HTTP/1.1 ") < answers or not data.endswith(b"\n"):
            chunk = await stream.receive_some()
            if not chunk:
                break
            data += chunk
    await stream.aclose()
    return data

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


async def _fast_then_slow(app, port: int, hypercorn_tasks: "HypercornTasks",
                          call_ids: tuple[str, str]) -> tuple[bytes, bytes]:
    """A plain connect answered below hypercorn (``hypercorn_tasks`` counting
    hypercorn's task steps meanwhile), then one with the fast path off."""
    trio.lowlevel.add_instrument(hypercorn_tasks)
    fast = await _exchange(port, _connect_request(port, call_ids[0], close=True))
    trio.lowlevel.remove_instrument(hypercorn_tasks)
    kept, app.fast_connect = app.fast_connect, None
    slow = await _exchange(port, _connect_request(port, call_ids[1], close=True))
    app.fast_connect = kept
    return fast, slow



def _connect_request(port: int, call_id: str, *, close: bool) -> bytes:
    body = json.dumps({"call_id": call_id}).encode()
    return (b"POST /api/voice/connect HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: req-wire\r\nContent-Length: %d\r\n%s\r\n%s"
            % (port, len(body), b"Connection: close\r\n" if close else b"", body))


def _without_date(response: bytes) -> bytes:
    return re.sub(rb"\r\ndate: [^\r]*", b"\r\ndate: -", response)


async def test_on_the_wire_below_hypercorn_the_bytes_are_hypercorns(make_sample, tmp_path, sim, pin_today):  # noqa: F811
    """Through ``serving.serve``: a plain connect is answered from the
    connection's first read without a task of hypercorn's, byte for byte as
    hypercorn answers it (but the date), with ``Connection: close`` and
    kept alive (the next request on the connection is hypercorn's)."""
    pin_today(DAY.isoformat())
    app = app_for(make_sample(days=3), tmp_path, sim)
    for n in range(4):
        sim.add_call(f"rtc_wire_{n}", [{"sleep": 0.2}, {"close": 1000}])
    hypercorn_tasks = HypercornTasks()
    async with _served(app) as port:
        assert app.first_read_answer(lambda: []).watching("127.0.0.1")
        fast, slow = await _fast_then_slow(app, port, hypercorn_tasks, ("rtc_wire_0", "rtc_wire_1"))
        kept, app.fast_connect = app.fast_connect, None
        slow_kept = await _exchange(port, _connect_request(port, "rtc_wire_2", close=False)
                                    + b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port, answers=2)
        app.fast_connect = kept
        # kept alive: the connect answered below hypercorn, the next request by hypercorn on the same connection
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_connect_request(port, "rtc_wire_3", close=False))
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
    assert _without_date(fast) == _without_date(slow)
    assert fast.startswith(b"HTTP/1.1 200 \r\n") and fast.endswith(b'\r\n\r\n{"status":"connected"}\n')
    assert b"Connection: close" in fast
    slow_first = slow_kept[:slow_kept.index(b"\n", slow_kept.index(b"\r\n\r\n") + 4) + 1]
    assert _without_date(first) == _without_date(slow_first) and b"Connection" not in first
    assert second.startswith(b"HTTP/1.1 200 ") and b"voiceactors_" in second


def test_the_hooks_the_fast_path_stands_in_for_are_the_apps(tmp_path):
    """``FastConnect`` asks the guards Quart's hooks run, as questions; a
    hook added to the app (a new guard, a header) must be added there too,
    so this list is pinned (with a token required: every guard installed)."""
    app = create_app(Settings(journal=tmp_path, state_dir=tmp_path / "state", api_token="tok-123456"))
    before = [hook.__name__ for hook in app.before_request_funcs[None]]
    after = [hook.__name__ for hook in app.after_request_funcs[None]]
    assert before == ["_begin", "_own_host_and_origin", "_browser_guard", "_require_token", "_rate_limit"]
    assert sorted(after) == ["_finish", "_settle_login"]
    assert set(app.before_request_funcs) == {None} and set(app.after_request_funcs) == {None}


async def test_with_a_shared_registry_a_plain_connect_wins_its_lease_without_quart(
        make_sample, tmp_path, sim, pin_today, redis_server, log_stream, quart_requests):  # noqa: F811
    """``--redis`` (every worker): the lease is won in the request's task
    (``Runtime.connect_leased``), so a plain connect skips Quart there too,
    with Quart's answer (status, headers, body, ``http.request`` line); its
    call's actor runs in the supervisor's context (its lines carry no
    request id); Redis down gives Quart's 503 both ways."""
    from voiceactors.http.errors import REGISTRY_DOWN

    pin_today(DAY.isoformat())
    app = _app(make_sample(days=3), tmp_path, sim, redis_url=redis_server.url)
    for call_id in ("rtc_shared_fast", "rtc_shared_slow"):
        sim.add_call(call_id, [{"sleep": 0.3}, {"close": 1000}])
    async with serving(app) as test_app:
        runtime = voice_state(app).runtime
        assert runtime.connect_now is None and runtime.connect_leased is not None and app.fast_connect.can_answer()
        assert app.first_read_answer(lambda: []).watching("127.0.0.1")
        client = test_app.test_client()
        headers = {**JSON, "X-Request-Id": "req-shared"}
        fast = await _post(client, b'{"call_id": "rtc_shared_fast"}', headers)
        assert quart_requests.count == 0                      # Quart never saw it
        kept, app.fast_connect = app.fast_connect, None
        slow = await _post(client, b'{"call_id": "rtc_shared_slow"}', headers)
        app.fast_connect = kept
        assert quart_requests.count == 1
        assert fast == slow and fast[0] == 200 and json.loads(fast[2]) == {"status": "connected"}
        supervisor = runtime.actors["calls"]
        assert set(supervisor.registry.lease_of(c).call_id for c in ("rtc_shared_fast", "rtc_shared_slow")) == {
            "rtc_shared_fast", "rtc_shared_slow"}                 # both leased here
        with trio.fail_after(10):
            while supervisor.calls:
                await trio.sleep(0.01)
        redis_server.stop()
        down_fast, down_slow = await _both_ways(app, client, b'{"call_id": "rtc_shared_down"}', headers)
        assert quart_requests.count == 2
    assert {call_id for call_id, _reason in supervisor.ended} == {"rtc_shared_fast", "rtc_shared_slow"}
    assert down_fast == down_slow and down_fast[0] == 503 and json.loads(down_fast[2]) == {"error": REGISTRY_DOWN}
    first, second = _request_lines(log_stream)[:2]
    for line in (first, second):
        line.pop("timestamp", None)
        line.pop("duration_ms")
    assert first == second and first["request_id"] == "req-shared" and first["status"] == 200
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.strip()]
    call_lines = [line for line in lines if line.get("call_id") == "rtc_shared_fast" and line["event"].startswith("call.")]
    assert call_lines and not any("request_id" in line for line in call_lines)


async def test_with_a_shared_registry_below_hypercorn_the_bytes_are_hypercorns(
        make_sample, tmp_path, sim, pin_today, redis_server):  # noqa: F811
    """``--redis`` through ``serving.serve``: a plain connect whole in the
    first read wins its lease and is answered without a task of
    hypercorn's, byte for byte as hypercorn answers it (but the date)."""
    pin_today(DAY.isoformat())
    app = _app(make_sample(days=3), tmp_path, sim, redis_url=redis_server.url)
    for n in range(2):
        sim.add_call(f"rtc_wire_shared_{n}", [{"sleep": 0.2}, {"close": 1000}])
    hypercorn_tasks = HypercornTasks()
    async with _served(app) as port:
        fast, slow = await _fast_then_slow(app, port, hypercorn_tasks, ("rtc_wire_shared_0", "rtc_wire_shared_1"))
        registry = voice_state(app).runtime.actors["registry"]
        held = {registry.lease_of(f"rtc_wire_shared_{n}") is not None for n in range(2)}
    assert hypercorn_tasks.count == 0
    assert held == {True}
    assert _without_date(fast) == _without_date(slow)
    assert fast.startswith(b"HTTP/1.1 200 \r\n") and fast.endswith(b'\r\n\r\n{"status":"connected"}\n')
