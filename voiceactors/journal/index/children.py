"""The index's child processes: the first build (waited for) and the
periodic refresh (in the background), and ``ensure_index``, which starts them.

A child is ``python -c`` running ``refresh_child``; it is niced, killed after
its timeout and exits by itself when its control pipe reaches EOF (the
parent closed it or died). Its outcome is logged here, in the parent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voiceactors.journal.index.build import (
    build_locked,
    build_locks_guard,
    file_lock,
    last_build,
    lock_for,
    log,
)
from voiceactors.journal.index.locations import index_path, is_ready, solstone_index

REFRESH_TIMEOUT_S = 600.0           # a refresh child still running after this is killed
REFRESH_NICE = 10                   # the child yields the CPU to the server's live calls


@dataclass
class _Refresh:
    proc: subprocess.Popen[bytes]
    control: int                  # write end of the child's control pipe
    finished: threading.Event = dataclasses.field(default_factory=threading.Event)  # outcome logged


_refreshes: dict[str, _Refresh] = {}   # db path -> its latest refresh (guarded by build_locks_guard)

_CHILD_CODE = ("import sys; from voiceactors.journal.index.children import refresh_child; "
               "sys.exit(refresh_child(sys.argv[1:]))")


# what a child's watcher logs: (done, failed, timed out), per kind of child
_EVENTS = {
    "refresh": ("search.index_refreshed", "search.index_refresh_failed", "search.index_refresh_timed_out"),
    "first": ("search.index_built", "search.index_build_failed", "search.index_build_timed_out"),
}


def refresh_child(argv: list[str]) -> int:
    """The index child's main: ``ROOT STATE_DIR CONTROL_FD [--first]``.

    A refresh (no ``--first``) refreshes the index unless another process
    holds its lock (then there is nothing to do: that one is refreshing it);
    exit 2 when the journal is gone: refreshing would empty the index. A
    first build (``--first``) waits for the lock, then builds unless the
    index is whole by then (``skipped: ready``: another process built it).
    Prints the stats as one JSON line on stdout; log lines (warnings only) go
    to stderr as JSON, for the parent to relay. Exits at once, mid-build if
    need be, when the control pipe reaches EOF: the parent closed it or died.
    A killed build leaves the last committed batches, and the next build or
    refresh redoes the rest.
    """
    root, state_dir, control = Path(argv[0]), Path(argv[1]), int(argv[2])
    first = argv[3:] == ["--first"]
    threading.Thread(target=_exit_with_parent, args=(control,), daemon=True).start()
    with contextlib.suppress(OSError):
        os.nice(REFRESH_NICE)
    from voiceactors import logs

    logs.configure("json", "warning")
    if not first and not root.is_dir():
        print(f"journal not found: {root}", file=sys.stderr)
        return 2
    if solstone_index(root) is not None:
        print(json.dumps({"solstone": True}))
        return 0
    db = index_path(root, state_dir)
    with file_lock(db, wait=first) as taken:
        if not taken:
            print(json.dumps({"skipped": "busy"}))
            return 0
        if first and is_ready(db):
            print(json.dumps({"skipped": "ready"}))
            return 0
        stats = build_locked(root, db)
    print(json.dumps(dataclasses.asdict(stats)))
    return 0


def _exit_with_parent(control: int) -> None:
    while os.read(control, 1):    # nothing is ever written: this waits for EOF
        pass
    os._exit(3)


def _spawn(root: Path, state_dir: Path, *, first: bool) -> _Refresh:
    """Start an index child (``refresh_child``); OSError etc. when it cannot."""
    read_end, write_end = os.pipe()    # both non-inheritable: no other child gets them
    argv = [sys.executable, "-c", _CHILD_CODE, str(root), str(state_dir), str(read_end)]
    try:
        proc = subprocess.Popen(argv + (["--first"] if first else []),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(read_end,))
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return _Refresh(proc, write_end)


def _start_refresh(root: Path, state_dir: Path, db: Path, timeout_s: float) -> None:
    """Start a refresh child for ``db`` unless one is running; never raises.
    Called with ``build_locks_guard`` held."""
    running = _refreshes.get(str(db))
    if running is not None and not running.finished.is_set():
        return
    try:
        refresh = _spawn(root, state_dir, first=False)
    except Exception as exc:   # a refresh failure must never break search
        log.warning(_EVENTS["refresh"][1], journal=str(root), error=repr(exc))
        return
    _refreshes[str(db)] = refresh
    threading.Thread(target=_watch, args=(root, refresh, timeout_s, "refresh"),
                     name="voiceactors-index-refresh", daemon=True).start()


def _first_build(root: Path, state_dir: Path, db: Path, timeout_s: float) -> bool:
    """Build ``db`` in a child and wait for it (blocked in the kernel: no GIL
    held); True when the child succeeded. Never raises: a failure is logged.
    Called with ``lock_for(db)`` held (not the file lock: the child takes it)."""
    try:
        refresh = _spawn(root, state_dir, first=True)
    except Exception as exc:
        log.warning(_EVENTS["first"][1], journal=str(root), error=repr(exc))
        return False
    with build_locks_guard:
        _refreshes[str(db)] = refresh      # running_refresh shows it while it builds
    return _watch(root, refresh, timeout_s, "first") is not None


def _watch(root: Path, refresh: _Refresh, timeout_s: float, kind: str) -> dict[str, Any] | None:
    """Wait for the child (blocked in the kernel: no GIL held), kill it after
    ``timeout_s``, log the outcome; the child's stats, or None when it failed."""
    try:
        return _wait(root, refresh, timeout_s, _EVENTS[kind])
    finally:
        refresh.finished.set()


