"""Journal writes, hardened (issue 11, items 4-6), on real journal files.

* line separators: JSONL is split at ``"\\n"`` only, so a record holding
  U+2028, U+2029, U+0085, ``\\v``, ``\\f`` or ``\\x1c``-``\\x1e`` stays one
  visible record, and a close in its day file leaves it byte for byte;
* clock skew: a close by another writer stamped ahead of our clock does not
  swallow ours (we stamp after it), and the tool never says ``ok`` for a
  state the journal does not derive;
* file mode, owner and debris: a close keeps the day file's mode and owner,
  and sweeps a temp file of ours that a kill left behind, never a foreign one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from voiceactors import storage
from voiceactors.call.record import read_record
from voiceactors.journal import activities, ledger, search
from voiceactors.journal.sample import write_sample_journal
from voiceactors.tools import REGISTRY, ToolContext

DAY = dt.date(2026, 3, 27)
ROOT = Path(__file__).resolve().parents[1]
complete = REGISTRY["commitments.complete"].handler

# every character str.splitlines() breaks at besides \n and \r
SEPARATORS = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]


def opened(journal: Path, item_id: str) -> tuple[Path, str, str, str]:
    """``(day file, facet, day, record id)`` of the record that opened the item."""
    ref = ledger._derived(journal).opening[item_id]   # noqa: SLF001 - where the item lives
    return journal / "facets" / ref.facet / "activities" / f"{ref.day}.jsonl", ref.facet, ref.day, ref.activity_id


def first_open(journal: Path) -> ledger.LedgerItem:
    return ledger.list_items(journal, state="open", top=1)[0]


def close_edits(path: Path, item_id: str) -> list[dict]:
    out = []
    for line in storage.jsonl_lines(path.read_text(encoding="utf-8")):
        if not line.strip():
            continue
        for edit in storage.loads_line(line).get("edits") or []:
            if edit.get("fields") == ["ledger_close"] and edit["ledger_close"]["item_id"] == item_id:
                out.append(edit)
    return out


def pasted_line(index: int, sep: str) -> str:
    """A record whose title, details and commitment hold ``sep`` raw, as a
    writer that does not escape it would put it on disk."""
    record = {"id": f"pasted_{index}", "created_at": 1774600000000 + index, "activity": "note",
              "title": f"Pasted SEP{index}", "details": f"zqxword{index} SEP{index} end",
              "commitments": [{"owner": "Me", "action": f"send pasted notes {index} SEP{index} soon",
                               "counterparty": "Paste Person"}]}
    return json.dumps(record, ensure_ascii=False).replace(f"SEP{index}", f"a{sep}b")


def test_records_holding_line_separators_stay_visible_and_survive_a_close_byte_for_byte(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = first_open(journal)
    path, facet, day, record_id = opened(journal, item.id)
    # the opening record itself holds one too: its rewritten line must stay one line for any reader
    original = storage.jsonl_lines(path.read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in original]
    target = next(i for i, r in enumerate(rows) if r["id"] == record_id)
    rows[target]["title"] = "opening\u2028record"
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    lines += [pasted_line(i, sep) for i, sep in enumerate(SEPARATORS)]
    crlf = json.dumps({"id": "crlf_record", "created_at": 1774600000100, "title": "windows line"}) + "\r"
    lines.append(crlf)
    records = len(lines)
    lines[3:3] = ["", "   "]                       # blank lines stay where they are too
    storage.atomic_write(path, "".join(line + "\n" for line in lines))   # replaced, as solstone writes
    before = path.read_bytes().split(b"\n")

    # visible: every surface reads each of them as one record
    loaded = {r["id"]: r for r in activities.load_records(journal, facet, day)}
    for i, sep in enumerate(SEPARATORS):
        assert loaded[f"pasted_{i}"]["title"] == f"Pasted a{sep}b"
        assert any(c.action == f"send pasted notes {i} a{sep}b soon" for c in ledger.derive(journal))
        hits = search.search(journal, tmp_path / "state", f"zqxword{i}")
        assert [h.path for h in hits] == [f"facets/{facet}/activities/{day}.jsonl"], sep
    assert loaded["crlf_record"]["title"] == "windows line"
    assert len(loaded) == records

    # a close in the same file: every other line is byte for byte what it was
    out = complete(ToolContext(journal, tmp_path / "state"), {"commitment_id": item.id, "resolution": "done"})
    assert out["ok"] is True and out["commitment"]["state"] == "closed"
    after = path.read_bytes().split(b"\n")
    assert len(after) == len(before)
    changed = [i for i, (old, new) in enumerate(zip(before, after)) if old != new]
    assert changed == [target if target < 3 else target + 2]
    rewritten = after[changed[0]].decode("utf-8")
    assert "\u2028" not in rewritten and len(rewritten.splitlines()) == 1     # escaped: one line for splitlines too
    assert json.loads(rewritten)["title"] == "opening\u2028record"
    assert ledger.get_item(journal, item.id).state == "closed"
    assert len(close_edits(path, item.id)) == 1


def test_call_record_lines_holding_separators_read_back_whole(tmp_path):
    path = tmp_path / "calls" / "rtc_x.jsonl"
    storage.append_lines(path, [json.dumps({"kind": "note", "text": f"a{sep}b"}, ensure_ascii=False)
                                for sep in ("\u2028", "\u2029", "\x85")])
    assert [line["text"] for line in read_record(path)] == ["a\u2028b", "a\u2029b", "a\x85b"]


# --- clock skew ------------------------------------------------------------------------

def iso_ms(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def their_close(item_id: str, as_state: str, at: dt.datetime) -> dict:
    return {"timestamp": iso_ms(at), "actor": "solstone", "fields": ["ledger_close"],
            "note": f"resolution: {as_state}", "ledger_close": {"item_id": item_id, "as_state": as_state}}


def add_edit(path: Path, record_id: str, edit: dict) -> None:
    """Another writer's edit, the way solstone writes: under the lock, replace the file."""
    with storage.file_lock(path):
        rows = [json.loads(line) for line in storage.jsonl_lines(path.read_text(encoding="utf-8"))]
        for row in rows:
            if row["id"] == record_id:
                row.setdefault("edits", []).append(edit)
        tmp = path.with_name(path.name + ".theirs")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, path)


