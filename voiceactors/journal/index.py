"""Our full-text index over a journal: discovery, extraction, incremental build.

The index is an SQLite FTS5 database with solstone's own ``chunks`` schema
(``content`` indexed; ``path, day, facet, agent, stream, idx, time_bucket``
UNINDEXED) plus ``files(path PRIMARY KEY, mtime)``. It lives in
``<state_dir>/search/<sha1 of the resolved journal path>.sqlite`` and never
inside the journal.

A *unit* is what one ``files`` row tracks and what ``chunks.path`` names:

* a segment (``YYYYMMDD/<stream>/HHMMSS_LEN``): its ``talents/*.md`` joined;
* a day talent (``YYYYMMDD/talents/<name>.md``, agent = the file stem);
* an entity (``entity_search:<id>``): identity, facet descriptions, observations;
* a facet file (``facets/<f>/activities|events|todos/YYYYMMDD.jsonl``,
  ``facets/<f>/news/YYYYMMDD.md``).

``files.mtime`` is the unit's signature: the file's ``st_mtime_ns`` for a
single file, and a 63-bit hash of every contributing file's name, mtime and
size for a multi-file unit (so a removed contributor also counts as a change).
Each unit's chunks get rowids ``files.rowid << 16 | idx``, so replacing or
removing a unit is an indexed rowid-range delete rather than a table scan.
(So never VACUUM this database: it may renumber ``files`` rowids. It is a
cache; delete it to start over.)

Everything here is synchronous and blocking; run it in a worker thread.
``ensure_index`` builds in a child process (``refresh_child``): the first
build (the caller waits for it, blocked in the kernel) and the periodic
refresh (in the background), so a walk over a big journal never holds the
server's GIL. ``build_index`` builds in the calling process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from voiceactors import storage
from voiceactors.journal.paths import DAY_RE, SEGMENT_RE, SLUG_RE, STREAM_RE
from voiceactors.logs import get_logger

log = get_logger(actor="search")

SCHEMA_VERSION = 1
ROW_SHIFT = 16                      # chunk rowid = files.rowid << 16 | idx
MAX_CHUNKS = (1 << ROW_SHIFT) - 1
CHUNK_CHARS = 2000                  # split long text at paragraph boundaries
BATCH = 500                         # units per transaction during a build
REFRESH_TIMEOUT_S = 600.0           # a refresh child still running after this is killed
REFRESH_NICE = 10                   # the child yields the CPU to the server's live calls

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS files(path TEXT PRIMARY KEY, mtime INTEGER)",
    """CREATE VIRTUAL TABLE IF NOT EXISTS chunks USING fts5(
        content, path UNINDEXED, day UNINDEXED, facet UNINDEXED, agent UNINDEXED,
        stream UNINDEXED, idx UNINDEXED, time_bucket UNINDEXED)""",
)

_SKIP_DAY_CHILDREN = {"health", "indexer", "talents"}
_FACET_KINDS = {"activities": ".jsonl", "events": ".jsonl", "todos": ".jsonl", "news": ".md"}
_AGENT = {"activities": "activity", "events": "event", "todos": "todo", "news": "news"}

# one build at a time per database: a thread lock within this process, and an
# flock on "<db>.lock" across processes (refresh children, `voiceactors index`,
# a second server on the same state dir)
_build_locks: dict[str, threading.Lock] = {}
_build_locks_guard = threading.Lock()
# db path -> time.monotonic() of its last build in this process. time.monotonic,
# not trio's clock: builds run in worker threads, outside the trio loop.
_last_build: dict[str, float] = {}


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


@dataclass(frozen=True)
class Unit:
    key: str                  # chunks.path / files.path
    kind: str                 # segment | day_talent | entity | activities | events | todos | news
    files: tuple[Path, ...]
    signature: int
    day: str = ""             # YYYYMMDD or ""
    facet: str = ""
    stream: str = ""
    primary: Path | None = None   # an entity's identity file (entities/<id>/entity.json)


@dataclass(frozen=True)
class Chunk:
    content: str
    day: str
    facet: str
    agent: str
    stream: str
    time_bucket: str


# --- locations --------------------------------------------------------------------------

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


def connect(db: Path) -> sqlite3.Connection:
    """A read-write connection to our index (WAL), creating the schema. The
    caller owns and closes it; connections are never shared across threads."""
    db.parent.mkdir(parents=True, exist_ok=True)
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
            return conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        finally:
            conn.close()
    except sqlite3.Error:
        return False


# --- discovery ----------------------------------------------------------------------------

def _scandir(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _stat_sig(entries: list[os.DirEntry]) -> int | None:
    """Signature of a set of files (None when none can be stat'ed)."""
    parts, mtime = [], 0
    for entry in entries:
        try:
            st = entry.stat()
        except OSError:
            continue
        mtime = st.st_mtime_ns
        parts.append(f"{entry.path}\0{st.st_mtime_ns}\0{st.st_size}")
    if not parts:
        return None
    if len(parts) == 1 and len(entries) == 1:
        return mtime
    digest = hashlib.sha1("\n".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _day_root(root: Path) -> Path:
    chronicle = root / "chronicle"
    return chronicle if chronicle.is_dir() else root


def _md_files(folder: Path) -> list[os.DirEntry]:
    return [e for e in _scandir(folder) if e.name.endswith(".md") and _is_file(e)]


def _segment_units(day: str, day_dir: Path) -> Iterator[Unit]:
    for child in _scandir(day_dir):
        if not _is_dir(child) or child.name in _SKIP_DAY_CHILDREN or child.name.startswith("."):
            continue
        if SEGMENT_RE.fullmatch(child.name):       # a segment directly under the day: stream default
            candidates = [(child, "default", f"{day}/{child.name}")]
        elif STREAM_RE.fullmatch(child.name):
            candidates = [(seg, child.name, f"{day}/{child.name}/{seg.name}")
                          for seg in _scandir(Path(child.path))
                          if SEGMENT_RE.fullmatch(seg.name) and _is_dir(seg)]
        else:
            continue
        for seg, stream, key in candidates:
            talents = _md_files(Path(seg.path) / "talents")
            sig = _stat_sig(talents)
            if sig is not None:
                yield Unit(key, "segment", tuple(Path(e.path) for e in talents), sig, day=day, stream=stream)


def _day_units(root: Path) -> Iterator[Unit]:
    for day_entry in _scandir(_day_root(root)):
        if not DAY_RE.fullmatch(day_entry.name) or not _is_dir(day_entry):
            continue
        day, day_dir = day_entry.name, Path(day_entry.path)
        yield from _segment_units(day, day_dir)
        for talent in _md_files(day_dir / "talents"):
            sig = _stat_sig([talent])
            if sig is not None:
                yield Unit(f"{day}/talents/{talent.name}", "day_talent", (Path(talent.path),), sig, day=day)


def _entity_units(root: Path) -> Iterator[Unit]:
    files: dict[str, list[os.DirEntry]] = {}
    identities: dict[str, Path] = {}
    for entry in _scandir(root / "entities"):
        if SLUG_RE.fullmatch(entry.name) and _is_dir(entry):
            found = [e for e in _scandir(Path(entry.path)) if e.name == "entity.json" and _is_file(e)]
            files.setdefault(entry.name, []).extend(found)
            if found:
                identities[entry.name] = Path(found[0].path)
    for facet in _scandir(root / "facets"):
        if not _is_dir(facet):
            continue
        for entry in _scandir(Path(facet.path) / "entities"):
            if SLUG_RE.fullmatch(entry.name) and _is_dir(entry):
                files.setdefault(entry.name, []).extend(
                    e for e in _scandir(Path(entry.path))
                    if e.name in ("entity.json", "observations.jsonl") and _is_file(e))
    for entity_id in sorted(files):
        sig = _stat_sig(files[entity_id])
        if sig is not None:
            yield Unit(f"entity_search:{entity_id}", "entity",
                       tuple(Path(e.path) for e in files[entity_id]), sig,
                       primary=identities.get(entity_id))


def _facet_units(root: Path) -> Iterator[Unit]:
    for facet in _scandir(root / "facets"):
        if not SLUG_RE.fullmatch(facet.name) or not _is_dir(facet):
            continue
        for kind, suffix in _FACET_KINDS.items():
            for entry in _scandir(Path(facet.path) / kind):
                stem = entry.name[: -len(suffix)] if entry.name.endswith(suffix) else ""
                if not DAY_RE.fullmatch(stem) or not _is_file(entry):
                    continue
                sig = _stat_sig([entry])
                if sig is not None:
                    yield Unit(f"facets/{facet.name}/{kind}/{entry.name}", kind, (Path(entry.path),),
                               sig, day=stem, facet=facet.name)


def discover(root: Path) -> dict[str, Unit]:
    """Every indexable unit of the journal, keyed by its ``chunks.path``."""
    root = Path(root)
    units: dict[str, Unit] = {}
    for source in (_day_units, _entity_units, _facet_units):
        for unit in source(root):
            units[unit.key] = unit
    return units


# --- extraction ---------------------------------------------------------------------------

def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        log.warning("unreadable json skipped", path=str(path))
        return {}
    return data if isinstance(data, dict) else {}


def _read_jsonl(path: Path) -> list[dict]:
    rows, bad = [], 0
    try:
        text = storage.read_text_exact(path, errors="replace")
    except OSError:
        text = ""
    for line in storage.jsonl_lines(text):
        if not line.strip():
            continue
        try:
            obj = storage.loads_line(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            bad += 1
    if bad:
        log.warning("corrupt jsonl lines skipped", path=str(path), count=bad)
    return rows


def split_text(text: str, limit: int = CHUNK_CHARS) -> list[str]:
    """Split text at blank lines into pieces of at most ~``limit`` characters."""
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    pieces, current = [], ""
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para:
            continue
        if current and len(current) + len(para) + 2 > limit:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
        while len(current) > limit:   # one huge paragraph: hard split
            pieces.append(current[:limit])
            current = current[limit:]
    if current:
        pieces.append(current)
    return pieces


def _lines(*parts: object) -> str:
    return "\n".join(str(p).strip() for p in parts if isinstance(p, str) and p.strip())


def _activity_text(rec: dict) -> str:
    story = rec.get("story")
    body = story.get("body") if isinstance(story, dict) else None
    return _lines(rec.get("title"), rec.get("description"), rec.get("details"), body)


def _event_text(rec: dict) -> str:
    people = rec.get("participants")
    people = ", ".join(p for p in people if isinstance(p, str)) if isinstance(people, list) else ""
    return _lines(rec.get("title"), rec.get("summary"), rec.get("details"), people)


def _entity_text(unit: Unit) -> str:
    ident = _read_json(unit.primary) if unit.primary else {}
    entity_id = unit.key.split(":", 1)[1]
    name = ident.get("name") if isinstance(ident.get("name"), str) else entity_id.replace("_", " ")
    parts = [name, _lines(ident.get("type"))]
    aka = ident.get("aka")
    if isinstance(aka, list) and aka:
        parts.append("also known as " + ", ".join(a for a in aka if isinstance(a, str)))
    for path in unit.files:
        if path == unit.primary:
            continue
        if path.name == "entity.json":
            parts.append(_lines(_read_json(path).get("description")))
        elif path.name == "observations.jsonl":
            parts.extend(_lines(o.get("content")) for o in _read_jsonl(path))
    return "\n".join(p for p in parts if p)


def _time_bucket(value: object) -> str:
    """The hour ("HH") of an ``HH:MM[:SS]`` or ``HHMMSS`` value, else ""."""
    text = value if isinstance(value, str) else ""
    return text[:2] if re.match(r"^\d{2}(:?\d{2})", text) else ""


def extract(unit: Unit) -> list[Chunk]:
    """The chunks of one unit, in ``idx`` order."""
    if unit.kind == "segment":
        text = "\n\n".join(_read_text(p).strip() for p in unit.files)
        bucket = _time_bucket(unit.key.rsplit("/", 1)[-1])
        return [Chunk(t, unit.day, "", "segment", unit.stream, bucket) for t in split_text(text)]
    if unit.kind == "day_talent":
        agent = unit.files[0].stem
        return [Chunk(t, unit.day, "", agent, "", "") for t in split_text(_read_text(unit.files[0]))]
    if unit.kind == "entity":
        return [Chunk(t, "", "", "entity", "", "") for t in split_text(_entity_text(unit))]
    if unit.kind == "news":
        return [Chunk(t, unit.day, unit.facet, "news", "", "")
                for t in split_text(_read_text(unit.files[0]))]
    chunks = []
    for rec in _read_jsonl(unit.files[0]):
        if unit.kind == "activities":
            if rec.get("hidden") is True:
                continue
            text = _activity_text(rec)
        elif unit.kind == "events":
            text = _event_text(rec)
        else:
            text = _lines(rec.get("text"))
        for piece in split_text(text):
            chunks.append(Chunk(piece, unit.day, unit.facet, _AGENT[unit.kind], "",
                                _time_bucket(rec.get("start"))))
    return chunks


# --- build --------------------------------------------------------------------------------

def _lock_for(db: Path) -> threading.Lock:
    with _build_locks_guard:
        return _build_locks.setdefault(str(db), threading.Lock())


@contextlib.contextmanager
def _file_lock(db: Path, *, wait: bool) -> Iterator[bool]:
    """Hold the exclusive flock on ``<db>.lock``; yields whether it was taken
    (always True when ``wait``; False at once when another holds it). The
    kernel drops it when the holder exits, even when killed."""
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.lock", "a+b") as handle:
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
        file_rowid = conn.execute("INSERT INTO files(path, mtime) VALUES (?, ?)",
                                  (unit.key, unit.signature)).lastrowid
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


def _build_locked(root: Path, db: Path) -> IndexStats:
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
    with _lock_for(db), _file_lock(db, wait=True):
        conn = connect(db)
        try:
            stats = build_into(conn, root, progress)
        finally:
            conn.close()
        _last_build[str(db)] = time.monotonic()
    log.info("search index built", journal=str(root), indexed=stats.files_indexed,
             removed=stats.files_removed, unchanged=stats.files_unchanged,
             chunks=stats.chunks, duration_ms=int(stats.seconds * 1000))
    return stats


# --- the background refresh: a child process ----------------------------------------------

@dataclass
class _Refresh:
    proc: subprocess.Popen
    control: int                  # write end of the child's control pipe
    finished: threading.Event = dataclasses.field(default_factory=threading.Event)  # outcome logged


_refreshes: dict[str, _Refresh] = {}   # db path -> its latest refresh (guarded by _build_locks_guard)

_CHILD_CODE = ("import sys; from voiceactors.journal.index import refresh_child; "
               "sys.exit(refresh_child(sys.argv[1:]))")


# what a child's watcher logs: (done, failed, timed out), per kind of child
_EVENTS = {
    "refresh": ("search index refreshed", "search index refresh failed",
                "search index refresh timed out"),
    "first": ("search index built", "search index build failed", "search index build timed out"),
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
    with _file_lock(db, wait=first) as taken:
        if not taken:
            print(json.dumps({"skipped": "busy"}))
            return 0
        if first and is_ready(db):
            print(json.dumps({"skipped": "ready"}))
            return 0
        stats = _build_locked(root, db)
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
    Called with ``_build_locks_guard`` held."""
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
    Called with ``_lock_for(db)`` held (not the file lock: the child takes it)."""
    try:
        refresh = _spawn(root, state_dir, first=True)
    except Exception as exc:
        log.warning(_EVENTS["first"][1], journal=str(root), error=repr(exc))
        return False
    with _build_locks_guard:
        _refreshes[str(db)] = refresh      # running_refresh shows it while it builds
    return _watch(root, refresh, timeout_s, "first") is not None


def _watch(root: Path, refresh: _Refresh, timeout_s: float, kind: str) -> dict | None:
    """Wait for the child (blocked in the kernel: no GIL held), kill it after
    ``timeout_s``, log the outcome; the child's stats, or None when it failed."""
    try:
        return _wait(root, refresh, timeout_s, _EVENTS[kind])
    finally:
        refresh.finished.set()


def _wait(root: Path, refresh: _Refresh, timeout_s: float,
          events: tuple[str, str, str]) -> dict | None:
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


def running_refresh(root: Path, state_dir: Path) -> subprocess.Popen | None:
    """The child building or refreshing this journal's index until its outcome
    is logged, else None."""
    with _build_locks_guard:
        refresh = _refreshes.get(str(index_path(root, state_dir)))
    if refresh is None or refresh.finished.is_set():
        return None
    return refresh.proc


def join_refresh(root: Path, state_dir: Path, timeout: float | None = None) -> None:
    """Wait for this journal's index child, if one runs (until it exited and
    the outcome is logged)."""
    with _build_locks_guard:
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
    last = _last_build.get(key)
    if last is not None and now - last < max_age_s and db.exists():
        return db
    if is_ready(db):
        with _build_locks_guard:
            _last_build[key] = now          # one refresh per interval, not one per query
            _start_refresh(Path(root), Path(state_dir), db, refresh_timeout_s)
        return db
    with _lock_for(db):
        if not is_ready(db):           # another thread may have built it while we waited
            built = _first_build(Path(root), Path(state_dir), db, build_timeout_s)
            if not built or not is_ready(db):   # (e.g. the child saw a solstone index appear)
                _build_in_thread(Path(root), db)
        _last_build[key] = time.monotonic()
    return db


def _build_in_thread(root: Path, db: Path) -> None:
    """The first build's fallback when its child failed: build here, as
    ``build_index`` does (raises what the build raises)."""
    started = time.monotonic()
    with _file_lock(db, wait=True):
        if is_ready(db):               # another process built it meanwhile
            return
        stats = _build_locked(root, db)
    log.warning("search index built in this thread", journal=str(root),
                indexed=stats.files_indexed, duration_ms=int((time.monotonic() - started) * 1000))
