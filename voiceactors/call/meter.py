"""CallMeter: one call's usage, cost and budget, with no I/O.

``CallProtocol`` holds one and consults it at two points only: each
``response.done`` (``count``: its ``usage`` counted, priced, checked against
the budget; on a Live call also each ``session.usage.updated``,
``count_audio``: the session's seconds of audio) and each chance to send a
``response.create`` (``farewell``).
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

from voiceactors.usage.cost import (AudioUsage, CallUsage, Prices, ResponseUsage, parse_audio_prices, parse_price_table,
                                    round_usd)

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
    """``budget_usd`` 0: no budget. ``prices`` None: the model's cost is unknown.
    ``audio``: a Live call's session audio (None: not a Live call)."""

    model: str = "unknown"
    prices: Prices | None = None
    budget_usd: float = 0.0
    usage: CallUsage = field(init=False)
    state: BudgetState = BudgetState.UNDER
    farewell_event_id: str | None = None
    end_at: float | None = None            # the call ends then (math.inf: not decided)
    unpriced_logged: bool = False
    audio: AudioUsage | None = None

    def __post_init__(self) -> None:
        self.usage = CallUsage(self.model, self.prices, audio=self.audio)

    @property
    def budgeted(self) -> bool:
        return self.budget_usd > 0

    def count(self, response_id: str, usage: object) -> tuple[ResponseUsage, list[str]]:
        """Count one response's usage; the entry and its malformed fields."""
        return self.usage.add(response_id, usage)

    def count_audio(self, seconds: object) -> float:
        """One ``session.usage.updated``'s cumulative seconds: the seconds it
        adds (0: none, a repeated or late report, or not a Live call)."""
        return self.audio.report(seconds) if self.audio is not None else 0.0

    @property
    def counted(self) -> bool:
        """Whether anything was counted (the ``usage_total`` line is written)."""
        return bool(self.usage.responses) or (self.audio is not None and self.audio.counted > 0)

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

    def audio_line(self, added_s: float) -> dict[str, Any]:
        """An ``audio_usage`` record line's fields: the seconds a report
        added, the session's total so far and what the added ones cost."""
        audio = self.audio
        assert audio is not None
        return {"model": audio.model, "seconds": audio.seconds, "added_s": added_s,
                "cost_usd": round_usd(audio.cost_of(added_s))}

    def totals(self) -> dict[str, Any]:
        """The call's totals (the ``usage_total`` line, the feed's ``call_*`` fields);
        a Live call's also its seconds of audio (``audio_s``)."""
        totals = {"model": self.model, "responses": len(self.usage.responses),
                  "tokens": self.usage.total.as_dict(), "cost_usd": round_usd(self.usage.cost_usd),
                  "budget_usd": self.budget_usd or None}
        if self.audio is not None:
            totals["audio_s"] = self.audio.counted
        return totals


@functools.lru_cache(maxsize=8)
def _table(entries: tuple[str, ...]) -> dict[str, Prices]:
    return parse_price_table(entries)


@functools.lru_cache(maxsize=8)
def _audio_table(entries: tuple[str, ...]) -> dict[str, float]:
    return parse_audio_prices(entries)


def meter_for(model: str, prices: tuple[str, ...], budget_usd: float, *,
              audio_model: str | None = None, audio_s: float = 0.0) -> CallMeter:
    """A call's meter: ``model``'s prices from the ``prices`` setting (checked
    at start-up); with ``audio_model`` (a Live call's Live model) its session
    audio too, priced by that model's per-minute entry, from ``audio_s``
    (the session's seconds its earlier runs counted: a rejoin)."""
    audio = (AudioUsage(audio_model, _audio_table(tuple(prices)).get(audio_model), seconds=audio_s)
             if audio_model else None)
    return CallMeter(model, _table(tuple(prices)).get(model), budget_usd, audio=audio)
