"""Days and segments, plus the rule every reader keeps: reading never creates
a folder or a file, and nothing resolves outside the journal."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from voiceactors.journal import activities, briefing, config, days, entities, facets, ledger
from voiceactors.journal.paths import InvalidName


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def tree(root: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


# --- the fixture ---------------------------------------------------------------


def test_list_days_of_fixture(fixture_journal):
    found = days.list_days(fixture_journal)
    assert found == sorted(found)
    assert {"20240101", "20260101", "20260306", "20260327", "20260520"} <= set(found)
    assert all(len(d) == 8 and d.isdigit() for d in found)


def test_fixture_day_with_default_stream(fixture_journal):
    segs = days.day_segments(fixture_journal, "20260306")
    assert [(s.id, s.stream, s.start, s.duration_s) for s in segs] == [
        ("093000_300", "default", "09:30", 300),
        ("110000_300", "default", "11:00", 300),
        ("143000_300", "default", "14:30", 300),
        ("170000_300", "default", "17:00", 300),
    ]
    assert segs[0].kinds == ("audio", "screen", "talents")
    assert segs[0].summary == ""  # the fixture has no *summary.md files
    assert segs[0].path == "chronicle/20260306/default/093000_300" and segs[0].day == "20260306"


def test_fixture_day_across_import_streams(fixture_journal):
    segs = days.day_segments(fixture_journal, "20260101")
    assert [(s.start, s.stream) for s in segs][:4] == [
        ("09:00", "import.ics"), ("09:30", "import.ics"), ("10:00", "import.chatgpt"), ("10:05", "import.chatgpt")]
    assert {s.stream for s in segs} == {"import.ics", "import.chatgpt", "import.gemini", "import.claude",
                                        "import.obsidian", "import.kindle"}
    assert all(s.kinds == ("transcript",) for s in segs)


def test_fixture_kinds(fixture_journal):
    (chat,) = days.day_segments(fixture_journal, "20260508")
    assert (chat.stream, chat.kinds) == ("chat", ("chat",))
    by_id = {s.id: s.kinds for s in days.day_segments(fixture_journal, "20260520")}
    assert by_id["090000_300"] == ("screen",) and by_id["094000_300"] == ("audio", "screen")
    assert {s.stream for s in days.day_segments(fixture_journal, "20240101")} == {"default", "import.apple"}


def test_fixture_days_without_segments(fixture_journal):
    assert days.day_segments(fixture_journal, "20250101") == []   # only health/
    assert days.day_segments(fixture_journal, "20250124") == []   # only a loose file
    assert days.day_segments(fixture_journal, "20260327") == []   # only talents/
    assert days.day_segments(fixture_journal, "19990101") is None


# --- own journals -----------------------------------------------------------------


def test_streams_summaries_and_order(tmp_path):
    day = tmp_path / "chronicle" / "20260401"
    touch(day / "default" / "100000_600" / "audio.jsonl", "{}\n")
    touch(day / "default" / "100000_600" / "talents" / "audio.md", "talk")
    touch(day / "default" / "100000_600" / "talents" / "segment_summary.md", "  Planned the launch.\n\n")
    touch(day / "120000_300" / "stream.json", json.dumps({"stream": "import.ics"}))
    touch(day / "120000_300" / "event_transcript.md", "event")
    touch(day / "090000_300" / "screen.webm", "")
    touch(day / "090000_300" / "summary.md", "Morning screen work")
    touch(day / "import.chatgpt" / "100000_300" / "conversation_transcript.jsonl", "{}\n")
    touch(day / "default" / "110000_300" / "talents" / "notes.json", "{}")  # no .md: no talents kind
    touch(day / "health" / "130000_300" / "audio.jsonl", "{}\n")
    touch(day / "indexer" / "transcripts.sqlite", "")
    touch(day / "talents" / "flow.md", "flow")
    touch(day / "README.md", "loose")
    touch(day / "default" / "not_a_segment" / "audio.jsonl", "")

    segs = days.day_segments(tmp_path, "20260401")
    assert [(s.start, s.stream, s.id) for s in segs] == [
        ("09:00", "default", "090000_300"),
        ("10:00", "default", "100000_600"),
        ("10:00", "import.chatgpt", "100000_300"),
        ("11:00", "default", "110000_300"),
        ("12:00", "import.ics", "120000_300"),
    ]
    kinds = {s.id + s.stream: s.kinds for s in segs}
    assert kinds["090000_300default"] == ("screen",)
    assert kinds["100000_600default"] == ("audio", "talents")
    assert kinds["100000_300import.chatgpt"] == ("transcript",)
    assert kinds["110000_300default"] == ()
    assert segs[1].summary == "Planned the launch." and segs[1].duration_s == 600
    assert segs[0].summary == "Morning screen work"
    assert days.day_summary(segs) == "Morning screen work\n\nPlanned the launch."
    assert days.day_summary([]) == "" and days.day_summary(None) == ""


def test_day_accepts_a_date_and_rejects_bad_days(tmp_path):
    touch(tmp_path / "chronicle" / "20260401" / "090000_300" / "audio.jsonl", "")
    assert len(days.day_segments(tmp_path, dt.date(2026, 4, 1))) == 1
    for bad in ("2026-04-01", "../../etc", "2026040", "20260401/..", ""):
        with pytest.raises(InvalidName):
            days.day_segments(tmp_path, bad)


def test_no_chronicle_folder(tmp_path):
    assert days.list_days(tmp_path) == []
    assert days.day_segments(tmp_path, "20260401") is None
    assert not (tmp_path / "chronicle").exists()


def test_symlinked_day_outside_the_journal_is_refused(tmp_path):
    outside = tmp_path / "outside"
    touch(outside / "090000_300" / "audio.jsonl", "")
    root = tmp_path / "journal"
    (root / "chronicle").mkdir(parents=True)
    (root / "chronicle" / "20260401").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidName):
        days.day_segments(root, "20260401")


def test_readers_never_create_anything(fixture_copy):
    before = tree(fixture_copy)
    root = fixture_copy
    config.load_config(root), config.agent_name(root), config.identity(root), config.identity_files(root)
    facets.all_facets(root), facets.enabled_facets(root), facets.get_facet(root, "no-such-facet")
    for day in days.list_days(root) + ["19990101"]:
        days.day_summary(days.day_segments(root, day))
    entities.load_entities(root), entities.get_entity(root, "Romeo Montague"), entities.get_entity(root, "nobody")
    entities.facet_views(root, "romeo_montague"), entities.facet_views(root, "nobody")
    for facet in ("verona", "work", "no-such-facet"):
        for day in activities.activity_days(root, facet) + ["19990101"]:
            activities.load_records(root, facet, day)
    activities.anticipated(root, dt.date(2026, 4, 22)), activities.anticipated(root, dt.date(1999, 1, 1))
    briefing.load_briefing(root, dt.date(2026, 3, 27)), briefing.load_briefing(root, dt.date(1999, 1, 1))
    ledger.derive(root), ledger.list_items(root, state="open")
    assert tree(root) == before


def test_readers_work_on_the_read_only_fixture(fixture_journal):
    # The shared fixture is read-only on disk: any attempted write would raise.
    assert days.day_segments(fixture_journal, "19990101") is None
    assert briefing.load_briefing(fixture_journal, dt.date(1999, 1, 1)) is None
    assert ledger.derive(fixture_journal) == []
