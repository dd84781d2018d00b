"""The one way to write a file: atomically, under the shared lock, off the trio loop.

* ``atomic_write`` — temp file in the same folder, fsync, ``os.replace``, fsync
  the folder. A crash at any point leaves either the old or the new file.
* ``update_jsonl`` — read-modify-write of a JSONL record file under an
  exclusive ``fcntl.flock`` on ``<file>.lock`` (the lock solstone's own writers
  take), so two writers never lose each other's lines. Lines that do not parse
  are kept verbatim: a write never drops what it did not understand.
* ``append_lines`` / ``append_line`` — append a block of lines, one fsync (call records).
* ``run_sync`` — run blocking file/SQLite work in a worker thread under one
  shared ``CapacityLimiter`` so it never blocks the trio loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import trio

T = TypeVar("T")

_limiter: trio.CapacityLimiter | None = None
THREADS = 16


def limiter() -> trio.CapacityLimiter:
    """The process-wide limiter for blocking work (created lazily inside trio)."""
    global _limiter
    if _limiter is None:
        _limiter = trio.CapacityLimiter(THREADS)
    return _limiter


async def run_sync(fn: Callable[..., T], *args: Any, cancellable: bool = True) -> T:
    """Run ``fn(*args)`` in a thread. ``cancellable=False`` for writes: a
    cancelled caller still waits for the write to finish (shield it as well)."""
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter(), abandon_on_cancel=cancellable)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``<path>.lock`` (blocking)."""
    lock_path = Path(f"{path}.lock")
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@dataclass
class RawLine:
    """A JSONL line that did not parse as a JSON object; written back verbatim."""

    text: str


def parse_jsonl(text: str) -> list[dict[str, Any] | RawLine]:
    rows: list[dict[str, Any] | RawLine] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            rows.append(RawLine(line))
            continue
        rows.append(obj if isinstance(obj, dict) else RawLine(line))
    return rows


def dump_jsonl(rows: list[dict[str, Any] | RawLine]) -> str:
    out = [row.text if isinstance(row, RawLine) else json.dumps(row, ensure_ascii=False) for row in rows]
    return "".join(line + "\n" for line in out)


def update_jsonl(path: Path, change: Callable[[list[dict[str, Any] | RawLine]], T]) -> T:
    """Under the file lock: read every line, let ``change`` edit the list in
    place, and write the file back atomically if ``change`` returned truthy.
    Returns what ``change`` returned."""
    path = Path(path)
    with file_lock(path):
        rows = parse_jsonl(path.read_text(encoding="utf-8")) if path.exists() else []
        result = change(rows)
        if result:
            atomic_write(path, dump_jsonl(rows))
        return result


def append_line(path: Path, line: str) -> None:
    """Append one line and fsync it (records that only grow)."""
    append_lines(path, [line])


def append_lines(path: Path, lines: list[str]) -> None:
    """Append lines with one write and one fsync (records that only grow).
    As with any append, a crash mid-write can leave a torn last line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    block = "".join(line.rstrip("\n") + "\n" for line in lines)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
