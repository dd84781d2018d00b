"""entities.get and entities.recent_with on the fixture journal and the sample journal."""

from __future__ import annotations

import json

import pytest

from voiceactors import storage
from voiceactors.tools import REGISTRY, ToolContext

get = REGISTRY["entities.get"].handler
recent_with = REGISTRY["entities.recent_with"].handler


@pytest.fixture
def ctx(fixture_journal, tmp_path):
    return ToolContext(fixture_journal, tmp_path / "state")


def test_get(ctx):
    out = get(ctx, {"entity_slug": "juliet_capulet"})
    assert (out["slug"], out["name"], out["type"]) == ("juliet_capulet", "Juliet Capulet", "Person")
    assert set(out["tags"]) == {"capulet", "montague", "verona"}
    profile = out["profile"]
    assert "Lead software architect at Capulet Industries." in profile   # the capulet facet's description
    assert "Co-lead of the Verona Platform joint venture" in profile
    assert "most recently on 2026-03-10" in profile
    assert "Commitments: 0 open, 0 closed." in profile
    dates = [c["date"] for c in out["recent_context"]]
    assert dates == sorted(dates, reverse=True) and dates[0] == "2026-03-10"
    assert {"date": "2026-03-10", "summary": "Named co-lead of Verona Platform joint venture"} in out["recent_context"]
    assert 0 < len(out["recent_context"]) <= 5
    assert out["_nav_target"] == "entity/juliet_capulet"


def test_get_by_name(ctx):
    out = get(ctx, {"entity_slug": "  juliet CAPULET "})
    assert out["slug"] == "juliet_capulet"


def test_get_not_found(ctx):
    assert get(ctx, {"entity_slug": "nobody_here"}) == {"error": "not found"}
    assert get(ctx, {"entity_slug": "../entities/juliet_capulet"}) == {"error": "not found"}


def test_recent_with_active_entities(ctx, pin_today):
    pin_today("2026-03-10")
    out = recent_with(ctx, {"entity_slug": "juliet_capulet", "days": 7})
    assert out["slug"] == "juliet_capulet"
    assert out["count"] == len(out["interactions"]) == 6
    assert [i["date"] for i in out["interactions"]] == sorted((i["date"] for i in out["interactions"]), reverse=True)
    assert out["interactions"][0]["activity"] in {"meeting", "design_review"}
    assert {"date": "2026-03-06", "activity": "engineering",
            "context": "End-to-end Verona Platform integration", "note": ""} in out["interactions"]
    narrow = recent_with(ctx, {"entity_slug": "juliet_capulet", "days": 2, "facet": "verona"})
    assert [i["date"] for i in narrow["interactions"]] == ["2026-03-09"]


def _records(root, facet, day, rows):
    storage.atomic_write(root / "facets" / facet / "activities" / f"{day}.jsonl",
                         "".join(json.dumps(r) + "\n" for r in rows))


def test_recent_with_participation(fixture_copy, tmp_path, pin_today):
    pin_today("2026-03-27")
    base = {"activity": "call", "segments": [], "details": "", "active_entities": []}
    _records(fixture_copy, "verona", "20260326", [
        {**base, "id": "call_090000_300", "description": "By id", "created_at": 1774512000000,
         "participation": [{"name": "J.", "role": "attendee", "entity_id": "juliet_capulet"}]},
        {**base, "id": "call_100000_300", "description": "By name, older row", "created_at": 1774515600000,
         "details": "talked budgets", "participation": [{"name": "juliet capulet", "role": "mentioned"}]},
        {**base, "id": "call_110000_300", "description": "Another Juliet", "created_at": 1774519200000,
         "participation": [{"name": "Juliet Capulet", "role": "attendee", "entity_id": "someone_else"}]},
        {**base, "id": "call_120000_300", "description": "Planned", "created_at": 1774522800000,
         "source": "anticipated", "participation": [{"name": "Juliet", "entity_id": "juliet_capulet"}]},
        {**base, "id": "call_130000_300", "description": "Storied", "created_at": 1774526400000,
         "story": {"body": "Juliet walked through the integration plan."},
         "participation": [{"name": "x", "entity_id": "juliet_capulet"}]},
    ])
    out = recent_with(ToolContext(fixture_copy, tmp_path / "s"), {"entity_slug": "Juliet Capulet"})
    assert [i["context"] for i in out["interactions"]] == [
        "Juliet walked through the integration plan.", "By name, older row", "By id"]
    assert out["interactions"][1] == {"date": "2026-03-26", "activity": "call",
                                      "context": "By name, older row", "note": "talked budgets"}


def test_recent_with_failures(ctx):
    assert recent_with(ctx, {"entity_slug": "nobody_here"}) == {"error": "not found"}
    assert recent_with(ctx, {"entity_slug": "juliet_capulet", "days": 0}) == {"error": "invalid days"}
    assert recent_with(ctx, {"entity_slug": "juliet_capulet", "days": 400}) == {"error": "invalid days"}


@pytest.fixture
def sample(sample_ctx):
    return sample_ctx


def test_sample_journal(sample):
    person = get(sample, {"entity_slug": "Maya Chen"})
    assert person["slug"] == "maya_chen" and "work" in person["tags"]
    assert "open" in person["profile"] and person["recent_context"]
    seen = recent_with(sample, {"entity_slug": "maya_chen", "days": 14})
    assert seen["count"] > 0
    assert all("2026-03-13" <= i["date"] <= "2026-03-27" for i in seen["interactions"])


def test_recent_with_window_edges(fixture_copy, tmp_path, pin_today):
    """``days: 3`` on 2026-03-27 covers the day files 2026-03-24 .. 2026-03-27."""
    pin_today("2026-03-27")
    for n, day in enumerate(("20260323", "20260324", "20260327", "20260328")):
        _records(fixture_copy, "verona", day, [
            {"id": f"call_{day}", "activity": "call", "description": f"On {day}", "created_at": 1774000000000 + n,
             "participation": [{"name": "J.", "entity_id": "juliet_capulet"}]}])
    out = recent_with(ToolContext(fixture_copy, tmp_path / "s"), {"entity_slug": "juliet_capulet", "days": 3})
    assert [i["date"] for i in out["interactions"]] == ["2026-03-27", "2026-03-24"]
