"""Hardening: DNS rebinding (Host), cross-origin
requests (Origin), per-client rate limits, connections the server closes,
config I/O errors that are not "not configured", shared OpenAI clients.

The Host/Origin and rate-limit rules are checked through the Quart test
client (no socket: the connection's port is unknown there) and through a
real hypercorn server on an ephemeral loopback port (the port is known and
must match). Connection handling is only meaningful on real sockets: those
tests speak raw HTTP/1.x to the real server.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio

from clock_support import clock_held_still, serving
from voiceactors.http import create_app
from voiceactors.journal.sample import write_sample_journal
from voiceactors.simulator import Simulator
from voiceactors.server import run_server
from voiceactors.settings import Settings
from child_support import die_with_parent, pump_stderr

DAY = dt.date(2026, 3, 27)
KEY = "sk-hardening-test-5e1c9a"

ROUTES = [
    ("GET", "/api/voice/status"), ("POST", "/api/voice/session"), ("POST", "/api/voice/connect"),
    ("POST", "/api/voice/refresh-brain"), ("GET", "/api/voice/events?call_id=rtc_x"),
    ("GET", "/api/voice/nav-hints?call_id=rtc_x"), ("GET", "/api/voice/observer-actions"),
    ("GET", "/api/voice/openapi.json"), ("GET", "/metrics"), ("GET", "/"), ("GET", "/api/voice/nope"),
]


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    return write_sample_journal(tmp_path_factory.mktemp("hardening") / "journal", days=1, today=DAY)


def settings_for(journal: Path, tmp_path: Path, **changes: Any) -> Settings:
    return Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=KEY).replace(**changes)


async def _json(response: Any) -> Any:
    return await response.get_json()


# --- 1. Host: only the server's own names -------------------------------------------------

REBOUND_HOSTS = ["evil.example", "evil.example:8765", "127.evil.example", "localhost.evil.example",
                 "127.0.0.1.nip.io", "attacker.localhost", "localhost:8765@evil.example", "", "localhost:0",
                 "localhost:99999", "localhost:http", "local host"]


async def test_a_host_that_is_not_ours_is_421_on_every_route(journal, tmp_path):
    app = create_app(settings_for(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for host in REBOUND_HOSTS:
            for method, path in ROUTES:
                response = await client.open(path, method=method, headers={"Host": host})
                assert response.status_code == 421, (host, method, path, response.status_code)
                assert await _json(response) == {"error": "host not allowed"}
                assert response.headers["Connection"] == "close"


async def test_loopback_names_pass_and_the_port_is_free_when_unknown(journal, tmp_path):
    app = create_app(settings_for(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for host in ("localhost", "LOCALHOST:8765", "127.0.0.1", "127.0.0.1:1234", "[::1]", "[::1]:8765"):
            response = await client.get("/api/voice/status", headers={"Host": host})
            assert response.status_code == 200, host


async def test_configured_names_and_ports(journal, tmp_path):
    settings = settings_for(journal, tmp_path, allowed_hosts=("Voice.Example.org", "lan-box:8443"))
    app = create_app(settings)
    async with serving(app) as test_app:
        client = test_app.test_client()
        for host, status in [("voice.example.org", 200), ("voice.example.org:443", 200), ("lan-box:8443", 200),
                             ("lan-box", 421), ("lan-box:8444", 421), ("evil.example", 421),
                             ("sub.voice.example.org", 421)]:
            response = await client.get("/api/voice/status", headers={"Host": host})
            assert response.status_code == status, host


def test_the_address_a_connection_arrived_at_is_one_of_our_names():
    """Listening on all interfaces, a LAN client uses the machine's address:
    an IP literal cannot be rebound, so the address the connection arrived at
    passes (with its port), as plain IPv4 when it came IPv4-mapped."""
    from voiceactors.http.hosts import HostPolicy

    policy = HostPolicy.from_settings(Settings(journal=Path("j"), state_dir=Path("s"), host="::", api_token="t"))
    assert policy.allows("192.168.1.20:8765", ("::ffff:192.168.1.20", 8765))
    assert policy.allows("[fe80::1]:8765", ("fe80::1", 8765))
    assert policy.allows("10.0.0.5:8765", ("10.0.0.5", 8765))
    assert not policy.allows("10.0.0.6:8765", ("10.0.0.5", 8765))
    assert not policy.allows("10.0.0.5:8766", ("10.0.0.5", 8765))
    assert not policy.allows("box.lan:8765", ("10.0.0.5", 8765))
    assert not policy.allows("[::]:8765", ("10.0.0.5", 8765))        # the wildcard is no name of ours
    with pytest.raises(ValueError, match="allowed host"):
        HostPolicy.from_settings(Settings(journal=Path("j"), state_dir=Path("s"), allowed_hosts=("a b",)))


def test_serve_refuses_a_malformed_allowed_host(journal, tmp_path, capsys):
    from voiceactors.cli import main
    import structlog

    try:
        code = main(["serve", "--port", "0", "--journal", str(journal), "--state-dir", str(tmp_path / "state"),
                     "--allowed-host", "voice.example.org/path"])
    finally:
        structlog.reset_defaults()
    assert code == 2 and "allowed host is not a host name" in capsys.readouterr().err


async def test_public_assets_are_exempt(journal, tmp_path):
    """``/static/`` (the console's assets) answers whatever the Host: there is
    no such route yet, so the answer is the app's 404, not the guard's 421."""
    app = create_app(settings_for(journal, tmp_path))
    async with serving(app) as test_app:
        response = await test_app.test_client().get("/static/app.js", headers={"Host": "evil.example"})
        assert response.status_code == 404 and await _json(response) == {"error": "not found"}


# --- 1/2. Origin: only the server's own ----------------------------------------------------

async def test_an_origin_that_is_not_ours_is_403(journal, tmp_path):
    app = create_app(settings_for(journal, tmp_path))
    async with serving(app) as test_app:
        client = test_app.test_client()
        host = {"Host": "127.0.0.1:8765"}
        for origin in ("null", "http://evil.example", "http://evil.example:8765", "http://127.0.0.1:3000",
                       "http://127.0.0.1", "http://localhost:8765", "file://", "chrome-extension://abc",
                       "http://127.0.0.1:8765.evil.example", "ws://127.0.0.1:8765", ""):
            for method, path in ROUTES[:4]:
                response = await client.open(path, method=method, headers={**host, "Origin": origin})
                assert response.status_code == 403, (origin, path)
                assert await _json(response) == {"error": "origin not allowed"}
        # the server's own origin, as a browser on the page sends it (no Fetch Metadata either)
        for origin in ("http://127.0.0.1:8765", "HTTP://127.0.0.1:8765"):
            response = await client.post("/api/voice/connect", json={}, headers={**host, "Origin": origin})
            assert response.status_code == 400 and await _json(response) == {"error": "call_id is required"}


@pytest.fixture
async def real_server(journal, tmp_path) -> AsyncIterator[dict[str, Any]]:
    """The real app under hypercorn on an ephemeral loopback port, with the
    simulator as OpenAI, in this test's trio run."""
    async with real_server_for(journal, tmp_path) as info:
        yield info


@asynccontextmanager
async def real_server_for(journal: Path, tmp_path: Path, **changes: Any) -> AsyncIterator[dict[str, Any]]:
    """``real_server`` with some settings changed (``Settings.replace``)."""
    sim = Simulator(None, api_key=KEY)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        settings = settings_for(journal, tmp_path, port=0, openai_base_url=sim.base_url, keep_alive_timeout_s=2.0,
                                brain_ready_wait_s=5.0, shutdown_deadline_s=3.0, close_deadline_s=1.0)
        settings = settings.replace(**changes)
        info: dict[str, Any] = {"sim": sim, "settings": settings}
        stopped = trio.Event()

        async def serve(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            try:
                await run_server(settings, shutdown_trigger=stop.wait, task_status=task_status)
            finally:
                stopped.set()

        [base] = await nursery.start(serve)
        info["base"] = base
        info["port"] = int(base.rsplit(":", 1)[1])
        yield info
        stop.set()
        with trio.move_on_after(20):
            await stopped.wait()
        nursery.cancel_scope.cancel()


async def test_on_a_real_server_the_host_must_carry_the_bound_port(real_server):
    port, sim = real_server["port"], real_server["sim"]
    async with httpx.AsyncClient(timeout=10) as client:
        url = f"http://127.0.0.1:{port}/api/voice/status"
        assert (await client.get(url)).status_code == 200                           # Host: 127.0.0.1:<port>
        for host, status in [(f"localhost:{port}", 200), (f"[::1]:{port}", 200), (f"localhost:{port + 1}", 421),
                             ("localhost", 421), (f"evil.example:{port}", 421)]:
            response = await client.get(url, headers={"Host": host})
            assert response.status_code == status, host
            if status == 421:
                assert response.json() == {"error": "host not allowed"}
        own = f"http://127.0.0.1:{port}"
        for origin, status in [(own, 200), (f"http://127.0.0.1:{port + 1}", 403), ("null", 403),
                               (f"http://localhost:{port}", 403)]:
            response = await client.get(url, headers={"Origin": origin})
            assert response.status_code == status, origin
        # a page rebound to 127.0.0.1 asks for a key: refused, nothing minted
        response = await client.post(f"http://127.0.0.1:{port}/api/voice/session",
                                     headers={"Host": f"rebind.evil.example:{port}",
                                              "Origin": f"http://rebind.evil.example:{port}"})
        assert response.status_code == 421 and sim.minted == []
        # another port on 127.0.0.1 (same-site: no Sec-Fetch-Site cross-site) asks for one: refused
        response = await client.post(f"http://127.0.0.1:{port}/api/voice/session",
                                     headers={"Origin": "http://127.0.0.1:3000", "Sec-Fetch-Site": "same-site"})
        assert response.status_code == 403 and sim.minted == []


# --- 2. rate limits ---------------------------------------------------------------------------

async def test_costly_posts_are_rate_limited_per_client(journal, tmp_path, settled_clock):
    settings = settings_for(journal, tmp_path, rate_limit_burst=3, rate_limit_per_s=0.5)
    app = create_app(settings)
    async with serving(app) as test_app:
        client = test_app.test_client()
        alice = {"client": ("127.0.0.1", 50001)}
        bob = {"client": ("127.0.0.2", 50002)}
        # the requests run worker threads (the brain's refresh, /status's key lookup): the
        # clock is held still while they run, so that it moves only in the test's sleeps
        async with clock_held_still():
            for _ in range(3):
                response = await client.post("/api/voice/connect", json={}, scope_base=alice)
                assert response.status_code == 400          # counted: a bad body still costs a parse
            response = await client.post("/api/voice/connect", json={"call_id": "rtc_1"}, scope_base=alice)
            assert response.status_code == 429
            assert await _json(response) == {"error": "too many requests"}
            assert response.headers["Retry-After"] == "2"          # one token at 0.5/s
            assert response.headers["Connection"] == "close"
            # another client, another route: their own buckets; reads are never limited
            assert (await client.post("/api/voice/connect", json={}, scope_base=bob)).status_code == 400
            assert (await client.post("/api/voice/refresh-brain", json={"x": 1}, scope_base=alice)).status_code != 429
            for _ in range(10):
                assert (await client.get("/api/voice/status", scope_base=alice)).status_code == 200
        await trio.sleep(2.1)                                   # one token back, not two
        async with clock_held_still():
            assert (await client.post("/api/voice/connect", json={}, scope_base=alice)).status_code == 400
            assert (await client.post("/api/voice/connect", json={}, scope_base=alice)).status_code == 429
        await trio.sleep(60)                                    # refills up to the burst, no further
        async with clock_held_still():
            statuses = [(await client.post("/api/voice/connect", json={}, scope_base=alice)).status_code
                        for _ in range(4)]
        assert statuses == [400, 400, 400, 429]


async def test_every_costly_post_is_limited(journal, tmp_path):
    app = create_app(settings_for(journal, tmp_path, rate_limit_burst=1, rate_limit_per_s=0.01))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for path in ("/api/voice/session", "/api/voice/connect", "/api/voice/refresh-brain"):
            await client.post(path, data=b"[", headers={"Content-Type": "application/json"})
            response = await client.post(path, json={})
            assert response.status_code == 429, path
            assert int(response.headers["Retry-After"]) == 100


def test_the_bucket_table_is_bounded():
    from voiceactors.http.ratelimit import RateLimiter

    async def main() -> None:
        limiter = RateLimiter(burst=1, per_s=1.0, max_clients=100)
        for n in range(10_000):
            assert limiter.take(("p", f"10.0.{n // 256}.{n % 256}")) == 0.0
        assert len(limiter._buckets) == 100

    trio.run(main)


# --- 8. connections the server closes ------------------------------------------------------

async def _exchange(port: int, request: bytes, *, read_until_eof_s: float = 10.0,
                    source: str | None = None) -> tuple[bytes, bool]:
    """Send ``request`` raw (from the loopback address ``source``, if given:
    a client of its own to the rate limits); read until the server closes
    (True) or the deadline passes (False: the connection was held)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    data = b""
    async with stream:
        await stream.send_all(request)
        with trio.move_on_after(read_until_eof_s):
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return data, True
                data += chunk
    return data, False


async def test_the_server_closes_after_connection_close_and_http_1_0(real_server):
    port = real_server["port"]
    host = f"Host: 127.0.0.1:{port}\r\n".encode()
    for request in (b"GET /api/voice/status HTTP/1.1\r\n" + host + b"Connection: close\r\n\r\n",
                    b"GET /api/voice/status HTTP/1.0\r\n" + host + b"\r\n",
                    b"GET /metrics HTTP/1.0\r\n" + host + b"\r\n"):
        data, closed = await _exchange(port, request)
        assert data.startswith(b"HTTP/1.1 200"), data[:80]
        assert closed, f"held after {request!r}"


async def test_the_server_closes_after_the_refusals_that_say_close(real_server):
    port = real_server["port"]
    host = f"Host: 127.0.0.1:{port}\r\n".encode()
    for request, status in [
        (b"POST /api/voice/connect HTTP/1.1\r\n" + host + b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\n",
         b"415"),
        (b"GET /api/voice/status HTTP/1.1\r\nHost: evil.example\r\n\r\n", b"421"),
        (b"GET /api/voice/status HTTP/1.1\r\n" + host + b"Origin: null\r\n\r\n", b"403"),
        (b"POST /api/voice/connect HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
         b"Content-Length: 999999\r\n\r\n", b"413"),
    ]:
        data, closed = await _exchange(port, request)
        assert data.startswith(b"HTTP/1.1 " + status), data[:80]
        assert b"connection: close" in data.lower()
        assert closed, f"held after a {status.decode()}"


async def test_keep_alive_serves_more_requests_then_closes_when_idle(real_server):
    port = real_server["port"]
    request = f"GET /api/voice/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        for _ in range(2):
            await stream.send_all(request)
            data = b""
            while not re.search(rb"\r\n\r\n\{.*\}", data, re.S):
                data += await stream.receive_some(65536)
            assert data.startswith(b"HTTP/1.1 200")
        idle_from = trio.current_time()
        with trio.fail_after(15):
            assert await stream.receive_some(65536) == b""           # the server closed it
        assert trio.current_time() - idle_from >= real_server["settings"].keep_alive_timeout_s - 0.5


async def test_past_the_in_flight_cap_requests_are_503_and_closed(journal, tmp_path):
    stop = trio.Event()
    settings = settings_for(journal, tmp_path, port=0, max_requests_in_flight=2, shutdown_deadline_s=3.0,
                            close_deadline_s=1.0)   # the deadline chain: close < shutdown
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        port = int(base.rsplit(":", 1)[1])
        stalled = []
        for _ in range(2):       # two uploads that never finish their body: two requests in flight
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(f"POST /api/voice/connect HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                                  "Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{".encode())
            stalled.append(stream)
        await trio.sleep(0.3)
        request = f"GET /api/voice/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        data, closed = await _exchange(port, request)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and json.loads(body) == {"error": "server busy"}
        assert closed
        for stream in stalled:
            await stream.aclose()
        with trio.fail_after(10):      # the server notices they went away, and serves again
            while True:
                data, _ = await _exchange(port, request, read_until_eof_s=1.0)
                if data.startswith(b"HTTP/1.1 200"):
                    break
                await trio.sleep(0.1)
        stop.set()


async def test_a_client_leaving_an_event_stream_still_ends_it(journal, tmp_path):
    """The connection class lets a sent response finish; a stream whose client
    goes away mid-response must still be cancelled (with a cap of one request
    in flight, the next request is served only once the stream has ended)."""
    sim = Simulator(None, api_key=KEY)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.serve, 0)
        settings = settings_for(journal, tmp_path, port=0, openai_base_url=sim.base_url, max_requests_in_flight=1,
                                shutdown_deadline_s=3.0, close_deadline_s=1.0)
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        port = int(base.rsplit(":", 1)[1])
        sim.add_call("rtc_leaving")
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            assert (await client.post("/api/voice/connect", json={"call_id": "rtc_leaving"})).status_code == 200
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(f"GET /api/voice/events?call_id=rtc_leaving HTTP/1.1\r\n"
                                  f"Host: 127.0.0.1:{port}\r\n\r\n".encode())
            head = b""
            with trio.fail_after(10):
                while b"\r\n\r\n" not in head:
                    head += await stream.receive_some(65536)
            assert head.startswith(b"HTTP/1.1 200")
            assert (await client.get("/api/voice/status")).status_code == 503      # the stream is in flight
            await stream.aclose()
            with trio.fail_after(10):
                while (await client.get("/api/voice/status")).status_code != 200:
                    await trio.sleep(0.05)
        stop.set()
        nursery.cancel_scope.cancel()


# --- 8. an unreadable config is not "not configured" ---------------------------------------

async def test_an_unreadable_config_is_503_could_not_read_not_key_not_configured(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=1, today=DAY)
    config_file = journal / "config" / "journal.json"
    config_file.unlink()
    config_file.mkdir()        # reading it fails with an OSError (EISDIR), as EMFILE or EIO would
    app = create_app(Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env=KEY))
    async with serving(app) as test_app:
        client = test_app.test_client()
        for path, body in (("/api/voice/connect", {"call_id": "rtc_1"}), ("/api/voice/session", {})):
            response = await client.post(path, json=body)
            assert response.status_code == 503, path
            assert await _json(response) == {"error": "voice unavailable — could not read configuration"}
    config_file.rmdir()        # and a config that is really absent still means "use the environment"
    app = create_app(Settings(journal=journal, state_dir=tmp_path / "state2"))
    async with serving(app) as test_app:
        response = await test_app.test_client().post("/api/voice/connect", json={"call_id": "rtc_1"})
        assert await _json(response) == {"error": "voice unavailable — openai key not configured"}


# --- 9a. one OpenAI client per key and base URL ------------------------------------------

def _clients_created(metrics_text: str) -> float:
    match = re.search(r"^voiceactors_openai_clients_created_total (\S+)$", metrics_text, re.M)
    assert match, "metric missing"
    return float(match.group(1))


async def test_mints_share_one_openai_client_per_key(real_server):
    port, sim = real_server["port"], real_server["sim"]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=15) as client:
        before = _clients_created((await client.get("/metrics")).text)
        for _ in range(3):
            response = await client.post("/api/voice/session")
            assert response.status_code == 200 and response.json()["ephemeral_key"]
        assert len(sim.minted) == 3
        assert _clients_created((await client.get("/metrics")).text) - before == 1


async def test_the_client_table_is_bounded_and_closes_what_it_drops():
    from voiceactors.openai_clients import OpenAIClients

    clients = OpenAIClients(max_clients=2, timeout_s=1.0)
    seen = []
    for n in range(5):
        async with clients.use(f"sk-key-{n}", "http://127.0.0.1:9/v1") as client:
            seen.append(client)
    async with clients.use("sk-key-4", "http://127.0.0.1:9/v1") as again:
        assert again is seen[4]
    assert len(clients) == 2 and clients.created == 5
    assert all(client.is_closed() for client in seen[:3]) and not seen[4].is_closed()
    await clients.aclose()
    assert seen[4].is_closed()


# --- 8. out of file descriptors, for real ---------------------------------------------------

CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
from voiceactors.cli import main
sys.exit(main(sys.argv[1:]))
"""
FD_LIMIT = 160


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts the child's descriptors in /proc")
def test_out_of_file_descriptors_the_key_is_unreadable_not_unset(tmp_path):
    """A server child with ``RLIMIT_NOFILE`` = 160, the key only in the journal
    config, and idle connections holding every descriptor: after an edit of
    the config, ``/connect`` answers "could not read configuration" (it
    answered "key not configured"), trio's
    accept retries are one rate-limited line (not a traceback ten times a
    second), and once the idle clients go the server serves again."""
    import os
    import socket
    import subprocess
    import sys
    import time

    journal = write_sample_journal(tmp_path / "journal", days=1, today=DAY)
    config_file = journal / "config" / "journal.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "voice": {"openai_api_key": KEY}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICEACTORS_", "OPENAI_"))}
    # The idle clients must stay while the test runs; hypercorn also waits out
    # this timeout before releasing a connection its client closed.
    env["VOICEACTORS_KEEP_ALIVE_TIMEOUT"] = "10"
    child = subprocess.Popen([sys.executable, "-c", CHILD.replace("FD_LIMIT", str(FD_LIMIT)), "serve", "--port", "0",
                              "--journal", str(journal), "--state-dir", str(tmp_path / "state")],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                             preexec_fn=die_with_parent())
    lines, serving = pump_stderr(child, "server.serving")
    held: list[socket.socket] = []
    try:
        assert serving.wait(60), "".join(lines)[-2000:]
        port = int(json.loads(next(line for line in lines if '"server.serving"' in line))["urls"][0].rsplit(":", 1)[1])
        host = f"127.0.0.1:{port}"

        def fds() -> int:
            return len(os.listdir(f"/proc/{child.pid}/fd"))

        asker = socket.create_connection(("127.0.0.1", port), timeout=10)
        deadline = time.monotonic() + 30
        while fds() < FD_LIMIT:              # every descriptor the child may open, taken by idle clients
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            time.sleep(0.01)
            assert time.monotonic() < deadline, fds()
        for _ in range(5):                   # a few more wait in the backlog: accept fails with EMFILE
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(1.5)
        # The voice block is kept in memory while its file is unchanged (a
        # stat needs no descriptor): an edit made now must be read, and that
        # read is the one that fails.
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()),
                                           "voice": {"openai_api_key": KEY + "-edited"}}))
        body = json.dumps({"call_id": "rtc_emfile"}).encode()
        asker.sendall(f"POST /api/voice/connect HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        answer = b""
        while chunk := asker.recv(65536):
            answer += chunk
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), "".join(lines)[-6000:]
        assert json.loads(payload) == {"error": "voice unavailable — could not read configuration"}
        asker.close()
        for sock in held:
            sock.close()
        held.clear()
        with httpx.Client(timeout=5) as client:       # the server recovers
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.get(f"http://{host}/api/voice/status").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, (fds(), "".join(lines)[-3000:])
                time.sleep(0.2)
    finally:
        for sock in held:
            sock.close()
        child.terminate()
        child.wait(timeout=30)
    text = "".join(lines)
    accept_lines = [json.loads(line) for line in lines if '"server.accept_failed"' in line]
    assert 1 <= len(accept_lines) <= 2, len(accept_lines)
    assert accept_lines[0]["error"] == "Too many open files"
    assert "Traceback" not in text and "could not read journal.json" in text


