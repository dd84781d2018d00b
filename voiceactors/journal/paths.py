"""Strict validation of every input that names a file, and safe joins.

Nothing a caller passes (a day, a slug, a facet) may resolve outside the
journal: values are matched against strict patterns first, and joined paths are
checked to stay under the root.
"""

from __future__ import annotations

import re
from pathlib import Path

DAY_RE = re.compile(r"^\d{8}$")               # chronicle folder name YYYYMMDD
SLUG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")   # entity ids, facet names
SEGMENT_RE = re.compile(r"^(\d{6})_(\d{1,6})$")               # HHMMSS_LEN
STREAM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class InvalidName(ValueError):
    """An input that names a file did not match its pattern."""


def check_slug(value: object) -> str:
    if not isinstance(value, str) or not SLUG_RE.fullmatch(value) or ".." in value:
        raise InvalidName(f"invalid slug: {value!r}")
    return value


def inside(root: Path, *parts: str) -> Path:
    """``root / parts`` after checking the result stays inside ``root``."""
    root = Path(root)
    path = root.joinpath(*parts)
    resolved_root = root.resolve()
    resolved = path.resolve()
    if resolved != resolved_root and resolved_root not in resolved.parents:
        raise InvalidName(f"path escapes the journal: {'/'.join(parts)!r}")
    return path


# --- tolerant readers -------------------------------------------------------
# Every journal surface reads through these two, so "missing → nothing,
# corrupt → skipped and logged, never fatal" holds in one place, and so does
# "no lone surrogate gets out" (``safe_text``: a string's ``\udc80`` escape
# comes out as U+FFFD). They only
# read: nothing here creates a file or a folder.

from typing import Any as _Any

from voiceactors import safe_text, storage
from voiceactors.logs import get_logger as _get_logger

_log = _get_logger(actor="journal")


def read_json(path: Path, *, raise_unreadable: bool = False) -> _Any | None:
    """The parsed JSON document at ``path``; None when the file is missing
    (silently) or corrupt (logged as a warning). A file that exists but
    cannot be read is logged and read as None too, unless
    ``raise_unreadable``: then the ``OSError`` propagates, for a caller that
    must not mistake an I/O error for an absent file (the voice config)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if raise_unreadable:
            raise
        _log.warning("journal.file_unreadable", file=str(path), error=type(exc).__name__)
        return None
    try:
        return safe_text.loads(text)
    except ValueError as exc:
        _log.warning("journal.json_corrupt", file=str(path), error=str(exc)[:200])
        return None


def read_jsonl(path: Path, *, log_each_skipped: bool = True) -> list[dict[str, _Any]]:
    """The JSON objects of a JSONL file, one a line (split at ``"\\n"`` only,
    see ``storage.jsonl_lines``). Blank lines are ignored;
    a line that is not a JSON object is skipped and logged with its file name
    and line number (``journal.jsonl_line_skipped``), or, for a bulk reader
    that passes ``log_each_skipped=False`` (the index build, over every file
    of the journal), counted in one ``journal.jsonl_lines_skipped`` line per
    file. A missing file reads as ``[]``."""
    try:
        text = storage.read_text_exact(path, errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        _log.warning("journal.file_unreadable", file=str(path), error=type(exc).__name__)
        return []
    rows: list[dict[str, _Any]] = []
    skipped = 0
    escaped = safe_text.may_hold_surrogate_escape(text)   # one search for the file, not one a line
    for lineno, line in enumerate(storage.jsonl_lines(text), start=1):
        if not line.strip():
            continue
        try:
            obj = storage.loads_line(line)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            rows.append(safe_text.clean(obj) if escaped else obj)
        elif log_each_skipped:
            _log.warning("journal.jsonl_line_skipped", file=str(path), line=lineno)
        else:
            skipped += 1
    if skipped:
        _log.warning("journal.jsonl_lines_skipped", path=str(path), count=skipped)
    return rows


def check_day(value: object) -> str:
    """A chronicle day name ``YYYYMMDD`` (a ``datetime.date`` is accepted and
    converted); InvalidName otherwise."""
    import datetime as _dt

    if isinstance(value, _dt.date):
        return value.strftime("%Y%m%d")
    if not isinstance(value, str) or not DAY_RE.fullmatch(value):
        raise InvalidName(f"invalid day: {value!r}")
    return value
