"""journal.get_day and journal.search on the fixture journal and the sample journal."""

from __future__ import annotations


import pytest

from voiceactors.tools import REGISTRY, ToolContext

get_day = REGISTRY["journal.get_day"].handler
search = REGISTRY["journal.search"].handler


@pytest.fixture
def ctx(fixture_journal, tmp_path):
    return ToolContext(fixture_journal, tmp_path / "state")


def test_get_day(ctx):
    out = get_day(ctx, {"day": "2026-03-04"})
    assert out["day"] == "2026-03-04"
    assert [s["id"] for s in out["segments"]] == ["090000_300", "140000_300", "180000_300"]
    assert out["segments"][0] == {"id": "090000_300", "time_of_day": "09:00", "duration_s": 300,
                                  "summary": "", "agent_type": "default"}
    assert out["summary"] == ""
    assert out["_nav_target"] == "today/journal/2026-03-04"


def test_get_day_stream_and_summary(fixture_copy, tmp_path):
    seg = fixture_copy / "chronicle" / "20260304" / "import.ics" / "120000_1800"
    seg.mkdir(parents=True)
    (seg / "summary.md").write_text("Imported calendar block.\n")
    out = get_day(ToolContext(fixture_copy, tmp_path / "s"), {"day": "2026-03-04"})
    row = next(s for s in out["segments"] if s["id"] == "120000_1800")
    assert row["agent_type"] == "import.ics" and row["duration_s"] == 1800
    assert row["summary"] == "Imported calendar block."
    assert out["summary"] == "Imported calendar block."


def test_get_day_failures(ctx, fixture_journal):
    assert get_day(ctx, {"day": "2026-03-01"}) == {"error": "day not found"}
    assert get_day(ctx, {"day": "2026-13-01"}) == {"error": "invalid day"}
    assert not (fixture_journal / "chronicle" / "20260301").exists()   # reading never creates


def test_search(ctx, pin_today):
    pin_today("2026-03-27")
    out = search(ctx, {"query": "Verona Platform", "limit": 5})
    assert 0 < out["count"] == len(out["results"]) <= 5
    for row in out["results"]:
        assert set(row) <= {"id", "day", "source", "snippet", "entity_slug"}
        assert "verona" in row["snippet"].lower()
    assert out["_nav_target"] == "today/search?q=Verona+Platform"
    # days: only hits from today - days onwards
    recent = search(ctx, {"query": "Verona", "days": 20, "limit": 50})
    assert recent["count"] > 0
    assert all(r["day"] >= "2026-03-07" for r in recent["results"])
    everything = search(ctx, {"query": "Verona", "limit": 50})
    assert everything["count"] > recent["count"]


def test_search_failures(ctx):
    assert search(ctx, {"query": "???"}) == {"error": "query is required"}
    assert search(ctx, {"query": "  "}) == {"error": "query is required"}
    assert search(ctx, {"query": "zzzqqqnothing"}) == {"results": [], "count": 0,
                                                       "_nav_target": "today/search?q=zzzqqqnothing"}


@pytest.fixture
def sample(sample_ctx):
    return sample_ctx


def test_sample_journal(sample):
    day = get_day(sample, {"day": "2026-03-26"})
    assert day["segments"] and day["summary"]
    assert all(s["summary"] for s in day["segments"])
    hits = search(sample, {"query": "pipeline", "days": 14})
    assert hits["count"] > 0 and all(r["day"] >= "2026-03-13" for r in hits["results"] if r["day"])
