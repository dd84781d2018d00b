"""Entities: the journal-wide identity record and its per-facet views.

* ``entities/<id>/entity.json`` = ``{id, name, type, is_principal?, aka?, blocked?}``;
  the folder name is the id.
* ``facets/<f>/entities/<id>/entity.json`` = ``{entity_id, description, detached?}``:
  how one facet sees the entity; ``observations.jsonl`` beside it holds
  ``{content, observed_at, source_day}`` lines (``observed_at`` in epoch ms; some
  older journals wrote an ISO string, which is converted).

Blocked entities are hidden from lookups. Reading never creates anything.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voiceactors.journal.facets import facet_slugs
from voiceactors.journal.paths import SLUG_RE, check_slug, inside, read_json, read_jsonl


@dataclass(frozen=True)
class Entity:
    id: str
    name: str
    type: str
    aka: tuple[str, ...] = ()
    is_principal: bool = False
    blocked: bool = False


@dataclass(frozen=True)
class FacetView:
    facet: str
    description: str
    observations: list[dict[str, Any]] = field(default_factory=list)  # newest first
    detached: bool = False


def _entity(slug: str, data: Any) -> Entity | None:
    if not isinstance(data, dict):
        return None
    aka = data.get("aka") or ()
    if isinstance(aka, str):
        aka = (aka,)
    name = data.get("name")
    kind = data.get("type")
    return Entity(
        id=slug,
        name=name.strip() if isinstance(name, str) and name.strip() else slug,
        type=kind if isinstance(kind, str) else "",
        aka=tuple(a for a in aka if isinstance(a, str) and a.strip()),
        is_principal=bool(data.get("is_principal", False)),
        blocked=bool(data.get("blocked", False)),
    )


def load_entity(root: Path, slug: str) -> Entity | None:
    """The entity whose id is exactly ``slug`` (blocked ones included), or None.
    InvalidName when ``slug`` is not a valid id."""
    folder = inside(root, "entities", check_slug(slug))
    return _entity(slug, read_json(folder / "entity.json"))


def load_entities(root: Path, *, include_blocked: bool = False) -> dict[str, Entity]:
    """All entities by id (sorted); blocked ones only with ``include_blocked``."""
    folder = Path(root) / "entities"
    if not folder.is_dir():
        return {}
    out: dict[str, Entity] = {}
    for name in sorted(os.listdir(folder)):
        if not SLUG_RE.fullmatch(name):
            continue
        entity = _entity(name, read_json(folder / name / "entity.json"))
        if entity is not None and (include_blocked or not entity.blocked):
            out[name] = entity
    return out


def get_entity(root: Path, slug: str) -> Entity | None:
    """Resolve ``slug``: an exact id first, then a case-insensitive match on
    name, aka or id. Blocked entities are never returned (an exact id that is
    blocked answers None)."""
    if not isinstance(slug, str) or not slug.strip():
        return None
    if SLUG_RE.fullmatch(slug) and ".." not in slug:
        exact = load_entity(root, slug)
        if exact is not None:
            return None if exact.blocked else exact
    wanted = " ".join(slug.split()).casefold()
    for entity in load_entities(root).values():
        names = (entity.name, entity.id, *entity.aka)
        if any(" ".join(n.split()).casefold() == wanted for n in names):
            return entity
    return None


def observed_ms(value: Any) -> int:
    """``observed_at`` as epoch ms: ints pass through, ISO strings are parsed
    (naive = UTC), anything else is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value.strip():
        try:
            parsed = _dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return 0
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=_dt.timezone.utc)
        return int(parsed.timestamp() * 1000)
    return 0


def observations(root: Path, facet: str, slug: str) -> list[dict[str, Any]]:
    """``{content, observed_at (ms), source_day}`` of one facet view, newest first."""
    path = inside(root, "facets", check_slug(facet), "entities", check_slug(slug), "observations.jsonl")
    out: list[dict[str, Any]] = []
    for row in read_jsonl(path):
        content = row.get("content")
        if not isinstance(content, str) or not content.strip():
            continue
        day = row.get("source_day")
        out.append({
            "content": content.strip(),
            "observed_at": observed_ms(row.get("observed_at")),
            "source_day": day if isinstance(day, str) else "",
        })
    out.sort(key=lambda o: o["observed_at"], reverse=True)
    return out


def facet_views(root: Path, slug: str, *, include_detached: bool = False) -> list[FacetView]:
    """How each facet sees entity ``slug`` (sorted by facet). A view exists
    when ``facets/<f>/entities/<slug>/`` holds ``entity.json`` or
    ``observations.jsonl``; detached views only with ``include_detached``.
    InvalidName when ``slug`` is not a valid id."""
    check_slug(slug)
    views = []
    for facet in facet_slugs(root):
        try:
            folder = inside(root, "facets", facet, "entities", slug)
        except ValueError:
            continue
        meta = read_json(folder / "entity.json")
        has_obs = (folder / "observations.jsonl").is_file()
        if meta is None and not has_obs:
            continue
        meta = meta if isinstance(meta, dict) else {}
        detached = bool(meta.get("detached", False))
        if detached and not include_detached:
            continue
        desc = meta.get("description")
        views.append(FacetView(
            facet=facet,
            description=desc.strip() if isinstance(desc, str) else "",
            observations=observations(root, facet, slug) if has_obs else [],
            detached=detached,
        ))
    return views
