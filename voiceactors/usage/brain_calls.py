"""The brain's own model calls, counted where their APIs report usage.

Each run of the ``openai`` and ``claude`` backends reports its tokens (text
only: ``text_in`` uncached, ``cached_in``, ``text_out``) to the metrics
(``voiceactors_tokens_total{source="brain"}``, ``voiceactors_cost_usd_total``)
and logs ``brain.usage``. The cost is what the API reports (the Claude CLI's
``total_cost_usd``), else the price table's (``prices`` setting; a model
without an entry has an unknown cost). The brain's spending is not part of
the daily budget, which bounds the voice calls.
"""

from __future__ import annotations

from typing import Any

from voiceactors import metrics
from voiceactors.logs import get_logger
from voiceactors.settings import Settings
from voiceactors.usage.cost import Tokens, cost_usd, parse_price_table, round_usd

_log = get_logger(actor="brain")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def openai_tokens(usage: Any) -> Tokens | None:
    """Chat Completions' ``usage`` (prompt, completion, cached prompt tokens)."""
    if usage is None:
        return None
    prompt = _count(getattr(usage, "prompt_tokens", None))
    cached = min(prompt, _count(getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)))
    return Tokens(text_in=prompt - cached, cached_in=cached,
                  text_out=_count(getattr(usage, "completion_tokens", None)))


def claude_tokens(data: Any) -> tuple[Tokens | None, float | None]:
    """The Claude CLI's JSON result: its ``usage`` and ``total_cost_usd``."""
    if not isinstance(data, dict) or not isinstance(data.get("usage"), dict):
        return None, None
    usage = data["usage"]
    tokens = Tokens(text_in=_count(usage.get("input_tokens")) + _count(usage.get("cache_creation_input_tokens")),
                    cached_in=_count(usage.get("cache_read_input_tokens")),
                    text_out=_count(usage.get("output_tokens")))
    cost = data.get("total_cost_usd")
    return tokens, float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0 else None


def record(settings: Settings, backend: str, model: str, tokens: Tokens | None,
           reported_cost: float | None = None) -> None:
    """Count one brain run's tokens and cost (nothing when its API reported none)."""
    if tokens is None:
        return
    cost = reported_cost if reported_cost is not None else cost_usd(tokens, parse_price_table(settings.prices).get(model))
    metrics.usage(model, tokens.as_dict(), cost, source="brain")
    _log.info("brain.usage", backend=backend, model=model, tokens=tokens.as_dict(), cost_usd=round_usd(cost))
