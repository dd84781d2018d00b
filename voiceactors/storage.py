"""The one way to write a file: atomically, under the shared lock, off the trio loop.

* ``atomic_write`` — a temp file of ours in the same folder (named
  ``.<name>.voiceactors-<12 hex>.tmp``), fsync, ``os.replace``, fsync the
  folder. A crash at any point leaves either the old or the new file (and, for
  a kill midway, our temp file, which the next locked write of that file
  sweeps). The new file keeps the old one's mode, and its owner where we may
  set it.
* ``update_jsonl`` — read-modify-write of a JSONL record file under an
  exclusive ``fcntl.flock`` on ``<file>.lock`` (the lock solstone's own writers
  take), so two writers never lose each other's lines. The lock is waited for
  at most ``lock_timeout_s`` (``LockTimeout`` after it: nothing written).
  Lines the change did not touch are written back byte for byte; lines that
  do not parse are kept verbatim: a write never drops what it did not
  understand.
* ``jsonl_lines`` — the one way to split JSONL text into lines: at ``"\\n"``
  only (``str.splitlines`` also splits at U+2028, U+2029, U+0085, ``\\v``,
  ``\\f`` and ``\\x1c``-``\\x1e``, which a JSON string may hold).
* ``append_lines`` / ``append_line`` — append a block of lines, one fsync;
  ``open_append`` / ``write_all`` — the call records'
  appends on a descriptor kept open (fsynced on their own schedule).
* ``syncfs`` — flush a whole filesystem in one call (Linux ``syncfs(2)``,
  ``None`` elsewhere): the call records' grouped fsync of many files.
* ``run_sync`` — run blocking file/SQLite work in a worker thread under one
  shared ``CapacityLimiter`` so it never blocks the trio loop. Journal writes
  take ``write_limiter()`` instead, so a write stuck on a lock never holds a
  thread that reads, key lookups or call records need.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import fcntl
import json
import math
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, TypeVar, TypeVarTuple, Unpack

import trio

from voiceactors import tracing
from voiceactors.logs import get_logger
from voiceactors.settings import default

T = TypeVar("T")
Args = TypeVarTuple("Args")

_log = get_logger(actor="storage")

_limiter: trio.CapacityLimiter | None = None
_write_limiter: trio.CapacityLimiter | None = None
THREADS = 16
WRITE_THREADS = 32

#: How long a write waits for a file lock unless told otherwise (seconds).
DEFAULT_LOCK_TIMEOUT_S: float = default("journal_lock_timeout_s")
#: Non-blocking lock attempts start this far apart and back off to ``LOCK_POLL_MAX_S``.
LOCK_POLL_MIN_S = 0.005
LOCK_POLL_MAX_S = 0.25

#: What marks a temp file as ours: ``.<target name>.voiceactors-<12 hex>.tmp``.
TEMP_MARK = ".voiceactors-"
_TEMP_TAIL_RE = re.compile(r"^[0-9a-f]{12}\.tmp$")


class LockTimeout(TimeoutError):
    """A file lock was not free within the bound; nothing was written."""

    def __init__(self, path: Path, timeout_s: float):
        super().__init__(f"lock on {Path(path).name} not free within {timeout_s} s")
        self.path = Path(path)
        self.timeout_s = timeout_s


def limiter() -> trio.CapacityLimiter:
    """The process-wide limiter for blocking work (created lazily inside trio)."""
    global _limiter
    if _limiter is None:
        _limiter = trio.CapacityLimiter(THREADS)
    return _limiter


def write_limiter() -> trio.CapacityLimiter:
    """The limiter for journal writes, apart from ``limiter()``: a write that
    waits on a lock holds one of these, never a slot reads need."""
    global _write_limiter
    if _write_limiter is None:
        _write_limiter = trio.CapacityLimiter(WRITE_THREADS)
    return _write_limiter


async def run_sync(fn: Callable[[Unpack[Args]], T], *args: Unpack[Args], cancellable: bool = True) -> T:
    """Run ``fn(*args)`` in a thread. ``cancellable=False`` for writes: a
    cancelled caller still waits for the write to finish (shield it as well)."""
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter(), abandon_on_cancel=cancellable)


async def run_in_write_slot(fn: Callable[[Unpack[Args]], T], *args: Unpack[Args]) -> T:
    """Run ``fn(*args)`` in a thread for a caller that already holds a
    ``write_limiter()`` token (it acquires and releases it itself, so that
    waiting for the token stays cancellable while the run itself is shielded).
    The thread is abandoned if the caller's own deadline passes."""
    return await trio.to_thread.run_sync(fn, *args, limiter=_no_limit(), abandon_on_cancel=True)


