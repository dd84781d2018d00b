"""``journal.get_day`` and ``journal.search``.

Handlers are synchronous and blocking (the executor runs them in a worker
thread); they return the model-facing dict, plus ``_nav_target`` for the
client, which the executor strips before the model sees the output.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any
from urllib.parse import quote_plus

from voiceactors import clock
from voiceactors.journal import days as journal_days
from voiceactors.journal import search as journal_search
from voiceactors.journal.paths import InvalidName
from voiceactors.tools.handler_context import ToolContext


def get_day(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """One day's segments and summary. ``agent_type`` is the segment's stream
    (``default``, ``import.ics``, ...): what produced the segment."""
    try:
        day = clock.parse_day(str(args.get("day", "")))
    except ValueError:
        return {"error": "invalid day"}
    iso = day.isoformat()
    try:
        segments = journal_days.day_segments(ctx.journal, day.strftime("%Y%m%d"))
    except InvalidName:
        return {"error": "invalid day"}
    if segments is None:
        return {"error": "day not found"}
    return {
        "day": iso,
        "segments": [
            {
                "id": seg.id,
                "time_of_day": seg.start,
                "duration_s": seg.duration_s,
                "summary": seg.summary,
                "agent_type": seg.stream,
            }
            for seg in segments
        ],
        "summary": journal_days.day_summary(segments),
        "_nav_target": f"today/journal/{iso}",
    }


def search(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Full-text search; ``days`` limits to ``today - days`` onwards,
    ``limit`` defaults to 10. Hits carry no path or sources."""
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return {"error": "query is required"}
    days = args.get("days")
    day_from = ctx.today() - _dt.timedelta(days=int(days)) if days is not None else None
    limit = int(args.get("limit") or 10)
    try:
        hits = journal_search.search(
            ctx.journal, ctx.state_dir, query,
            facet=args.get("facet") or None, day_from=day_from, limit=limit,
            refresh_interval_s=ctx.search_refresh_interval_s,
        )
    except ValueError:  # nothing searchable left in the query (e.g. only punctuation)
        return {"error": "query is required"}
    results = []
    for hit in hits:
        row = {"id": hit.id, "day": hit.day, "source": hit.source, "snippet": hit.snippet}
        if hit.entity_slug:
            row["entity_slug"] = hit.entity_slug
        results.append(row)
    return {
        "results": results,
        "count": len(results),
        "_nav_target": f"today/search?q={quote_plus(query)}",
    }
