"""``voiceactors serve``: the voice server under hypercorn's trio worker.

SIGINT or SIGTERM starts a graceful shutdown: hypercorn stops accepting,
event streams end, in-flight requests get ``GRACEFUL_S`` to finish, then the
app's lifespan cancels and joins the runtime (every live call sends its last
outputs, closes its sideband and flushes its call record) within
``settings.shutdown_deadline_s``; the process then exits 0. A second signal
during that shutdown interrupts it.

A runtime that crashes or cannot start (``http.runtime_failed``: every live
call of the process ended with it, and it does not come back) starts the same
shutdown, and the process exits ``EXIT_RUNTIME_FAILED`` (3): a process that
can serve no call must not look alive, and whatever supervises it
(``serve --workers``' parent, systemd's ``Restart=on-failure``) starts it
again. Meanwhile ``/api/voice/status`` answers 503.

``--demo`` (``voiceactors.demo``) serves a generated sample journal with the
Realtime simulator in the same process standing in for OpenAI; this module
never imports the simulator, it takes the demo's folders and backend as hooks.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import trio
from hypercorn.config import Config as HypercornConfig

from voiceactors import clock, gc_policy, logs, metrics, notices, tracing
from voiceactors.tracing import setup as tracing_setup
from voiceactors.commands import (EXIT_INTERRUPTED, EXIT_RUNTIME_FAILED, EXIT_USAGE, StateDirInUse, console_url,
                                  state_dir_lock)
from voiceactors.http import auth, create_app, hosts, serving, voice_state
from voiceactors.http.app import check_journal_settings
from voiceactors.logs import get_logger
from voiceactors.settings import InvalidSettings, Settings, flag_values, shutdown_deadlines

GRACEFUL_S = 2.0        # hypercorn's wait for in-flight requests before the lifespan stops

_log = get_logger(actor="server")
_hypercorn_log = get_logger(actor="hypercorn")


# --- settings ------------------------------------------------------------------

def settings_from_args(args: argparse.Namespace, **extra: Any) -> Settings:
    """Settings from the serve flags (flags > env > defaults), checked. Raises
    ValueError for a malformed environment value or ``InvalidSettings`` (a
    ValueError) for values the server cannot run with: both exit 2."""
    return Settings.from_env(**{**flag_values(args), **extra}).validate()


# --- hypercorn -----------------------------------------------------------------

class _StructlogHandler(logging.Handler):
    """Hypercorn's error log, as our structured log lines."""

    def emit(self, record: logging.LogRecord) -> None:
        # hypercorn's own text stays as it is, in ``message``; the event is ours
        method = getattr(_hypercorn_log, record.levelname.lower(), _hypercorn_log.info)
        if record.exc_info and record.exc_info[1] is not None:
            method("hypercorn.message", message=record.getMessage(), exc_info=record.exc_info)
        else:
            method("hypercorn.message", message=record.getMessage())


ACCEPT_LOG_EVERY_S = 10.0


class _AcceptErrorHandler(logging.Handler):
    """trio's accept loop, out of file descriptors (EMFILE), logs an error
    with a traceback every 0.1 s while it retries. Here it is one structured
    warning at most every ``ACCEPT_LOG_EVERY_S``, with the number of retries
    in between, and no traceback (the errno says it all)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: float | None = None
        self._suppressed = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            now = trio.current_time()
        except RuntimeError:        # outside a trio run: no clock to rate-limit by
            now = None
        if now is not None and self._last is not None and now - self._last < ACCEPT_LOG_EVERY_S:
            self._suppressed += 1
            return
        self._last = now
        error = record.exc_info[1] if record.exc_info else None
        _log.warning(
            "server.accept_failed", errno=getattr(error, "errno", None), error=getattr(error, "strerror", None),
            retries_since_last_line=self._suppressed)
        self._suppressed = 0


def _quiet_accept_errors() -> None:
    logger = logging.getLogger("trio.serve_listeners")
    logger.handlers = [_AcceptErrorHandler()]
    logger.propagate = False


FD_HEADROOM = 64     # descriptors besides connections: listeners, journal files, threads' reads


def _check_connection_cap(cap: int) -> None:
    """Warn when ``max_connections`` leaves too few descriptors for the rest
    (then a flood can still reach EMFILE before the cap)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (cap == 0 or cap > soft - FD_HEADROOM):
        _log.warning("server.connection_cap_above_fd_limit", max_connections=cap, fd_limit=soft,
                     advice=f"set VOICEACTORS_MAX_CONNECTIONS below {max(1, soft - FD_HEADROOM)} or raise ulimit -n")


