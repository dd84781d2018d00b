"""Search: our incremental FTS5 index, solstone's read-only one, query hygiene."""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from voiceactors import storage
from voiceactors.cli import main
from voiceactors.journal import index as index_mod
from voiceactors.journal import search as search_mod
from voiceactors.journal.sample import write_sample_journal
from voiceactors.journal.search import IndexStats, build_index, build_query, search

TODAY = dt.date(2026, 3, 27)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return write_sample_journal(tmp_path / "journal", days=5, today=TODAY, seed=3)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            st = path.stat()
            out[str(path.relative_to(root))] = (st.st_mtime_ns, st.st_size)
    return out


def _bump(path: Path, text: str) -> None:
    """Rewrite ``path`` and move its mtime clearly forward (mtime granularity
    can hide two writes within a few milliseconds)."""
    path.write_text(text, encoding="utf-8")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


# --- queries -----------------------------------------------------------------------------

def test_build_query_shapes():
    assert build_query("maya") == '"maya"'
    assert build_query("glaze tests") == 'NEAR("glaze" "tests") OR ("glaze" AND "tests")'
    # syntax characters and bare keywords go; the terms stay quoted
    assert build_query('"foo" OR bar* -x') == 'NEAR("foo" "bar" "x") OR ("foo" AND "bar" AND "x")'
    # stopwords are dropped when other terms remain, kept when they are all there is
    assert build_query("what about the summer camp") == 'NEAR("summer" "camp") OR ("summer" AND "camp")'
    assert build_query("the") == '"the"'


@pytest.mark.parametrize("query", ["", "   ", "***", '"()"', "AND OR NOT NEAR", "-+^:"])
def test_empty_query_is_an_error(journal, state, query):
    with pytest.raises(ValueError, match="query is required"):
        search(journal, state, query)


@pytest.mark.parametrize("query", [
    '"foo" OR bar*', "-x", "NEAR(maya", "maya:chen", "(a OR b", 'Zoë ^ * "', "日本語 テスト",
    "'; DROP TABLE chunks; --", "col:value NOT", "a\"b\"c", "maya*", "{x} [y]", "\x00maya",
])
def test_fts_syntax_never_reaches_sqlite(journal, state, query):
    hits = search(journal, state, query)      # must not raise sqlite3.Error
    assert isinstance(hits, list)


# --- results on a sample journal ---------------------------------------------------------

def test_results_have_the_contract_shape(journal, state):
    hits = search(journal, state, "Maya", limit=50)
    assert hits and len(hits) <= 50
    for hit in hits:
        assert hit.day == "" or dt.date.fromisoformat(hit.day)
        assert "[Maya]" in hit.snippet and "\n" not in hit.snippet
        assert hit.source and hit.path and not hit.path.startswith("chronicle/")
        assert hit.id.startswith(hit.path + "#")
    assert {"segment", "activity"} <= {h.source for h in hits}
    assert len({h.id for h in hits}) == len(hits)


def test_entity_hits_carry_the_slug(journal, state):
    hits = search(journal, state, "Engineering manager")
    entity = [h for h in hits if h.source == "entity"]
    assert entity and entity[0].entity_slug == "maya_chen"
    assert entity[0].path == "entity_search:maya_chen" and entity[0].day == ""
    assert all(h.entity_slug is None for h in hits if h.source != "entity")


def test_unicode_and_diacritics(journal, state):
    folded = search(journal, state, "zoe martin")
    assert any(h.entity_slug == "zoe_martin" for h in folded)
    assert any(h.entity_slug == "zoe_martin" for h in search(journal, state, "Zoë Martín"))


def test_facet_filter(journal, state):
    everything = search(journal, state, "Worked", limit=100)
    facet = sorted(h.facet for h in everything if h.facet)[0]
    assert any(h.facet != facet for h in everything)
    only = search(journal, state, "Worked", facet=facet, limit=100)
    assert only and all(h.facet == facet for h in only)
    assert search(journal, state, "Worked", facet=facet.upper(), limit=100) == only
    assert search(journal, state, "Worked", facet="nope", limit=100) == []


