"""Shared pieces of the benchmarks: child processes, CPU and memory
accounting, percentiles, the sample journal, machine facts.

Nothing here is timed itself. Every process the benchmarks start is a child
of the driver on loopback; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import psutil

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
#: The day every benchmark journal is generated for and every peer is pinned to.
BENCH_TODAY = _dt.date(2026, 3, 2)
BENCH_KEY = "sk-bench-voiceactors"


def work_dir() -> Path:
    """Where journals and run folders go: ``$VOICEACTORS_BENCH_DIR``, default /tmp/voiceactors-bench."""
    return Path(os.environ.get("VOICEACTORS_BENCH_DIR") or "/tmp/voiceactors-bench")


def redis_socket_path(folder: Path) -> Path:
    """``folder/redis.sock``, or ``redis.sock`` in a short temporary folder
    when that path is too long for a unix socket address (sun_path is 108
    bytes: a deep ``$VOICEACTORS_BENCH_DIR``, or pytest-xdist's tmp paths)."""
    from voiceactors.workers import UNIX_PATH_MAX
    path = folder / "redis.sock"
    if len(str(path)) > UNIX_PATH_MAX:
        path = Path(tempfile.mkdtemp(prefix="voiceactors-bench-redis-")) / "redis.sock"
    return path


# --- statistics ---------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(values: Iterable[float]) -> dict[str, float]:
    """n, p50, p99, max and mean of ``values`` (milliseconds by convention)."""
    vals = list(values)
    if not vals:
        return {"n": 0, "p50": math.nan, "p99": math.nan, "max": math.nan, "mean": math.nan}
    return {"n": len(vals), "p50": percentile(vals, 50), "p99": percentile(vals, 99),
            "max": max(vals), "mean": sum(vals) / len(vals)}


def fmt(s: dict[str, float]) -> str:
    """``p50 / p99 / max`` in ms, one decimal."""
    if not s or not s.get("n"):
        return "n/a"
    return f"{s['p50']:.1f} / {s['p99']:.1f} / {s['max']:.1f} (n={s['n']})"


# --- processes ----------------------------------------------------------------------------

class ProcError(RuntimeError):
    """A child process did not say what it should have, in time."""


@dataclass
class Proc:
    """A child Python process speaking a line protocol on stdin/stdout.

    stdout lines are collected by a thread (so a wait can time out); stderr
    goes to a file (``stderr_path``) so a failing child can be diagnosed.
    """

    name: str
    popen: subprocess.Popen[str]
    stderr_path: Path
    lines: "queue.Queue[str | None]" = field(default_factory=queue.Queue)
    tree: bool = False      # CPU and RSS of the process and every process under it (a serve and its workers)

    def _processes(self) -> list[psutil.Process]:
        if not self.tree:
            return [self.ps]
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.Error:
            return [self.ps]

    def __post_init__(self) -> None:
        self.ps = psutil.Process(self.popen.pid)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float) -> str:
        """The next stdout line starting with ``prefix`` (other lines are
        skipped); ProcError on timeout or exit."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProcError(f"{self.name}: no {prefix!r} within {timeout:.0f}s; stderr: {self.tail()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise ProcError(f"{self.name}: exited ({self.popen.poll()}) before {prefix!r}; stderr: {self.tail()}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(line + "\n")
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def close_stdin(self) -> None:
        try:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        except OSError:
            pass

    def cpu_s(self) -> float:
        """User + system CPU seconds so far (all threads; with ``tree``, of
        every process under it still running: one that exited is not counted)."""
        total = 0.0
        for ps in self._processes():
            try:
                t = ps.cpu_times()
            except psutil.Error:
                if ps is self.ps:
                    return math.nan
                continue
            total += t.user + t.system
        return total

    def rss(self) -> int:
        total = 0
        for ps in self._processes():
            try:
                total += ps.memory_info().rss
            except psutil.Error:
                continue
        return total

    def wait(self, timeout: float) -> int | None:
        """Wait for exit; terminate then kill when it overstays. Returns the exit code."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.terminate()
            try:
                return self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                return self.popen.wait(timeout=5)

    def tail(self, chars: int = 1500) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


#: the environment variable naming another checkout whose server the benchmarks measure
SERVER_CHECKOUT_ENV = "BENCH_PEER_REPO"


