"""``voiceactors serve --workers N``: a parent process and N server processes on one port.

The parent serves nothing itself. It holds ``<state_dir>/server.lock``,
reserves the port, starts the coordination (the ``--redis`` given, or a
private ``redis-server`` of its own on a unix socket in the state folder, no
persistence) and then N workers, each a whole ``voiceactors serve`` in a fresh
interpreter (``python -m voiceactors.cli serve …``: spawned, never a fork of
a running trio), with its own state folder ``<state_dir>/workers/<i>/``.

Why ``SO_REUSEPORT`` and not one socket inherited by every worker: each
worker owns its listening socket and its accept queue, and the kernel spreads
new connections over the workers by a hash of the connection's addresses, so
the spread does not depend on which worker's event loop wakes first (with one
shared socket every worker is woken for every connection and the fastest
takes it). The parent keeps a bound, never listening socket with
``SO_REUSEPORT`` on the port: it reserves the port (``--port 0`` picks one
for all) and a server without the option cannot take the port meanwhile.
What it costs: connections still in a killed worker's accept queue are reset.

Supervision: a worker that exits while the parent is not stopping is started
again after a back-off (``RESTART_BACKOFF_S`` doubling to
``RESTART_BACKOFF_MAX_S``; back to the first step once a worker has served for
``RESTART_RESET_S``); its calls meanwhile are taken over through Redis by the
other workers (docs/operations.md § Scaling out). The private Redis is started
again too if it dies (it forgets every key: the registry handles that as a
Redis restart), after ``RESTART_BACKOFF_S``, doubling while its starts fail.
SIGTERM or SIGINT to the parent: SIGTERM to every worker, which shut down
gracefully within the shutdown bound; one still running past it is killed;
the private Redis is stopped last. A second signal kills the workers at
once. A worker's stdin is a pipe from the parent: when the parent is gone
(even by kill -9) the worker sees end of file and shuts down.

Exit codes: 0 stopped by a signal, every worker exited 0; 1 a worker had to
be killed or exited non-zero on the way down, the port could not be bound or
the private Redis did not start; 2 a usage error (a worker exiting 2 before
it served is one too: every worker would); 130 a second signal.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
import trio

from voiceactors import storage
from voiceactors.http.history import WORKERS_FOLDER
from voiceactors.logs import get_logger
from voiceactors.commands import EXIT_INTERRUPTED, EXIT_USAGE, StateDirInUse, console_url, state_dir_lock
from voiceactors.settings import Settings, shutdown_deadlines

REDIS_FOLDER = "redis"
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
RESTART_RESET_S = 60.0         # a worker that served this long restarts after the first step again
STOP_SLACK_S = 2.0             # beyond the worker's own shutdown bound, before it is killed
REDIS_READY_S = 10.0
UNIX_PATH_MAX = 100            # sun_path is 108 bytes on Linux; leave room

_log = get_logger(actor="workers")


class StartRefused(Exception):
    """The workers cannot start; the message says why, the code how to exit."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def worker_state_dir(root: Path, index: int) -> Path:
    return Path(root) / WORKERS_FOLDER / str(index)


def worker_argv(argv: list[str], *, index: int, state_dir: Path, port: int, redis_url: str | None) -> list[str]:
    """The worker's command: the parent's own ``serve`` arguments, then the
    ones it decides (argparse keeps the last of a repeated option)."""
    extra = ["--state-dir", str(state_dir), "--port", str(port), "--workers", "1"]
    if redis_url is not None:
        extra += ["--redis", redis_url]
    return [sys.executable, "-m", "voiceactors.cli", *argv, *extra]


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, never listening socket with ``SO_REUSEPORT`` on ``host:port``
    (``0``: a free port, the same for every worker). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as hypercorn sets it on the workers'
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock


# --- the private Redis ------------------------------------------------------------------

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None   # loaded before any fork


