"""Children of the tests die with the test process, also when it is killed
outright and no teardown runs (a killed pytest left ``serve`` children
behind): ``child_support.Child`` forks in the main thread with
``die_with_parent``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# a trio program (as pytest is) that starts a long child as the tests do, then waits to be killed
PARENT = """
import sys
import trio
sys.path.insert(0, sys.argv[1])
from child_support import Child

async def main():
    await trio.to_thread.run_sync(lambda: None)      # trio's worker threads exist, as in a test
    child = Child([sys.executable, "-c", "import time; time.sleep(600)"])
    print(child.pid, flush=True)
    await trio.sleep_forever()

trio.run(main)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_when_the_test_process_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(TESTS)], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert alive(child_pid)
        parent.send_signal(signal.SIGKILL)        # no teardown runs
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(child_pid), "the child outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
