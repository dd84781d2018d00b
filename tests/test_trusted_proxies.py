"""Behind a TLS-terminating proxy (setting ``trusted_proxies``).

Every request through a reverse proxy arrives from the proxy's address over
plain http. With the proxy's address (or network) in ``trusted_proxies``, a
request from it carries its client in ``X-Forwarded-For`` (the rightmost hop
that is not itself a trusted proxy) and the public scheme in
``X-Forwarded-Proto``: the rate limits key on that client and the console's
cookie is ``Secure`` when the scheme is https. From any other peer the
headers are ignored (anyone can send them). Through the Quart test client
(the peer set per request) on ``autojump_clock``, and the early refusal
below hypercorn (``asgi.RateLimitRefusal``) on its own.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import trio

from clock_support import serving
from voiceactors.http import create_app
from voiceactors.http.asgi import RateLimitRefusal
from voiceactors.http.forwarded import TrustedProxies
from voiceactors.http.ratelimit import LOGIN_PATH, RateLimiter
from voiceactors.journal.sample import write_sample_journal
from voiceactors.server import run_server
from voiceactors.settings import InvalidSettings, Settings

DAY = dt.date(2026, 3, 27)
TOKEN = "trusted-proxy-token-41c9e2"
PROXY = {"client": ("127.0.0.1", 50001)}
OTHER_PEER = {"client": ("127.0.0.9", 50009)}
ALICE, BOB = "203.0.113.7", "203.0.113.8"


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    return write_sample_journal(tmp_path_factory.mktemp("proxies") / "journal", days=1, today=DAY)


def _app(journal: Path, tmp_path: Path, **changes: Any) -> Any:
    settings = Settings(journal=journal, state_dir=tmp_path / "state", api_token=TOKEN, rate_limit_burst=2)
    return create_app(settings.replace(**changes))


async def _login(client: Any, peer: dict, headers: dict[str, str] | None = None) -> Any:
    return await client.post("/api/voice/login", json={"token": TOKEN}, scope_base=peer, headers=headers or {})


def _forwarded_for(value: str, proto: str | None = None) -> dict[str, str]:
    headers = {"X-Forwarded-For": value}
    if proto is not None:
        headers["X-Forwarded-Proto"] = proto
    return headers


async def test_forwarded_headers_from_an_untrusted_peer_are_ignored(journal, tmp_path, settled_clock):
    for trusted in ((), ("10.0.0.0/8",)):            # none trusted, or only another network
        async with serving(_app(journal, tmp_path, trusted_proxies=trusted)) as test_app:
            client = test_app.test_client()
            first = await _login(client, OTHER_PEER, _forwarded_for(ALICE, "https"))
            assert first.status_code == 200
            assert "Secure" not in first.headers["Set-Cookie"]       # the peer spoke plain http
            assert (await _login(client, OTHER_PEER, _forwarded_for(BOB))).status_code == 200
            # a new X-Forwarded-For each time does not give the peer a new bucket
            refused = await _login(client, OTHER_PEER, _forwarded_for("198.51.100.1"))
            assert refused.status_code == 429
            assert await refused.get_json() == {"error": "too many requests"}


async def test_from_a_trusted_proxy_each_client_has_its_own_bucket(journal, tmp_path, settled_clock):
    async with serving(_app(journal, tmp_path, trusted_proxies=("127.0.0.1",))) as test_app:
        client = test_app.test_client()
        assert (await _login(client, PROXY, _forwarded_for(ALICE))).status_code == 200
        assert (await _login(client, PROXY, _forwarded_for(ALICE))).status_code == 200
        assert (await _login(client, PROXY, _forwarded_for(ALICE))).status_code == 429
        # Bob behind the same proxy is not Alice
        assert (await _login(client, PROXY, _forwarded_for(BOB))).status_code == 200
        # Alice prepending a made-up hop: the proxy appended her real address, the rightmost
        assert (await _login(client, PROXY, _forwarded_for(f"198.51.100.1, {ALICE}"))).status_code == 429
        # the proxy itself, without the header, is a client of its own
        assert (await _login(client, PROXY)).status_code == 200


async def test_trusted_hops_are_skipped_from_the_right(journal, tmp_path, settled_clock):
    async with serving(_app(journal, tmp_path, trusted_proxies=("127.0.0.0/8", "::1"))) as test_app:
        client = test_app.test_client()
        for _ in range(2):    # Alice through two proxies of ours, the second one's port given
            assert (await _login(client, PROXY, _forwarded_for(f"{ALICE}, 127.0.0.5:8080"))).status_code == 200
        assert (await _login(client, PROXY, _forwarded_for(ALICE))).status_code == 429
        assert (await _login(client, PROXY, _forwarded_for(f"{BOB}, [::1]:443"))).status_code == 200


async def test_the_cookie_is_secure_when_the_trusted_proxy_says_https(journal, tmp_path, settled_clock):
    async with serving(_app(journal, tmp_path, trusted_proxies=("127.0.0.1",), rate_limit_per_s=0)) as test_app:
        client = test_app.test_client()
        secure = await _login(client, PROXY, _forwarded_for(ALICE, "https"))
        assert secure.status_code == 200 and "Secure" in secure.headers["Set-Cookie"]
        plain = await _login(client, PROXY, _forwarded_for(ALICE, "http"))
        assert "Secure" not in plain.headers["Set-Cookie"]
        out = await client.post("/api/voice/logout", scope_base=PROXY, headers={"X-Forwarded-Proto": "https"})
        assert "Secure" in out.headers["Set-Cookie"]      # the cookie is cleared with the attributes it was set with
        nonsense = await _login(client, PROXY, _forwarded_for(ALICE, "gopher"))
        assert "Secure" not in nonsense.headers["Set-Cookie"]


async def test_the_refusal_below_hypercorn_leaves_a_trusted_proxy_to_the_app(journal, tmp_path, settled_clock):
    """The early 429 at accept reads only the socket's peer: for a trusted
    proxy's connection that is not the client, so it is never refused
    there (the app's limit, which reads the forwarded client, still is)."""
    limiter = RateLimiter(burst=1, per_s=0.5, max_clients=16)
    assert limiter.take((LOGIN_PATH, "127.0.0.1")) == 0.0        # the proxy's own bucket is empty now
    request = (b"POST /api/voice/login HTTP/1.1\r\nhost: localhost\r\nx-forwarded-for: 203.0.113.8\r\n"
               b"content-length: 0\r\n\r\n")
    app = _app(journal, tmp_path)
    untrusting = RateLimitRefusal(app, limiter, TrustedProxies(()))
    assert untrusting.watching("127.0.0.1") and untrusting.answer("127.0.0.1", request) is not None
    trusting = RateLimitRefusal(app, limiter, TrustedProxies(("127.0.0.1",)))
    assert not trusting.watching("127.0.0.1")
    assert trusting.answer("127.0.0.1", request) is None


async def _exchange(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = b""
    async with stream:
        await stream.send_all(request)
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    return data


async def test_a_real_server_limits_each_client_behind_a_trusted_proxy(journal, tmp_path):
    """On real sockets, where the refusal at accept reads the socket's peer
    first: the proxy's own empty bucket refuses none of its clients."""
    settings = Settings(journal=journal, state_dir=tmp_path / "state", openai_api_key_env="sk-proxy-test-5e").replace(
        port=0, rate_limit_burst=1, rate_limit_per_s=0.01, shutdown_deadline_s=3.0, close_deadline_s=1.0,
        trusted_proxies=("127.0.0.1",))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        [base] = await nursery.start(lambda task_status: run_server(settings, shutdown_trigger=stop.wait,
                                                                     task_status=task_status))
        port = int(base.rsplit(":", 1)[1])

        def post(forwarded: str | None) -> bytes:
            header = f"X-Forwarded-For: {forwarded}\r\n" if forwarded else ""
            return (f"POST /api/voice/refresh-brain HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{header}"
                    "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}").encode()

        statuses = [(await _exchange(port, post(forwarded))).split(b" ", 2)[1]
                    for forwarded in (None, ALICE, ALICE, BOB, None)]
        stop.set()
    # the proxy's own token, Alice's, Alice refused, Bob's, the proxy refused
    assert statuses == [b"200", b"200", b"429", b"200", b"429"]


def test_a_malformed_trusted_proxy_entry_is_refused_at_start():
    settings = Settings(journal=Path("j"), state_dir=Path("s"), trusted_proxies=("10.0.0.0/8", "proxy.local"))
    with pytest.raises(InvalidSettings, match="trusted_proxies.*'proxy.local'"):
        settings.validate()


def test_trusted_proxies_come_from_the_environment_comma_separated():
    settings = Settings.from_env({"VOICEACTORS_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.1.4 ,fd00::/8"})
    assert settings.trusted_proxies == ("10.0.0.0/8", "192.168.1.4", "fd00::/8")
    proxies = TrustedProxies(settings.trusted_proxies)
    assert proxies.trusts("10.1.2.3") and proxies.trusts("192.168.1.4") and proxies.trusts("fd00::1")
    assert proxies.trusts("::ffff:10.1.2.3")                 # a dual-stack socket's view of 10.1.2.3
    assert not proxies.trusts("192.168.1.5") and not proxies.trusts("<local>")