def _wait(root: Path, refresh: _Refresh, timeout_s: float,
          events: tuple[str, str, str]) -> dict[str, Any] | None:
    done, failed, timed_out = events
    proc, started = refresh.proc, time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        log.warning(timed_out, journal=str(root), pid=proc.pid, timeout_s=timeout_s)
        return None
    finally:
        os.close(refresh.control)
    _relay(err, proc.pid)
    duration_ms = int((time.monotonic() - started) * 1000)
    try:
        stats = json.loads(out.decode("utf-8").strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (ValueError, IndexError):
        stats = None
    if not isinstance(stats, dict):
        tail = err.decode("utf-8", "replace").strip()[-800:]
        log.warning(failed, journal=str(root), pid=proc.pid,
                    returncode=proc.returncode, error=tail, duration_ms=duration_ms)
        return None
    log.info(done, journal=str(root), pid=proc.pid,
             indexed=stats.get("files_indexed", 0), removed=stats.get("files_removed", 0),
             skipped=stats.get("skipped"), duration_ms=duration_ms)
    return stats


def _relay(err: bytes, pid: int) -> None:
    """Re-log the child's JSON log lines through our logger (our format)."""
    for line in err.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue                     # not a log line: reported as the error on failure
        if isinstance(entry, dict) and isinstance(entry.get("event"), str):
            fields = {k: v for k, v in entry.items()
                      if k not in ("event", "level", "timestamp", "actor", "refresh_pid")}
            log.warning(entry["event"], refresh_pid=pid, **fields)


def running_refresh(root: Path, state_dir: Path) -> subprocess.Popen[bytes] | None:
    """The child building or refreshing this journal's index until its outcome
    is logged, else None."""
    with build_locks_guard:
        refresh = _refreshes.get(str(index_path(root, state_dir)))
    if refresh is None or refresh.finished.is_set():
        return None
    return refresh.proc


def join_refresh(root: Path, state_dir: Path, timeout: float | None = None) -> None:
    """Wait for this journal's index child, if one runs (until it exited and
    the outcome is logged)."""
    with build_locks_guard:
        refresh = _refreshes.get(str(index_path(root, state_dir)))
    if refresh is not None:
        refresh.finished.wait(timeout)


def ensure_index(root: Path, state_dir: Path, max_age_s: float,
                 refresh_timeout_s: float = REFRESH_TIMEOUT_S,
                 build_timeout_s: float = REFRESH_TIMEOUT_S) -> Path:
    """Our index of ``root``, ready to query.

    A missing or half-built index is built first by a child process while
    this thread waits for it (blocked in the kernel, so the walk never holds
    this process's GIL); one build at a time per index (the other callers
    wait, then find it whole). The child is killed after ``build_timeout_s``;
    if it fails, that is logged and this thread builds the index itself, so
    a search still answers, or raises what the build raises. A whole index
    that this process has not checked for ``max_age_s`` seconds is served as
    is while a child process refreshes it (WAL lets the searches read during
    the write), so a query never pays for the walk over the journal tree. At
    most one child per index runs (per process; across processes the index's
    file lock makes a second refresh exit at once); it is killed after
    ``refresh_timeout_s`` and exits by itself when this process is gone. Its
    outcome is only logged. ``build_index`` refreshes on demand.
    """
    db = index_path(root, state_dir)
    key = str(db)
    now = time.monotonic()
    last = last_build.get(key)
    if last is not None and now - last < max_age_s and db.exists():
        return db
    if is_ready(db):
        with build_locks_guard:
            last_build[key] = now          # one refresh per interval, not one per query
            _start_refresh(Path(root), Path(state_dir), db, refresh_timeout_s)
        return db
    with lock_for(db):
        if not is_ready(db):           # another thread may have built it while we waited
            built = _first_build(Path(root), Path(state_dir), db, build_timeout_s)
            if not built or not is_ready(db):   # (e.g. the child saw a solstone index appear)
                _build_in_thread(Path(root), db)
        last_build[key] = time.monotonic()
    return db


def _build_in_thread(root: Path, db: Path) -> None:
    """The first build's fallback when its child failed: build here, as
    ``build_index`` does (raises what the build raises)."""
    started = time.monotonic()
    with file_lock(db, wait=True):
        if is_ready(db):               # another process built it meanwhile
            return
        stats = build_locked(root, db)
    log.warning("search.index_built_in_thread", journal=str(root),
                indexed=stats.files_indexed, duration_ms=int((time.monotonic() - started) * 1000))
