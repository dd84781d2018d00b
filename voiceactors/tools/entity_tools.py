"""``entities.get`` and ``entities.recent_with``.

An entity is resolved by id first, then by case-insensitive name or aka
(``journal.entities.get_entity``); blocked entities are never found.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from voiceactors.journal import activities, entities, facets, ledger
from voiceactors.journal.paths import InvalidName
from voiceactors.tools.handler_context import ToolContext

RECENT_CONTEXT_MAX = 5
RECENT_WITH_MAX = 10     # spoken-friendly cap on interactions
TOP_FACETS = 3


def _iso(day: str) -> str:
    return f"{day[:4]}-{day[4:6]}-{day[6:]}" if len(day) == 8 and day.isdigit() else ""


def _obs_day(obs: dict[str, Any]) -> str:
    day = _iso(obs.get("source_day") or "")
    if day or not obs.get("observed_at"):
        return day
    return _dt.datetime.fromtimestamp(obs["observed_at"] / 1000, tz=_dt.timezone.utc).date().isoformat()


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if not text or text.endswith((".", "!", "?")) else text + "."


def _commitment_counts(root: Path, entity: entities.Entity) -> tuple[int, int]:
    names = {n.casefold() for n in (entity.name, *entity.aka)}
    open_n = closed_n = 0
    for item in ledger.derive(root):
        ids = {item.owner_entity_id, item.counterparty_entity_id}
        people = {(item.owner or "").casefold(), (item.counterparty or "").casefold()}
        if entity.id in ids or names & people:
            if item.state == "open":
                open_n += 1
            else:
                closed_n += 1
    return open_n, closed_n


def _profile(root: Path, entity: entities.Entity, views: list[entities.FacetView],
             observed: list[dict[str, Any]]) -> str:
    """Plain sentences for speech: who they are in each facet, how often they
    come up, commitments with them, and where they matter most."""
    titles = {f.slug: f.title for f in facets.all_facets(root)}
    parts = [f"{entity.name} ({entity.type})." if entity.type else f"{entity.name}."]
    if entity.aka:
        parts.append(f"Also known as {', '.join(entity.aka)}.")
    for view in views:
        if view.description:
            parts.append(f"In {titles.get(view.facet, view.facet)}: {_sentence(view.description)}")
    obs_days = sorted({d for d in (_obs_day(o) for o in observed) if d})
    if observed:
        last = f", most recently on {obs_days[-1]}" if obs_days else ""
        parts.append(f"Observed {len(observed)} times across {len(obs_days) or 1} days{last}.")
    else:
        parts.append("No observations recorded yet.")
    open_n, closed_n = _commitment_counts(root, entity)
    parts.append(f"Commitments: {open_n} open, {closed_n} closed.")
    ranked = _ranked_facets(views)
    if ranked:
        parts.append("Most relevant in: " + ", ".join(titles.get(f, f) for f in ranked[:TOP_FACETS]) + ".")
    return " ".join(parts)


def _ranked_facets(views: list[entities.FacetView]) -> list[str]:
    """Facets by how much they say about the entity (observations, then a
    description), ties by name."""
    return [v.facet for v in sorted(views, key=lambda v: (-len(v.observations), not v.description, v.facet))]


def get(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The entity's profile. ``tags`` are the facets it appears in, most
    relevant first; ``recent_context`` the newest distinct observations."""
    entity = entities.get_entity(ctx.journal, str(args.get("entity_slug", "")).strip())
    if entity is None:
        return {"error": "not found"}
    views = entities.facet_views(ctx.journal, entity.id)
    observed = sorted((o for v in views for o in v.observations), key=lambda o: o["observed_at"], reverse=True)
    recent, seen = [], set()
    for obs in observed:
        if obs["content"] in seen:
            continue
        seen.add(obs["content"])
        recent.append({"date": _obs_day(obs), "summary": obs["content"]})
        if len(recent) >= RECENT_CONTEXT_MAX:
            break
    return {
        "slug": entity.id,
        "name": entity.name,
        "type": entity.type,
        "profile": _profile(ctx.journal, entity, views, observed),
        "tags": _ranked_facets(views),
        "recent_context": recent,
        "_nav_target": f"entity/{entity.id}",
    }


def _matches(record: dict[str, Any], entity: entities.Entity, names: set[str]) -> bool:
    """Participation by ``entity_id`` first; rows without one match by
    casefolded name/aka; then the record's ``active_entities``."""
    for part in record.get("participation") or ():
        if not isinstance(part, dict):
            continue
        pid = part.get("entity_id")
        if isinstance(pid, str) and pid:
            if pid == entity.id:
                return True
        elif isinstance(part.get("name"), str) and " ".join(part["name"].split()).casefold() in names:
            return True
    for active in record.get("active_entities") or ():
        if isinstance(active, str) and (active == entity.id or " ".join(active.split()).casefold() in names):
            return True
    return False


def _text(value: Any) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


def _interaction(record: dict[str, Any], day: str) -> dict[str, Any]:
    story = record.get("story")
    body = _text(story.get("body")) if isinstance(story, dict) else ""
    return {
        "date": _iso(day),
        "activity": _text(record.get("activity")) or _text(record.get("title")),
        "context": body or _text(record.get("description")) or _text(record.get("title")),
        "note": _text(record.get("details")),
    }


def _order(record: dict[str, Any], day: str) -> tuple[int, str, str]:
    try:
        created = int(record.get("created_at") or 0)
    except (TypeError, ValueError):
        created = 0
    return (created, day, str(record.get("id") or ""))


def recent_with(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Activities with the entity in the last ``days`` days (default 7,
    today included), newest first by ``created_at``, at most 10. Anticipated
    (calendar) and hidden records are not interactions."""
    days = args.get("days")
    days = 7 if days is None else days
    if isinstance(days, bool) or not isinstance(days, (int, float)) or not 1 <= days <= 365:
        return {"error": "invalid days"}
    entity = entities.get_entity(ctx.journal, str(args.get("entity_slug", "")).strip())
    if entity is None:
        return {"error": "not found"}
    today = ctx.today()
    first = (today - _dt.timedelta(days=int(days))).strftime("%Y%m%d")
    last = today.strftime("%Y%m%d")
    facet = args.get("facet")
    slugs = [facet] if facet else [f.slug for f in facets.enabled_facets(ctx.journal)]
    names = {" ".join(n.split()).casefold() for n in (entity.name, entity.id, *entity.aka)}
    found: list[tuple[tuple[int, str, str], dict[str, Any]]] = []
    for slug in slugs:
        try:
            # only the window's files: a long journal has thousands per facet
            window = activities.records_between(ctx.journal, slug, first, last)
        except InvalidName:
            continue
        for day, records in window:
            for record in records:
                if record.get("source") == "anticipated" or record.get("hidden"):
                    continue
                if _matches(record, entity, names):
                    found.append((_order(record, day), _interaction(record, day)))
    found.sort(key=lambda pair: pair[0], reverse=True)
    interactions = [row for _key, row in found[:RECENT_WITH_MAX]]
    return {"slug": entity.id, "interactions": interactions, "count": len(interactions)}