def _load_syncfs() -> Callable[[int], None] | None:
    """``syncfs(2)`` from the C library, or ``None`` where there is none
    (not Linux, or a libc without it). The os module has only ``sync()``,
    which flushes every filesystem of the machine."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        # the running process's own symbols, libc's among them: no library
        # search (ctypes.util.find_library runs ldconfig in a subprocess)
        c_syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    c_syncfs.argtypes = [ctypes.c_int]
    c_syncfs.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        """Write back and wait for every dirty file and folder of the
        filesystem ``fd`` is on, as an fsync of each would (the kernel
        reports writeback errors from it since Linux 5.8). One call, so the
        calling thread takes the GIL back once, not three times a file."""
        if c_syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return syncfs


#: ``syncfs(fd)``: flush the filesystem ``fd`` is on; ``None`` where the platform has no such call.
syncfs: Callable[[int], None] | None = _load_syncfs()


_unbounded: trio.CapacityLimiter | None = None


def thread_limiters() -> tuple[trio.CapacityLimiter, ...]:
    """Every limiter this module's worker threads borrow from (a token
    borrowed is a thread at work, or waiting for a write's lock)."""
    return limiter(), write_limiter(), _no_limit()


def threads_at_work() -> int:
    """How many worker threads of ours (``thread_limiters``, and trio's
    default limiter) are at work now: a fuzz run's clock and its kill wait
    for none of this run's."""
    limiters = (*thread_limiters(), trio.to_thread.current_default_thread_limiter())
    return sum(limiter.borrowed_tokens for limiter in limiters)


def _no_limit() -> trio.CapacityLimiter:
    global _unbounded
    if _unbounded is None:
        _unbounded = trio.CapacityLimiter(math.inf)
    return _unbounded


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- private files ------------------------------------------------------------------

#: What the state folder holds (call records with their transcripts, captures,
#: the write log, usage, the search index) is its user's alone, whatever the
#: umask: files are made with this mode ...
PRIVATE_FILE_MODE = 0o600
#: ... and folders with this one.
PRIVATE_FOLDER_MODE = 0o700


def private_folder(folder: Path) -> None:
    """``folder`` and its missing parents, each made with mode 0700 (a plain
    ``mkdir -p`` makes them 0777 less the umask: 0755 under 022). A folder
    that already exists is left as it is."""
    folder = Path(folder)
    missing: list[Path] = []
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, PRIVATE_FOLDER_MODE)
        except FileExistsError:
            continue                     # made meanwhile by another writer
        os.chmod(path, PRIVATE_FOLDER_MODE)      # exactly 0700: a umask may take the owner's bits too


def open_private(path: Path, flags: int) -> tuple[int, bool]:
    """``os.open(path, flags | O_CLOEXEC)``, creating a missing file with
    mode 0600 exactly, whatever the umask (an existing file keeps its own);
    and whether this call created it."""
    flags |= os.O_CLOEXEC
    while True:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
        except FileExistsError:
            try:
                return os.open(path, flags), False
            except FileNotFoundError:
                continue                 # removed between the two opens: make it
        try:
            os.fchmod(fd, PRIVATE_FILE_MODE)
        except BaseException:
            os.close(fd)
            raise
        return fd, True


# --- temp files ---------------------------------------------------------------------

