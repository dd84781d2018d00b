"""The sample journal: deterministic, well-formed, and readable by every surface."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from voiceactors.cli import main
from voiceactors.journal import activities, briefing, config, days, entities, facets, ledger
from voiceactors.journal.sample import MARKER, SampleError, Scale, write_sample_journal

TODAY = dt.date(2026, 3, 27)


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return write_sample_journal(tmp_path / "journal", days=14, today=TODAY, seed=0)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _records(root: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(root.glob("facets/*/activities/*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines()]


def test_deterministic_for_a_seed(tmp_path, sample):
    again = write_sample_journal(tmp_path / "again", days=14, today=TODAY, seed=0)
    assert _tree(again) == _tree(sample)
    other = write_sample_journal(tmp_path / "other", days=14, today=TODAY, seed=1)
    assert _tree(other) != _tree(sample)


def test_every_file_parses(sample):
    files = [p for p in sample.rglob("*") if p.is_file()]
    assert len(files) > 100
    for path in files:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json" or path.name == MARKER:
            assert isinstance(json.loads(text), dict), path
        elif path.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines()]
            assert rows and all(isinstance(r, dict) for r in rows), path
        else:
            assert path.suffix == ".md" and text.strip(), path


def test_layout_matches_the_solstone_format(sample):
    cfg = json.loads((sample / "config" / "journal.json").read_text())
    assert cfg["agent"]["name"] == "sol" and cfg["identity"]["name"]
    assert (sample / "identity" / "self.md").is_file()
    day_dirs = sorted(p.name for p in (sample / "chronicle").iterdir())
    assert len(day_dirs) == 14 and day_dirs[-1] == TODAY.strftime("%Y%m%d")
    segs = sorted((sample / "chronicle").glob("*/default/*_300"))
    assert 14 * 2 <= len(segs) <= 14 * 8
    for seg in segs:
        assert {"stream.json", "audio.jsonl", "talents"} <= {p.name for p in seg.iterdir()}
        assert {"audio.md", "summary.md"} == {p.name for p in (seg / "talents").iterdir()}
        header, *entries = [json.loads(line) for line in (seg / "audio.jsonl").read_text().splitlines()]
        assert "raw" in header and entries and {"start", "source", "speaker", "text"} <= set(entries[0])
    for day in day_dirs:
        assert (sample / "chronicle" / day / "talents" / "flow.md").is_file()
    for rec in _records(sample):
        assert isinstance(rec["created_at"], int) and rec["id"]
        for part in rec.get("participation", []):
            assert part["entity_id"] and (sample / "entities" / part["entity_id"] / "entity.json").is_file()


def test_commitments_open_and_closed_in_the_files(sample):
    records = _records(sample)
    commitments = [c for r in records for c in r.get("commitments", [])]
    closures = [c for r in records for c in r.get("closures", [])]
    manual = [e["ledger_close"] for r in records for e in r.get("edits", [])
              if e.get("fields") == ["ledger_close"]]
    assert len(commitments) >= 15 and closures
    for c in commitments + closures:
        assert c["owner_entity_id"] and c["counterparty_entity_id"] and c["action"]
    # some closures are reworded, so only the fuzzy match can pair them
    actions = {c["action"] for c in commitments}
    assert any(c["action"] not in actions for c in closures)
    assert len(commitments) > len(closures) + len(manual)     # some stay open


def test_ledger_derives_every_state(tmp_path):
    # a longer sample makes every state (including manual drops) certain
    root = write_sample_journal(tmp_path / "j", days=40, today=TODAY, seed=0)
    items = ledger.derive(root)
    states = {i.state for i in items}
    assert states == {"open", "closed", "dropped"}
    records = _records(root)
    manual = {e["ledger_close"]["as_state"] for r in records for e in r.get("edits", [])
              if e.get("fields") == ["ledger_close"]}
    assert manual == {"closed", "dropped"}
    actions = {c["action"] for r in records for c in r.get("commitments", [])}
    reworded = [c for r in records for c in r.get("closures", []) if c["action"] not in actions]
    closed_keys = {(i.owner_entity_id, i.counterparty_entity_id) for i in items if i.state == "closed"}
    assert any((c["owner_entity_id"], c["counterparty_entity_id"]) in closed_keys for c in reworded)
    listed = ledger.list_items(root, state="open", top=None)
    assert listed and all(i.state == "open" and i.facet != "archive" for i in listed)


def test_today_has_anticipated_events_and_a_briefing(sample):
    raw = [r for r in _records(sample) if r.get("source") == "anticipated"
           and r["target_date"] == TODAY.isoformat()]
    assert len(raw) >= 4
    for rec in raw:
        assert {"start", "end", "title", "participation", "location", "prep_notes"} <= set(rec)
    planned = activities.anticipated(sample, TODAY)
    assert planned and all(not r["cancelled"] and r["facet"] != "archive" for r in planned)
    assert [r["start"] for r in planned] == sorted(r["start"] for r in planned)

    path = sample / "chronicle" / TODAY.strftime("%Y%m%d") / "talents" / "morning_briefing.json"
    data = json.loads(path.read_text())
    assert set(data) == {"metadata", "your_day", "yesterday", "needs_attention", "forward_look", "reading"}
    assert all({"start", "end", "text"} <= set(item) for item in data["your_day"])
    b = briefing.load_briefing(sample, TODAY)
    assert b is not None and b.your_day and b.needs_attention and b.yesterday and b.forward_look
    assert briefing.highlights(b) and briefing.briefing_text(b)


def test_round_trip_through_the_readers(sample):
    assert config.agent_name(sample) == "sol"
    assert "self" in config.identity_files(sample)
    assert [f.slug for f in facets.all_facets(sample) if f.muted] == ["archive"]
    assert "archive" not in {f.slug for f in facets.enabled_facets(sample)}
    listed = days.list_days(sample)
    assert len(listed) == 14
    for day in listed:
        segs = days.day_segments(sample, day)
        assert segs and all(s.summary and s.duration_s == 300 for s in segs)
    people = entities.load_entities(sample)
    assert len(people) >= 12
    principal = [e for e in people.values() if e.is_principal]
    assert len(principal) == 1
    zoe = entities.get_entity(sample, "Zoë")
    assert zoe is not None and zoe.id == "zoe_martin"
    views = entities.facet_views(sample, "maya_chen")
    assert views and views[0].facet == "work" and views[0].observations


def test_refuses_a_foreign_non_empty_dir(tmp_path, capsys):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    with pytest.raises(SampleError, match="non-empty"):
        write_sample_journal(dest, days=2, today=TODAY)
    assert main(["journal", "sample", str(dest), "--days", "2", "--today", "2026-03-27"]) == 2
    assert "non-empty" in capsys.readouterr().err
    assert (dest / "notes.txt").read_text() == "keep me"


def test_replaces_a_previous_sample(tmp_path):
    dest = write_sample_journal(tmp_path / "j", days=6, today=TODAY)
    write_sample_journal(dest, days=2, today=TODAY)
    assert len(list((dest / "chronicle").iterdir())) == 2


def test_cli(tmp_path, capsys, pin_today):
    assert main(["journal", "sample", str(tmp_path / "a"), "--days", "3", "--today", "2026-03-27",
                 "--seed", "2"]) == 0
    assert "2026-03-27" in capsys.readouterr().out
    assert (tmp_path / "a" / "chronicle" / "20260327" / "talents" / "morning_briefing.json").is_file()
    pin_today("2025-12-31")
    assert main(["journal", "sample", str(tmp_path / "b"), "--days", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "b" / "chronicle").iterdir()) == ["20251230", "20251231"]
    assert main(["journal", "sample", str(tmp_path / "c"), "--today", "27/03/2026"]) == 2
    assert main(["journal", "sample", str(tmp_path / "c"), "--days", "0"]) == 2


def test_scale():
    assert Scale.for_days(14).people == 12 and Scale.for_days(14).segments == (4, 8)
    big = Scale.for_days(1000)
    assert big.people == 2000 and big.segments == (44, 56) and big.commitments == (8, 12)