def test_a_close_stamped_ahead_of_our_clock_does_not_swallow_ours(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = first_open(journal)
    path, _facet, _day, record_id = opened(journal, item.id)
    ahead = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1, milliseconds=123)
    add_edit(path, record_id, their_close(item.id, "dropped", ahead))
    assert ledger.get_item(journal, item.id).state == "dropped"
    ctx = ToolContext(journal, tmp_path / "state")

    out = complete(ctx, {"commitment_id": item.id, "resolution": "done"})
    assert out["ok"] is True and out["commitment"]["state"] == "closed"
    assert ledger.get_item(journal, item.id).state == "closed"
    ours = close_edits(path, item.id)[-1]
    their_ms = ledger.parse_timestamp_ms(iso_ms(ahead))
    assert ledger.parse_timestamp_ms(ours["timestamp"]) == their_ms + 1      # just after theirs
    # asked again: nothing more is appended
    assert complete(ctx, {"commitment_id": item.id, "resolution": "done"})["ok"] is True
    assert len(close_edits(path, item.id)) == 2


def test_complete_is_never_ok_when_the_journal_derives_another_state(tmp_path, monkeypatch):
    """A future close lands in another day file, appended in place after our
    ledger was derived (so the close does not see it): ours is written, but
    the state derived afterwards is theirs, and the tool says so."""
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = first_open(journal)
    path, facet, _day, _record_id = opened(journal, item.id)
    other = next(p for p in sorted((journal / "facets" / facet / "activities").glob("2*.jsonl")) if p != path)
    monkeypatch.setattr(ledger, "monotonic", lambda: 1000.0)   # the cached derivation stays trusted
    assert ledger.get_item(journal, item.id).state == "open"
    ahead = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    with open(other, "a", encoding="utf-8") as handle:       # in place: the folder's mtime does not move
        handle.write(json.dumps({"id": "theirs_ahead", "created_at": 1774600000000,
                                 "edits": [their_close(item.id, "dropped", ahead)]}) + "\n")

    out = complete(ToolContext(journal, tmp_path / "state"), {"commitment_id": item.id, "resolution": "done"})
    assert out == {"error": "not applied: the journal shows this commitment as dropped"}
    assert ledger.get_item(journal, item.id).state == "dropped"


