"""Activity records: ``facets/<f>/activities/YYYYMMDD.jsonl``, one JSON object a line.

Only day-named files hold records; ``activities.jsonl`` beside them is the
facet's list of activity *types* and is never read as records. A corrupt line
is skipped and logged (file and line number), never fatal.

Anticipated (calendar) records carry ``source: "anticipated"`` and a
``target_date`` (``YYYY-MM-DD``) that need not match the file they live in, so
``anticipated`` scans every day file of every enabled facet; each file's
anticipated records are cached by ``(mtime_ns, size)`` so a repeated call only
stats the files.
"""

from __future__ import annotations

import copy
import datetime as _dt
import os
from pathlib import Path
from typing import Any

from voiceactors.journal.facets import enabled_facets
from voiceactors.journal.file_cache import StatCache, file_stamp
from voiceactors.journal.paths import DAY_RE, check_day, check_slug, inside, read_jsonl


def activities_dir(root: Path, facet: str) -> Path:
    """``facets/<facet>/activities`` (validated; InvalidName otherwise)."""
    return inside(root, "facets", check_slug(facet), "activities")


def _day_names(root: Path, facet: str, first: str | None, last: str | None) -> tuple[Path, list[str]]:
    """The facet's folder and its sorted ``YYYYMMDD`` record-file days within
    ``first``..``last`` (inclusive, ``YYYYMMDD``; None = open ended). Names are
    filtered as strings before anything else: a long journal has thousands."""
    folder = activities_dir(root, facet)
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return folder, []
    days = []
    for e in entries:
        name = e.name
        if not name.endswith(".jsonl"):
            continue
        day = name[:-6]
        if (first is not None and day < first) or (last is not None and day > last):
            continue
        if DAY_RE.fullmatch(day) and e.is_file():
            days.append(day)
    days.sort()       # same order as sorting the paths: one folder, same suffix
    return folder, days


def day_files(root: Path, facet: str, first: str | None = None, last: str | None = None) -> list[Path]:
    """The facet's record files ``YYYYMMDD.jsonl``, sorted by day; only days
    from ``first`` to ``last`` (inclusive, ``YYYYMMDD``) when given."""
    folder, days = _day_names(root, facet, first, last)
    return [folder / f"{day}.jsonl" for day in days]


def activity_days(root: Path, facet: str, first: str | None = None, last: str | None = None) -> list[str]:
    """Sorted ``YYYYMMDD`` days for which the facet has a record file; only
    days from ``first`` to ``last`` (inclusive, ``YYYYMMDD``) when given."""
    return _day_names(root, facet, first, last)[1]


def records_path(root: Path, facet: str, day: str) -> Path:
    return activities_dir(root, facet) / f"{check_day(day)}.jsonl"


def load_records(root: Path, facet: str, day: str) -> list[dict[str, Any]]:
    """The records of one facet and day (``YYYYMMDD``), in file order; ``[]``
    when there is no file. Corrupt lines are skipped and logged."""
    return read_jsonl(records_path(root, facet, day))


def records_between(root: Path, facet: str, first: str | None = None,
                    last: str | None = None) -> list[tuple[str, list[dict[str, Any]]]]:
    """``(day, records)`` for each of the facet's record files from ``first``
    to ``last`` (inclusive, ``YYYYMMDD``; None = open ended), oldest day
    first: ``load_records`` over a range, with the folder checked once."""
    folder, days = _day_names(root, facet, first, last)
    return [(day, read_jsonl(folder / f"{day}.jsonl")) for day in days]


# --- anticipated ------------------------------------------------------------

# path -> that file's anticipated records, by its stamp
_anticipated_cache: StatCache[list[dict[str, Any]]] = StatCache()


def _file_anticipated(path: Path) -> list[dict[str, Any]]:
    stamp = file_stamp(path)
    if stamp is None:
        return []
    return _anticipated_cache.get(
        str(path), stamp, lambda: [r for r in read_jsonl(path) if r.get("source") == "anticipated"])


def _time_key(value: Any) -> tuple[int, int, int]:
    """Sort key for ``HH:MM[:SS]``; missing or odd values sort last."""
    if isinstance(value, str):
        parts = value.strip().split(":")
        if 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
            nums = [int(p) for p in parts] + [0]
            return (0, nums[0] * 3600 + nums[1] * 60 + nums[2], 0)
    return (1, 0, 0)


def anticipated(root: Path, day: _dt.date | str) -> list[dict[str, Any]]:
    """Anticipated records for ``day`` across enabled facets: ``source ==
    "anticipated"``, ``target_date`` equal to the day, not cancelled, not
    hidden; sorted by start time (records without one last), then title.
    ``day`` is a date or ``YYYY-MM-DD``. Each returned dict is a copy with
    ``facet`` filled in when the record lacks it."""
    target = day.isoformat() if isinstance(day, _dt.date) else _dt.date.fromisoformat(day).isoformat()
    out = []
    for facet in enabled_facets(root):
        try:
            files = day_files(root, facet.slug)
        except ValueError:  # facet folder escapes the journal
            continue
        for path in files:
            for rec in _file_anticipated(path):
                if rec.get("target_date") != target or rec.get("cancelled") or rec.get("hidden"):
                    continue
                rec = copy.deepcopy(rec)
                if not isinstance(rec.get("facet"), str) or not rec.get("facet"):
                    rec["facet"] = facet.slug
                out.append(rec)
    out.sort(key=lambda r: (_time_key(r.get("start")), str(r.get("title") or ""), str(r.get("id") or "")))
    return out
