"""A unit's text, split into the chunks the index stores.

JSON and JSONL files are read through the journal's one reader pair
(``paths.read_json`` / ``paths.read_jsonl``): missing reads as nothing,
corrupt is skipped and logged (one line per JSONL file, with the count).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voiceactors import safe_text
from voiceactors.journal.index.discovery import Unit
from voiceactors.journal.paths import read_json, read_jsonl

CHUNK_CHARS = 2000                  # split long text at paragraph boundaries
_AGENT = {"activities": "activity", "events": "event", "todos": "todo", "news": "news"}


@dataclass(frozen=True)
class Chunk:
    content: str
    day: str
    facet: str
    agent: str
    stream: str
    time_bucket: str


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json(path)
    return data if isinstance(data, dict) else {}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path, log_each_skipped=False)


def split_text(text: str, limit: int = CHUNK_CHARS) -> list[str]:
    """Split text at blank lines into pieces of at most ~``limit`` characters."""
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    pieces, current = [], ""
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para:
            continue
        if current and len(current) + len(para) + 2 > limit:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
        while len(current) > limit:   # one huge paragraph: hard split
            pieces.append(current[:limit])
            current = current[limit:]
    if current:
        pieces.append(current)
    return pieces


def _lines(*parts: object) -> str:
    return "\n".join(str(p).strip() for p in parts if isinstance(p, str) and p.strip())


def _activity_text(rec: dict[str, Any]) -> str:
    story = rec.get("story")
    body = story.get("body") if isinstance(story, dict) else None
    return _lines(rec.get("title"), rec.get("description"), rec.get("details"), body)


def _event_text(rec: dict[str, Any]) -> str:
    people = rec.get("participants")
    people = ", ".join(p for p in people if isinstance(p, str)) if isinstance(people, list) else ""
    return _lines(rec.get("title"), rec.get("summary"), rec.get("details"), people)


def _entity_text(unit: Unit) -> str:
    ident = _read_json(unit.primary) if unit.primary else {}
    entity_id = unit.key.split(":", 1)[1]
    name = ident.get("name") if isinstance(ident.get("name"), str) else entity_id.replace("_", " ")
    parts = [name, _lines(ident.get("type"))]
    aka = ident.get("aka")
    if isinstance(aka, list) and aka:
        parts.append("also known as " + ", ".join(a for a in aka if isinstance(a, str)))
    for path in unit.files:
        if path == unit.primary:
            continue
        if path.name == "entity.json":
            parts.append(_lines(_read_json(path).get("description")))
        elif path.name == "observations.jsonl":
            parts.extend(_lines(o.get("content")) for o in _read_jsonl(path))
    return "\n".join(p for p in parts if p)


def _time_bucket(value: object) -> str:
    """The hour ("HH") of an ``HH:MM[:SS]`` or ``HHMMSS`` value, else ""."""
    text = value if isinstance(value, str) else ""
    return text[:2] if re.match(r"^\d{2}(:?\d{2})", text) else ""


def extract(unit: Unit) -> list[Chunk]:
    """The chunks of one unit, in ``idx`` order."""
    if unit.kind == "segment":
        text = "\n\n".join(_read_text(p).strip() for p in unit.files)
        bucket = _time_bucket(unit.key.rsplit("/", 1)[-1])
        return [Chunk(t, unit.day, "", "segment", unit.stream, bucket) for t in split_text(text)]
    if unit.kind == "day_talent":
        agent = safe_text.clean_str(unit.files[0].stem)      # a file name: U+FFFD for undecodable bytes
        return [Chunk(t, unit.day, "", agent, "", "") for t in split_text(_read_text(unit.files[0]))]
    if unit.kind == "entity":
        return [Chunk(t, "", "", "entity", "", "") for t in split_text(_entity_text(unit))]
    if unit.kind == "news":
        return [Chunk(t, unit.day, unit.facet, "news", "", "")
                for t in split_text(_read_text(unit.files[0]))]
    chunks = []
    for rec in _read_jsonl(unit.files[0]):
        if unit.kind == "activities":
            if rec.get("hidden") is True:
                continue
            text = _activity_text(rec)
        elif unit.kind == "events":
            text = _event_text(rec)
        else:
            text = _lines(rec.get("text"))
        for piece in split_text(text):
            chunks.append(Chunk(piece, unit.day, unit.facet, _AGENT[unit.kind], "",
                                _time_bucket(rec.get("start"))))
    return chunks
