"""``calendar.today``, ``briefing.get`` and ``observer.start_listening``."""

from __future__ import annotations

import re
from typing import Any

from voiceactors.journal import activities, briefing
from voiceactors.logs import get_logger
from voiceactors.tools.handler_context import ToolContext

_log = get_logger(actor="tools")
_TIME = re.compile(r"^(\d{1,2}):(\d{2})(?::\d{2})?$")

OBSERVER_NOTE = "passed to the observer; capture starts when the user's observer picks it up"


def _time(value: Any) -> str:
    match = _TIME.fullmatch(value.strip()) if isinstance(value, str) else None
    return f"{int(match.group(1)):02d}:{match.group(2)}" if match else ""


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _attendees(record: dict[str, Any]) -> list[str]:
    """Participation names, attendees before the merely mentioned, no repeats."""
    parts = [p for p in record.get("participation") or () if isinstance(p, dict) and _str(p.get("name"))]
    parts.sort(key=lambda p: p.get("role") != "attendee")   # stable: keeps file order within a role
    names: list[str] = []
    for part in parts:
        name = _str(part["name"])
        if name.casefold() not in {n.casefold() for n in names}:
            names.append(name)
    return names


def _event(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "time": _time(record.get("start")),
        "title": _str(record.get("title")) or _str(record.get("description")) or _str(record.get("activity")),
        "attendees": _attendees(record),
        "location": _str(record.get("location")),
        "prep_notes": _str(record.get("prep_notes")),
    }


def calendar_today(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Today's anticipated events, by start time (untimed last)."""
    today = ctx.today()
    try:
        events = [_event(r) for r in activities.anticipated(ctx.journal, today)]
    except Exception:  # the design: only unexpected failures answer "today unavailable"
        _log.warning("tool.calendar_today_failed", exc_info=True)
        return {"error": "today unavailable"}
    return {"date": today.isoformat(), "events": events, "_nav_target": "today"}


def briefing_get(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Today's morning briefing as spoken text and highlights."""
    today = ctx.today()
    found = briefing.load_briefing(ctx.journal, today)
    if found is None:
        return {"error": "no briefing today yet"}
    return {
        "date": today.isoformat(),
        "facet": "identity",            # the design's fixed spoken-context label
        "text": briefing.briefing_text(found),
        "highlights": briefing.highlights(found),
        "_nav_target": "today",
    }


def start_listening(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Queue a start request for the user's observer (delivered to the call's
    client as an observer action); nothing is recorded here."""
    mode = args.get("mode")
    if mode not in ("meeting", "voice_memo"):
        return {"error": "invalid mode"}
    _log.info("tool.observer_start_requested", mode=mode)
    return {
        "status": "requested",
        "mode": mode,
        "note": OBSERVER_NOTE,
        "_observer_action": {"type": "start_observer", "mode": mode},
    }
