"""Facets: ``facets/<slug>/facet.json`` = ``{title, description, color, emoji, muted?}``.

A folder without a readable ``facet.json`` object is not a facet. Muted facets
exist but are not *enabled*; surfaces that speak for "the journal" (anticipated
events, the default ledger listing) use enabled facets only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from voiceactors.journal.paths import SLUG_RE, check_slug, inside, read_json


@dataclass(frozen=True)
class Facet:
    slug: str
    title: str
    description: str
    muted: bool
    color: str = ""
    emoji: str = ""

    @property
    def enabled(self) -> bool:
        return not self.muted


def facets_dir(root: Path) -> Path:
    return Path(root) / "facets"


def facet_slugs(root: Path) -> list[str]:
    """Sorted slugs of the folders under ``facets/`` that hold a
    ``facet.json`` (a cheap stat; the file is not parsed)."""
    folder = facets_dir(root)
    if not folder.is_dir():
        return []
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if SLUG_RE.fullmatch(entry.name) and (entry / "facet.json").is_file()
    )


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def get_facet(root: Path, slug: str) -> Facet | None:
    """The facet ``slug``; None when it has no (valid) ``facet.json``.
    InvalidName when ``slug`` is not a valid facet name or escapes the journal."""
    folder = inside(root, "facets", check_slug(slug))
    data = read_json(folder / "facet.json")
    if not isinstance(data, dict):
        return None
    return Facet(
        slug=slug,
        title=_str(data.get("title")) or slug,
        description=_str(data.get("description")),
        muted=bool(data.get("muted", False)),
        color=_str(data.get("color")),
        emoji=_str(data.get("emoji")),
    )


def all_facets(root: Path) -> list[Facet]:
    """Every facet, sorted by slug (corrupt ``facet.json`` files are logged
    and their folders left out)."""
    out = []
    for slug in facet_slugs(root):
        try:
            facet = get_facet(root, slug)
        except ValueError:  # a symlinked facet pointing outside the journal
            continue
        if facet is not None:
            out.append(facet)
    return out


def enabled_facets(root: Path) -> list[Facet]:
    """Facets that are not muted, sorted by slug."""
    return [facet for facet in all_facets(root) if not facet.muted]
