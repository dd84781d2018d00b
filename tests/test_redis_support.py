"""The tests' throwaway redis-server dies with the process that started it.

A pytest killed outright (SIGKILL, an OOM kill, a CI timeout) runs no
fixture teardown; its redis-server children used to live on, each holding a
socket in a deleted temporary folder. ``RedisServer`` now asks the kernel
to SIGKILL the child when its parent dies (Linux ``PR_SET_PDEATHSIG``).
Checked with a real child Python process that starts one through
``redis_support`` and is then SIGKILLed: the redis-server's pid must be
gone (or a zombie waiting for its new parent to reap it) within a bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redis_support import needs_redis

TESTS = Path(__file__).resolve().parent
CHILD = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from redis_support import RedisServer
server = RedisServer(Path(sys.argv[2]))
server.start()
print(server.proc.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    """``pid`` has exited: no such process, or a zombie (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@needs_redis
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_parent_takes_its_redis_server_with_it(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(TESTS), str(tmp_path / "redis")],
                             stdout=subprocess.PIPE, text=True)
    redis_pid = None
    try:
        line = child.stdout.readline()          # the child prints it once redis-server answered PING
        assert line.strip().isdigit(), f"the child did not start redis-server: {line!r}"
        redis_pid = int(line)
        assert not _gone(redis_pid)
        child.send_signal(signal.SIGKILL)         # no teardown runs
        child.wait(10)
        assert _wait_gone(redis_pid, within_s=10), "redis-server outlived the process that started it"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if redis_pid is not None and not _gone(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)  # leave nothing behind when the check failed
