"""The morning briefing: ``chronicle/<YYYYMMDD>/talents/morning_briefing.json``.

Sections: ``your_day[{start, end, text}]`` (older files: ``{time, text}``),
``yesterday[str]``, ``needs_attention[{text, source_id}]``, ``forward_look[str]``,
``reading[{facet, summary}]`` and ``metadata{...}``. A missing file is "no
briefing yet" (None); a corrupt one is logged and also None. Texts carry
markdown links to ``sol://`` sources; the spoken forms strip them to labels.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voiceactors.journal.paths import check_day, inside, read_json
from voiceactors.logs import get_logger

_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_log = get_logger(actor="journal")


@dataclass(frozen=True)
class Briefing:
    day: _dt.date
    your_day: list[dict[str, str]] = field(default_factory=list)        # {start, end, text}
    yesterday: list[str] = field(default_factory=list)
    needs_attention: list[dict[str, str]] = field(default_factory=list)  # {text, source_id}
    forward_look: list[str] = field(default_factory=list)
    reading: list[dict[str, str]] = field(default_factory=list)          # {facet, summary}
    metadata: dict[str, Any] = field(default_factory=dict)


def clean(text: str) -> str:
    """Spoken plain text: ``[label](url)`` → ``label``, ``**`` removed,
    whitespace collapsed."""
    text = _LINK.sub(r"\1", text).replace("**", "")
    return " ".join(text.split())


def _s(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _strings(value: Any) -> list[str]:
    return [s for s in (_s(v) for v in value or () if isinstance(v, str)) if s] if isinstance(value, list) else []


def _your_day(value: Any) -> list[dict[str, str]]:
    out = []
    for item in value if isinstance(value, list) else ():
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or not _s(item.get("text")):
            continue
        start = _s(item.get("start")) or _s(item.get("time"))
        out.append({"start": start, "end": _s(item.get("end")), "text": _s(item.get("text"))})
    return out


def _attention(value: Any) -> list[dict[str, str]]:
    out = []
    for item in value if isinstance(value, list) else ():
        if isinstance(item, str):
            item = {"text": item}
        if isinstance(item, dict) and _s(item.get("text")):
            out.append({"text": _s(item.get("text")), "source_id": _s(item.get("source_id"))})
    return out


def _reading(value: Any) -> list[dict[str, str]]:
    out = []
    for item in value if isinstance(value, list) else ():
        if isinstance(item, dict) and _s(item.get("summary")):
            out.append({"facet": _s(item.get("facet")), "summary": _s(item.get("summary"))})
    return out


def briefing_path(root: Path, day: _dt.date | str) -> Path:
    return inside(root, "chronicle", check_day(day), "talents", "morning_briefing.json")


def load_briefing(root: Path, day: _dt.date) -> Briefing | None:
    """The briefing written for ``day`` (a date or ``YYYYMMDD``); None when
    there is none or it is not a readable JSON object (logged)."""
    path = briefing_path(root, day)
    data = read_json(path)
    if data is None:
        return None
    if not isinstance(data, dict):
        _log.warning("journal.briefing_not_object", file=str(path))
        return None
    if not isinstance(day, _dt.date):
        day = _dt.datetime.strptime(day, "%Y%m%d").date()
    meta = data.get("metadata")
    return Briefing(
        day=day,
        your_day=_your_day(data.get("your_day")),
        yesterday=_strings(data.get("yesterday")),
        needs_attention=_attention(data.get("needs_attention")),
        forward_look=_strings(data.get("forward_look")),
        reading=_reading(data.get("reading")),
        metadata=meta if isinstance(meta, dict) else {},
    )


def _your_day_line(item: dict[str, str]) -> str:
    start, end, text = item["start"], item["end"], clean(item["text"])
    if start and end and end != start:
        return f"{start} to {end}: {text}"
    return f"{start}: {text}" if start else text


def _sections(b: Briefing) -> list[tuple[str, list[str]]]:
    return [
        ("Your day", [_your_day_line(i) for i in b.your_day]),
        ("Yesterday", [clean(t) for t in b.yesterday]),
        ("Needs attention", [clean(i["text"]) for i in b.needs_attention]),
        ("Looking ahead", [clean(t) for t in b.forward_look]),
        ("Reading", [clean(f"{i['facet']}: {i['summary']}" if i["facet"] else i["summary"]) for i in b.reading]),
    ]


def briefing_text(b: Briefing) -> str:
    """The briefing as plain spoken text: one paragraph per non-empty
    section, a heading line then one line per bullet."""
    parts = []
    for title, lines in _sections(b):
        if lines:
            parts.append(f"{title}:\n" + "\n".join(lines))
    return "\n\n".join(parts)


def highlights(b: Briefing) -> list[str]:
    """What to say first: the needs-attention texts; when there are none,
    the first three bullets across the other sections (in section order)."""
    attention = [clean(i["text"]) for i in b.needs_attention]
    if attention:
        return attention
    others = [line for title, lines in _sections(b) if title != "Needs attention" for line in lines]
    return others[:3]
