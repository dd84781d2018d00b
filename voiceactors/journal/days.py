"""Days and their segments: ``chronicle/YYYYMMDD/<stream>/HHMMSS_LEN/``.

A segment folder directly under the day folder belongs to stream ``default``
(or the stream its ``stream.json`` names). ``health/``, ``indexer/``,
``talents/``, dot-folders and loose files are not streams. Reading never
creates a folder: solstone's own path helper does, which is why this module
only ever lists and stats.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from voiceactors.journal.paths import (
    DAY_RE,
    SEGMENT_RE,
    STREAM_RE,
    check_day,
    inside,
    read_json,
)

NOT_STREAMS = frozenset({"health", "indexer", "talents"})
_AUDIO_EXT = (".flac", ".opus", ".ogg", ".m4a", ".wav", ".mp3")
_SCREEN_EXT = (".webm", ".mp4", ".mov")
#: Recordings: a segment's kinds come from their names; no surface reads their bytes.
RECORDING_SUFFIXES = frozenset(_AUDIO_EXT + _SCREEN_EXT)


@dataclass(frozen=True)
class Segment:
    id: str            # HHMMSS_LEN
    stream: str
    start: str         # HH:MM
    duration_s: int
    summary: str       # text of the segment's *summary.md files, "" when none
    kinds: tuple[str, ...]
    day: str = ""      # YYYYMMDD
    path: str = ""     # relative to the journal root


def chronicle_dir(root: Path) -> Path:
    return Path(root) / "chronicle"


def list_days(root: Path) -> list[str]:
    """Sorted ``YYYYMMDD`` names of the day folders."""
    folder = chronicle_dir(root)
    if not folder.is_dir():
        return []
    return sorted(e.name for e in os.scandir(folder) if DAY_RE.fullmatch(e.name) and e.is_dir())


def _kinds(folder: Path, names: list[str]) -> tuple[str, ...]:
    kinds: set[str] = set()
    for name in names:
        low = name.lower()
        if low.startswith("audio.") or low.endswith(_AUDIO_EXT):
            kinds.add("audio")
        elif low.startswith("screen.") or low.endswith(_SCREEN_EXT):
            kinds.add("screen")
        elif low.endswith(("_transcript.md", "_transcript.jsonl")):
            kinds.add("transcript")
        elif low == "chat.jsonl":
            kinds.add("chat")
    talents = folder / "talents"
    if "talents" in names and talents.is_dir() and any(talents.glob("*.md")):
        kinds.add("talents")
    return tuple(sorted(kinds))


def _summary(folder: Path, names: list[str]) -> str:
    paths = [folder / n for n in names if n.endswith("summary.md")]
    talents = folder / "talents"
    if "talents" in names and talents.is_dir():
        paths += sorted(talents.glob("*summary.md"))
    parts = []
    for path in sorted(paths):
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue
        if text:
            parts.append(text)
    return "\n\n".join(parts)


def _segment(root: Path, day: str, stream: str | None, folder: Path) -> Segment | None:
    match = SEGMENT_RE.fullmatch(folder.name)
    if match is None or not folder.is_dir():
        return None
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    if stream is None:  # directly under the day: "default" unless stream.json says otherwise
        meta = read_json(folder / "stream.json") if "stream.json" in names else None
        named = meta.get("stream") if isinstance(meta, dict) else None
        stream = named if isinstance(named, str) and STREAM_RE.fullmatch(named) else "default"
    hhmmss, length = match.groups()
    return Segment(
        id=folder.name,
        stream=stream,
        start=f"{hhmmss[:2]}:{hhmmss[2:4]}",
        duration_s=int(length),
        summary=_summary(folder, names),
        kinds=_kinds(folder, names),
        day=day,
        path=folder.relative_to(root).as_posix(),
    )


def day_segments(root: Path, day: str) -> list[Segment] | None:
    """The segments of ``day`` (``YYYYMMDD``) across all streams, sorted by
    start time then stream; None when the day folder does not exist.
    InvalidName for a malformed day."""
    root = Path(root)
    day = check_day(day)
    folder = inside(root, "chronicle", day)
    if not folder.is_dir():
        return None
    segments: list[Segment] = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name in NOT_STREAMS or entry.name.startswith(".") or not entry.is_dir():
            continue
        if SEGMENT_RE.fullmatch(entry.name):
            seg = _segment(root, day, None, Path(entry.path))
            if seg:
                segments.append(seg)
        elif STREAM_RE.fullmatch(entry.name):
            for sub in sorted(os.scandir(entry.path), key=lambda e: e.name):
                seg = _segment(root, day, entry.name, Path(sub.path))
                if seg:
                    segments.append(seg)
    segments.sort(key=lambda s: (s.id.split("_")[0], s.stream, s.duration_s))
    return segments


def day_summary(segments: list[Segment] | None) -> str:
    """The day's summary: the non-empty segment summaries in order, joined by
    blank lines ("" when there are none)."""
    return "\n\n".join(s.summary for s in segments or () if s.summary)
