"""Where our index lives, its schema, and whether a build of it is whole."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

from voiceactors import storage

SCHEMA_VERSION = 1
ROW_SHIFT = 16                      # chunk rowid = files.rowid << 16 | idx
MAX_CHUNKS = (1 << ROW_SHIFT) - 1

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS files(path TEXT PRIMARY KEY, mtime INTEGER)",
    """CREATE VIRTUAL TABLE IF NOT EXISTS chunks USING fts5(
        content, path UNINDEXED, day UNINDEXED, facet UNINDEXED, agent UNINDEXED,
        stream UNINDEXED, idx UNINDEXED, time_bucket UNINDEXED)""",
)


def solstone_index(root: Path) -> Path | None:
    """solstone's own index in the journal, if it has built one."""
    path = Path(root) / "indexer" / "journal.sqlite"
    return path if path.is_file() else None


def index_path(root: Path, state_dir: Path) -> Path:
    """Where our index for ``root`` lives. ValueError if the state dir is inside
    the journal: the journal belongs to solstone and we never write there."""
    journal = Path(root).resolve()
    state = Path(state_dir).resolve()
    if state == journal or journal in state.parents:
        raise ValueError("state dir must not be inside the journal")
    digest = hashlib.sha1(str(journal).encode("utf-8")).hexdigest()
    return state / "search" / f"{digest}.sqlite"


def make_private(db: Path) -> None:
    """Our index file made, with its folder, before SQLite opens it: SQLite
    makes a new one 0644 less the umask, and the index holds the journal's
    text. Its ``-wal`` and ``-shm`` files take the database file's mode."""
    storage.private_folder(db.parent)
    fd, _created = storage.open_private(db, os.O_RDONLY)   # an empty file is a new database to SQLite
    os.close(fd)


def connect(db: Path) -> sqlite3.Connection:
    """A read-write connection to our index (WAL), creating the schema. The
    caller owns and closes it; connections are never shared across threads."""
    make_private(db)
    conn = sqlite3.connect(db, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version not in (0, SCHEMA_VERSION):
        # an index from an incompatible build: it is only a cache, start over
        conn.execute("DROP TABLE IF EXISTS chunks")
        conn.execute("DROP TABLE IF EXISTS files")
    for statement in SCHEMA:
        conn.execute(statement)
    conn.commit()
    return conn


def is_ready(db: Path) -> bool:
    """True when ``db`` holds a completed build. ``user_version`` is set to
    ``SCHEMA_VERSION`` only when a first build finishes, so a half-built index
    (a crash or a build still running) is not served as if it were whole."""
    if not db.is_file():
        return False
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            return version == SCHEMA_VERSION
        finally:
            conn.close()
    except sqlite3.Error:
        return False
