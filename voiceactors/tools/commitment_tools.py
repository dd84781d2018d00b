"""``commitments.list`` and ``commitments.complete`` over the derived ledger.

``sources`` (provenance) never reaches the model: items are shaped field by
field, never dumped whole.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from voiceactors.journal import ledger
from voiceactors.tools.handler_context import ToolContext

# The design's resolutions: only "dropped" drops; the others close.
RESOLUTION_STATES = {
    "done": "closed",
    "sent": "closed",
    "signed": "closed",
    "deferred": "closed",
    "dropped": "dropped",
}


def _day_from_ms(ms: int | None) -> str:
    if not ms or ms <= 0:
        return ""
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc).date().isoformat()


def _opening_day(item: ledger.LedgerItem) -> str:
    """Day the item was opened: its record's ``created_at`` (UTC), else the
    day file of the record that holds it."""
    day = _day_from_ms(item.opened_at)
    if day:
        return day
    for ref in item.sources:
        if ref.field == "commitments" and len(ref.day) == 8:
            return f"{ref.day[:4]}-{ref.day[4:6]}-{ref.day[6:]}"
    return ""


def shape(item: ledger.LedgerItem) -> dict[str, Any]:
    """The model-facing commitment: no ``sources``, no entity ids, days as
    ``YYYY-MM-DD`` (UTC); ``day_closed`` and ``resolution`` only when known."""
    out: dict[str, Any] = {
        "id": item.id,
        "owner": item.owner,
        "action": item.action,
        "counterparty": item.counterparty or "",
        "state": item.state,
        "context": item.context,
        "day_opened": _opening_day(item),
    }
    if item.state != "open" and item.closed_at:
        out["day_closed"] = _day_from_ms(item.closed_at)
    resolution = item.resolution or ("dropped" if item.state == "dropped" else None)
    if resolution:
        out["resolution"] = resolution
    return out


def list_commitments(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Open items oldest first, then closed/dropped most recent first;
    ``limit`` defaults to 20; ``facet`` filters by the opening record's facet
    (default: every enabled facet)."""
    state = args.get("state")
    if state is not None and state not in ledger.STATES:
        return {"error": "invalid state"}
    facet = args.get("facet")
    items = ledger.list_items(ctx.journal, state=state, facets=[facet] if facet else None,
                              top=int(args.get("limit") or 20))
    return {"commitments": [shape(item) for item in items]}


#: The answer when, after our close, the journal still derives another state
#: (a close by another writer outranks ours): never ``ok`` for a state not reached.
NOT_APPLIED = {state: f"not applied: the journal shows this commitment as {state}" for state in ledger.STATES}


def complete(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Close or drop one item (appends a ``ledger_close`` edit; idempotent for
    the same item and state) and answer from the state derived afterwards.
    Blocking; the journal lock is waited for at most
    ``ctx.journal_lock_timeout_s`` (``storage.LockTimeout`` propagates: the
    executor answers it, nothing is recorded)."""
    resolution = args.get("resolution")
    as_state = RESOLUTION_STATES.get(resolution) if isinstance(resolution, str) else None
    if as_state is None:
        return {"error": "invalid resolution"}
    try:
        item = ledger.close(ctx.journal, str(args.get("commitment_id", "")), as_state,
                            f"resolution: {resolution}", actor="voice",
                            lock_timeout_s=ctx.journal_lock_timeout_s)
    except KeyError:
        return {"error": "not found"}
    if item.state != as_state:   # a close we could not outrank: say what the journal says
        return {"error": NOT_APPLIED[item.state]}
    commitment = shape(item)
    commitment["resolution"] = resolution
    return {"ok": True, "commitment": commitment}