def _stop_with_parent() -> None:
    """In the forked child before exec: SIGTERM when the parent dies (a
    kill -9 of the parent must not leave its redis-server running). Only a
    preloaded libc call: nothing that could wait for a lock another thread held."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class PrivateRedis:
    """A ``redis-server`` of the parent's on a unix socket, no persistence.

    Started with ``subprocess.Popen`` on the trio thread, not trio's
    ``open_process``: that forks from a worker thread, and the parent-death
    signal fires when the *thread* that forked exits (trio's idle threads do)."""

    binary: str
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.folder / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [self.binary, "--port", "0", "--unixsocket", str(self.socket_path), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_stop_with_parent)     # no Ctrl-C of its own: stopped last
        with trio.move_on_after(REDIS_READY_S):
            while not await self._pong():
                if self.proc.poll() is not None:
                    break
                await trio.sleep(0.01)
            else:
                _log.info("workers.redis_started", pid=self.proc.pid, socket=str(self.socket_path))
                return
        returncode = self.proc.poll()
        await self.stop()
        if returncode is not None:
            raise StartRefused(f"the private redis-server exited ({returncode}) before it answered", 1)
        raise StartRefused(f"the private redis-server did not answer within {REDIS_READY_S:g} s", 1)

    async def wait(self) -> int:
        """Its exit code, once it has exited."""
        assert self.proc is not None
        proc = self.proc
        while proc.poll() is None:
            await trio.sleep(0.2)       # a Popen has no trio wait; a poll is cheap and this is rare
        return proc.returncode

    async def _pong(self) -> bool:
        try:
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with sock:
                await sock.connect(str(self.socket_path))
                await sock.send(b"PING\r\n")
                return (await sock.recv(16)).startswith(b"+PONG")
        except OSError:
            return False

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        with trio.move_on_after(5):
            while proc.poll() is None:
                await trio.sleep(0.01)
            return
        proc.kill()
        await trio.to_thread.run_sync(proc.wait)


def private_redis_folder(root: Path) -> Path:
    """``<state_dir>/redis``, or a short temporary folder when its socket's
    path would be too long for a unix socket address."""
    folder = Path(root).resolve() / REDIS_FOLDER
    if len(str(folder / "redis.sock")) > UNIX_PATH_MAX:
        folder = Path(tempfile.mkdtemp(prefix="voiceactors-redis-"))
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


# --- the workers ------------------------------------------------------------------------

@dataclass
class Worker:
    index: int
    argv: list[str]
    env: dict[str, str]
    proc: trio.Process | None = None
    serving: bool = False                                     # this run announced it is serving
    first_served: trio.Event = field(default_factory=trio.Event)
    runs: int = 0


@dataclass
class Parent:
    settings: Settings
    workers: list[Worker]
    redis: PrivateRedis | None
    stopping: bool = False
    exit_code: int = 0
    fatal: trio.Event = field(default_factory=trio.Event)     # a worker cannot start: stop everything

    @property
    def stop_bound_s(self) -> float:
        return shutdown_deadlines(self.settings).hypercorn_s + STOP_SLACK_S

    async def keep_worker(self, worker: Worker) -> None:
        """Run ``worker``, and again after a back-off each time it exits, until stopping."""
        backoff = RESTART_BACKOFF_S
        while not self.stopping:
            started = trio.current_time()
            returncode = await self._run_once(worker)
            if self.stopping:
                return
            served_s = trio.current_time() - started
            if returncode == EXIT_USAGE and not worker.serving:
                _log.error("workers.worker_refused", worker=worker.index, returncode=returncode)
                self.exit_code = EXIT_USAGE
                self.fatal.set()
                return
            if served_s >= RESTART_RESET_S:
                backoff = RESTART_BACKOFF_S
            _log.warning("workers.worker_exited", worker=worker.index, returncode=returncode,
                         served_s=round(served_s, 1), restart_in_s=backoff)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)

    async def _run_once(self, worker: Worker) -> int:
        worker.serving = False
        worker.runs += 1
        # its own session: a Ctrl-C at the terminal (SIGINT to the process group) reaches the parent
        # alone, which stops the workers with one SIGTERM each (a second signal would cut a worker's
        # graceful shutdown short)
        proc = await trio.lowlevel.open_process(worker.argv, env=worker.env, stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, start_new_session=True)
        worker.proc = proc
        _log.info("workers.worker_started", worker=worker.index, pid=proc.pid, run=worker.runs)
        if self.stopping:       # the stop began while it was being started: it gets the same signal
            proc.terminate()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_stdout, worker, proc)
            await proc.wait()
        assert proc.stdin is not None
        await proc.stdin.aclose()
        return proc.returncode if proc.returncode is not None else -1

    async def _read_stdout(self, worker: Worker, proc: trio.Process) -> None:
        """A worker prints one line once serving (the parent prints its own
        for all); anything else it prints goes on to the parent's stdout."""
        assert proc.stdout is not None
        pending = b""
        async with proc.stdout:
            async for chunk in proc.stdout:
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if not worker.serving and b"console is at" in line:
                        worker.serving = True
                        worker.first_served.set()
                        _log.info("workers.worker_serving", worker=worker.index, pid=proc.pid, run=worker.runs)
                        continue
                    sys.stdout.buffer.write(line + b"\n")
                    sys.stdout.flush()

    async def keep_redis(self) -> None:
        """The private Redis, started again if it dies (it comes back empty)."""
        assert self.redis is not None
        while not self.stopping:
            returncode = await self.redis.wait()
            if self.stopping:
                return
            _log.error("workers.redis_exited", returncode=returncode)
            await self._start_redis_again()

    async def _start_redis_again(self) -> None:
        """Start the private Redis, after a back-off doubling at each start
        that fails, until one succeeds or the parent stops (the workers keep
        serving meanwhile: their connects answer 503 until it is back)."""
        assert self.redis is not None
        backoff = RESTART_BACKOFF_S
        while not self.stopping:
            await trio.sleep(backoff)
            try:
                await self.redis.start()
                return
            except StartRefused as error:
                backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)
                _log.error("workers.redis_start_failed", error=str(error), retry_in_s=backoff)

    async def stop_workers(self) -> None:
        """SIGTERM to every worker; kill those still running past the bound."""
        self.stopping = True
        live = [w for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for worker in live:
            assert worker.proc is not None
            worker.proc.terminate()
        with trio.move_on_after(self.stop_bound_s):
            for worker in live:
                assert worker.proc is not None
                await worker.proc.wait()
        for worker in live:
            assert worker.proc is not None
            if worker.proc.returncode is None:
                _log.error("workers.worker_killed", worker=worker.index, pid=worker.proc.pid,
                           after_s=self.stop_bound_s)
                worker.proc.kill()
                await worker.proc.wait()
                self.exit_code = self.exit_code or 1
            elif worker.proc.returncode != 0:
                self.exit_code = self.exit_code or 1
        for worker in live:
            assert worker.proc is not None
            _log.info("workers.worker_stopped", worker=worker.index, returncode=worker.proc.returncode)

    def kill_workers(self) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                worker.proc.kill()


async def _announce(parent: Parent, url: str) -> None:
    for worker in parent.workers:
        await worker.first_served.wait()
    _log.info("workers.serving", workers=len(parent.workers), url=url)
    print(f"voiceactors: the voice console is at {url} — open it in a browser "
          f"({len(parent.workers)} workers)", flush=True)


async def run_parent(parent: Parent, url: str) -> int:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        if parent.redis is not None:
            await parent.redis.start()      # StartRefused: nothing else started yet
        async with trio.open_nursery() as nursery:
            if parent.redis is not None:
                nursery.start_soon(parent.keep_redis)
            for worker in parent.workers:
                nursery.start_soon(parent.keep_worker, worker)
            nursery.start_soon(_announce, parent, url)
            async with trio.open_nursery() as waiting:
                async def on_signal() -> None:
                    async for signum in signals:
                        _log.info("workers.shutdown_signal", signal=signal.Signals(signum).name)
                        break
                    waiting.cancel_scope.cancel()

                async def on_fatal() -> None:
                    await parent.fatal.wait()
                    waiting.cancel_scope.cancel()
                waiting.start_soon(on_signal)
                waiting.start_soon(on_fatal)
            interrupted = False
            async with trio.open_nursery() as stopping:
                async def second_signal() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        interrupted = True
                        parent.kill_workers()
                        return
                stopping.start_soon(second_signal)
                await parent.stop_workers()
                stopping.cancel_scope.cancel()
            if parent.redis is not None:
                await parent.redis.stop()
            nursery.cancel_scope.cancel()
    _log.info("workers.stopped", exit_code=EXIT_INTERRUPTED if interrupted else parent.exit_code)
    return EXIT_INTERRUPTED if interrupted else parent.exit_code


def _redis_binary(settings: Settings) -> str | None:
    """redis-server's path, when the workers need a private one."""
    if settings.redis_url is not None:
        return None
    binary = shutil.which("redis-server")
    if binary is None:
        raise StartRefused("--workers N needs Redis to coordinate the workers: install redis-server "
                           "(apt-get install -y redis-server) or pass --redis URL", EXIT_USAGE)
    return binary


def _parent(args: argparse.Namespace, settings: Settings, root: Path, port: int, binary: str | None) -> Parent:
    redis = PrivateRedis(binary, private_redis_folder(root)) if binary is not None else None
    redis_url = redis.url if redis is not None else None
    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    env = dict(os.environ)
    workers = []
    for index in range(settings.workers):
        state_dir = worker_state_dir(root, index)
        storage.private_folder(state_dir)
        workers.append(Worker(index, worker_argv(argv, index=index, state_dir=state_dir, port=port,
                                                 redis_url=redis_url),
                              {**env, "VOICEACTORS_WORKER_INDEX": str(index)}))
    return Parent(settings, workers, redis)


def cli_serve_workers(args: argparse.Namespace, settings: Settings) -> int:
    """``serve --workers N`` (N > 1), once the settings are checked."""
    try:
        if settings.demo:
            raise StartRefused("--workers does not go with --demo (the demo is one process)", EXIT_USAGE)
        binary = _redis_binary(settings)
        with state_dir_lock(settings.state_dir):
            try:
                reserved = reserve_port(settings.host, settings.port)
            except OSError as error:
                raise StartRefused(f"cannot serve on {settings.host}:{settings.port}: {error}", 1) from None
            with reserved:
                port = reserved.getsockname()[1]
                host = f"[{settings.host}]" if ":" in settings.host else settings.host
                parent = _parent(args, settings, Path(settings.state_dir), port, binary)
                return trio.run(run_parent, parent, console_url([f"http://{host}:{port}"]))
    except StateDirInUse as error:
        print(f"voiceactors: {error}", file=sys.stderr)
        return EXIT_USAGE
    except StartRefused as error:
        print(f"voiceactors: {error}", file=sys.stderr)
        return error.code