def _hypercorn_logger() -> logging.Logger:
    logger = logging.getLogger("voiceactors.hypercorn")
    logger.handlers = [_StructlogHandler()]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def hypercorn_config(settings: Settings) -> HypercornConfig:
    config = HypercornConfig()
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    config.bind = [f"{host}:{settings.port}"]
    config.accesslog = None          # the app logs each request itself, with its request id
    config.errorlog = _hypercorn_logger()
    config.graceful_timeout = GRACEFUL_S
    config.shutdown_timeout = shutdown_deadlines(settings).hypercorn_s   # the chain's outermost link
    config.h11_max_incomplete_size = 16 * 1024
    config.keep_alive_timeout = settings.keep_alive_timeout_s
    if settings.worker_index is not None:
        # A `serve --workers` worker shares its port with its siblings (the kernel spreads connections
        # over them): hypercorn's Config.create_sockets sets SO_REUSEPORT when `workers` > 1, its sign
        # that processes share the binds. We never run hypercorn's own process pool (http/serving.py).
        config.workers = 2
    return config


async def wait_for_signal() -> None:
    """Return at the first SIGINT or SIGTERM received from now on."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        await _first_signal(signals)


async def _first_signal(signals: Any) -> None:
    async for signum in signals:
        _log.info("server.shutdown_signal", signal=signal.Signals(signum).name)
        return


async def _log_startup_notices(settings: Settings) -> None:
    """Say at start what a person would otherwise find out at their first
    call (``notices``): a warning each, with what to do."""
    for notice in await trio.to_thread.run_sync(notices.startup_notices, settings):
        _log.warning("server.startup_notice", notice=notice.value, what_to_do=notices.WHAT_TO_DO[notice])


async def run_server(settings: Settings, *, shutdown_trigger: Callable[[], Awaitable[None]] = wait_for_signal,
                     brain_backend: Any | None = None, tune_gc: bool = False,
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``settings`` until ``shutdown_trigger`` returns or the runtime
    fails, then shut down gracefully (bounded); raises ``RuntimeFailed``
    after the shutdown in the second case. ``task_status.started`` gets the
    bound URLs.
    ``tune_gc``: once serving (the runtime started, its lazy imports done),
    move the heap out of the garbage collector's sight and schedule full
    collections every ``gc_full_interval_s`` (``gc_policy``) — process-wide,
    so only the command asks for it."""
    app = create_app(settings, brain_backend=brain_backend)
    voice = voice_state(app)
    _quiet_accept_errors()
    _check_connection_cap(settings.max_connections)

    async def trigger() -> None:
        await _first_of(shutdown_trigger, voice.runtime_failed.wait)
        voice.stopping.set()    # event streams end now, not after the graceful wait
        _log.info("server.shutdown_started", runtime_failed=voice.runtime_failed.is_set())

    background = trio.CancelScope()   # process upkeep: ends when serving ends

    async def serve(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await serving.serve(app, hypercorn_config(settings), max_connections=settings.max_connections,
                                shutdown_trigger=trigger, task_status=task_status)
        finally:
            background.cancel()

    async def scheduled_gc() -> None:
        with background:
            await gc_policy.collect_on_schedule(settings.gc_full_interval_s)

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve)
        if tune_gc:
            frozen = gc_policy.freeze_startup_heap()
            _log.info("server.heap_frozen", objects=frozen, full_collection_every_s=settings.gc_full_interval_s)
            nursery.start_soon(scheduled_gc)
        _log.info("server.serving", urls=binds, journal=str(settings.journal), state_dir=str(settings.state_dir),
                  demo=settings.demo, token_required=auth.token_required(settings))
        await _log_startup_notices(settings)
        task_status.started(binds)
    _log.info("server.stopped", served_s=round(trio.current_time() - started, 1))
    if voice.runtime_failed.is_set():
        raise RuntimeFailed("the voice runtime failed (http.runtime_failed): the server stopped")


class RuntimeFailed(RuntimeError):
    """The app's runtime crashed or could not start; the server stopped for it."""


# --- serving and announcing -----------------------------------------------------

async def _serve_announced(settings: Settings, shutdown_trigger: Callable[[], Awaitable[None]]) -> None:
    """Serve, and once serving print where the console is (stdout, one line),
    then each start-up notice (no OpenAI key, an empty journal) in words."""
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(run_server, settings, shutdown_trigger=shutdown_trigger, tune_gc=True))
        print(f"voiceactors: the voice console is at {console_url(binds)} — open it in a browser", flush=True)
        # the same words as the log's server.startup_notice, where a person reads them
        for notice in await trio.to_thread.run_sync(notices.startup_notices, settings):
            print(f"voiceactors: note: {notices.WHAT_TO_DO[notice]}", flush=True)


#: Prepares the folders a run serves: given the settings, yields the settings
#: to serve (``voiceactors.demo`` writes a sample journal in a temp folder).
Folders = Callable[[Settings], contextlib.AbstractContextManager[Settings]]
#: Runs what the server talks to, around serving: yields the settings to serve
#: (``voiceactors.demo`` starts the Realtime simulator and points them at it).
Backend = Callable[[Settings], contextlib.AbstractAsyncContextManager[Settings]]


