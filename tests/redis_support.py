"""A throwaway redis-server per test: Debian's ``redis-server`` on a unix
socket in the test's temporary folder, no persistence (``--save ''
--appendonly no``), no TCP port (``--port 0``). Tests that need it skip with a
reason when ``redis-server`` is not installed (``.ci/run`` installs it).

The child dies with the process that started it, also when that process is
killed outright and no teardown runs (Linux: ``PR_SET_PDEATHSIG``, SIGKILL;
``tests/test_redis_support.py``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import trio

from child_support import die_with_parent
from voiceactors.cluster import redis_client as rc

REDIS_SERVER = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(REDIS_SERVER is None,
                                 reason="redis-server is not installed (apt-get install -y redis-server)")


class RedisServer:
    """One redis-server child; ``stop`` and ``start`` again keep its socket
    path (a restart without persistence forgets every key)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.socket = folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        assert threading.current_thread() is threading.main_thread(), \
            "start redis-server from the main thread: it dies with the thread that forks it"
        self.socket.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent())
        deadline = time.monotonic() + 10
        while not self._pong():
            assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not answer PING within 10 s"
            time.sleep(0.01)

    def _pong(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1)
                s.connect(str(self.socket))
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path):
    """A running redis-server for this test (skips without one)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def expire_lease_now(server: RedisServer, call_id: str, ttl_s: float) -> None:
    """The call's lease (taken with ``ttl_s``) runs out now, as its TTL would
    for a holder that stopped renewing or was paused past it: Redis expires
    the key itself, no test sleeps a TTL."""
    key = rc.lease_key(call_id)
    async with rc.client(server.url) as redis:
        assert 0 < await redis.pttl(key) <= ttl_s * 1000
        await redis.pexpire(key, 1)
        with trio.fail_after(5):
            while await redis.exists([key]):
                await trio.sleep(0.01)