def test_day_range(journal, state):
    day = TODAY - dt.timedelta(days=2)
    hits = search(journal, state, "Worked", day_from=day, day_to=day.isoformat(), limit=100)
    assert hits and all(h.day == day.isoformat() for h in hits)
    later = search(journal, state, "Worked", day_from=day.strftime("%Y%m%d"), limit=100)
    assert later and all(h.day >= day.isoformat() for h in later)   # entities (no day) left out
    assert search(journal, state, "Worked", day_from="2030-01-01") == []
    with pytest.raises(ValueError):
        search(journal, state, "Worked", day_from="last tuesday")


def test_day_talents_are_indexed_under_their_stem(journal, state):
    key = (TODAY - dt.timedelta(days=1)).strftime("%Y%m%d")
    hits = search(journal, state, "Daily Flow Summary", day_from=key, day_to=key)
    assert any(h.source == "flow" and h.path == f"{key}/talents/flow.md" for h in hits)


def test_raw_transcripts_are_not_indexed(journal, state):
    seg = next((journal / "chronicle").glob("*/default/*/audio.jsonl"))
    lines = seg.read_text().splitlines()
    lines.append(json.dumps({"start": "00:04:00", "source": "mic", "speaker": 1,
                             "text": "xylophonequartz", "description": ""}))
    seg.write_text("\n".join(lines) + "\n")
    assert search(journal, state, "xylophonequartz") == []


# --- the index: placement, incremental refresh -------------------------------------------

def test_index_lives_in_the_state_dir_never_the_journal(journal, state):
    before = _snapshot(journal)
    search(journal, state, "Maya")
    build_index(journal, state)
    assert _snapshot(journal) == before
    db = index_mod.index_path(journal, state)
    assert db.is_file() and db.parent == state.resolve() / "search"
    assert db.name == hashlib.sha1(str(journal.resolve()).encode()).hexdigest() + ".sqlite"
    with pytest.raises(ValueError, match="inside the journal"):
        build_index(journal, journal / ".state")
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_incremental_refresh(journal, state):
    first = build_index(journal, state)
    assert first.files_indexed > 10 and first.files_removed == 0 and first.chunks > 0
    again = build_index(journal, state)
    assert (again.files_indexed, again.files_removed) == (0, 0)
    assert again.files_unchanged == first.files_indexed

    # one changed activity file: only it is re-indexed
    day = TODAY - dt.timedelta(days=1)
    path = next(journal.glob(f"facets/*/activities/{day:%Y%m%d}.jsonl"))
    rec = {"id": "meeting_235500_300", "activity": "meeting", "title": "Quokkaflux planning",
           "description": "", "created_at": 1}
    _bump(path, path.read_text() + json.dumps(rec) + "\n")
    stats = build_index(journal, state)
    assert (stats.files_indexed, stats.files_removed) == (1, 0)
    hit, = search(journal, state, "quokkaflux")
    assert hit.source == "activity" and hit.day == day.isoformat()
    assert hit.path == str(path.relative_to(journal)) and hit.facet == path.parts[-3]

    # one changed segment talent
    summary = next((journal / "chronicle").glob("*/default/*/talents/summary.md"))
    _bump(summary, "Sketched the marmalade roadmap.\n")
    stats = build_index(journal, state)
    assert stats.files_indexed == 1
    hit, = search(journal, state, "marmalade")
    assert hit.source == "segment" and hit.path == "/".join(summary.parts[-5:-2])

    # a new day talent, then its removal
    notes = journal / "chronicle" / f"{day:%Y%m%d}" / "talents" / "notes.md"
    notes.write_text("# Notes\n\nThe zeppelinwombat idea.\n")
    assert build_index(journal, state).files_indexed == 1
    hit, = search(journal, state, "zeppelinwombat")
    assert (hit.source, hit.path) == ("notes", f"{day:%Y%m%d}/talents/notes.md")
    notes.unlink()
    stats = build_index(journal, state)
    assert (stats.files_indexed, stats.files_removed) == (0, 1)
    assert search(journal, state, "zeppelinwombat") == []

    # an entity's observation changes its one entity_search unit
    obs = journal / "facets" / "work" / "entities" / "maya_chen" / "observations.jsonl"
    _bump(obs, obs.read_text() + json.dumps({"content": "Loves gooseberryfool", "observed_at": 2,
                                             "source_day": "20260301"}) + "\n")
    assert build_index(journal, state).files_indexed == 1
    assert [h.entity_slug for h in search(journal, state, "gooseberryfool")] == ["maya_chen"]


