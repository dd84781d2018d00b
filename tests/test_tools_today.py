"""calendar.today, briefing.get and observer.start_listening."""

from __future__ import annotations

import datetime as _dt
import json
import shutil

import pytest

from voiceactors import storage
from voiceactors.tools import REGISTRY, ToolContext

calendar_today = REGISTRY["calendar.today"].handler
briefing_get = REGISTRY["briefing.get"].handler
start_listening = REGISTRY["observer.start_listening"].handler


@pytest.fixture
def ctx(fixture_journal, tmp_path):
    return ToolContext(fixture_journal, tmp_path / "state")


def test_calendar_today(ctx, pin_today):
    pin_today("2026-04-22")
    out = calendar_today(ctx, {})
    assert out["date"] == "2026-04-22" and out["_nav_target"] == "today"
    assert [(e["time"], e["title"]) for e in out["events"]] == [
        ("09:00", "Morning planning meeting"), ("14:00", "Partner call"), ("17:00", "Proposal deadline"),
        ("", "Afternoon appointment"), ("", "Unknown planned item")]
    assert out["events"][0] == {"time": "09:00", "title": "Morning planning meeting", "attendees": [],
                                "location": "", "prep_notes": ""}


def test_calendar_attendees_location_prep(fixture_copy, tmp_path, pin_today):
    pin_today("2026-03-27")
    row = {"id": "anticipated_meeting_101500_0327", "activity": "meeting", "target_date": "2026-03-27",
           "start": "10:15", "title": "Roadmap sync", "source": "anticipated", "cancelled": False,
           "location": "Room 4", "prep_notes": "Bring numbers",
           "participation": [{"name": "Nurse Angela", "role": "mentioned"},
                             {"name": "Juliet Capulet", "role": "attendee"},
                             {"name": "juliet capulet", "role": "attendee"},
                             {"name": "Romeo Montague", "role": "attendee"}]}
    cancelled = {**row, "id": "anticipated_x", "title": "Cancelled", "cancelled": True}
    storage.atomic_write(fixture_copy / "facets" / "verona" / "activities" / "20260326.jsonl",
                         json.dumps(row) + "\n" + json.dumps(cancelled) + "\n")
    out = calendar_today(ToolContext(fixture_copy, tmp_path / "s"), {})
    assert out["events"] == [{"time": "10:15", "title": "Roadmap sync",
                              "attendees": ["Juliet Capulet", "Romeo Montague", "Nurse Angela"],
                              "location": "Room 4", "prep_notes": "Bring numbers"}]


def test_calendar_empty_day(ctx, pin_today):
    pin_today("2026-03-27")
    assert calendar_today(ctx, {}) == {"date": "2026-03-27", "events": [], "_nav_target": "today"}


def test_calendar_unexpected_failure(fixture_copy, tmp_path, pin_today):
    pin_today("2026-04-22")
    activities = fixture_copy / "facets" / "verona" / "activities"
    shutil.rmtree(activities)
    activities.symlink_to(activities)        # a symlink loop: reading it fails unexpectedly
    assert calendar_today(ToolContext(fixture_copy, tmp_path / "s"), {}) == {"error": "today unavailable"}


def test_briefing(ctx, pin_today):
    pin_today("2026-03-27")
    out = briefing_get(ctx, {})
    assert out["date"] == "2026-03-27" and out["facet"] == "identity" and out["_nav_target"] == "today"
    assert out["text"].startswith("Your day:\n09:00: Sync with Sarah Chen")
    assert "sol://" not in out["text"] and "](" not in out["text"]
    assert len(out["highlights"]) == 3
    assert out["highlights"][0].startswith("Follow up with investors on the Series A term sheet")


def test_briefing_missing(ctx, pin_today):
    pin_today("2026-03-28")
    assert briefing_get(ctx, {}) == {"error": "no briefing today yet"}


def test_start_listening(ctx):
    out = start_listening(ctx, {"mode": "voice_memo"})
    assert out["status"] == "requested" and out["mode"] == "voice_memo" and out["note"]
    assert out["_observer_action"] == {"type": "start_observer", "mode": "voice_memo"}


def test_start_listening_invalid(ctx):
    assert start_listening(ctx, {"mode": "dictation"}) == {"error": "invalid mode"}
    assert start_listening(ctx, {}) == {"error": "invalid mode"}


@pytest.fixture
def sample(sample_ctx):
    return sample_ctx


def test_sample_journal(sample):
    cal = calendar_today(sample, {})
    assert cal["date"] == "2026-03-27" and cal["events"]
    assert cal["events"][0]["time"] <= cal["events"][-1]["time"] or not cal["events"][-1]["time"]
    assert any(e["attendees"] for e in cal["events"])
    brief = briefing_get(sample, {})
    assert brief["text"] and brief["highlights"]
    tomorrow = ToolContext(sample.journal, sample.state_dir, today=lambda: _dt.date(2026, 3, 28))
    assert briefing_get(tomorrow, {}) == {"error": "no briefing today yet"}
