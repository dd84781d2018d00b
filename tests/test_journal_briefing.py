"""The morning briefing and its spoken forms."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from structlog.testing import capture_logs

from voiceactors.journal import briefing

DAY = dt.date(2026, 4, 2)


def write_briefing(root: Path, data, day: str = "20260402") -> Path:
    path = root / "chronicle" / day / "talents" / "morning_briefing.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_fixture_briefing(fixture_journal):
    b = briefing.load_briefing(fixture_journal, dt.date(2026, 3, 27))
    assert b.day == dt.date(2026, 3, 27)
    assert b.your_day[0]["start"] == "09:00" and b.your_day[3]["start"] == ""
    assert len(b.yesterday) == 3 and len(b.needs_attention) == 3 and len(b.forward_look) == 3
    assert b.reading[0] == {"facet": "work", "summary": "Product analytics show a 15% increase in daily active users this week"}
    assert b.metadata["sources"]["segments"] == 14
    text = briefing.briefing_text(b)
    assert "sol://" not in text and "](" not in text and "**" not in text
    assert "(from your March standup)" in text
    assert "Monday — All-hands presentation" in text
    hl = briefing.highlights(b)
    assert hl[0] == ("Follow up with investors on the Series A term sheet — response was due yesterday "
                     "(committed March 20)")
    assert len(hl) == 3


def test_missing_briefing_is_none(fixture_journal, tmp_path):
    assert briefing.load_briefing(fixture_journal, dt.date(2026, 3, 28)) is None
    assert briefing.load_briefing(tmp_path, DAY) is None
    assert list(tmp_path.iterdir()) == []


def test_corrupt_briefing_is_none_and_logged(tmp_path):
    write_briefing(tmp_path, "{ not json")
    with capture_logs() as logs:
        assert briefing.load_briefing(tmp_path, DAY) is None
    assert any(e["event"] == "journal.json_corrupt" for e in logs)
    write_briefing(tmp_path, "[]")
    assert briefing.load_briefing(tmp_path, DAY) is None


def test_older_time_field_and_string_items(tmp_path):
    write_briefing(tmp_path, {
        "your_day": [{"time": "08:15", "text": "Gym"}, {"start": "10:00", "end": "11:00", "text": "**Board** call"},
                     "Pick up the kids", {"time": "12:00"}],
        "needs_attention": ["Pay the [invoice](sol://x)"],
    })
    b = briefing.load_briefing(tmp_path, "20260402")
    assert b.day == DAY
    assert b.your_day == [
        {"start": "08:15", "end": "", "text": "Gym"},
        {"start": "10:00", "end": "11:00", "text": "**Board** call"},
        {"start": "", "end": "", "text": "Pick up the kids"},
    ]
    assert b.needs_attention == [{"text": "Pay the [invoice](sol://x)", "source_id": ""}]
    assert briefing.briefing_text(b) == (
        "Your day:\n08:15: Gym\n10:00 to 11:00: Board call\nPick up the kids\n\n"
        "Needs attention:\nPay the invoice")
    assert briefing.highlights(b) == ["Pay the invoice"]


def test_highlights_fall_back_to_first_three_bullets(tmp_path):
    write_briefing(tmp_path, {
        "your_day": [{"start": "09:00", "end": "09:30", "text": "Standup with [Ana](sol://e/ana)"}],
        "yesterday": ["Shipped **v2**", "Fixed the build"],
        "needs_attention": [],
        "forward_look": ["Offsite on Friday"],
    })
    b = briefing.load_briefing(tmp_path, DAY)
    assert briefing.highlights(b) == ["09:00 to 09:30: Standup with Ana", "Shipped v2", "Fixed the build"]


def test_empty_briefing(tmp_path):
    write_briefing(tmp_path, {})
    b = briefing.load_briefing(tmp_path, DAY)
    assert briefing.briefing_text(b) == "" and briefing.highlights(b) == []


def test_clean():
    assert briefing.clean("see [the doc](https://x.y/z) and **this**  now") == "see the doc and this now"