def test_search_builds_a_missing_index_and_refreshes_in_the_background(journal, state, monkeypatch):
    db = index_mod.index_path(journal, state)
    assert not db.exists()
    assert search(journal, state, "Maya")
    assert index_mod.is_ready(db)

    path = journal / "facets" / "work" / "todos" / "20260301.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"text": "Water the aspidistra", "completed": False}) + "\n")
    assert search(journal, state, "aspidistra") == []        # within the refresh interval
    assert index_mod.running_refresh(journal, state) is None
    monkeypatch.setattr(search_mod, "REFRESH_INTERVAL_S", 0.0)
    with capture_logs() as logs:
        search(journal, state, "aspidistra")                  # stale: starts a refresh, answers now
        child = index_mod.running_refresh(journal, state)
        index_mod.join_refresh(journal, state, timeout=30)
    assert child is not None and child.pid != os.getpid() and child.returncode == 0
    done, = [e for e in logs if e["event"] == "search.index_refreshed"]
    assert (done["indexed"], done["removed"], done["pid"]) == (1, 0, child.pid)
    hit, = search(journal, state, "aspidistra")
    assert (hit.source, hit.facet, hit.day) == ("todo", "work", "2026-03-01")


# --- the refresh child ------------------------------------------------------------------------

@contextlib.contextmanager
def _writer_holding(db: Path):
    """Hold SQLite's write lock on the index: a refresh child that has to write
    waits (busy timeout) and so is reliably still running."""
    conn = sqlite3.connect(db, timeout=5.0)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie awaiting its reaper counts)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_one_refresh_child_at_a_time(journal, state):
    db = index_mod.index_path(journal, state)
    build_index(journal, state)
    notes = journal / "chronicle" / f"{TODAY:%Y%m%d}" / "talents" / "notes.md"
    notes.write_text("# Notes\n\nThe armadillo timetable.\n")
    with _writer_holding(db):
        index_mod.ensure_index(journal, state, 0.0)            # stale: starts the child
        child = index_mod.running_refresh(journal, state)
        assert child is not None
        for _ in range(3):                                      # stale again: still that one child
            index_mod.ensure_index(journal, state, 0.0)
            assert search(journal, state, "armadillo") == []    # answered from the index as it is
            assert index_mod.running_refresh(journal, state) is child
        assert child.poll() is None
    index_mod.join_refresh(journal, state, timeout=30)
    assert child.returncode == 0 and index_mod.running_refresh(journal, state) is None
    assert [h.path for h in search(journal, state, "armadillo")] == [str(notes.relative_to(journal / "chronicle"))]


def test_the_childs_warnings_reach_our_log(journal, state):
    build_index(journal, state)
    path = journal / "facets" / "work" / "todos" / "20260302.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"text": "Call the piano tuner"}\nnot json\n')
    with capture_logs() as logs:
        index_mod.ensure_index(journal, state, 0.0)
        child = index_mod.running_refresh(journal, state)
        index_mod.join_refresh(journal, state, timeout=30)
    relayed, = [e for e in logs if e["event"] == "journal.jsonl_lines_skipped"]
    assert relayed["log_level"] == "warning" and relayed["refresh_pid"] == child.pid
    assert (relayed["path"], relayed["count"]) == (str(path), 1)
    assert search(journal, state, "piano tuner")


def test_a_refresh_in_another_process_makes_the_child_skip(journal, state):
    db = index_mod.index_path(journal, state)
    build_index(journal, state)
    with open(f"{db}.lock", "a+b") as held, capture_logs() as logs:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)               # as another process's build does
        index_mod.ensure_index(journal, state, 0.0)
        index_mod.join_refresh(journal, state, timeout=30)
    # this journal's only: an earlier test's refresh, finishing in its watcher thread, may log meanwhile
    done, = [e for e in logs if e["event"] == "search.index_refreshed" and e["journal"] == str(journal)]
    assert done["skipped"] == "busy"


def test_a_failed_refresh_is_logged_and_search_still_answers(journal, state, tmp_path):
    build_index(journal, state)
    before = search(journal, state, "Maya")
    moved = journal.rename(tmp_path / "elsewhere")              # the journal vanished
    try:
        with capture_logs() as logs:
            index_mod.ensure_index(journal, state, 0.0)
            child = index_mod.running_refresh(journal, state)
            index_mod.join_refresh(journal, state, timeout=30)
        failed, = [e for e in logs if e["event"] == "search.index_refresh_failed"]
        assert failed["returncode"] == 2 and "journal not found" in failed["error"]
        assert child is not None and child.returncode == 2
        assert search(journal, state, "Maya") == before         # the index was not emptied
    finally:
        moved.rename(journal)


