"""``clock.today()``: the one seam for the calendar date."""

from __future__ import annotations

import datetime as dt

import pytest

from voiceactors import clock


def test_today_follows_voiceactors_today_as_it_changes(monkeypatch):
    """Its parse is remembered per text, never per process: a new value
    applies at the next call, and a bad one is refused each time."""
    clock.pin(None)
    monkeypatch.setenv("VOICEACTORS_TODAY", "2026-03-04")
    assert clock.today() == dt.date(2026, 3, 4)
    assert clock.today() == dt.date(2026, 3, 4)
    monkeypatch.setenv("VOICEACTORS_TODAY", " 20260305 ")
    assert clock.today() == dt.date(2026, 3, 5)
    monkeypatch.setenv("VOICEACTORS_TODAY", "2026-02-30")
    for _ in range(2):
        with pytest.raises(ValueError, match="not a day"):
            clock.today()
    monkeypatch.delenv("VOICEACTORS_TODAY")
    assert clock.today() == dt.date.today()


def test_a_pinned_day_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv("VOICEACTORS_TODAY", "2026-03-04")
    clock.pin("2026-01-02")
    try:
        assert clock.today() == dt.date(2026, 1, 2)
    finally:
        clock.pin(None)
    assert clock.today() == dt.date(2026, 3, 4)