def _temp_path(path: Path) -> Path:
    return path.parent / f".{path.name}{TEMP_MARK}{secrets.token_hex(6)}.tmp"


def is_our_temp(name: str, target: str) -> bool:
    """Whether ``name`` is a temp file ``atomic_write`` made for ``target``."""
    prefix = f".{target}{TEMP_MARK}"
    return name.startswith(prefix) and bool(_TEMP_TAIL_RE.fullmatch(name[len(prefix):]))


def sweep_temp_files(path: Path) -> list[str]:
    """Remove our leftover temp files for ``path`` (a kill during a rewrite
    leaves one). Call it only while holding the lock every writer of ``path``
    takes: then no temp file of ours for it can be in use. Files that are not
    ours are never touched. Returns the names removed."""
    path = Path(path)
    removed: list[str] = []
    try:
        with os.scandir(path.parent) as entries:
            names = [e.name for e in entries if is_our_temp(e.name, path.name)]
    except OSError:
        return removed
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.parent / name)
            removed.append(name)
    if removed:
        _log.warning("storage.temp_files_swept", file=path.name, count=len(removed))
    return removed


def _keep_owner_and_mode(fd: int, old: os.stat_result) -> None:
    """Give the new file the old one's owner (as root; else its group, when we
    may) and mode. Owner first: ``chown`` may clear set-id bits."""
    uid = old.st_uid if os.geteuid() == 0 else -1
    if uid != -1 or old.st_gid != os.getegid():
        with contextlib.suppress(PermissionError):
            os.fchown(fd, uid, old.st_gid)
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


#: A fenced write's last check (``cluster/fence.py``): set around a leased
#: call's write tool in its worker thread, asked right before
#: ``atomic_write`` replaces the file; False leaves the file as it was.
replace_guard: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "replace_guard", default=None)


class Fenced(Exception):
    """A fenced write found its call's lease may be gone: nothing replaced."""