def test_the_new_settings_come_from_the_environment():
    settings = Settings.from_env({"VOICEACTORS_ALLOWED_HOSTS": " voice.example.org, lan-box:8443 ,,",
                                  "VOICEACTORS_RATE_LIMIT_BURST": "5", "VOICEACTORS_RATE_LIMIT_PER_S": "0",
                                  "VOICEACTORS_KEEP_ALIVE_TIMEOUT": "7.5", "VOICEACTORS_MAX_REQUESTS_IN_FLIGHT": "64"})
    assert settings.allowed_hosts == ("voice.example.org", "lan-box:8443")
    assert (settings.rate_limit_burst, settings.rate_limit_per_s) == (5, 0.0)
    assert (settings.keep_alive_timeout_s, settings.max_requests_in_flight) == (7.5, 64)
    defaults = Settings.from_env({})
    assert defaults.allowed_hosts == () and defaults.rate_limit_per_s > 0 and defaults.max_requests_in_flight > 0


async def test_a_client_already_refused_is_answered_before_the_app_runs(journal, tmp_path, log_stream):
    # A flood of refused POSTs once cost ~1.5 ms of the trio thread each in
    # Quart; a client whose bucket is empty is now answered by the ASGI layer:
    # the same 429 and headers, no `http.request` line each, one summary line.
    stop = trio.Event()
    settings = settings_for(journal, tmp_path, port=0, rate_limit_burst=2, rate_limit_per_s=0.01,
                            shutdown_deadline_s=3.0, close_deadline_s=1.0)
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        port = int(base.rsplit(":", 1)[1])
        request = (f"POST /api/voice/refresh-brain HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                   "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}").encode()
        answers = [await _exchange(port, request, read_until_eof_s=2.0) for _ in range(6)]
        stop.set()
    heads = [data.partition(b"\r\n\r\n")[0].lower() for data, _closed in answers]
    assert [h.split(b" ", 2)[1] for h in heads] == [b"200", b"200", b"429", b"429", b"429", b"429"]
    for data, closed in answers[2:]:
        head, _, body = data.partition(b"\r\n\r\n")
        assert json.loads(body) == {"error": "too many requests"} and closed
        assert b"\r\nretry-after: " in head.lower() and b"\r\nx-request-id: " in head.lower()
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.startswith("{")]
    refresh_lines = [x for x in lines if x.get("event") == "http.request" and x.get("path") == "/api/voice/refresh-brain"]
    # the refusals never reached the app: no request line of theirs, one summary line
    assert [x["status"] for x in refresh_lines] == [200, 200]
    summaries = [x for x in lines if x.get("event") == "http.rate_limited"]
    assert [x["refused"] for x in summaries] == [1]     # the first at once; the rest counted for the next
