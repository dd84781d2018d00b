"""Activity records per facet and day, and anticipated (calendar) records."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from voiceactors.journal import activities
from voiceactors.journal.paths import InvalidName


def write_facet(root: Path, slug: str, *, muted: bool = False) -> None:
    folder = root / "facets" / slug
    (folder / "activities").mkdir(parents=True, exist_ok=True)
    (folder / "facet.json").write_text(json.dumps({"title": slug, "muted": muted}))


def write_day(root: Path, facet: str, day: str, records: list[dict], raw: list[str] = ()) -> Path:
    path = root / "facets" / facet / "activities" / f"{day}.jsonl"
    lines = [json.dumps(r) for r in records] + list(raw)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def planned(rid: str, target: str, start: str | None, **extra) -> dict:
    return {"id": rid, "source": "anticipated", "target_date": target, "start": start, "title": rid,
            "cancelled": False, "hidden": False, **extra}


def test_fixture_activity_days_ignore_type_list(fixture_journal):
    assert activities.activity_days(fixture_journal, "full-featured") == ["20260214", "20260422"]
    assert activities.activity_days(fixture_journal, "verona") == ["20260305", "20260306", "20260309"]
    assert activities.activity_days(fixture_journal, "minimal-facet") == []
    assert activities.activity_days(fixture_journal, "no-such-facet") == []


def test_fixture_load_records(fixture_journal):
    recs = activities.load_records(fixture_journal, "verona", "20260309")
    assert [r["id"] for r in recs] == ["engineering_090000_300", "design_review_133000_300"]
    assert activities.load_records(fixture_journal, "verona", "19990101") == []


def test_fixture_anticipated(fixture_journal):
    events = activities.anticipated(fixture_journal, dt.date(2026, 4, 22))
    assert [e["title"] for e in events] == [
        "Morning planning meeting", "Partner call", "Proposal deadline",
        "Afternoon appointment", "Unknown planned item"]  # no start time: last, by title
    assert all(e["facet"] == "full-featured" for e in events)
    assert activities.anticipated(fixture_journal, "2026-04-22") == events
    assert activities.anticipated(fixture_journal, dt.date(2026, 4, 23)) == []


def test_anticipated_rules(tmp_path):
    write_facet(tmp_path, "work")
    write_facet(tmp_path, "quiet", muted=True)
    write_day(tmp_path, "work", "20260401", [
        planned("standup", "2026-04-02", "9:30"),
        planned("lunch", "2026-04-02", "12:00:00", facet="elsewhere"),
        planned("cancelled", "2026-04-02", "10:00", cancelled=True),
        planned("hidden", "2026-04-02", "10:00", hidden=True),
        planned("other_day", "2026-04-03", "10:00"),
        {"id": "done", "source": "cogitate", "target_date": "2026-04-02", "start": "08:00"},
    ], raw=["not json"])
    write_day(tmp_path, "work", "20260402", [planned("review", "2026-04-02", "11:00")])
    write_day(tmp_path, "quiet", "20260402", [planned("muted", "2026-04-02", "08:00")])
    with capture_logs() as logs:
        events = activities.anticipated(tmp_path, dt.date(2026, 4, 2))
    assert [(e["id"], e["facet"]) for e in events] == [
        ("standup", "work"), ("review", "work"), ("lunch", "elsewhere")]
    assert any(e["event"] == "journal.jsonl_line_skipped" and e["line"] == 7 for e in logs)
    # results are copies: changing one does not change the next answer
    events[0]["title"] = "changed"
    assert activities.anticipated(tmp_path, dt.date(2026, 4, 2))[0]["title"] == "standup"


def test_anticipated_sees_file_changes(tmp_path):
    write_facet(tmp_path, "work")
    write_day(tmp_path, "work", "20260401", [planned("a", "2026-04-02", "09:00")])
    assert [e["id"] for e in activities.anticipated(tmp_path, dt.date(2026, 4, 2))] == ["a"]
    write_day(tmp_path, "work", "20260401", [planned("a", "2026-04-02", "09:00"), planned("b", "2026-04-02", "08:00")])
    assert [e["id"] for e in activities.anticipated(tmp_path, dt.date(2026, 4, 2))] == ["b", "a"]


def test_load_records_skips_corrupt_lines_with_line_numbers(tmp_path):
    write_facet(tmp_path, "work")
    path = write_day(tmp_path, "work", "20260401", [{"id": "a"}], raw=["", "{bad", '"a string"', '{"id": "b"}'])
    with capture_logs() as logs:
        recs = activities.load_records(tmp_path, "work", "20260401")
    assert [r["id"] for r in recs] == ["a", "b"]
    assert [(e["file"], e["line"]) for e in logs if e["event"] == "journal.jsonl_line_skipped"] == [
        (str(path), 3), (str(path), 4)]
    assert activities.activity_days(tmp_path, "work") == ["20260401"]


def test_paths_are_validated(tmp_path):
    for facet, day in (("../../etc", "20260401"), ("work", "../../x"), ("work/..", "20260401"), ("work", "2026-04-01")):
        with pytest.raises(InvalidName):
            activities.load_records(tmp_path, facet, day)
    with pytest.raises(InvalidName):
        activities.activity_days(tmp_path, "../facets")


def test_activity_days_and_day_files_within_a_range(tmp_path):
    write_facet(tmp_path, "work")
    for day in ("20260330", "20260331", "20260401", "20260402", "20260410"):
        write_day(tmp_path, "work", day, [{"id": day}])
    acts = tmp_path / "facets" / "work" / "activities"
    (acts / "activities.jsonl").write_text("{}\n")       # the type list: never a day
    (acts / "2026040.jsonl").write_text("{}\n")          # not a day name
    (acts / "20260403.jsonl").mkdir()                    # not a file
    assert activities.activity_days(tmp_path, "work", "20260331", "20260403") == [
        "20260331", "20260401", "20260402"]
    assert activities.activity_days(tmp_path, "work", first="20260402") == ["20260402", "20260410"]
    assert activities.activity_days(tmp_path, "work", last="20260330") == ["20260330"]
    assert activities.activity_days(tmp_path, "work", "20260403", "20260409") == []
    assert activities.day_files(tmp_path, "work", "20260401", "20260401") == [acts / "20260401.jsonl"]
    assert activities.day_files(tmp_path, "work") == [acts / f"{d}.jsonl" for d in (
        "20260330", "20260331", "20260401", "20260402", "20260410")]


def test_records_between(tmp_path):
    write_facet(tmp_path, "work")
    write_day(tmp_path, "work", "20260401", [{"id": "a"}, {"id": "b"}], raw=["{bad"])
    write_day(tmp_path, "work", "20260403", [{"id": "c"}])
    write_day(tmp_path, "work", "20260405", [{"id": "d"}])
    assert activities.records_between(tmp_path, "work", "20260401", "20260404") == [
        ("20260401", [{"id": "a"}, {"id": "b"}]), ("20260403", [{"id": "c"}])]
    assert [day for day, _ in activities.records_between(tmp_path, "work")] == ["20260401", "20260403", "20260405"]
    assert activities.records_between(tmp_path, "nowhere", "20260401", "20260404") == []
    with pytest.raises(InvalidName):
        activities.records_between(tmp_path, "../facets")
