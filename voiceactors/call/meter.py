"""CallMeter: one call's usage, cost and budget, with no I/O.

``CallProtocol`` holds one and consults it at two points only: each
``response.done`` (``count``: its ``usage`` counted, priced, checked against
the budget) and each chance to send a ``response.create`` (``farewell``).
Everything the budget decides is plain state here; the protocol turns it
into effects.

The budget's course, once ``CallUsage.cost_usd`` reaches ``budget_usd``:

1. ``REACHED`` — the model is to be asked to say goodbye. The protocol sends
   that ``response.create`` (``FAREWELL``) at its next chance under the usual
   rules: no response active, no create of ours in flight, every output of a
   finished batch written first. A refused or lost farewell is asked again.
2. ``FAREWELL`` — the farewell is sent; no other ``response.create`` follows.
3. ``ENDING`` — the farewell's ``response.done`` came: the call ends
   ``GRACE_S`` later (the user hears the sentence out).

Whatever happens, the call ends at the latest ``FAREWELL_MAX_S`` after the
budget was reached (a service that never answers the farewell).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from voiceactors.usage.cost import CallUsage, Prices, ResponseUsage, parse_price_table, round_usd

#: After the farewell's response.done: time for its audio to play out.
GRACE_S = 4.0
#: The latest end after the budget was reached.
FAREWELL_MAX_S = 20.0
#: The farewell's response parameters (overriding the session's for that response only).
FAREWELL: dict[str, Any] = {
    "instructions": ("This call has reached its spending limit and must end now. Tell the user so in one "
                     "short sentence, and say nothing else."),
    "tool_choice": "none",
}


class BudgetState(StrEnum):
    UNDER = "under"          # no budget, or not reached
    REACHED = "reached"      # the farewell is due
    FAREWELL = "farewell"    # the farewell is sent
    ENDING = "ending"        # the farewell is done: the call ends at ``end_at``


@dataclass
class CallMeter:
    """``budget_usd`` 0: no budget. ``prices`` None: the model's cost is unknown."""

    model: str = "unknown"
    prices: Prices | None = None
    budget_usd: float = 0.0
    usage: CallUsage = field(init=False)
    state: BudgetState = BudgetState.UNDER
    farewell_event_id: str | None = None
    end_at: float | None = None            # the call ends then (math.inf: not decided)
    unpriced_logged: bool = False

    def __post_init__(self) -> None:
        self.usage = CallUsage(self.model, self.prices)

    @property
    def budgeted(self) -> bool:
        return self.budget_usd > 0

    def count(self, response_id: str, usage: object) -> tuple[ResponseUsage, list[str]]:
        """Count one response's usage; the entry and its malformed fields."""
        return self.usage.add(response_id, usage)

    def budget_reached_now(self, now: float) -> bool:
        """True once, when the call's cost first reaches its budget."""
        cost = self.usage.cost_usd
        if self.state != BudgetState.UNDER or not self.budgeted or cost is None or cost < self.budget_usd:
            return False
        self.state = BudgetState.REACHED
        self.end_at = now + FAREWELL_MAX_S
        return True

    def farewell_done(self, now: float) -> bool:
        """The farewell's response ended: the grace starts (True once)."""
        if self.state != BudgetState.FAREWELL:
            return False
        self.state = BudgetState.ENDING
        self.end_at = min(self.end_at if self.end_at is not None else math.inf, now + GRACE_S)
        return True

    def due(self, now: float) -> bool:
        return self.end_at is not None and now >= self.end_at

    def line(self, entry: ResponseUsage) -> dict[str, Any]:
        """A ``usage`` record line's (and feed event's) fields for one response."""
        return {"response_id": entry.response_id, "model": self.model, "tokens": entry.tokens.as_dict(),
                "cost_usd": round_usd(entry.cost_usd)}

    def totals(self) -> dict[str, Any]:
        """The call's totals (the ``usage_total`` line, the feed's ``call_*`` fields)."""
        return {"model": self.model, "responses": len(self.usage.responses),
                "tokens": self.usage.total.as_dict(), "cost_usd": round_usd(self.usage.cost_usd),
                "budget_usd": self.budget_usd or None}


@functools.lru_cache(maxsize=8)
def _table(entries: tuple[str, ...]) -> dict[str, Prices]:
    return parse_price_table(entries)


def meter_for(model: str, prices: tuple[str, ...], budget_usd: float) -> CallMeter:
    """A call's meter: ``model``'s prices from the ``prices`` setting (checked at start-up)."""
    return CallMeter(model, _table(tuple(prices)).get(model), budget_usd)
