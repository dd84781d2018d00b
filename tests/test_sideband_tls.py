"""The client TLS contexts: one per process (``realtime/tls.py``), still verifying.

``ssl.create_default_context()`` loads the system's CA store (~30 ms of CPU
on this machine); trio-websocket makes one for every ``wss`` connect unless
given a context, and ``httpx.AsyncClient`` one per client (the hangup's).
The sideband and the hangup use the process's (``tls.SIDEBAND``,
``tls.REST``). These tests open real TLS websockets on loopback (a
trio-websocket server with a certificate from a throwaway CA, trustme), run
real hangups against the simulator, and count the contexts the standard
library itself makes.
"""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import trio
import trustme
from trio_websocket import serve_websocket

from calls_support import Sideband, rig
from voiceactors.realtime import sideband
from voiceactors.realtime import tls as client_tls


@pytest.fixture
def ca(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> trustme.CA:
    """A throwaway CA the default context trusts (``SSL_CERT_FILE``), and a
    process context made afresh for this test (an earlier test's one would
    not trust it)."""
    authority = trustme.CA()
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.setattr(client_tls.SIDEBAND, "made", None)
    return authority


@pytest.fixture
def contexts_made(monkeypatch: pytest.MonkeyPatch) -> list[ssl.SSLContext]:
    """Every client ``ssl.create_default_context(...)`` made while the test
    runs (the standard library's function wrapped, not ours; httpx's default
    calls it with its ``cafile``)."""
    made: list[ssl.SSLContext] = []
    original = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        context = original(*args, **kwargs)
        if not args or args[0] == ssl.Purpose.SERVER_AUTH:    # a client's (not a test server's)
            made.append(context)
        return context

    monkeypatch.setattr(ssl, "create_default_context", counting)
    return made


async def _tls_server(nursery: trio.Nursery, ca: trustme.CA, *, host_name: str = "localhost") -> int:
    """A loopback wss server that answers every handshake and echoes nothing;
    returns its port."""
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(host_name).configure_cert(server_context)

    async def handler(request: Any) -> None:
        ws = await request.accept()
        try:
            await ws.get_message()
        except Exception:  # noqa: BLE001 - the client closes; that is the end
            pass

    server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, server_context)
    port: int = server.port
    return port


async def test_wss_sidebands_share_one_tls_context_and_still_verify(ca: trustme.CA,
                                                                    contexts_made: list[ssl.SSLContext]) -> None:
    async with trio.open_nursery() as nursery:
        port = await _tls_server(nursery, ca)
        for call in ("rtc_a", "rtc_b", "rtc_c"):
            async with sideband.open_sideband(f"https://localhost:{port}/v1", "sk-test", call,
                                              connect_timeout=10) as ws:
                assert ws.is_client
        nursery.cancel_scope.cancel()
    # three connects, one context (trio-websocket alone makes one per connect)
    assert len(contexts_made) == 1
    assert contexts_made[0] is client_tls.SIDEBAND.made
    assert contexts_made[0].verify_mode == ssl.CERT_REQUIRED and contexts_made[0].check_hostname


async def test_the_shared_context_refuses_a_certificate_for_another_host(ca: trustme.CA) -> None:
    async with trio.open_nursery() as nursery:
        port = await _tls_server(nursery, ca, host_name="elsewhere.example")
        with pytest.raises(sideband.SidebandUnavailable):
            async with sideband.open_sideband(f"https://localhost:{port}/v1", "sk-test", "rtc_a",
                                              connect_timeout=10):
                pass
        nursery.cancel_scope.cancel()


async def test_a_plain_ws_sideband_makes_no_tls_context(contexts_made: list[ssl.SSLContext],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_tls.SIDEBAND, "made", None)

    async def handler(request: Any) -> None:
        ws = await request.accept()
        try:
            await ws.get_message()
        except Exception:  # noqa: BLE001
            pass

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        async with sideband.open_sideband(f"http://127.0.0.1:{server.port}/v1", "sk-test", "rtc_a",
                                          connect_timeout=10):
            pass
        nursery.cancel_scope.cancel()
    assert contexts_made == [] and client_tls.SIDEBAND.made is None


async def test_hangups_share_one_tls_context(tmp_path: Any, autojump_clock: Any, contexts_made: list[ssl.SSLContext],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Two idle ends, two hangups (plain http to the simulator: an httpx
    client makes its TLS context whatever the scheme), one context."""
    monkeypatch.setattr(client_tls.REST, "made", None)
    async with rig(tmp_path, sideband=Sideband.LOOPBACK, call_idle_timeout_s=5.0) as r:
        for call in ("rtc_idle_a", "rtc_idle_b"):
            actor, _sc = await r.run_call(call, "silence")
            assert actor.end_reason == "idle_timeout"
    assert r.sim.hangups == ["rtc_idle_a", "rtc_idle_b"]
    assert len(contexts_made) == 1 and contexts_made[0] is client_tls.REST.made


async def test_a_supervisor_that_hangs_up_makes_the_hangups_context_in_a_worker_thread(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not at the first hangup on the trio thread (a 20–45 ms stall of every call)."""
    import math
    import threading

    import httpx

    from voiceactors.call.supervisor import CallSupervisor
    from voiceactors.settings import Settings

    made_on: list[threading.Thread] = []
    original = httpx.create_ssl_context

    def noting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made_on.append(threading.current_thread())
        return original(*args, **kwargs)

    monkeypatch.setattr(httpx, "create_ssl_context", noting)
    monkeypatch.setattr(client_tls.REST, "made", None)
    settings = Settings(journal=tmp_path / "journal", state_dir=tmp_path / "state", rejoin_max_calls=0,
                        call_idle_timeout_s=math.inf)
    executor_inbox, _receive = trio.open_memory_channel[Any](1)
    async with trio.open_nursery() as nursery:
        await nursery.start(CallSupervisor(settings, executor_inbox, api_key="sk-test", hangup=False).run)
        assert made_on == [] and client_tls.REST.made is None        # no hangups: nothing made
        await nursery.start(CallSupervisor(settings, executor_inbox, api_key="sk-test").run)
        assert len(made_on) == 1 and made_on[0] is not threading.main_thread()
        assert client_tls.REST.made is not None
        nursery.cancel_scope.cancel()
