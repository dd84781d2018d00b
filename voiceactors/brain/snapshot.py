"""The brain's context snapshot: what matters in the journal right now.

``gather(root, day)`` reads the journal surfaces once (blocking; async callers
use ``voiceactors.storage.run_sync``) into a ``ContextSnapshot``: the agent's
name and identity, the day's segments, the people who matter now, the open
commitments, the day's calendar and the morning briefing's highlights.

Each section is read on its own: a section whose surface fails is left empty
and named in ``snapshot.unavailable`` (and logged), so one corrupt file costs
one section, never the whole instruction. Text is flattened to plain spoken
phrases (no markdown) and bounded, because it ends up in a voice instruction.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from voiceactors.logs import get_logger

T = TypeVar("T")
_log = get_logger(actor="brain")

PEOPLE_WINDOW_DAYS = 7
MAX_SEGMENTS = 6
MAX_PEOPLE = 5
MAX_COMMITMENTS = 5
MAX_EVENTS = 6
MAX_HIGHLIGHTS = 3
MAX_IDENTITY_NOTES = 3
IDENTITY_FILES = ("self", "partner", "awareness")   # in the order they speak for the agent


@dataclass(frozen=True)
class SegmentNote:
    start: str          # HH:MM
    stream: str
    summary: str        # plain text, may be ""


@dataclass(frozen=True)
class Commitment:
    owner: str
    action: str
    counterparty: str
    when: str


@dataclass(frozen=True)
class Event:
    time: str           # HH:MM or ""
    title: str
    attendees: tuple[str, ...] = ()
    location: str = ""


@dataclass(frozen=True)
class ContextSnapshot:
    day: _dt.date
    agent_name: str = "sol"
    owner_name: str = ""
    owner_names: tuple[str, ...] = ()           # name, preferred and aliases (who "you" is)
    identity_notes: tuple[str, ...] = ()
    segment_count: int = 0
    segments: tuple[SegmentNote, ...] = ()       # the latest ones, in time order
    people: tuple[str, ...] = ()
    commitments: tuple[Commitment, ...] = ()
    calendar: tuple[Event, ...] = ()
    highlights: tuple[str, ...] = ()
    unavailable: tuple[str, ...] = field(default=())   # sections whose surface failed


# --- text helpers --------------------------------------------------------------

_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_MARKS = re.compile(r"[*_`#>|]+")
_SPACE = re.compile(r"\s+")


def plain(text: object, limit: int = 200) -> str:
    """``text`` as one plain line: markdown links become their label, marks
    and bullets go, whitespace collapses; cut at a sentence or word boundary
    to at most ``limit`` characters."""
    if not isinstance(text, str):
        return ""
    text = _LINK.sub(r"\1", text)
    lines = [re.sub(r"^\s*([-*+]|\d+\.)\s+", "", line) for line in text.splitlines()]
    text = _SPACE.sub(" ", _MARKS.sub("", " ".join(lines))).strip()
    if len(text) <= limit:
        return text
    cut = text[:limit]
    end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "))
    if end >= limit // 2:
        return cut[: end + 1]
    return cut.rsplit(" ", 1)[0].rstrip(",;:—- ") + "…"


def _hhmm(value: Any) -> str:
    if isinstance(value, str):
        parts = value.strip().split(":")
        if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]):
            return f"{int(parts[0]):02d}:{int(parts[1]):02d}"
    return ""


def _section(name: str, unavailable: list[str], read: Callable[[], T], empty: T) -> T:
    try:
        return read()
    except Exception as exc:  # one failing surface costs one section
        _log.warning("brain.context_section_failed", section=name, error=type(exc).__name__)
        unavailable.append(name)
        return empty


# --- sections ------------------------------------------------------------------

def _identity(root: Path) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(agent name, owner names with the preferred one first, identity notes)."""
    from voiceactors.journal import config as jconfig

    ident = jconfig.identity(root)
    aliases = ident.get("aliases")
    if not isinstance(aliases, list):
        aliases = []
    names: list[str] = []
    for value in (ident.get("preferred"), ident.get("name"), *aliases):
        if isinstance(value, str) and value.strip() and value.strip() not in names:
            names.append(value.strip())
    files = jconfig.identity_files(root)
    notes: list[str] = []
    for name in IDENTITY_FILES:
        note = _identity_note(files.get(name, ""))
        if note:
            notes.append(note)
    return jconfig.agent_name(root), tuple(names), tuple(notes[:MAX_IDENTITY_NOTES])