@dataclass(frozen=True)
class Checkout:
    """A checkout of the project whose ``voiceactors`` a child process runs.

    This checkout's (``Checkout(REPO)``) is the default. Another's (a
    ``git worktree add`` of an older commit) runs only the server under
    test: the child starts in a folder holding nothing but a link to this
    checkout's ``benchmarks`` (``python -m`` puts its start folder first on
    ``sys.path``), with the other checkout next on ``PYTHONPATH`` (so its
    ``voiceactors`` is found before the one installed in this checkout's
    venv, whose finder comes after ``sys.path``), and with that checkout's
    own interpreter when it has a ``.venv`` (its dependencies' versions).
    A process the child starts (``serve --workers``'s workers, a peer's
    ``serve``) inherits the folder and the path.
    """

    root: Path

    @property
    def is_this(self) -> bool:
        return self.root.resolve() == REPO

    @property
    def python(self) -> str:
        own = self.root / ".venv" / "bin" / "python"
        return str(own) if not self.is_this and own.exists() else PYTHON

    def start_folder(self) -> Path:
        """Where a child of this checkout starts (``cwd``)."""
        if self.is_this:
            return REPO
        folder = work_dir() / "checkouts" / hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]
        folder.mkdir(parents=True, exist_ok=True)
        link = folder / "benchmarks"
        with contextlib.suppress(FileExistsError):     # made by an earlier child (or one started meanwhile)
            link.symlink_to(REPO / "benchmarks", target_is_directory=True)
        return folder

    def env(self) -> dict[str, str]:
        """What a child's environment adds (nothing for this checkout)."""
        if self.is_this:
            return {}
        path = [str(self.start_folder()), str(self.root.resolve()), os.environ.get("PYTHONPATH", "")]
        return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}

    def label(self) -> str:
        return code_label(self.root)


def server_checkout() -> Checkout:
    """The checkout the server under test comes from: ``$BENCH_PEER_REPO``,
    else this one."""
    other = os.environ.get(SERVER_CHECKOUT_ENV)
    return Checkout(Path(other)) if other else Checkout(REPO)


def spawn(name: str, module: str, args: list[str], *, workdir: Path, env: dict[str, str] | None = None,
          repo: Path | None = None) -> Proc:
    """Start ``python -m module args`` from this checkout (or, its
    ``voiceactors`` taken from ``repo``, another checkout: ``Checkout``);
    stderr to ``workdir/name.stderr``."""
    workdir.mkdir(parents=True, exist_ok=True)
    stderr_path = workdir / f"{name}.stderr"
    checkout = Checkout(repo or REPO)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "VOICEACTORS_TODAY": BENCH_TODAY.isoformat(),
                **checkout.env(), **(env or {})}
    popen = subprocess.Popen([checkout.python, "-m", module, *args], cwd=checkout.start_folder(), env=full_env,
                             text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=open(stderr_path, "w"), bufsize=1)
    return Proc(name, popen, stderr_path)


@dataclass
class CpuWindow:
    """CPU seconds of some processes between ``start()`` and ``stop()``."""

    procs: dict[str, Proc]
    t0: float = 0.0
    c0: dict[str, float] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = {k: p.cpu_s() for k, p in self.procs.items()}

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        cores = psutil.cpu_count() or 1
        out: dict[str, Any] = {"wall_s": round(wall, 3), "cores": cores}
        for k, p in self.procs.items():
            cpu = p.cpu_s() - self.c0[k]
            out[k] = {"cpu_s": round(cpu, 3), "core_pct": round(100 * cpu / wall, 1),
                      "machine_pct": round(100 * cpu / wall / cores, 1)}
        self.result = out
        return out


# --- journals -----------------------------------------------------------------------------

def sample_journal(days: int, *, seed: int = 0) -> Path:
    """A generated sample journal of ``days`` days ending ``BENCH_TODAY``,
    written once under ``work_dir()`` and reused (its marker file says what it is)."""
    from voiceactors.journal.sample import MARKER, write_sample_journal

    dest = work_dir() / f"journal-{days}d-s{seed}"
    marker = dest / MARKER
    if marker.is_file():
        try:
            meta = json.loads(marker.read_text())
            if meta.get("days") == days and meta.get("today") == BENCH_TODAY.isoformat():
                return dest
        except ValueError:
            pass
    dest.parent.mkdir(parents=True, exist_ok=True)
    return write_sample_journal(dest, days=days, today=BENCH_TODAY, seed=seed)


# --- facts --------------------------------------------------------------------------------

def machine_facts() -> dict[str, Any]:
    """What the numbers were measured on, and how busy the machine was."""
    busy = 0
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if "pytest" in cmd and p.pid != os.getpid():
            busy += 1
    return {
        "cores": psutil.cpu_count(), "python": platform.python_version(),
        "platform": platform.platform(), "loadavg_1m": round(os.getloadavg()[0], 2),
        "pytest_processes": busy, "when_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
    }


def raise_nofile_limit() -> dict[str, Any]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit where
    permitted (children inherit it). Returns what it was and what it is now,
    so a report can say how many sockets a run could hold."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = {"soft": soft, "hard": hard}
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    error = None
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:   # not permitted: keep what we have
            error = f"{type(exc).__name__}: {exc}"
    soft_now, hard_now = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"before": before, "after": {"soft": soft_now, "hard": hard_now}, "error": error}


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a child that needs ``--port``)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]   # an AF_INET address: (host, port)
        return port


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str))


def code_label(repo: Path | None = None) -> str:
    """The short commit of a checkout (this one by default; ``+dirty`` when
    the measured code, the package or the benchmarks, has uncommitted
    changes); "" when it is not a git checkout."""
    import subprocess

    where = str(repo or REPO)
    try:
        rev = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no", "--",
                                "voiceactors", "benchmarks", "pyproject.toml"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return rev + ("+dirty" if rev and dirty else "")