def test_stamp_after_uses_whole_seconds_unless_the_latest_is_not_older():
    past = ledger.parse_timestamp_ms("2001-01-01T00:00:00Z")
    assert ledger.stamp_after(past).endswith("Z") and "." not in ledger.stamp_after(past)
    future = ledger.parse_timestamp_ms("2999-01-01T00:00:00.999Z")
    assert ledger.stamp_after(future) == "2999-01-01T00:00:01.000Z"


# --- file mode, owner, debris ------------------------------------------------------------

@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664])
def test_a_close_keeps_the_day_files_mode(tmp_path, mode):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = first_open(journal)
    path = opened(journal, item.id)[0]
    os.chmod(path, mode)
    ledger.close(journal, item.id, "closed", "resolution: done")
    assert len(close_edits(path, item.id)) == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == mode


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may give a file to another owner")
def test_a_close_keeps_the_day_files_owner_when_running_as_root(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = first_open(journal)
    path = opened(journal, item.id)[0]
    os.chown(path, 12345, 23456)
    ledger.close(journal, item.id, "closed", "resolution: done")
    assert len(close_edits(path, item.id)) == 1
    st = os.stat(path)
    assert (st.st_uid, st.st_gid) == (12345, 23456)


KILLED_MID_REWRITE = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from voiceactors.journal import ledger
    def die(src, dst):                      # the temp file is written and fsynced: now the kill
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace = die
    ledger.close(Path(sys.argv[1]), sys.argv[2], "closed", "resolution: done")
""")


def test_a_temp_file_left_by_a_kill_mid_rewrite_is_swept_and_foreign_files_are_not(tmp_path):
    journal = write_sample_journal(tmp_path / "journal", days=3, today=DAY)
    item = first_open(journal)
    path = opened(journal, item.id)[0]
    before = path.read_bytes()
    run = subprocess.run([sys.executable, "-c", KILLED_MID_REWRITE, str(journal), item.id],
                         capture_output=True, timeout=60, cwd=ROOT)
    assert run.returncode == -9, run.stderr[-2000:]
    assert path.read_bytes() == before                          # the kill left the old file
    leftovers = [p for p in path.parent.iterdir() if storage.is_our_temp(p.name, path.name)]
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > len(before)   # full size, hidden
    foreign = {
        path.parent / f".{path.name}.a1b2c3d4.tmp": b"mkstemp style, maybe someone else's",
        path.parent / f"{path.name}.other.tmp": b"another writer's",
        path.parent / f".{path.name}.voiceactors-notours.tmp": b"not our naming",
        path.parent / f".{path.name}.voiceactors-0123456789ab.tmp.keep": b"not our naming",
    }
    sibling = next(p for p in sorted(path.parent.glob("2*.jsonl")) if p != path)
    foreign[sibling.parent / f".{sibling.name}.voiceactors-0123456789ab.tmp"] = b"ours, but another file's"
    for foreign_path, data in foreign.items():
        foreign_path.write_bytes(data)

    ledger.close(journal, item.id, "closed", "resolution: done")
    assert not leftovers[0].exists()
    assert {p: p.read_bytes() for p in foreign} == foreign       # untouched
    assert len(close_edits(path, item.id)) == 1
    assert not [p for p in path.parent.iterdir() if storage.is_our_temp(p.name, path.name)]


def test_a_write_log_temp_file_left_by_a_kill_is_swept_under_that_ids_lock(tmp_path):
    from voiceactors.executor import write_log

    state = tmp_path / "state"
    record = write_log.record_path(state, "call_killed")
    record.parent.mkdir(parents=True)
    leftover = record.parent / f".{record.name}.voiceactors-00112233aabb.tmp"
    leftover.write_text('{"output": "half')
    other = write_log.record_path(state, "call_other")
    not_this_ids = other.parent / f".{other.name}.voiceactors-00112233aabb.tmp"
    not_this_ids.write_text("another id's")
    out, replayed = write_log.apply_once(state, "call_killed", lambda: {"output": "{}", "outcome": "ok"})
    assert not replayed and not leftover.exists() and not_this_ids.read_text() == "another id's"
    assert write_log.load(state, "call_killed")["output"] == "{}"
    assert stat.S_IMODE(os.stat(record).st_mode) == 0o600        # the write log stays private