def _identity_note(text: str) -> str:
    """The first substantive paragraph of an identity file: not front matter,
    a heading, a ``[placeholder]``, "not yet ..." or a command example."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":   # front matter
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), len(lines) - 1)
        lines = lines[end + 1:]
    paragraph: list[str] = []
    for raw in lines + [""]:
        line = raw.strip()
        skip = (line.startswith(("#", "[", "-", "*", ">", "|")) or "`" in line
                or line.lower().startswith(("not yet", "none yet")))
        if line and not skip:
            paragraph.append(line)
        elif paragraph:
            return plain(" ".join(paragraph), 240)
    return ""


def _segments(root: Path, day: _dt.date) -> tuple[int, tuple[SegmentNote, ...]]:
    from voiceactors.journal import days

    segments = days.day_segments(root, day.strftime("%Y%m%d")) or []
    latest = segments[-MAX_SEGMENTS:]
    notes = tuple(SegmentNote(s.start, s.stream, plain(s.summary, 220)) for s in latest)
    return len(segments), notes


def _recent_records(root: Path, day: _dt.date) -> list[dict[str, Any]]:
    from voiceactors.journal import activities, facets

    out: list[dict[str, Any]] = []
    window = [(day - _dt.timedelta(days=n)).strftime("%Y%m%d") for n in range(PEOPLE_WINDOW_DAYS)]
    for facet in facets.enabled_facets(root):
        have = set(activities.activity_days(root, facet.slug))
        for d in window:
            if d in have:
                out.extend(r for r in activities.load_records(root, facet.slug, d)
                           if not r.get("hidden") and r.get("source") != "anticipated")
    return out


def _people(root: Path, day: _dt.date, calendar_records: list[dict[str, Any]],
            exclude: set[str]) -> tuple[str, ...]:
    """Who matters now, by weight: today's calendar attendees (3), recent
    attendees (2), recent mentions and active entities (1)."""
    from voiceactors.journal import entities

    known = entities.load_entities(root)
    principals = {e.id for e in known.values() if e.is_principal}
    scores: Counter[str] = Counter()

    def add(name: Any, entity_id: Any, weight: int) -> None:
        if isinstance(entity_id, str) and entity_id in principals:
            return
        if isinstance(entity_id, str) and entity_id in known:
            name = known[entity_id].name
        if isinstance(name, str) and name.strip() and name.strip().casefold() not in exclude:
            scores[name.strip()] += weight

    for rec in calendar_records:
        for p in rec.get("participation") or ():
            if isinstance(p, dict):
                add(p.get("name"), p.get("entity_id"), 3)
    for rec in _recent_records(root, day):
        for p in rec.get("participation") or ():
            if isinstance(p, dict):
                add(p.get("name"), p.get("entity_id"), 2 if p.get("role") == "attendee" else 1)
        for entity_id in rec.get("active_entities") or ():
            if isinstance(entity_id, str) and entity_id in known:
                add(None, entity_id, 1)
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    return tuple(name for name, _ in ranked[:MAX_PEOPLE])


def _commitments(root: Path) -> tuple[Commitment, ...]:
    from voiceactors.journal import ledger

    items = ledger.list_items(root, state="open", top=MAX_COMMITMENTS)
    return tuple(
        Commitment(plain(i.owner, 60), plain(i.action, 160), plain(i.counterparty, 60), plain(i.when, 60))
        for i in items[:MAX_COMMITMENTS]
    )


def _calendar(root: Path, day: _dt.date) -> list[dict[str, Any]]:
    from voiceactors.journal import activities

    return activities.anticipated(root, day)


def _events(records: list[dict[str, Any]]) -> tuple[Event, ...]:
    out = []
    for rec in records[:MAX_EVENTS]:
        attendees = tuple(
            plain(p.get("name"), 60) for p in rec.get("participation") or ()
            if isinstance(p, dict) and p.get("role", "attendee") == "attendee" and plain(p.get("name"), 60)
        )
        title = plain(rec.get("title") or rec.get("activity"), 120)
        attendees = tuple(a for a in attendees if a.casefold() not in title.casefold())
        out.append(Event(_hhmm(rec.get("start")), title, attendees[:4], plain(rec.get("location"), 80)))
    return tuple(out)


def _highlights(root: Path, day: _dt.date) -> tuple[str, ...]:
    from voiceactors.journal import briefing

    loaded = briefing.load_briefing(root, day)
    if loaded is None:
        return ()
    return tuple(h for h in (plain(x, 200) for x in briefing.highlights(loaded)) if h)[:MAX_HIGHLIGHTS]


def gather(root: Path, day: _dt.date) -> ContextSnapshot:
    """Read the snapshot of ``root`` as of ``day`` (blocking, read-only)."""
    root = Path(root)
    unavailable: list[str] = []
    # the empties and targets are annotated so mypy solves each section's T
    # from the reader, not from a literal like ``()``
    no_identity: tuple[str, tuple[str, ...], tuple[str, ...]] = ("sol", (), ())
    no_segments: tuple[int, tuple[SegmentNote, ...]] = (0, ())
    agent, owners, notes = _section("identity", unavailable, lambda: _identity(root), no_identity)
    count, segments = _section("segments", unavailable, lambda: _segments(root, day), no_segments)
    calendar_records: list[dict[str, Any]] = _section(
        "calendar", unavailable, lambda: _calendar(root, day), [])
    exclude = {agent.casefold(), *(n.casefold() for n in owners)}
    people: tuple[str, ...] = _section(
        "people", unavailable, lambda: _people(root, day, calendar_records, exclude), ())
    commitments: tuple[Commitment, ...] = _section(
        "commitments", unavailable, lambda: _commitments(root), ())
    highlights: tuple[str, ...] = _section("briefing", unavailable, lambda: _highlights(root, day), ())
    return ContextSnapshot(
        day=day, agent_name=agent, owner_name=owners[0] if owners else "", owner_names=owners,
        identity_notes=notes,
        segment_count=count, segments=segments, people=people, commitments=commitments,
        calendar=_events(calendar_records), highlights=highlights, unavailable=tuple(unavailable),
    )


def spoken_day(day: _dt.date) -> str:
    """``Friday, March 27, 2026``."""
    return f"{day.strftime('%A')}, {day.strftime('%B')} {day.day}, {day.year}"


def render_text(snap: ContextSnapshot) -> str:
    """The snapshot as plain labelled lines, for a text model to read."""
    lines = [f"Today: {spoken_day(snap.day)} ({snap.day.isoformat()})",
             f"Agent name: {snap.agent_name}"]
    if snap.owner_name:
        lines.append(f"Journal owner: {snap.owner_name}")
    lines += [f"Identity note: {n}" for n in snap.identity_notes]
    lines.append(f"Segments recorded today: {snap.segment_count}")
    lines += [f"Segment {s.start} ({s.stream}): {s.summary or 'no summary'}" for s in snap.segments]
    lines.append("People who matter now: " + (", ".join(snap.people) or "none found"))
    if not snap.commitments:
        lines.append("Open commitments: none found")
    for c in snap.commitments:
        extra = f", due {c.when}" if c.when else ""
        lines.append(f"Open commitment: {c.owner or 'someone'} to {c.action}"
                     f"{' for ' + c.counterparty if c.counterparty else ''}{extra}")
    if not snap.calendar:
        lines.append("Calendar today: nothing scheduled")
    for e in snap.calendar:
        who = f" with {', '.join(e.attendees)}" if e.attendees else ""
        where = f" at {e.location}" if e.location else ""
        lines.append(f"Calendar: {e.time or 'unscheduled'} {e.title}{who}{where}")
    if not snap.highlights:
        lines.append("Morning briefing: none today")
    lines += [f"Briefing highlight: {h}" for h in snap.highlights]
    if snap.unavailable:
        lines.append("Could not read: " + ", ".join(snap.unavailable))
    return "\n".join(lines)
