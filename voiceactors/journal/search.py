"""Full-text search over a journal (SQLite FTS5, bm25 order, snippets).

If the journal has solstone's own ``indexer/journal.sqlite`` it is queried
read-only (``mode=ro``) and never written. Otherwise we search our own index
(``voiceactors.journal.index``) in the state directory. ``search`` builds it
when it is missing (in a child process; the caller waits) and, at most once every
``REFRESH_INTERVAL_S`` seconds per process, starts an incremental refresh in a
child process while it answers from the index as it is (the refresh walks the
journal tree: too slow for a query to wait on, and in this process it would
hold the GIL for seconds). ``build_index`` / ``voiceactors index`` refreshes it
on demand.

Queries are reduced to plain terms (letters, digits, spaces; the bare FTS
keywords ``AND OR NOT NEAR`` dropped; common English function words dropped
when other terms remain), each double-quoted, so no user input can reach
FTS5 as syntax. Terms match whole tokens (the unicode61 tokenizer:
case- and diacritic-insensitive); there is no prefix matching, so the same
query means the same thing on solstone's index and ours. Several terms become
``NEAR("a" "b") OR ("a" AND "b")``: every term must occur, and bm25 ranks
chunks where they occur close together first.

Everything is synchronous and blocking; callers use ``storage.run_sync``
(an abandoned, cancelled search finishes in its thread and is discarded).
Each worker thread keeps its own SQLite connection, so searches run
concurrently in worker threads without sharing one.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import sqlite3
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from voiceactors.journal.index import (
    IndexStats,
    build_index,
    ensure_index,
    index_path,
    solstone_index,
)
from voiceactors.journal.paths import SLUG_RE
from voiceactors.settings import default

__all__ = ["SearchHit", "IndexStats", "search", "build_index", "build_query", "cli_index",
           "REFRESH_INTERVAL_S"]

REFRESH_INTERVAL_S: float = default("search_refresh_interval_s")  # how stale our index may get before a refresh
SNIPPET_TOKENS = 12
MAX_LIMIT = 100
_FTS_KEYWORDS = {"AND", "OR", "NOT", "NEAR"}
# function words dropped from multi-word queries: spoken queries are full of
# them ("what did I say about the camp"), they match nearly every chunk (slow
# to intersect) and requiring them would only lose results
STOPWORDS = frozenset(
    "a an the of to in on at by for from with about into over and or but if "
    "is are was were be been am do does did have has had will would can could "
    "i me my we us our you your he she it they them his her its their this that "
    "what when where who which how there".split())
_local = threading.local()

@dataclass(frozen=True)
class SearchHit:
    id: str                    # "<path>#<idx>": stable for a chunk
    day: str                   # YYYY-MM-DD, or "" (entities have no day)
    source: str                # the chunk's agent: segment, entity, activity, event, todo, news, flow, ...
    snippet: str               # one line, matches in [brackets]
    facet: str
    path: str                  # solstone-style path, without "chronicle/"
    entity_slug: str | None    # only when the path names an entity


def query_terms(query: str) -> list[str]:
    """The plain search terms of ``query``: FTS syntax removed, duplicates and
    (unless nothing else is left) stopwords dropped."""
    cleaned = "".join(ch if ch.isalnum() else " " for ch in str(query))
    terms = list(dict.fromkeys(t for t in cleaned.split() if t not in _FTS_KEYWORDS))
    content = [t for t in terms if t.lower() not in STOPWORDS]
    return content or terms


def build_query(query: str) -> str:
    """The FTS5 MATCH expression for ``query``; ValueError("query is required")
    when nothing searchable is left."""
    terms = query_terms(query)
    if not terms:
        raise ValueError("query is required")
    quoted = [f'"{t}"' for t in terms]   # terms are alphanumeric: no quote to escape
    if len(quoted) == 1:
        return quoted[0]
    return f"NEAR({' '.join(quoted)}) OR ({' AND '.join(quoted)})"


def _day_key(value: object) -> str | None:
    """YYYYMMDD for a date, 'YYYY-MM-DD' or 'YYYYMMDD'; ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, _dt.date):
        return value.strftime("%Y%m%d")
    text = str(value).strip().replace("-", "")
    if not re.fullmatch(r"\d{8}", text):
        raise ValueError(f"not a day: {value!r}")
    return text


def _iso_day(value: object) -> str:
    text = str(value or "")
    return f"{text[:4]}-{text[4:6]}-{text[6:8]}" if re.fullmatch(r"\d{8}", text) else ""