def test_a_hung_refresh_is_killed_after_its_timeout(journal, state):
    db = index_mod.index_path(journal, state)
    build_index(journal, state)
    with _writer_holding(db), capture_logs() as logs:
        index_mod.ensure_index(journal, state, 0.0, refresh_timeout_s=0.5)
        child = index_mod.running_refresh(journal, state)
        index_mod.join_refresh(journal, state, timeout=30)
        assert child is not None and child.returncode == -signal.SIGKILL
        assert search(journal, state, "Maya")
    timed_out, = [e for e in logs if e["event"] == "search.index_refresh_timed_out"]
    assert timed_out["pid"] == child.pid


def test_the_child_exits_when_its_parent_dies(journal, state):
    db = index_mod.index_path(journal, state)
    build_index(journal, state)
    server = ("import sys, time; from pathlib import Path; from voiceactors.journal import index; "
              "index.ensure_index(Path(sys.argv[1]), Path(sys.argv[2]), 0.0); "
              "print(index.running_refresh(Path(sys.argv[1]), Path(sys.argv[2])).pid, flush=True); "
              "time.sleep(60)")
    with _writer_holding(db):                                   # the child cannot finish on its own
        parent = subprocess.Popen([sys.executable, "-c", server, str(journal), str(state)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            child_pid = int(parent.stdout.readline())
            assert not _gone(child_pid)
        finally:
            parent.kill()
            parent.wait()
            parent.stdout.close()
        deadline = time.monotonic() + 10
        while not _gone(child_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(child_pid)


def test_concurrent_searches_on_a_fresh_index(journal, state):
    with capture_logs() as logs, concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda q: search(journal, state, q), ["Maya", "Jonas", "Ravi"] * 6))
    assert all(results)
    built, = [e for e in logs if e["event"] == "search.index_built"]    # one build, by one child
    assert built["pid"] != os.getpid() and built["indexed"] > 10
    assert not [e for e in logs if e["log_level"] == "warning"]
    assert build_index(journal, state).files_indexed == 0   # built once, whole


# --- the first build: a child too ----------------------------------------------------------

def test_the_first_build_runs_in_a_child_while_the_caller_waits(journal, state):
    db = index_mod.index_path(journal, state)
    index_mod.connect(db).close()                          # a half-built index: not ready
    with capture_logs() as logs, concurrent.futures.ThreadPoolExecutor(1) as pool:
        with _writer_holding(db):                          # the child cannot finish yet
            pending = pool.submit(search, journal, state, "Engineering manager")
            deadline = time.monotonic() + 10
            while index_mod.running_refresh(journal, state) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            child = index_mod.running_refresh(journal, state)
            assert child is not None and child.pid != os.getpid()
            time.sleep(0.2)
            assert not pending.done() and child.poll() is None    # the caller waits for the child
        hits = pending.result(timeout=30)
    assert any(h.entity_slug == "maya_chen" for h in hits)
    assert child.returncode == 0 and index_mod.running_refresh(journal, state) is None
    built, = [e for e in logs if e["event"] == "search.index_built"]
    assert built["pid"] == child.pid and built["indexed"] > 10
    assert index_mod.is_ready(db) and build_index(journal, state).files_indexed == 0


def test_a_failed_first_build_child_falls_back_to_this_thread(journal, state):
    with capture_logs() as logs:
        db = index_mod.ensure_index(journal, state, 300.0, build_timeout_s=0.01)   # killed at once
    timed_out, = [e for e in logs if e["event"] == "search.index_build_timed_out"]
    fallback, = [e for e in logs if e["event"] == "search.index_built_in_thread"]
    assert timed_out["pid"] != os.getpid() and fallback["indexed"] > 10
    assert index_mod.is_ready(db) and search(journal, state, "Maya")


def test_a_first_build_that_cannot_work_raises_as_before(journal, tmp_path):
    state = tmp_path / "not-a-dir"
    state.write_text("")
    with pytest.raises(NotADirectoryError):
        build_index(journal, state)                        # what the in-process build raises
    with capture_logs() as logs, pytest.raises(NotADirectoryError):
        search(journal, state, "Maya")                     # the child failed, then the fallback
    failed, = [e for e in logs if e["event"] == "search.index_build_failed"]
    assert failed["returncode"] == 1 and "NotADirectoryError" in failed["error"]


async def test_searches_from_trio_worker_threads(journal, state):
    out = []

    async def one(query):
        out.append(await storage.run_sync(search, journal, state, query))

    async with trio.open_nursery() as nursery:
        for query in ["Maya", "Priya", "Helen", "Tom"] * 3:
            nursery.start_soon(one, query)
    assert len(out) == 12 and all(out)


def test_progress_reports(journal, state):
    calls = []
    stats = build_index(journal, state, progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, stats.files_indexed) and calls[-1] == (stats.files_indexed,) * 2


def test_cli_index(journal, state, capsys):
    assert main(["index", "--journal", str(journal), "--state-dir", str(state), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "indexed" in out and "removed 0" in out
    assert main(["index", "--journal", str(journal), "--state-dir", str(state)]) == 0
    assert "indexed 0," in capsys.readouterr().out
    assert main(["index", "--journal", str(journal / "missing"), "--state-dir", str(state)]) == 2


# --- solstone's own index ------------------------------------------------------------------

def _solstone_index(root: Path) -> Path:
    db = root / "indexer" / "journal.sqlite"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE files(path TEXT PRIMARY KEY, mtime INTEGER)")
    conn.execute("""CREATE VIRTUAL TABLE chunks USING fts5(content, path UNINDEXED, day UNINDEXED,
                    facet UNINDEXED, agent UNINDEXED, stream UNINDEXED, idx UNINDEXED,
                    time_bucket UNINDEXED)""")
    rows = [
        ("Walked the harbor with Benvolio", "20260306/default/143000_300", "20260306", "montague",
         "segment", "default", 0, "14"),
        ("Benvolio Montague, DevOps lead", "entity_search:benvolio_montague", "", "", "entity", "", 0, ""),
        ("Harbor cleanup day", "facets/verona/events/20260307.jsonl", "20260307", "verona", "event", "", 0, ""),
    ]
    conn.executemany("INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    return db


def test_solstone_index_is_used_read_only(tmp_path, state):
    root = tmp_path / "journal"
    root.mkdir()
    db = _solstone_index(root)
    os.chmod(db, 0o444)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()

    hits = search(root, state, "harbor")
    assert {h.path for h in hits} == {"20260306/default/143000_300", "facets/verona/events/20260307.jsonl"}
    assert [h.facet for h in search(root, state, "harbor", facet="verona")] == ["verona"]
    assert [h.day for h in search(root, state, "harbor", day_to="2026-03-06")] == ["2026-03-06"]
    ent, = search(root, state, "DevOps")
    assert (ent.entity_slug, ent.source, ent.day) == ("benvolio_montague", "entity", "")
    assert len(search(root, state, '-harbor* OR "')) == 2

    assert build_index(root, state) == IndexStats(0, 0, 0, 0, 0.0, solstone=True)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert not (state / "search").exists()
    # only SQLite's own WAL companions may appear beside it
    assert {p.name for p in db.parent.iterdir()} <= {"journal.sqlite", "journal.sqlite-wal",
                                                      "journal.sqlite-shm"}


# --- the real fixture journal ---------------------------------------------------------------

def test_fixture_journal_search(fixture_copy, state):
    before = _snapshot(fixture_copy)
    hits = search(fixture_copy, state, "Tybalt", limit=20)
    assert hits and all("[Tybalt]" in h.snippet for h in hits)
    assert {"event", "segment"} <= {h.source for h in hits}
    montague = search(fixture_copy, state, "Verona Platform", facet="montague", limit=20)
    assert montague and all(h.facet == "montague" for h in montague)
    seg = [h for h in search(fixture_copy, state, "sub-millisecond performance", limit=20)
           if h.source == "segment"]
    assert any(h.path == "20260306/default/143000_300" and h.day == "2026-03-06" for h in seg)
    mesh = search(fixture_copy, state, "mesh routing", limit=20)
    assert "balthasar_davi" in {h.entity_slug for h in mesh}
    march6 = search(fixture_copy, state, "Benvolio", day_from="2026-03-06", day_to="2026-03-06")
    assert march6 and {h.day for h in march6} == {"2026-03-06"}
    assert _snapshot(fixture_copy) == before