def atomic_write(path: Path, data: str | bytes, *, new_mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically and durably. An existing file's
    mode (and owner, where permitted) is kept; a new file gets ``new_mode``
    (0600 by default), whatever the umask, and new folders 0700.
    ``Fenced`` (nothing replaced) when ``replace_guard`` says no."""
    path = Path(path)
    private_folder(path.parent)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        old: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        old = None
    tmp = _temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, new_mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            if old is not None:
                _keep_owner_and_mode(handle.fileno(), old)
            else:
                os.fchmod(handle.fileno(), new_mode)     # exactly: not less a umask
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        guard = replace_guard.get()
        if guard is not None and not guard():
            raise Fenced(str(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


# --- locks --------------------------------------------------------------------------

def _clock() -> tuple[Callable[[], float], Callable[[float], None]]:
    """``(now, sleep_until)`` for lock polling: trio's clock when called from a
    trio worker thread (so tests' autojump clocks drive the wait and no real
    time passes), the monotonic clock otherwise."""
    try:
        trio.from_thread.run_sync(trio.current_time)
    except RuntimeError:        # not a trio worker thread (or trio is gone)
        return time.monotonic, lambda at: time.sleep(max(0.0, at - time.monotonic()))

    def now() -> float:
        return trio.from_thread.run_sync(trio.current_time)

    def sleep_until(at: float) -> None:
        trio.from_thread.run(trio.sleep_until, at)

    return now, sleep_until


def _lock_within(fd: int, lock_path: Path, timeout_s: float | None) -> None:
    if timeout_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    now: Callable[[], float] | None = None
    sleep_until: Callable[[float], None] | None = None
    delay = LOCK_POLL_MIN_S
    deadline = math.inf
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        try:
            if now is None:
                now, sleep_until = _clock()
                deadline = now() + timeout_s
            assert sleep_until is not None   # set together with ``now``
            at = now()
            if at >= deadline:
                raise LockTimeout(lock_path, timeout_s)
            # Wake on a grid of ``delay`` (not ``delay`` from now): waiters at
            # the same backoff step wake together, one clock jump for all.
            sleep_until(min(deadline, (math.floor(at / delay) + 1) * delay))
        except (RuntimeError, trio.Cancelled):   # trio ended under us: give up, nothing done
            raise LockTimeout(lock_path, timeout_s) from None
        delay = min(delay * 2, LOCK_POLL_MAX_S)


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Exclusive advisory lock on ``<path>.lock``. ``timeout_s=None`` blocks
    until it is free; otherwise ``LockTimeout`` once ``timeout_s`` has passed
    (non-blocking attempts, backing off from 5 ms to 250 ms)."""
    lock_path = Path(f"{path}.lock")
    fd, _created = open_private(lock_path, os.O_RDWR | os.O_APPEND)
    with os.fdopen(fd, "a+b") as handle:
        _lock_within(handle.fileno(), lock_path, timeout_s)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# --- reading a file we did not write ---------------------------------------------------

_SPECIAL_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                  (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _not_regular(mode: int) -> str | None:
    """What a file that is not a regular one is (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "not a regular file")


def open_regular(path: Path) -> BinaryIO:
    """``path`` open for reading in binary, or ``ValueError`` naming what it
    is when it is not a regular file: a FIFO blocks the open (or the read)
    until a writer comes, a device such as ``/dev/zero`` never ends. Checked
    by ``stat`` before the open, and again on the descriptor (the name may
    have been swapped meanwhile: ``O_NONBLOCK`` keeps that open from waiting
    for a FIFO's writer)."""
    kind = _not_regular(os.stat(path).st_mode)
    if kind is not None:
        raise ValueError(f"{path}: not a regular file ({kind})")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        kind = _not_regular(os.fstat(fd).st_mode)
        if kind is not None:
            raise ValueError(f"{path}: not a regular file ({kind})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB"


def bounded_lines(handle: BinaryIO, name: str, *, max_line: int, max_total: int) -> Iterator[bytes]:
    """The lines of ``handle`` (split at ``"\n"`` only, each without it and
    a trailing ``"\r"``), never reading more than ``max_line`` bytes for a
    line or ``max_total`` in all: past either, ``ValueError`` naming ``name``
    and the bound (a line read whole first could take every byte of memory)."""
    if os.fstat(handle.fileno()).st_size > max_total:
        raise ValueError(f"{name}: larger than {_mib(max_total)}")
    total = 0
    number = 0
    while raw := handle.readline(max_line + 1):
        number += 1
        total += len(raw)
        if len(raw) > max_line and not raw.endswith(b"\n"):
            raise ValueError(f"{name}: line {number} is longer than {_mib(max_line)}")
        if total > max_total:
            raise ValueError(f"{name}: larger than {_mib(max_total)}")
        yield raw[:-1].removesuffix(b"\r") if raw.endswith(b"\n") else raw.removesuffix(b"\r")


# --- JSONL --------------------------------------------------------------------------

def jsonl_lines(text: str) -> list[str]:
    """The lines of JSONL text, split at ``"\\n"`` only, each without a
    trailing ``"\\r"``. A last line without its newline is a line too."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def loads_line(line: str) -> Any:
    """One JSONL line's value (``ValueError`` if it is not JSON). Control
    characters inside strings are accepted: a reader should see the record."""
    return json.loads(line, strict=False)


def read_text_exact(path: Path, errors: str = "strict") -> str:
    """A file's text with its line endings as they are (``Path.read_text``
    turns a lone ``"\\r"`` into a line break)."""
    return Path(path).read_bytes().decode("utf-8", errors)


# Raw in a JSON string these are valid, but readers that split with
# ``str.splitlines`` break lines at them: what we serialize carries them escaped.
# So does a lone surrogate, which UTF-8 has no bytes for: a journal row we
# rewrite (``update_jsonl``) keeps the ``\udc80`` escape it was read with.
_ESCAPED_RE = re.compile("[\u2028\u2029\x85\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def dumps_line(row: Any) -> str:
    """One JSONL line for ``row``: UTF-8 JSON, with the characters some readers
    split lines at and lone surrogates escaped (they can only occur inside
    strings)."""
    text = json.dumps(row, ensure_ascii=False)
    return _ESCAPED_RE.sub(_escape, text)


@dataclass
class RawLine:
    """A JSONL line that is blank or did not parse as a JSON object; written
    back verbatim."""

    text: str


def _parse_rows(text: str) -> tuple[list[dict[str, Any] | RawLine], dict[int, tuple[Any, str]]]:
    """The rows of a JSONL text, and for each parsed row (by ``id``) the row
    and its line exactly as read (``"\\r"`` included), so an untouched row can
    be written back byte for byte."""
    rows: list[dict[str, Any] | RawLine] = []
    read_as: dict[int, tuple[Any, str]] = {}
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for raw in lines:
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip():
            rows.append(RawLine(raw))    # kept as it is: nothing but the change moves
            continue
        try:
            obj = loads_line(line)
        except ValueError:
            rows.append(RawLine(raw))
            continue
        if isinstance(obj, dict):
            rows.append(obj)
            read_as[id(obj)] = (obj, raw)
        else:
            rows.append(RawLine(raw))
    return rows, read_as


def _unchanged(row: dict[str, Any], line: str) -> bool:
    # Compare serializations, not values: 1 == 1.0 == True as Python values.
    try:
        again = loads_line(line[:-1] if line.endswith("\r") else line)
    except ValueError:   # pragma: no cover - it parsed when read
        return False
    return json.dumps(again, ensure_ascii=False) == json.dumps(row, ensure_ascii=False)


def dump_jsonl(rows: list[dict[str, Any] | RawLine],
               read_as: dict[int, tuple[Any, str]] | None = None) -> str:
    out = []
    for row in rows:
        if isinstance(row, RawLine):
            out.append(row.text)
            continue
        seen = (read_as or {}).get(id(row))
        if seen is not None and seen[0] is row and _unchanged(row, seen[1]):
            out.append(seen[1])
        else:
            out.append(dumps_line(row))
    return "".join(line + "\n" for line in out)


def update_jsonl(path: Path, change: Callable[[list[dict[str, Any] | RawLine]], T], *,
                 lock_timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_S) -> T:
    """Under the file lock (waited for at most ``lock_timeout_s``, else
    ``LockTimeout`` and nothing read or written): sweep our leftover temp
    files, read every line, let ``change`` edit the list in place, and write
    the file back atomically if ``change`` returned truthy. Returns what
    ``change`` returned."""
    path = Path(path)
    # a journal write's span (tracing on), under the tool's: its lock wait and write, never its text
    with tracing.span("journal.write", file=path.suffix) as span, file_lock(path, lock_timeout_s):
        sweep_temp_files(path)
        text = read_text_exact(path) if path.exists() else ""
        rows, read_as = _parse_rows(text)
        result = change(rows)
        if result:
            atomic_write(path, dump_jsonl(rows, read_as))
        if span is not None:
            span.set_attribute("voiceactors.changed", bool(result))
        return result


def append_line(path: Path, line: str) -> None:
    """Append one line and fsync it (records that only grow)."""
    append_lines(path, [line])


def append_lines(path: Path, lines: list[str]) -> None:
    """Append lines with one write and one fsync (records that only grow).
    As with any append, a crash mid-write can leave a torn last line."""
    block = "".join(line.rstrip("\n") + "\n" for line in lines)
    fd, _created = open_append(path)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())


def open_append(path: Path) -> tuple[int, bool]:
    """An ``O_APPEND`` descriptor on ``path`` (created, with its folder, when
    missing: mode 0600, folders 0700) and whether this call created the file
    (its folder then needs an fsync for the name to survive a power loss)."""
    path = Path(path)
    private_folder(path.parent)
    return open_private(path, os.O_WRONLY | os.O_APPEND)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a short write is continued)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
