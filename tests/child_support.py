"""Child processes of the tests: a server child's stderr, read while the test
talks to it; how long its start may take; a child that dies with the test."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

import trio

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


class Child:
    """A child process for a trio test, forked here in the main thread so that
    ``die_with_parent`` holds (``trio.lowlevel.open_process`` forks in a worker
    thread): the parts of ``trio.Process`` the tests use. ``stderr`` (and
    ``stdout`` when piped) are trio streams."""

    def __init__(self, args: list[str], **popen: Any) -> None:
        assert threading.current_thread() is threading.main_thread(), \
            "start a Child from the main thread: it dies with the thread that forks it"
        self._popen = subprocess.Popen(args, preexec_fn=die_with_parent(), **popen)
        self.args, self.pid = args, self._popen.pid
        self.stdout = self._trio_stream(self._popen.stdout)
        self.stderr = self._trio_stream(self._popen.stderr)

    @staticmethod
    def _trio_stream(pipe: Any) -> trio.lowlevel.FdStream | None:
        if pipe is None:
            return None
        stream = trio.lowlevel.FdStream(os.dup(pipe.fileno()))
        pipe.close()
        return stream

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """Its exit status, waiting without a thread (a pidfd is readable once it exits)."""
        if self._popen.poll() is None:
            pidfd = os.pidfd_open(self.pid)
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        return self._popen.wait()

    def send_signal(self, sig: int) -> None:
        self._popen.send_signal(sig)

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()