async def _serve_main(settings: Settings, backend: Backend | None) -> None:
    # The handlers go in before anything starts: a SIGTERM that arrived
    # between "serving" and hypercorn calling its trigger used to kill the
    # process with the default action instead of shutting it down.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        signalled: Callable[[], Awaitable[None]] = partial(_first_signal, signals)
        if settings.worker_index is not None:
            signalled = partial(_first_of, signalled, _parent_gone)
        if backend is None:
            await _serve_announced(settings, signalled)
            return
        async with backend(settings) as served:
            await _serve_announced(served, signalled)


async def _parent_gone() -> None:
    """Return when a ``serve --workers`` worker's parent is gone: its stdin
    is a pipe from the parent, which never writes, so end of file means the
    parent exited (even by kill -9) and the worker shuts down as on SIGTERM."""
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stream:
        while await stream.receive_some(4096):
            pass
    _log.info("server.shutdown_signal", signal="parent_gone")


async def _first_of(*waits: Callable[[], Awaitable[None]]) -> None:
    """Return when the first of ``waits`` returns (the others are cancelled)."""
    async with trio.open_nursery() as nursery:
        for wait in waits:
            async def run(wait: Callable[[], Awaitable[None]] = wait) -> None:
                await wait()
                nursery.cancel_scope.cancel()
            nursery.start_soon(run)


# --- the command -----------------------------------------------------------------

def prepare(args: argparse.Namespace) -> Settings | int:
    """Settings, today's pin and logging for a command; an exit code on a usage error."""
    try:
        settings = settings_from_args(args)
        hosts.HostPolicy.from_settings(settings)       # a malformed --allowed-host is a usage error
        clock.check_env()
        if getattr(args, "today", None):
            clock.pin(args.today)
    except ValueError as error:
        print(f"voiceactors: {error}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(settings.log_format, settings.log_level)
    return settings


def cli_serve(args: argparse.Namespace, *, folders: Folders | None = None,
              backend: Backend | None = None) -> int:
    """``voiceactors serve``: exit 0 after a signalled shutdown, 2 on a usage
    error, an insecure address without a token or a state folder another
    server holds, 3 after the runtime failed (``EXIT_RUNTIME_FAILED``). ``serve --demo`` comes through ``voiceactors.demo``, which
    passes its ``folders`` and ``backend``."""
    prepared = prepare(args)
    if isinstance(prepared, int):
        return prepared
    settings = prepared
    reason = auth.refusal(settings)
    if reason:
        print(f"voiceactors: {reason}", file=sys.stderr)
        return EXIT_USAGE
    if not settings.demo and not Path(settings.journal).is_dir():
        print(f"voiceactors: journal folder not found: {settings.journal} "
              "(--journal, VOICEACTORS_JOURNAL or SOLSTONE_JOURNAL)", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_journal_settings(settings)    # create_app checks too; here it is a usage error, not a crash
    except InvalidSettings as error:
        print(f"voiceactors: {error}", file=sys.stderr)
        return EXIT_USAGE
    if settings.workers > 1 and settings.worker_index is None:
        from voiceactors import workers     # the parent of the worker processes: it serves nothing itself

        return workers.cli_serve_workers(args, settings)
    if settings.worker_index is not None:
        logs.set_process_fields(worker=settings.worker_index)
    try:
        if tracing.configure():     # the standard OTEL_* variables (docs/operations.md § Traces)
            _log.info("tracing.on", exporter=str(tracing_setup.choice(os.environ).exporter))
    except tracing_setup.TracingUnavailable as error:
        print(f"voiceactors: {error}", file=sys.stderr)
        return EXIT_USAGE
    gc_policy.watch_pauses(metrics.gc_pause)
    try:
        with (folders or contextlib.nullcontext)(settings) as ready, state_dir_lock(ready.state_dir):
            trio.run(partial(_serve_main, ready, backend))
    except StateDirInUse as error:
        print(f"voiceactors: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # a second Ctrl-C during the graceful shutdown
        print("voiceactors: interrupted during shutdown", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (RuntimeFailed, OSError, ExceptionGroup) as error:
        if _found(error, RuntimeFailed) is not None:
            print("voiceactors: the voice runtime failed (see the log's http.runtime_failed); "
                  "the server stopped", file=sys.stderr)
            return EXIT_RUNTIME_FAILED
        cause = _found(error, OSError)
        if cause is None:
            raise
        print(f"voiceactors: cannot serve on {settings.host}:{settings.port}: {cause}", file=sys.stderr)
        return 1
    return 0


E = TypeVar("E", bound=BaseException)


def _found(error: BaseException, kind: type[E]) -> E | None:
    """The ``kind`` in ``error`` or its groups, if any (an OSError: a port in
    use, an address not here; ``RuntimeFailed``)."""
    if isinstance(error, kind):
        return error
    for inner in getattr(error, "exceptions", ()):
        found = _found(inner, kind)
        if found is not None:
            return found
    return None