def entity_slug_for(path: str) -> str | None:
    """The entity a chunk path names (``entity_search:<id>``, ``entity:<id>``
    or ``.../entities/<id>/...``), else None."""
    for prefix in ("entity_search:", "entity:"):
        if path.startswith(prefix):
            slug = path[len(prefix):]
            return slug if SLUG_RE.fullmatch(slug) else None
    parts = path.split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "entities":
            slug = parts[i + 1]
            if SLUG_RE.fullmatch(slug) and not slug.endswith((".json", ".jsonl", ".md")):
                return slug
    return None


def _clean_snippet(text: str) -> str:
    text = re.sub(r"[#*`]+", "", text or "")
    return " ".join(text.split())


def _connection(db: Path, *, readonly: bool) -> sqlite3.Connection:
    """This thread's connection to ``db`` (SQLite's page cache is per
    connection, so keeping one per worker thread keeps queries warm; a
    connection is never used by another thread). Reopened when the file was
    replaced. ``readonly`` opens with ``mode=ro``: solstone owns that file and
    we must never write it."""
    conns = _local.__dict__.setdefault("conns", {})
    st = os.stat(db)
    ident = (st.st_dev, st.st_ino)
    cached = conns.get(str(db))
    if cached is not None and cached[0] == ident:
        conn: sqlite3.Connection = cached[1]
        return conn
    if cached is not None:
        cached[1].close()
    if readonly:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    else:
        conn = sqlite3.connect(db, timeout=30.0)
        conn.execute("PRAGMA query_only=1")
    conns[str(db)] = (ident, conn)
    return conn


def search(root: Path, state_dir: Path, query: str, *, facet: str | None = None,
           day_from: object = None, day_to: object = None, limit: int = 10,
           refresh_interval_s: float | None = None) -> list[SearchHit]:
    """Search the journal; best (lowest bm25) first.

    ``facet`` filters on the chunk's facet (case-insensitive). ``day_from`` /
    ``day_to`` are inclusive (``date``, ``YYYY-MM-DD`` or ``YYYYMMDD``);
    a day range leaves out chunks without a day (entities). ValueError
    ("query is required") when the query has no searchable term. Blocking:
    may build or refresh our index first (see the module docstring), when it
    is older than ``refresh_interval_s`` (None: ``REFRESH_INTERVAL_S``; the
    server passes ``settings.search_refresh_interval_s``).
    """
    match = build_query(query)
    limit = max(1, min(int(limit or 10), MAX_LIMIT))
    root = Path(root)
    clauses: list[str] = ["chunks MATCH ?"]
    params: list[str | int] = [match]
    if facet:
        clauses.append("lower(facet) = lower(?)")
        params.append(str(facet))
    for op, value in ((">=", _day_key(day_from)), ("<=", _day_key(day_to))):
        if value is not None:
            clauses.append(f"day {op} ?")
            params.append(value)
    sql = (f"SELECT path, day, facet, agent, idx, "
           f"snippet(chunks, 0, '[', ']', '…', {SNIPPET_TOKENS}) "
           f"FROM chunks WHERE {' AND '.join(clauses)} ORDER BY rank LIMIT ?")
    params.append(limit)

    theirs = solstone_index(root)
    interval = REFRESH_INTERVAL_S if refresh_interval_s is None else refresh_interval_s
    db = theirs or ensure_index(root, Path(state_dir), interval)
    rows = _connection(db, readonly=theirs is not None).execute(sql, params).fetchall()
    return [
        SearchHit(id=f"{path}#{idx}", day=_iso_day(day), source=str(agent or ""),
                  snippet=_clean_snippet(snip), facet=str(facet_ or ""), path=str(path or ""),
                  entity_slug=entity_slug_for(str(path or "")))
        for path, day, facet_, agent, idx, snip in rows
    ]


def cli_index(args: argparse.Namespace) -> int:
    """``voiceactors index --journal DIR [--state-dir DIR] [--no-progress]``."""
    from tqdm import tqdm

    root = Path(args.journal)
    if not root.is_dir():
        print(f"journal not found: {root}", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir or default("state_dir"))
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="file", desc="indexing", file=sys.stderr, leave=False)
        bar.update(done - bar.n)

    try:
        stats = build_index(root, state_dir, progress=None if args.no_progress else progress)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    finally:
        if bar is not None:
            bar.close()
    if stats.solstone:
        print(f"using solstone's index at {solstone_index(root)}; nothing to build")
        return 0
    print(f"indexed {stats.files_indexed}, removed {stats.files_removed}, "
          f"unchanged {stats.files_unchanged}, {stats.chunks} chunks in {stats.seconds:.1f}s "
          f"-> {index_path(root, state_dir)}")
    return 0
