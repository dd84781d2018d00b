"""The incremental build: one at a time per database, committed in batches."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from voiceactors import storage
from voiceactors.journal.index.discovery import Unit, discover
from voiceactors.journal.index.extraction import extract
from voiceactors.journal.index.locations import (
    MAX_CHUNKS,
    ROW_SHIFT,
    SCHEMA_VERSION,
    connect,
    index_path,
    solstone_index,
)
from voiceactors.logs import get_logger

log = get_logger(actor="search")

BATCH = 500                         # units per transaction during a build

# one build at a time per database: a thread lock within this process, and an
# flock on "<db>.lock" across processes (refresh children, `voiceactors index`,
# a second server on the same state dir)
_build_locks: dict[str, threading.Lock] = {}
build_locks_guard = threading.Lock()
# db path -> time.monotonic() of its last build in this process. time.monotonic,
# not trio's clock: builds run in worker threads, outside the trio loop.
last_build: dict[str, float] = {}


@dataclass(frozen=True)
class IndexStats:
    """What one ``build_index`` did. ``solstone`` is True when the journal has
    solstone's own index, which is used instead and never written."""

    files_indexed: int
    files_removed: int
    files_unchanged: int
    chunks: int
    seconds: float
    solstone: bool = False


def lock_for(db: Path) -> threading.Lock:
    with build_locks_guard:
        return _build_locks.setdefault(str(db), threading.Lock())


@contextlib.contextmanager
def file_lock(db: Path, *, wait: bool) -> Iterator[bool]:
    """Hold the exclusive flock on ``<db>.lock``; yields whether it was taken
    (always True when ``wait``; False at once when another holds it). The
    kernel drops it when the holder exits, even when killed."""
    storage.private_folder(db.parent)
    fd, _created = storage.open_private(Path(f"{db}.lock"), os.O_RDWR | os.O_APPEND)
    with os.fdopen(fd, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            taken = True
        except BlockingIOError:
            taken = False
        yield taken     # closing the file releases the lock


def _delete_unit_rows(conn: sqlite3.Connection, file_rowid: int) -> None:
    low = file_rowid << ROW_SHIFT
    conn.execute("DELETE FROM chunks WHERE rowid BETWEEN ? AND ?", (low, low + MAX_CHUNKS))


def _write_unit(conn: sqlite3.Connection, unit: Unit, known: dict[str, tuple[int, int]]) -> int:
    if unit.key in known:
        file_rowid = known[unit.key][0]
        _delete_unit_rows(conn, file_rowid)
        conn.execute("UPDATE files SET mtime=? WHERE rowid=?", (unit.signature, file_rowid))
    else:
        inserted = conn.execute("INSERT INTO files(path, mtime) VALUES (?, ?)",
                                (unit.key, unit.signature)).lastrowid
        assert inserted is not None   # an INSERT always sets lastrowid
        file_rowid = inserted
    chunks = extract(unit)[:MAX_CHUNKS]
    conn.executemany(
        "INSERT INTO chunks(rowid, content, path, day, facet, agent, stream, idx, time_bucket)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [((file_rowid << ROW_SHIFT) | i, c.content, unit.key, c.day, c.facet, c.agent, c.stream,
          i, c.time_bucket) for i, c in enumerate(chunks)],
    )
    return len(chunks)


def build_into(conn: sqlite3.Connection, root: Path,
               progress: Callable[[int, int], None] | None = None) -> IndexStats:
    """Bring ``conn``'s index up to date with ``root`` (see ``build_index``)."""
    started = time.monotonic()
    units = discover(root)
    known = {path: (rowid, mtime) for rowid, path, mtime
             in conn.execute("SELECT rowid, path, mtime FROM files")}
    changed = [u for key, u in units.items() if known.get(key, (0, None))[1] != u.signature]
    removed = [key for key in known if key not in units]
    total = len(changed) + len(removed)
    if progress:
        progress(0, total)
    chunks = done = 0
    with conn:
        for key in removed:
            _delete_unit_rows(conn, known[key][0])
            conn.execute("DELETE FROM files WHERE rowid=?", (known[key][0],))
            done += 1
    if progress and removed:
        progress(done, total)
    for start in range(0, len(changed), BATCH):
        with conn:     # one transaction per batch keeps progress visible and memory bounded
            for unit in changed[start:start + BATCH]:
                chunks += _write_unit(conn, unit, known)
                done += 1
        if progress:
            progress(done, total)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")   # the build is whole
    return IndexStats(
        files_indexed=len(changed), files_removed=len(removed),
        files_unchanged=len(units) - len(changed), chunks=chunks,
        seconds=round(time.monotonic() - started, 3),
    )


def build_locked(root: Path, db: Path) -> IndexStats:
    """``build_into`` on a fresh connection; the caller holds the locks."""
    conn = connect(db)
    try:
        return build_into(conn, root)
    finally:
        conn.close()


def build_index(root: Path, state_dir: Path,
                progress: Callable[[int, int], None] | None = None) -> IndexStats:
    """Build or refresh our index of ``root`` incrementally.

    Units whose signature changed are re-extracted, units that disappeared
    lose their rows, the rest are untouched. ``progress(done, total)`` is
    called as batches commit. When the journal has solstone's own
    ``indexer/journal.sqlite`` nothing is built (searches use that index) and
    the stats say ``solstone=True``. Blocking; one build per database at a
    time (it waits for a build running in another thread or process).
    """
    root = Path(root)
    if solstone_index(root) is not None:
        return IndexStats(0, 0, 0, 0, 0.0, solstone=True)
    db = index_path(root, state_dir)
    with lock_for(db), file_lock(db, wait=True):
        conn = connect(db)
        try:
            stats = build_into(conn, root, progress)
        finally:
            conn.close()
        last_build[str(db)] = time.monotonic()
    log.info("search.index_built", journal=str(root), indexed=stats.files_indexed,
             removed=stats.files_removed, unchanged=stats.files_unchanged,
             chunks=stats.chunks, duration_ms=int(stats.seconds * 1000))
    return stats
