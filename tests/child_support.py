"""Child processes of the tests: a server child's stderr, read while the test
talks to it; how long its start may take; a child that dies with the test."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Callable

# A child's start (imports, journal, sockets) is setup, not behaviour: on a
# loaded machine it takes many times its idle second, so it gets real time.
CHILD_START_S = 60.0

PR_SET_PDEATHSIG = 1      # <linux/prctl.h>


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when its parent
    dies (None off Linux): a killed pytest leaves no server behind. The
    kernel's "parent" is the *thread* that forks: pass it to a
    ``subprocess.Popen`` made in the main thread, never to
    ``trio.lowlevel.open_process`` (it forks in a worker thread, which trio
    retires when idle). libc and the parent's pid are looked up before the
    fork; the child only calls ``prctl``, then checks that the parent did not
    die before it asked."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(127)                      # no child that could outlive its test
        if os.getppid() != parent:             # the parent died between the fork and prctl
            os._exit(0)

    return preexec


def pump_stderr(child: subprocess.Popen[str], ready_event: str) -> tuple[list[str], threading.Event]:
    """Collect ``child``'s stderr lines in a daemon thread (a full pipe would
    stall the child). The event is set once a line carries ``ready_event``
    as its JSON event name (e.g. ``server.serving``)."""
    lines: list[str] = []
    ready = threading.Event()
    marker = f'"{ready_event}"'
    assert child.stderr is not None

    def pump() -> None:
        for line in child.stderr:
            lines.append(line)
            if marker in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    return lines, ready
