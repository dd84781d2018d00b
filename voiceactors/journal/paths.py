"""Strict validation of every input that names a file, and safe joins.

Nothing a caller passes (a day, a slug, a facet) may resolve outside the
journal: values are matched against strict patterns first, and joined paths are
checked to stay under the root.
"""

from __future__ import annotations

import re
from pathlib import Path

DAY_RE = re.compile(r"^\d{8}$")               # chronicle folder name YYYYMMDD
ISO_DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
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
